#ifndef WSYNC_PLUGIN_LIVE_HANDLES_H_
#define WSYNC_PLUGIN_LIVE_HANDLES_H_

// The C ABI's registry of live session handles (c_api.cc). Thread-safe.

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "wsync/wsync.h"

namespace wsync {

// The live handles, so that abort may race finalize (wsync.h): abort looks its handle up here
// before touching it and holds it (a count of aborts in flight) while it works; finalize takes the
// handle out first and waits for the aborts in flight to leave before it frees anything. An abort
// that finds no handle (finalize started or finished) does nothing. The registry never shrinks
// below what is live, and is leaked at exit (aborts may run on other threads then).
class LiveHandles {
 public:
  static LiveHandles& Get() {
    static LiveHandles* handles = new LiveHandles();
    return *handles;
  }
  void Add(const wsync_session_t* handle) {
    absl::MutexLock lock(&mu_);
    aborting_[handle] = 0;
  }
  // True when `handle` is live; it then stays live until Leave(handle).
  bool Enter(const wsync_session_t* handle) {
    absl::MutexLock lock(&mu_);
    auto it = aborting_.find(handle);
    if (it == aborting_.end()) return false;
    ++it->second;
    return true;
  }
  void Leave(const wsync_session_t* handle) {
    absl::MutexLock lock(&mu_);
    auto it = aborting_.find(handle);
    if (it != aborting_.end()) --it->second;
  }
  // Takes `handle` out once no abort is in flight on it; false when it was not live.
  bool Remove(const wsync_session_t* handle) {
    absl::MutexLock lock(&mu_);
    if (!aborting_.contains(handle)) return false;
    struct Args {
      absl::flat_hash_map<const wsync_session_t*, int>* aborting;
      const wsync_session_t* handle;
    } args{&aborting_, handle};
    mu_.Await(absl::Condition(
        +[](Args* a) { return a->aborting->at(a->handle) == 0; }, &args));
    aborting_.erase(handle);
    return true;
  }

 private:
  absl::Mutex mu_;
  absl::flat_hash_map<const wsync_session_t*, int> aborting_ ABSL_GUARDED_BY(mu_);
};

}  // namespace wsync

#endif  // WSYNC_PLUGIN_LIVE_HANDLES_H_
