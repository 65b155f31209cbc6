#ifndef WSYNC_INTEGRATION_HOST_PLUGIN_HOST_H_
#define WSYNC_INTEGRATION_HOST_PLUGIN_HOST_H_

// libwsync.so as a host program loads it (dlopen, dlsym("wsyncPlugin_v1")) and the calls every
// host of integration/ makes through its C ABI (plugin/include/wsync/wsync.h) and nothing else:
// the session, a layout part declared piece by piece (FP8 targets included), the schedule report,
// the library's own metrics. Shared by the demo process and the bench host (wsync_host).

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "integration/fill/fill.h"
#include "planner/layout.h"
#include "plugin/include/wsync/wsync.h"

namespace wsync::host {

// $WSYNC_LIBRARY when set, else ../../plugin/libwsync.so relative to this binary's directory (a
// host's place in the build tree, integration/<folder>/).
std::string DefaultLibrary();

// "WSYNC_TIMED_OUT" for WSYNC_TIMED_OUT, and so on.
const char* StatusName(wsync_status_t code);

// The plugin's outcome as a Status: OK for WSYNC_OK, else Unknown with `call`, the code's name and
// last_error(session) (last_error(NULL), the thread's, for a call that had no session).
absl::Status PluginStatus(const wsync_plugin_v1_t& plugin, wsync_session_t* session,
                          wsync_status_t code, absl::string_view call);

// The loaded library's v1 table and this process's one session. The library stays loaded until
// the process ends, as in an engine; the destructor finalizes a session still open.
class Plugin {
 public:
  // NotFound when `path` cannot be loaded or exports no wsyncPlugin_v1; FailedPrecondition for
  // another ABI version.
  static absl::StatusOr<std::unique_ptr<Plugin>> Load(const std::string& path);
  ~Plugin();
  Plugin(const Plugin&) = delete;
  Plugin& operator=(const Plugin&) = delete;

  const wsync_plugin_v1_t& api() const { return *api_; }
  // The size of the library's wsyncPlugin_v1 symbol (wsync.h, "Loading"): with
  // WSYNC_PLUGIN_V1_HAS(table_size(), entry), whether the library has an appended entry.
  size_t table_size() const { return table_size_; }
  wsync_session_t* session() const { return session_; }
  // PluginStatus of this session.
  absl::Status Call(wsync_status_t code, absl::string_view call) const;
  absl::Status Init(const wsync_config_t& config);
  absl::Status Finalize();

 private:
  Plugin(const wsync_plugin_v1_t* api, size_t table_size) : api_(api), table_size_(table_size) {}
  const wsync_plugin_v1_t* api_;
  size_t table_size_;
  wsync_session_t* session_ = nullptr;
};

// Registers `part` (one process's part of a layout) through the ABI: its buffers at their
// addresses in `memory`, every parameter (a quantized one as fp8_e4m3 followed by
// declare_fp8_parameter, which declares its scale tensor; the scale tensors are not declared
// otherwise) and every piece. The first failing call's status.
absl::Status Declare(const Plugin& plugin, const Layout& part, test::HostBuffers& memory);

// The session's schedule report ("" when it has none).
std::string ScheduleReport(const Plugin& plugin);

// The library's wsync_bytes_sent_total (sent = true) or wsync_bytes_received_total counters by
// path class, summed over transports, from metrics_text: what the session counted for its syncs
// so far (the schedule's message bytes of every sync whose transfer ran to the end).
absl::StatusOr<std::map<std::string, int64_t>> PathBytes(const Plugin& plugin, bool sent);

// The path of the file mapped into this process (/proc/self/maps) whose name is `file_name`
// ("libwsync.so"); NotFound when none is.
absl::StatusOr<std::string> MappedFile(absl::string_view file_name);

}  // namespace wsync::host

#endif  // WSYNC_INTEGRATION_HOST_PLUGIN_HOST_H_
