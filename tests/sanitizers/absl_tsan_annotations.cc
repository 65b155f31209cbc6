// ThreadSanitizer annotations for Debian's uninstrumented Abseil synchronization and absl::Status
// (TSan builds only; cmake/WsyncSanitizers.cmake links this library into every target and passes
// -Wl,--wrap for each symbol below).
//
// Debian's libabsl_synchronization.so is compiled without -fsanitize=thread, so TSan does not see
// the acquire/release inside absl::Mutex, CondVar and Notification and would report every access
// guarded by them as a race. The linker redirects each call our code makes to one of those
// functions (`--wrap=S` turns a call of S into a call of __wrap_S, and __real_S into S); the
// wrapper tells TSan what the call does, with the same annotations Abseil itself makes when it is
// built with TSan (absl/synchronization/mutex.cc):
//   lock:        __tsan_mutex_pre_lock / real call / __tsan_mutex_post_lock
//   unlock:      __tsan_mutex_pre_unlock / real call / __tsan_mutex_post_unlock
//   wait (Await, CondVar::Wait*): an unlock before and a lock after the real call.
// Between pre and post TSan ignores memory accesses, which covers the absl::Condition evaluations
// Abseil runs inside Unlock and LockWhen on behalf of other threads (the lock is held then).
// Notification: Notify releases and a wait that saw the notification acquires, on the address of
// the flag the inline HasBeenNotified() reads with an acquire load.
// Calls from inside Abseil are not redirected; they stay consistent among themselves.

#include <sanitizer/tsan_interface.h>

#include <atomic>
#include <cstdint>
#include <mutex>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

#if !defined(ABSL_LTS_RELEASE_VERSION) || ABSL_LTS_RELEASE_VERSION != 20220623
#error "the wrapped symbol names (cmake/WsyncSanitizers.cmake) are those of Abseil 20220623"
#endif

namespace {

using absl::Condition;
using absl::CondVar;
using absl::Duration;
using absl::Mutex;
using absl::Notification;
using absl::Time;

constexpr unsigned kRead = __tsan_mutex_read_lock;

// Runs `call`, which returns holding `mu`, between the lock annotations.
template <typename Call>
auto Locking(Mutex* mu, unsigned flags, Call call) {
  __tsan_mutex_pre_lock(mu, flags);
  const auto result = call();
  __tsan_mutex_post_lock(mu, flags, 0);
  return result;
}

// Runs `call`, which releases `mu` while it waits and holds it again when it returns.
template <typename Call>
auto Waiting(Mutex* mu, Call call) {
  __tsan_mutex_pre_unlock(mu, 0);
  const auto result = call();
  __tsan_mutex_post_unlock(mu, 0);
  __tsan_mutex_pre_lock(mu, 0);
  __tsan_mutex_post_lock(mu, 0, 0);
  return result;
}

// The address TSan synchronizes a Notification on: its flag, which HasBeenNotified() loads with
// acquire in our (instrumented) code.
void* FlagOf(const Notification* n) {
  // The flag is the last member (absl/synchronization/notification.h, 20220623).
  static_assert(sizeof(Notification) == sizeof(Mutex) + sizeof(std::atomic<bool>) ||
                sizeof(Notification) == 2 * sizeof(Mutex));
  return const_cast<char*>(reinterpret_cast<const char*>(n) + sizeof(Mutex));
}

}  // namespace

#define WSYNC_MANGLED(name) _ZN4absl7debian3##name
#define WSYNC_MANGLED_CONST(name) _ZNK4absl7debian3##name
#define WSYNC_CAT(a, b) a##b
#define WSYNC_REAL(sym) WSYNC_CAT(__real_, sym)
#define WSYNC_WRAP(sym) WSYNC_CAT(__wrap_, sym)

// Declares __real_SYM and defines __wrap_SYM(PARAMS) with BODY; BODY calls REAL(args).
#define WSYNC_WRAP_FUNCTION(ret, sym, params, body) \
  extern "C" ret WSYNC_REAL(sym) params;            \
  extern "C" ret WSYNC_WRAP(sym)                    \
  params body

#define LOCK_SYM WSYNC_MANGLED(5Mutex4LockEv)
WSYNC_WRAP_FUNCTION(void, LOCK_SYM, (Mutex * mu),
                    { Locking(mu, 0, [&] { return (WSYNC_REAL(LOCK_SYM)(mu), 0); }); })

#define READER_LOCK_SYM WSYNC_MANGLED(5Mutex10ReaderLockEv)
WSYNC_WRAP_FUNCTION(void, READER_LOCK_SYM, (Mutex * mu),
                    { Locking(mu, kRead, [&] { return (WSYNC_REAL(READER_LOCK_SYM)(mu), 0); }); })

