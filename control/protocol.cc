#include "control/protocol.h"

#include "absl/strings/str_cat.h"

namespace wsync {

absl::string_view ControlRoleName(ControlRole role) {
  switch (role) {
    case ControlRole::kTrainer:
      return "trainer";
    case ControlRole::kRollout:
      return "rollout";
  }
  return "invalid";
}

control::Role RoleToProto(ControlRole role) {
  return role == ControlRole::kTrainer ? control::ROLE_TRAINER : control::ROLE_ROLLOUT;
}

std::optional<ControlRole> RoleFromProto(int value) {
  if (value == control::ROLE_TRAINER) return ControlRole::kTrainer;
  if (value == control::ROLE_ROLLOUT) return ControlRole::kRollout;
  return std::nullopt;
}

absl::Status CheckIdentifier(absl::string_view what, absl::string_view value) {
  if (value.empty() || static_cast<int64_t>(value.size()) > kMaxIdBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " must have 1 to ", kMaxIdBytes, " bytes"));
  }
  for (char c : value) {
    if (c < 0x21 || c > 0x7e) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " must be printable ASCII without spaces"));
    }
  }
  return absl::OkStatus();
}

std::string DescribeProcess(int32_t process, ControlRole role, int32_t rank,
                            absl::string_view node_id) {
  return absl::StrCat("process ", process, " (", ControlRoleName(role), " rank ", rank,
                      node_id.empty() ? "" : ", node ", node_id, ")");
}

absl::string_view CollectiveName(int kind) {
  switch (kind) {
    case control::COLLECTIVE_ALL_GATHER:
      return "AllGather";
    case control::COLLECTIVE_BROADCAST:
      return "Broadcast";
    case control::COLLECTIVE_BARRIER:
      return "Barrier";
    case control::COLLECTIVE_DECIDE:
      return "Decide";
  }
  return "unknown collective";
}

absl::Status StatusFromWire(int32_t code, absl::string_view message) {
  if (code == 0) return absl::OkStatus();
  absl::StatusCode status_code = absl::StatusCode::kUnknown;
  if (code > 0 && code <= static_cast<int32_t>(absl::StatusCode::kUnauthenticated)) {
    status_code = static_cast<absl::StatusCode>(code);
  }
  return absl::Status(status_code, message);
}

std::string TruncateText(absl::string_view text, int64_t max_bytes) {
  if (static_cast<int64_t>(text.size()) <= max_bytes) return std::string(text);
  if (max_bytes < 3) return std::string(text.substr(0, max_bytes));
  return absl::StrCat(text.substr(0, max_bytes - 3), "...");
}

}  // namespace wsync
