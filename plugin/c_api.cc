// The C ABI of include/wsync/wsync.h over wsync::Session (session.h).
//
// Contracts kept here, for every entry point of the exported table:
//   - No C++ exception leaves: each call runs inside Guarded, which turns std::bad_alloc into
//     WSYNC_NO_MEMORY and anything else into WSYNC_INTERNAL, with a message.
//   - Arguments the ABI can check by itself (NULL handles and pointers, enum values, axis counts,
//     dtype names, struct sizes) are checked before the Session sees them: WSYNC_INVALID_ARGUMENT
//     with a message naming the call and the argument.
//   - Every failure leaves its message where last_error finds it: in the session (Remember) when
//     the call had one, else in this thread's detached buffer, which last_error(NULL) returns.
//   - Session errors map to wsync_status_t by ToWsyncStatus (the rule is in docs/abi.md).

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <limits>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <tuple>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/dtype.h"
#include "common/log.h"
#include "common/status.h"
#include "plugin/c_config.h"
#include "plugin/live_handles.h"
#include "plugin/session.h"
#include "wsync/wsync.h"

// The opaque handle of the C ABI: owns the session; freed by finalize.
struct wsync_session {
  std::unique_ptr<wsync::Session> impl;
};

namespace wsync {
namespace {

// The detail of this thread's most recent failure that had no session to go to (init, finalize,
// or a call given a NULL handle). last_error(NULL) returns it; it lives until this thread's next
// such failure.
thread_local std::string detached_error;
// The copy of a session's last error that last_error(session) handed out on this thread; it lives
// until this thread's next last_error call.
thread_local std::string error_copy;

bool HasSession(const wsync_session_t* session) {
  return session != nullptr && session->impl != nullptr;
}

// Stores `status` (not OK) where last_error finds it. Never throws: a failure to store (out of
// memory) keeps the previous message.
void Record(wsync_session_t* session, const absl::Status& status) noexcept {
  try {
    if (HasSession(session)) {
      static_cast<void>(session->impl->Remember(status));
    } else {
      detached_error.assign(status.message().data(), status.message().size());
    }
  } catch (...) {
  }
}

// Records `status` (if not OK) and returns its ABI status.
wsync_status_t Report(wsync_session_t* session, const absl::Status& status) {
  if (status.ok()) return WSYNC_OK;
  Record(session, status);
  return ToWsyncStatus(status);
}

// Records "wsync <call>: <what>" and returns `code`.
wsync_status_t Refuse(wsync_session_t* session, wsync_status_t code, absl::string_view call,
                      absl::string_view what) {
  Record(session, absl::Status(code == WSYNC_UNSUPPORTED ? absl::StatusCode::kUnimplemented
                                                         : absl::StatusCode::kInvalidArgument,
                               absl::StrCat("wsync ", call, ": ", what)));
  return code;
}

wsync_status_t Invalid(wsync_session_t* session, absl::string_view call, absl::string_view what) {
  return Refuse(session, WSYNC_INVALID_ARGUMENT, call, what);
}

// Runs `body` with the exception firewall: nothing thrown inside leaves; it is recorded on
// `session` (or the detached buffer when null) and mapped to NO_MEMORY or INTERNAL.
template <typename Body>
wsync_status_t Guarded(wsync_session_t* session, absl::string_view call, Body&& body) noexcept {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    Record(session, absl::ResourceExhaustedError("wsync: out of memory"));
    return WSYNC_NO_MEMORY;
  } catch (const std::exception& e) {
    Record(session, absl::InternalError(
                        absl::StrCat("wsync ", call, ": internal error: exception: ", e.what())));
    return WSYNC_INTERNAL;
  } catch (...) {
    Record(session, absl::InternalError(
                        absl::StrCat("wsync ", call, ": internal error: unknown exception")));
    return WSYNC_INTERNAL;
  }
}

// ---- The entry points, in the order of wsync_plugin_v1_t. ----

wsync_status_t Init(const wsync_config_t* config, wsync_session_t** session) {
  return Guarded(nullptr, "init", [&]() -> wsync_status_t {
    if (session == nullptr) return Invalid(nullptr, "init", "session (the out pointer) is NULL");
    *session = nullptr;
    if (config == nullptr) return Invalid(nullptr, "init", "config is NULL");
    if (config->struct_size < kMinConfigSize) {
      return Invalid(
          nullptr, "init",
          absl::StrCat("config->struct_size is ", config->struct_size,
                       "; set it to sizeof(wsync_config_t) (at least ", kMinConfigSize, ")"));
    }
    // Fields past the caller's struct_size keep the zero that means "default"; fields of a newer
    // header past this library's sizeof are not read.
    wsync_config_t copy;
    std::memset(&copy, 0, sizeof(copy));
    std::memcpy(&copy, config, std::min(config->struct_size, sizeof(copy)));
    absl::StatusOr<SessionConfig> converted = ToSessionConfig(copy);
    if (!converted.ok()) {
      const wsync_status_t code =
          absl::IsUnimplemented(converted.status()) ? WSYNC_UNSUPPORTED : WSYNC_INVALID_ARGUMENT;
      return Refuse(nullptr, code, "init", converted.status().message());
    }
    absl::StatusOr<std::unique_ptr<Session>> created = Session::Create(*std::move(converted));
    if (!created.ok()) return Report(nullptr, created.status());
    auto handle = std::make_unique<wsync_session>();
    handle->impl = *std::move(created);
    LiveHandles::Get().Add(handle.get());
    *session = handle.release();
    return WSYNC_OK;
  });
}

wsync_status_t RegisterBuffer(wsync_session_t* session, uint64_t buffer_id, void* address,
                              uint64_t bytes, wsync_memory_kind_t kind, int32_t device) {
  constexpr absl::string_view kCall = "register_buffer";
  return Guarded(session, kCall, [&]() -> wsync_status_t {
    if (!HasSession(session)) return Invalid(nullptr, kCall, "session is NULL");
    const int memory_kind = EnumValue(kind);
    if (memory_kind != WSYNC_MEMORY_HOST && memory_kind != WSYNC_MEMORY_CUDA) {
      return Invalid(session, kCall,
                     absl::StrCat("kind must be WSYNC_MEMORY_HOST (1) or WSYNC_MEMORY_CUDA (2), "
                                  "got ",
                                  memory_kind));
    }
    if (bytes > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return Invalid(session, kCall, absl::StrCat("bytes ", bytes, " exceeds INT64_MAX"));
    }
    if (address == nullptr && bytes > 0) {
      return Invalid(session, kCall, absl::StrCat("buffer ", buffer_id, ": address is NULL"));
    }
    const MemoryKind memory =
        memory_kind == WSYNC_MEMORY_HOST ? MemoryKind::kHost : MemoryKind::kCuda;
    return Report(session, session->impl->RegisterBuffer(
                               buffer_id, address, static_cast<int64_t>(bytes), memory, device));
  });
}

wsync_status_t DeclareParameter(wsync_session_t* session, const char* name, const char* dtype,
                                int32_t num_axes, const int64_t* shape) {
  constexpr absl::string_view kCall = "declare_parameter";
  return Guarded(session, kCall, [&]() -> wsync_status_t {
    if (!HasSession(session)) return Invalid(nullptr, kCall, "session is NULL");
    if (name == nullptr) return Invalid(session, kCall, "name is NULL");
    if (dtype == nullptr) return Invalid(session, kCall, absl::StrCat(name, ": dtype is NULL"));
    absl::StatusOr<DType> parsed = ParseDType(dtype);
    if (!parsed.ok()) {
      return Invalid(session, kCall, absl::StrCat(name, ": ", parsed.status().message()));
    }
    if (absl::Status axes = CheckAxes(num_axes, {{"shape", shape}}); !axes.ok()) {
      return Invalid(session, kCall, absl::StrCat(name, ": ", axes.message()));
    }
    return Report(session, session->impl->DeclareParameter(name, *parsed, ToDims(shape, num_axes)));
  });
}

wsync_status_t DeclarePiece(wsync_session_t* session, const char* parameter, uint64_t buffer_id,
                            int32_t num_axes, const int64_t* origin, const int64_t* extent,
                            int64_t offset, const int64_t* strides) {
  constexpr absl::string_view kCall = "declare_piece";
  return Guarded(session, kCall, [&]() -> wsync_status_t {
    if (!HasSession(session)) return Invalid(nullptr, kCall, "session is NULL");
    if (parameter == nullptr) return Invalid(session, kCall, "parameter is NULL");
    if (absl::Status axes =
            CheckAxes(num_axes, {{"origin", origin}, {"extent", extent}, {"strides", strides}});
        !axes.ok()) {
      return Invalid(session, kCall, absl::StrCat(parameter, ": ", axes.message()));
    }
    const Box box{ToDims(origin, num_axes), ToDims(extent, num_axes)};
    return Report(session, session->impl->DeclarePiece(parameter, buffer_id, box, offset,
                                                       ToDims(strides, num_axes)));
  });
}

wsync_status_t SetManifest(wsync_session_t* session, const void* bytes, size_t size) {
  constexpr absl::string_view kCall = "set_manifest";
  return Guarded(session, kCall, [&]() -> wsync_status_t {
    if (!HasSession(session)) return Invalid(nullptr, kCall, "session is NULL");
    if (bytes == nullptr && size > 0) return Invalid(session, kCall, "bytes is NULL");
    const absl::string_view text =
        size == 0 ? absl::string_view() : absl::string_view(static_cast<const char*>(bytes), size);
    return Report(session, session->impl->SetManifest(text));
  });
}

wsync_status_t SetNamedLayout(wsync_session_t* session, const char* model, const char* layout) {
  constexpr absl::string_view kCall = "set_named_layout";
  return Guarded(session, kCall, [&]() -> wsync_status_t {
    if (!HasSession(session)) return Invalid(nullptr, kCall, "session is NULL");
    if (model == nullptr) return Invalid(session, kCall, "model is NULL");
    if (layout == nullptr) return Invalid(session, kCall, "layout is NULL");
    return Report(session, session->impl->SetNamedLayout(model, layout));
  });
}

wsync_status_t Connect(wsync_session_t* session) {
  constexpr absl::string_view kCall = "connect";
  return Guarded(session, kCall, [&]() -> wsync_status_t {
    if (!HasSession(session)) return Invalid(nullptr, kCall, "session is NULL");
    return Report(session, session->impl->Connect());
  });
}

wsync_status_t ScheduleReport(wsync_session_t* session, char* buffer, size_t* size) {
  constexpr absl::string_view kCall = "schedule_report";
  return Guarded(session, kCall, [&]() -> wsync_status_t {
    if (!HasSession(session)) return Invalid(nullptr, kCall, "session is NULL");
    if (absl::Status out = CheckOutBuffer(buffer, size); !out.ok()) {
      return Invalid(session, kCall, out.message());
    }
    absl::StatusOr<std::string> report = session->impl->ScheduleReport();
    if (!report.ok()) return Report(session, report.status());
    CopyOut(*report, buffer, size);
    return WSYNC_OK;
  });
}

wsync_status_t Sync(wsync_session_t* session, int64_t version) {
  constexpr absl::string_view kCall = "sync";
  return Guarded(session, kCall, [&]() -> wsync_status_t {
    if (!HasSession(session)) return Invalid(nullptr, kCall, "session is NULL");
    if (version < 0) {
      return Invalid(session, kCall, absl::StrCat("version must not be negative, got ", version));
    }
    return Report(session, session->impl->Sync(version));
  });
}

wsync_status_t SyncBegin(wsync_session_t* session, int64_t version) {
  constexpr absl::string_view kCall = "sync_begin";
  return Guarded(session, kCall, [&]() -> wsync_status_t {
    if (!HasSession(session)) return Invalid(nullptr, kCall, "session is NULL");
    if (version < 0) {
      return Invalid(session, kCall, absl::StrCat("version must not be negative, got ", version));
    }
    return Report(session, session->impl->SyncBegin(version));
  });
}

wsync_status_t SyncTest(wsync_session_t* session) {
  constexpr absl::string_view kCall = "sync_test";
  return Guarded(session, kCall, [&]() -> wsync_status_t {
    if (!HasSession(session)) return Invalid(nullptr, kCall, "session is NULL");
    std::optional<absl::Status> outcome = session->impl->SyncTest();
    if (!outcome.has_value()) return WSYNC_IN_PROGRESS;
    return Report(session, *outcome);
  });
}

// The status an after_update callback gets; never throws (it runs on the session's thread).
wsync_status_t CallbackStatus(const absl::Status& status) noexcept {
  try {
    return ToWsyncStatus(status);
  } catch (...) {
    return WSYNC_INTERNAL;
  }
}

wsync_status_t SetUpdateCallbacks(wsync_session_t* session, wsync_before_update_fn before,
                                  wsync_after_update_fn after, void* user) {
  constexpr absl::string_view kCall = "set_update_callbacks";
  return Guarded(session, kCall, [&]() -> wsync_status_t {
    if (!HasSession(session)) return Invalid(nullptr, kCall, "session is NULL");
    // A NULL function becomes an empty std::function: the Session skips it.
    Session::BeforeUpdate before_update;
    if (before != nullptr) {
      before_update = [before, user](int64_t version) { before(user, version); };
    }
    Session::AfterUpdate after_update;
    if (after != nullptr) {
      after_update = [after, user](int64_t version, const absl::Status& status) {
        after(user, version, CallbackStatus(status));
      };
    }
    return Report(session, session->impl->SetUpdateCallbacks(std::move(before_update),
                                                             std::move(after_update)));
  });
}

wsync_status_t Abort(wsync_session_t* session, const char* reason) {
  constexpr absl::string_view kCall = "abort";
  // The handle is not touched before it is known live (finalize may be freeing it).
  return Guarded(nullptr, kCall, [&]() -> wsync_status_t {
    if (session == nullptr) return Invalid(nullptr, kCall, "session is NULL");
    if (!LiveHandles::Get().Enter(session)) return WSYNC_OK;  // Finalized: nothing runs.
    struct Leave {
      wsync_session_t* session;
      ~Leave() { LiveHandles::Get().Leave(session); }
    } leave{session};
    return Guarded(session, kCall, [&]() -> wsync_status_t {
      session->impl->Abort(absl::AbortedError(reason != nullptr ? absl::StrCat("aborted: ", reason)
                                                                : "aborted by the host"));
      return WSYNC_OK;
    });
  });
}

wsync_status_t State(wsync_session_t* session, int64_t* version, wsync_state_t* state) {
  constexpr absl::string_view kCall = "state";
  return Guarded(session, kCall, [&]() -> wsync_status_t {
    if (!HasSession(session)) return Invalid(nullptr, kCall, "session is NULL");
    if (version == nullptr || state == nullptr) {
      return Invalid(session, kCall, "version and state must not be NULL");
    }
    const auto [current_version, current_state] = session->impl->State();
    switch (current_state) {
      case SessionState::kRegistered:
        *state = WSYNC_STATE_REGISTERED;
        break;
      case SessionState::kConnected:
        *state = WSYNC_STATE_CONNECTED;
        break;
      case SessionState::kIdle:
        *state = WSYNC_STATE_IDLE;
        break;
      case SessionState::kSyncing:
        *state = WSYNC_STATE_SYNCING;
        break;
      case SessionState::kDirty:
        *state = WSYNC_STATE_DIRTY;
        break;
      default:
        return Report(session,
                      absl::InternalError(absl::StrCat("wsync state: the session is in state ",
                                                       SessionStateName(current_state),
                                                       ", which the ABI has no value for")));
    }
    *version = current_version;
    return WSYNC_OK;
  });
}

// The body of the calls that fill a caller's versioned struct (stats, progress): checks the
// session, `out` and its struct_size (at least `minimum`), has `fill` write a zeroed full-size
// struct and copies it up to the caller's struct_size (CopyPrefix).
template <typename Struct, typename Fill>
wsync_status_t FillOut(wsync_session_t* session, absl::string_view call, Struct* out,
                       size_t minimum, absl::string_view type, Fill fill) {
  return Guarded(session, call, [&]() -> wsync_status_t {
    if (!HasSession(session)) return Invalid(nullptr, call, "session is NULL");
    if (out == nullptr) return Invalid(session, call, absl::StrCat(call, " is NULL"));
    if (absl::Status size = CheckStructSize(out->struct_size, minimum, call, type); !size.ok()) {
      return Invalid(session, call, size.message());
    }
    Struct full;
    std::memset(&full, 0, sizeof(full));
    fill(full);
    CopyPrefix(full, *out);
    return WSYNC_OK;
  });
}

wsync_status_t Stats(wsync_session_t* session, wsync_stats_t* stats) {
  return FillOut(session, "stats", stats, kMinStatsSize, "wsync_stats_t", [&](wsync_stats_t& full) {
    const wsync::Session::SyncStats stats_and_version = session->impl->LastStats();
    const TransferStats& last = stats_and_version.stats;
    full.version = stats_and_version.version;
    full.segments = last.segments;
    full.chunks = last.chunks;
    full.rounds = last.rounds;
    full.sent_bytes = last.sent_bytes;
    full.received_bytes = last.received_bytes;
    full.local_copy_bytes = last.local_copy_bytes;
    full.direct_bytes = last.direct_bytes;
    full.staged_bytes = last.staged_bytes;
    full.peak_arena_bytes = last.peak_arena_bytes;
    full.seconds = last.seconds;
    full.verified_chunks = last.verified_chunks;
    full.delta_messages = last.delta_messages;
    full.delta_saved_bytes = last.delta_saved_bytes;
    full.delta_compared_elements = last.delta_compared_elements;
    full.delta_changed_elements = last.delta_changed_elements;
    full.delta_encode_seconds = last.delta_encode_cpu_seconds;
    full.delta_apply_seconds = last.delta_apply_cpu_seconds;
  });
}

wsync_status_t Progress(wsync_session_t* session, wsync_progress_t* progress) {
  return FillOut(session, "progress", progress, kMinProgressSize, "wsync_progress_t",
                 [&](wsync_progress_t& full) {
                   const SyncProgressSnapshot now = session->impl->Progress();
                   full.version = now.version;
                   full.rounds_done = now.rounds_done;
                   full.rounds_total = now.rounds_total;
                   full.bytes_done = now.bytes_done;
                   full.bytes_total = now.bytes_total;
                   full.committed_version = now.committed_version;
                   full.phase = static_cast<int32_t>(now.phase);
                 });
}

wsync_status_t MetricsText(wsync_session_t* session, char* buffer, size_t* size) {
  constexpr absl::string_view kCall = "metrics_text";
  return Guarded(session, kCall, [&]() -> wsync_status_t {
    if (!HasSession(session)) return Invalid(nullptr, kCall, "session is NULL");
    if (absl::Status out = CheckOutBuffer(buffer, size); !out.ok()) {
      return Invalid(session, kCall, out.message());
    }
    CopyOut(session->impl->MetricsText(), buffer, size);
    return WSYNC_OK;
  });
}

wsync_status_t ListeningPorts(wsync_session_t* session, int32_t* metrics_port,
                              int32_t* coordinator_port) {
  constexpr absl::string_view kCall = "listening_ports";
  return Guarded(session, kCall, [&]() -> wsync_status_t {
    if (!HasSession(session)) return Invalid(nullptr, kCall, "session is NULL");
    if (metrics_port != nullptr) *metrics_port = session->impl->metrics_port();
    if (coordinator_port != nullptr) *coordinator_port = session->impl->coordinator_port();
    return WSYNC_OK;
  });
}

wsync_status_t RebindBuffer(wsync_session_t* session, uint64_t buffer_id, void* address) {
  constexpr absl::string_view kCall = "rebind_buffer";
  return Guarded(session, kCall, [&]() -> wsync_status_t {
    if (!HasSession(session)) return Invalid(nullptr, kCall, "session is NULL");
    return Report(session, session->impl->RebindBuffer(buffer_id, address));
  });
}

wsync_status_t DeclareFp8Parameter(wsync_session_t* session, const wsync_fp8_parameter_t* fp8) {
  constexpr absl::string_view kCall = "declare_fp8_parameter";
  return Guarded(session, kCall, [&]() -> wsync_status_t {
    if (!HasSession(session)) return Invalid(nullptr, kCall, "session is NULL");
    if (fp8 == nullptr) return Invalid(session, kCall, "fp8 is NULL");
    absl::StatusOr<Fp8Declaration> declared = ToFp8Declaration(*fp8);
    if (!declared.ok()) return Invalid(session, kCall, declared.status().message());
    return Report(session,
                  session->impl->DeclareFp8Parameter(declared->parameter, declared->quant,
                                                     declared->scale_dtype, declared->scale_shape));
  });
}

wsync_status_t SetParameterWave(wsync_session_t* session, const char* parameter, int32_t wave) {
  constexpr absl::string_view kCall = "set_parameter_wave";
  return Guarded(session, kCall, [&]() -> wsync_status_t {
    if (!HasSession(session)) return Invalid(nullptr, kCall, "session is NULL");
    if (parameter == nullptr) return Invalid(session, kCall, "parameter is NULL");
    return Report(session, session->impl->SetParameterWave(parameter, wave));
  });
}

wsync_status_t SetWaveCallback(wsync_session_t* session, wsync_wave_fn callback, void* user) {
  constexpr absl::string_view kCall = "set_wave_callback";
  return Guarded(session, kCall, [&]() -> wsync_status_t {
    if (!HasSession(session)) return Invalid(nullptr, kCall, "session is NULL");
    Session::AfterWave after_wave;  // NULL: none.
    if (callback != nullptr) {
      after_wave = [callback, user](int64_t version, int32_t wave) -> absl::Status {
        const wsync_status_t code = callback(user, version, wave);
        if (code == WSYNC_OK) return absl::OkStatus();
        return absl::Status(
            code == WSYNC_ABORTED ? absl::StatusCode::kAborted : absl::StatusCode::kInvalidArgument,
            absl::StrCat("it returned ", static_cast<int>(code)));
      };
    }
    return Report(session, session->impl->SetWaveCallback(std::move(after_wave)));
  });
}

wsync_status_t SetLog(wsync_log_fn callback, void* user, const char* categories, int32_t level) {
  constexpr absl::string_view kCall = "set_log";
  return Guarded(nullptr, kCall, [&]() -> wsync_status_t {
    if (level < 0 || level > WSYNC_LOG_DEBUG) {
      return Invalid(nullptr, kCall, absl::StrCat("level ", level, " is not 0..4"));
    }
    absl::StatusOr<uint32_t> mask = log::ParseCategories(categories != nullptr ? categories : "");
    if (!mask.ok()) return Invalid(nullptr, kCall, mask.status().message());
    log::Sink sink;  // Empty: standard error.
    if (callback != nullptr) {
      sink = [callback, user](log::Level at, log::Category category, absl::string_view line) {
        callback(user, static_cast<int32_t>(at), std::string(log::CategoryName(category)).c_str(),
                 std::string(line).c_str());
      };
    }
    return Report(
        nullptr,
        log::Configure(std::move(sink), *mask,
                       level == 0 ? std::nullopt : std::optional(static_cast<log::Level>(level))));
  });
}

wsync_status_t SettingInfo(int32_t index, wsync_setting_info_t* info) {
  constexpr absl::string_view kCall = "setting_info";
  return Guarded(nullptr, kCall, [&]() -> wsync_status_t {
    const absl::Status described = DescribeSetting(index, info);
    return described.ok() ? WSYNC_OK : Invalid(nullptr, kCall, described.message());
  });
}

wsync_status_t ConfigSet(wsync_config_t* config, const char* name, const char* text) {
  constexpr absl::string_view kCall = "config_set";
  return Guarded(nullptr, kCall, [&]() -> wsync_status_t {
    const absl::Status set = SetConfigText(config, name, text);
    return set.ok() ? WSYNC_OK : Invalid(nullptr, kCall, set.message());
  });
}

const char* LastError(wsync_session_t* session) {
  try {
    if (session == nullptr) return detached_error.c_str();
    if (session->impl == nullptr) return "";
    error_copy = session->impl->LastError();
    return error_copy.c_str();
  } catch (...) {
    return "wsync last_error: out of memory while copying the message";
  }
}

wsync_status_t Finalize(wsync_session_t* session) {
  constexpr absl::string_view kCall = "finalize";
  // Failures go to the detached buffer: the handle is gone when finalize returns.
  return Guarded(nullptr, kCall, [&]() -> wsync_status_t {
    if (!HasSession(session)) return Invalid(nullptr, kCall, "session is NULL");
    // After this no abort touches the handle: those in flight have left, later ones find nothing.
    LiveHandles::Get().Remove(session);
    std::unique_ptr<wsync_session> owned(session);
    owned->impl->Finalize();
    owned.reset();
    return WSYNC_OK;
  });
}

}  // namespace
}  // namespace wsync