#define UNLOCK_SYM WSYNC_MANGLED(5Mutex6UnlockEv)
WSYNC_WRAP_FUNCTION(void, UNLOCK_SYM, (Mutex * mu), {
  __tsan_mutex_pre_unlock(mu, 0);
  WSYNC_REAL(UNLOCK_SYM)(mu);
  __tsan_mutex_post_unlock(mu, 0);
})

#define READER_UNLOCK_SYM WSYNC_MANGLED(5Mutex12ReaderUnlockEv)
WSYNC_WRAP_FUNCTION(void, READER_UNLOCK_SYM, (Mutex * mu), {
  __tsan_mutex_pre_unlock(mu, kRead);
  WSYNC_REAL(READER_UNLOCK_SYM)(mu);
  __tsan_mutex_post_unlock(mu, kRead);
})

#define TRY_LOCK_SYM WSYNC_MANGLED(5Mutex7TryLockEv)
WSYNC_WRAP_FUNCTION(bool, TRY_LOCK_SYM, (Mutex * mu), {
  __tsan_mutex_pre_lock(mu, __tsan_mutex_try_lock);
  const bool locked = WSYNC_REAL(TRY_LOCK_SYM)(mu);
  __tsan_mutex_post_lock(mu, __tsan_mutex_try_lock | (locked ? 0 : __tsan_mutex_try_lock_failed),
                         0);
  return locked;
})

#define READER_TRY_LOCK_SYM WSYNC_MANGLED(5Mutex13ReaderTryLockEv)
WSYNC_WRAP_FUNCTION(bool, READER_TRY_LOCK_SYM, (Mutex * mu), {
  const unsigned flags = kRead | __tsan_mutex_try_lock;
  __tsan_mutex_pre_lock(mu, flags);
  const bool locked = WSYNC_REAL(READER_TRY_LOCK_SYM)(mu);
  __tsan_mutex_post_lock(mu, flags | (locked ? 0 : __tsan_mutex_try_lock_failed), 0);
  return locked;
})

// The *LockWhen* functions hold the lock when they return, whether or not the condition held.
#define LOCK_WHEN_SYM WSYNC_MANGLED(5Mutex8LockWhenERKNS0_9ConditionE)
WSYNC_WRAP_FUNCTION(void, LOCK_WHEN_SYM, (Mutex * mu, const Condition& c),
                    { Locking(mu, 0, [&] { return (WSYNC_REAL(LOCK_WHEN_SYM)(mu, c), 0); }); })

#define READER_LOCK_WHEN_SYM WSYNC_MANGLED(5Mutex14ReaderLockWhenERKNS0_9ConditionE)
WSYNC_WRAP_FUNCTION(void, READER_LOCK_WHEN_SYM, (Mutex * mu, const Condition& c), {
  Locking(mu, kRead, [&] { return (WSYNC_REAL(READER_LOCK_WHEN_SYM)(mu, c), 0); });
})

#define LOCK_WHEN_TIMEOUT_SYM \
  WSYNC_MANGLED(5Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE)
WSYNC_WRAP_FUNCTION(bool, LOCK_WHEN_TIMEOUT_SYM, (Mutex * mu, const Condition& c, Duration d), {
  return Locking(mu, 0, [&] { return WSYNC_REAL(LOCK_WHEN_TIMEOUT_SYM)(mu, c, d); });
})

#define LOCK_WHEN_DEADLINE_SYM \
  WSYNC_MANGLED(5Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE)
WSYNC_WRAP_FUNCTION(bool, LOCK_WHEN_DEADLINE_SYM, (Mutex * mu, const Condition& c, Time t), {
  return Locking(mu, 0, [&] { return WSYNC_REAL(LOCK_WHEN_DEADLINE_SYM)(mu, c, t); });
})

#define READER_LOCK_WHEN_TIMEOUT_SYM \
  WSYNC_MANGLED(5Mutex25ReaderLockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE)
WSYNC_WRAP_FUNCTION(bool, READER_LOCK_WHEN_TIMEOUT_SYM,
                    (Mutex * mu, const Condition& c, Duration d), {
                      return Locking(mu, kRead, [&] {
                        return WSYNC_REAL(READER_LOCK_WHEN_TIMEOUT_SYM)(mu, c, d);
                      });
                    })

#define READER_LOCK_WHEN_DEADLINE_SYM \
  WSYNC_MANGLED(5Mutex26ReaderLockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE)
WSYNC_WRAP_FUNCTION(bool, READER_LOCK_WHEN_DEADLINE_SYM, (Mutex * mu, const Condition& c, Time t), {
  return Locking(mu, kRead, [&] { return WSYNC_REAL(READER_LOCK_WHEN_DEADLINE_SYM)(mu, c, t); });
})

