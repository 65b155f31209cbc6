// Session's layout calls (session.h): each checks the state (REGISTERED; rebind_buffer: IDLE or
// DIRTY) and forwards to the session's LocalLayoutBuilder (local_layout.h), which validates and
// keeps the layout; the update and wave callbacks are the session's own. The class comment in
// session.h states the contracts.

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "plugin/session.h"

namespace wsync {

absl::Status Session::RegisterBuffer(uint64_t id, void* address, int64_t bytes, MemoryKind kind,
                                     int32_t device) {
  WSYNC_RETURN_IF_ERROR(RequireState(SessionState::kRegistered, "register_buffer"));
  return layout_.RegisterBuffer(id, address, bytes, kind, device);
}

absl::Status Session::DeclareParameter(const std::string& name, DType dtype, const Dims& shape) {
  WSYNC_RETURN_IF_ERROR(RequireState(SessionState::kRegistered, "declare_parameter"));
  return layout_.DeclareParameter(name, dtype, shape);
}

absl::Status Session::DeclareFp8Parameter(const std::string& name, const ParamQuant& quant,
                                          DType scale_dtype, const Dims& scale_shape) {
  WSYNC_RETURN_IF_ERROR(RequireState(SessionState::kRegistered, "declare_fp8_parameter"));
  return layout_.DeclareFp8Parameter(name, quant, scale_dtype, scale_shape);
}

absl::Status Session::DeclarePiece(const std::string& parameter, uint64_t buffer, const Box& box,
                                   int64_t offset, const Dims& strides) {
  WSYNC_RETURN_IF_ERROR(RequireState(SessionState::kRegistered, "declare_piece"));
  return layout_.DeclarePiece(parameter, buffer, box, offset, strides);
}

absl::Status Session::SetManifest(absl::string_view bytes) {
  WSYNC_RETURN_IF_ERROR(RequireState(SessionState::kRegistered, "set_manifest"));
  return layout_.SetManifest(bytes);
}

absl::Status Session::SetNamedLayout(const std::string& model, const std::string& layout) {
  WSYNC_RETURN_IF_ERROR(RequireState(SessionState::kRegistered, "set_named_layout"));
  return layout_.SetNamedLayout(model, layout);
}

absl::Status Session::SetParameterWave(const std::string& name, int32_t wave) {
  WSYNC_RETURN_IF_ERROR(RequireState(SessionState::kRegistered, "set_parameter_wave"));
  return layout_.SetParameterWave(name, wave);
}

absl::Status Session::SetUpdateCallbacks(BeforeUpdate before, AfterUpdate after) {
  WSYNC_RETURN_IF_ERROR(RequireState(SessionState::kRegistered, "set_update_callbacks"));
  if (config_.role != Role::kRollout) {
    return absl::InvalidArgumentError("update callbacks are for rollout processes");
  }
  before_update_ = std::move(before);
  after_update_ = std::move(after);
  trainer_triggered_ = true;
  return absl::OkStatus();
}

absl::Status Session::SetWaveCallback(AfterWave after_wave) {
  WSYNC_RETURN_IF_ERROR(RequireState(SessionState::kRegistered, "set_wave_callback"));
  after_wave_ = std::move(after_wave);
  return absl::OkStatus();
}

absl::Status Session::RebindBuffer(uint64_t id, void* address) {
  {
    absl::MutexLock lock(&mu_);
    if (state_ != SessionState::kIdle && state_ != SessionState::kDirty) {
      return WithErrorKind(absl::FailedPreconditionError(
                               absl::StrCat("rebind_buffer is not allowed in state ",
                                            SessionStateName(state_), " (needs IDLE or DIRTY)")),
                           kErrorWrongState);
    }
  }
  if (trainer_triggered_) {
    return WithErrorKind(
        absl::FailedPreconditionError("rebind_buffer needs a host-driven session: a "
                                      "trainer-triggered one starts its syncs on its own thread"),
        kErrorWrongState);
  }
  WSYNC_RETURN_IF_ERROR(connected_->RebindBuffer(id, address));
  return layout_.RebindAddress(id, address);
}

}  // namespace wsync