// The only symbol the library exports (see wsync.map).
extern "C" __attribute__((visibility("default"))) const wsync_plugin_v1_t wsyncPlugin_v1 = {
    .name = "wsync",
    .abi_version = WSYNC_ABI_VERSION,
    .init = wsync::Init,
    .register_buffer = wsync::RegisterBuffer,
    .declare_parameter = wsync::DeclareParameter,
    .declare_piece = wsync::DeclarePiece,
    .set_manifest = wsync::SetManifest,
    .set_named_layout = wsync::SetNamedLayout,
    .connect = wsync::Connect,
    .schedule_report = wsync::ScheduleReport,
    .sync = wsync::Sync,
    .sync_begin = wsync::SyncBegin,
    .sync_test = wsync::SyncTest,
    .set_update_callbacks = wsync::SetUpdateCallbacks,
    .abort = wsync::Abort,
    .state = wsync::State,
    .stats = wsync::Stats,
    .metrics_text = wsync::MetricsText,
    .listening_ports = wsync::ListeningPorts,
    .last_error = wsync::LastError,
    .finalize = wsync::Finalize,
    .progress = wsync::Progress,
    .rebind_buffer = wsync::RebindBuffer,
    .declare_fp8_parameter = wsync::DeclareFp8Parameter,
    .set_parameter_wave = wsync::SetParameterWave,
    .set_wave_callback = wsync::SetWaveCallback,
    .set_log = wsync::SetLog,
    .setting_count = wsync::SettingCount,
    .setting_info = wsync::SettingInfo,
    .config_set = wsync::ConfigSet,
};
