// ControlClient's check of the rosters the coordinator sends (client.h). Called by the I/O thread.

#include "absl/strings/str_cat.h"
#include "control/client.h"

namespace wsync {

absl::StatusOr<Roster> ControlClient::ReadRoster(control::Roster& wire) const {
  const int32_t world = size();
  bool consistent = wire.num_trainers() == num_trainers_ && wire.num_rollouts() == num_rollouts_ &&
                    wire.processes_size() == world;
  for (int32_t id = 0; consistent && id < world; ++id) {
    const control::RosterEntry& e = wire.processes(id);
    const std::optional<ControlRole> role = RoleFromProto(e.role());
    consistent = e.process() == id && role.has_value() && e.rank() >= 0 &&
                 GlobalProcessId(*role, e.rank(), num_trainers_) == id &&
                 CheckIdentifier("node id", e.node_id()).ok() && e.manifest() >= 0 &&
                 e.manifest() < wire.blobs_size() && e.metadata() >= 0 &&
                 e.metadata() < wire.blobs_size() &&
                 (id != process_ || e.node_id() == options_.node_id);
  }
  if (!consistent) {
    return absl::InternalError("protocol error: the coordinator sent an inconsistent roster");
  }
  Roster roster;
  roster.num_trainers = num_trainers_;
  roster.num_rollouts = num_rollouts_;
  roster.processes.reserve(world);
  for (control::RosterEntry& e : *wire.mutable_processes()) {
    roster.processes.push_back(RosterEntry{e.process(), *RoleFromProto(e.role()), e.rank(),
                                           std::move(*e.mutable_node_id()), e.manifest(),
                                           e.metadata(), std::move(*e.mutable_address())});
  }
  roster.blobs.reserve(wire.blobs_size());
  for (std::string& blob : *wire.mutable_blobs()) roster.blobs.push_back(std::move(blob));
  roster.epoch = wire.epoch();
  return roster;
}

}  // namespace wsync