#define AWAIT_SYM WSYNC_MANGLED(5Mutex5AwaitERKNS0_9ConditionE)
WSYNC_WRAP_FUNCTION(void, AWAIT_SYM, (Mutex * mu, const Condition& c),
                    { Waiting(mu, [&] { return (WSYNC_REAL(AWAIT_SYM)(mu, c), 0); }); })

#define AWAIT_TIMEOUT_SYM WSYNC_MANGLED(5Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE)
WSYNC_WRAP_FUNCTION(bool, AWAIT_TIMEOUT_SYM, (Mutex * mu, const Condition& c, Duration d), {
  return Waiting(mu, [&] { return WSYNC_REAL(AWAIT_TIMEOUT_SYM)(mu, c, d); });
})

#define AWAIT_DEADLINE_SYM WSYNC_MANGLED(5Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE)
WSYNC_WRAP_FUNCTION(bool, AWAIT_DEADLINE_SYM, (Mutex * mu, const Condition& c, Time t), {
  return Waiting(mu, [&] { return WSYNC_REAL(AWAIT_DEADLINE_SYM)(mu, c, t); });
})

#define WAIT_SYM WSYNC_MANGLED(7CondVar4WaitEPNS0_5MutexE)
WSYNC_WRAP_FUNCTION(void, WAIT_SYM, (CondVar * cv, Mutex* mu),
                    { Waiting(mu, [&] { return (WSYNC_REAL(WAIT_SYM)(cv, mu), 0); }); })

#define WAIT_TIMEOUT_SYM WSYNC_MANGLED(7CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE)
WSYNC_WRAP_FUNCTION(bool, WAIT_TIMEOUT_SYM, (CondVar * cv, Mutex* mu, Duration d), {
  return Waiting(mu, [&] { return WSYNC_REAL(WAIT_TIMEOUT_SYM)(cv, mu, d); });
})

#define WAIT_DEADLINE_SYM WSYNC_MANGLED(7CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE)
WSYNC_WRAP_FUNCTION(bool, WAIT_DEADLINE_SYM, (CondVar * cv, Mutex* mu, Time t), {
  return Waiting(mu, [&] { return WSYNC_REAL(WAIT_DEADLINE_SYM)(cv, mu, t); });
})

#define NOTIFY_SYM WSYNC_MANGLED(12Notification6NotifyEv)
WSYNC_WRAP_FUNCTION(void, NOTIFY_SYM, (Notification * n), {
  __tsan_release(FlagOf(n));
  WSYNC_REAL(NOTIFY_SYM)(n);
})

#define WAIT_FOR_SYM WSYNC_MANGLED_CONST(12Notification19WaitForNotificationEv)
WSYNC_WRAP_FUNCTION(void, WAIT_FOR_SYM, (const Notification* n), {
  WSYNC_REAL(WAIT_FOR_SYM)(n);
  __tsan_acquire(FlagOf(n));
})

#define WAIT_FOR_TIMEOUT_SYM \
  WSYNC_MANGLED_CONST(12Notification30WaitForNotificationWithTimeoutENS0_8DurationE)
WSYNC_WRAP_FUNCTION(bool, WAIT_FOR_TIMEOUT_SYM, (const Notification* n, Duration d), {
  const bool notified = WSYNC_REAL(WAIT_FOR_TIMEOUT_SYM)(n, d);
  if (notified) __tsan_acquire(FlagOf(n));
  return notified;
})

#define WAIT_FOR_DEADLINE_SYM \
  WSYNC_MANGLED_CONST(12Notification31WaitForNotificationWithDeadlineENS0_4TimeE)
WSYNC_WRAP_FUNCTION(bool, WAIT_FOR_DEADLINE_SYM, (const Notification* n, Time t), {
  const bool notified = WSYNC_REAL(WAIT_FOR_DEADLINE_SYM)(n, t);
  if (notified) __tsan_acquire(FlagOf(n));
  return notified;
})

// absl::Status: copies share one reference-counted representation; the inline Ref() increments
// its count in our (instrumented) code, but every decrement and the final delete happen inside
// the uninstrumented Status::UnrefNonInlined. TSan then sees a thread that copied a shared error
// status and dropped its copy as racing with the thread whose drop deleted it. Dropping a
// reference under one process-wide mutex orders every drop after all earlier ones, as the
// release/acquire decrements do in Abseil. TSan builds only; the mutex costs nothing elsewhere.
#define STATUS_UNREF_SYM WSYNC_MANGLED(6Status15UnrefNonInlinedEm)
WSYNC_WRAP_FUNCTION(void, STATUS_UNREF_SYM, (uintptr_t rep), {
  static std::mutex* const unref_mutex = new std::mutex;
  std::lock_guard<std::mutex> lock(*unref_mutex);
  WSYNC_REAL(STATUS_UNREF_SYM)(rep);
})
