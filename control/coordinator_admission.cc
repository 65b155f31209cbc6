// The coordinator's admission (part of the protocol core, coordinator_core.h): the Hello's checks
// and MAC, the Welcome and the sealing it starts, Joins, the roster, replacements of lost
// processes, and the rendezvous' failure.

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "control/auth.h"
#include "control/coordinator_core.h"

namespace wsync {
namespace {

// Who a Hello says it is, before its MAC is checked: "rollout rank 1" (", node n" when the node
// id is well formed); empty when the role is not one.
std::string ClaimOf(const control::Hello& hello) {
  const std::optional<ControlRole> role = RoleFromProto(hello.role());
  if (!role.has_value()) return "";
  return absl::StrCat(ControlRoleName(*role), " rank ", hello.rank(),
                      CheckIdentifier("node id", hello.node_id()).ok()
                          ? absl::StrCat(", node ", hello.node_id())
                          : "");
}

}  // namespace

void CoordinatorCore::HandleHello(Connection& c, const control::Hello& hello, absl::Time now) {
  auto refuse = [&](RefusalReason reason, absl::Status status) { Refuse(c, reason, status, now); };
  c.claim = ClaimOf(hello);
  if (hello.protocol_version() != kControlProtocolVersion) {
    return refuse(
        RefusalReason::kProtocolVersion,
        absl::FailedPreconditionError(absl::StrCat(
            "control: protocol version ", hello.protocol_version(),
            " is not supported; the coordinator speaks version ", kControlProtocolVersion)));
  }
  const std::optional<ControlRole> role = RoleFromProto(hello.role());
  if (!role.has_value()) {
    return refuse(RefusalReason::kBadField, absl::InvalidArgumentError("control: bad role"));
  }
  absl::Status ids = CheckIdentifier("job id", hello.job_id());
  if (ids.ok()) ids = CheckIdentifier("node id", hello.node_id());
  if (!ids.ok()) {
    return refuse(RefusalReason::kBadField,
                  absl::InvalidArgumentError(absl::StrCat("control: ", ids.message())));
  }
  if (hello.client_nonce().size() != kNonceBytes || hello.mac().size() != kMacBytes) {
    return refuse(RefusalReason::kBadField,
                  absl::InvalidArgumentError("control: bad nonce or MAC length"));
  }
  const std::string expected = HelloMac(options_.secret, c.nonce, hello.client_nonce(),
                                        hello.job_id(), *role, hello.rank(), hello.node_id());
  if (!ConstantTimeEquals(expected, hello.mac())) {
    return refuse(RefusalReason::kAuthenticationFailed,
                  absl::UnauthenticatedError("control: authentication failed"));
  }
  // Authenticated from here on: the peer holds the secret, so details help the operator.
  if (hello.job_id() != options_.job_id) {
    return refuse(
        RefusalReason::kUnknownJob,
        absl::InvalidArgumentError(absl::StrCat("control: unknown job id '", hello.job_id(), "'")));
  }
  const int32_t count =
      *role == ControlRole::kTrainer ? options_.num_trainers : options_.num_rollouts;
  if (hello.rank() < 0 || hello.rank() >= count) {
    return refuse(RefusalReason::kRankOutOfRange,
                  absl::OutOfRangeError(absl::StrCat("control: ", ControlRoleName(*role), " rank ",
                                                     hello.rank(), " is out of range: the job has ",
                                                     count, " ", ControlRoleName(*role), "s")));
  }
  const int32_t id = GlobalProcessId(*role, hello.rank(), options_.num_trainers);
  if (processes_[id].connection != nullptr) {
    return refuse(RefusalReason::kDuplicateRank,
                  absl::AlreadyExistsError(
                      absl::StrCat("control: ", ControlRoleName(*role), " rank ", hello.rank(),
                                   " has already joined (", Describe(id), ")")));
  }
  if (rendezvous_failed_ || (rendezvous_done_ && !processes_[id].lost)) {
    return refuse(RefusalReason::kRendezvousClosed,
                  absl::FailedPreconditionError(absl::StrCat(
                      "control: the job's rendezvous ", rendezvous_failed_ ? "failed" : "is over",
                      "; ", Describe(id), " cannot join")));
  }
  // After the rendezvous a lost process's rank may be taken by a replacement (AdmitReplacement).
  Welcome(c, hello, id, now);
}

void CoordinatorCore::Welcome(Connection& c, const control::Hello& hello, int32_t id,
                              absl::Time now) {
  Process& p = processes_[id];
  p.connection = &c;
  p.node_id = hello.node_id();
  c.process = id;
  c.phase = Phase::kWelcomed;
  Unpend(c);
  c.handshake_deadline = absl::InfiniteFuture();
  c.heartbeats = hello.heartbeats() && options_.heartbeat_interval > absl::ZeroDuration();
  c.rendezvous_progress = hello.rendezvous_progress();
  if (c.heartbeats) {
    c.last_heard = now;
    c.next_heartbeat = now + options_.heartbeat_interval;
  }
  {
    absl::MutexLock lock(&mu_);
    ++counters_.welcomed;
  }
  control::Frame frame;
  control::Welcome* welcome = frame.mutable_welcome();
  welcome->set_process(id);
  welcome->set_num_trainers(options_.num_trainers);
  welcome->set_num_rollouts(options_.num_rollouts);
  welcome->set_max_frame_bytes(options_.max_frame_bytes);
  if (c.heartbeats) {
    welcome->set_heartbeat_interval_ms(absl::ToInt64Milliseconds(options_.heartbeat_interval));
    welcome->set_silence_limit_ms(absl::ToInt64Milliseconds(options_.silence_limit));
  }
  welcome->set_mac(WelcomeMac(options_.secret, hello.client_nonce(), c.nonce, options_.job_id,
                              WelcomeFieldsOf(*welcome)));
  Send(c, frame);  // The last unsealed frame: every later one in either direction is sealed.
  if (!c.open) return;
  CoordinatorAction seal;
  seal.kind = CoordinatorAction::Kind::kSeal;
  seal.connection = c.id;
  seal.nonce = c.nonce;
  seal.client_nonce = hello.client_nonce();
  seal.process = id;
  seal.peer = Describe(id);
  actions_.push_back(std::move(seal));
}

void CoordinatorCore::HandleJoin(Connection& c, control::Join& join, absl::Time now) {
  Process& p = processes_[c.process];
  p.manifest = std::move(*join.mutable_manifest());
  p.address = std::move(*join.mutable_address());
  p.metadata = std::move(*join.mutable_metadata());
  p.joined = true;
  p.left = false;
  c.phase = Phase::kJoined;
  ++joined_count_;
  progress_changed_ = true;
  WSYNC_LOG(kControl, kInfo, "coordinator: ", Describe(c.process), " joined (", joined_count_,
            " of ", world_, ")");
  {
    absl::MutexLock lock(&mu_);
    ++counters_.joined;
  }
  if (joined_count_ == world_) CompleteRendezvous(now);
}

void CoordinatorCore::CompleteRendezvous(absl::Time now) {
  control::Frame frame;
  control::Roster* roster = frame.mutable_roster();
  roster->set_num_trainers(options_.num_trainers);
  roster->set_num_rollouts(options_.num_rollouts);
  absl::flat_hash_map<absl::string_view, int32_t> blob_index;
  auto blob = [&](const std::string& bytes) {
    auto [it, inserted] = blob_index.try_emplace(bytes, roster->blobs_size());
    if (inserted) roster->add_blobs(bytes);
    return it->second;
  };
  for (int32_t id = 0; id < world_; ++id) {
    const Process& p = processes_[id];
    control::RosterEntry* entry = roster->add_processes();
    entry->set_process(id);
    entry->set_role(RoleToProto(p.role));
    entry->set_rank(p.rank);
    entry->set_node_id(p.node_id);
    entry->set_manifest(blob(p.manifest));
    entry->set_metadata(blob(p.metadata));
    entry->set_address(p.address);
  }
  auto encoded = PrepareFrame(frame, options_.max_frame_bytes);
  if (!encoded.ok()) {
    FailRendezvous(absl::ResourceExhaustedError(
                       absl::StrCat("control: rendezvous failed: the roster (",
                                    frame.ByteSizeLong(), " bytes) exceeds the frame cap of ",
                                    options_.max_frame_bytes, " bytes; raise max_frame_bytes")),
                   now);
    return;
  }
  rendezvous_done_ = true;
  roster_ = *roster;
  WSYNC_LOG(kControl, kInfo, "coordinator: rendezvous complete: the roster of ", world_,
            " processes sent to every process");
  {
    absl::MutexLock lock(&mu_);
    rendezvous_status_ = absl::OkStatus();
  }
  auto shared = *std::move(encoded);
  for (Process& p : processes_) {
    Enqueue(*p.connection, shared);
    std::string().swap(p.manifest);  // The roster holds them now.
    std::string().swap(p.address);
    std::string().swap(p.metadata);
  }
}

void CoordinatorCore::AdmitReplacement(Connection& c, control::Join& join, absl::Time now) {
  const int32_t id = c.process;
  Process& p = processes_[id];
  control::RosterEntry& entry = *roster_.mutable_processes(id);
  if (join.manifest() != roster_.blobs(entry.manifest())) {
    return Refuse(c, RefusalReason::kBadField,
                  absl::InvalidArgumentError(absl::StrCat(
                      "control: ", Describe(id),
                      " cannot replace the lost process: its layout part differs from the one "
                      "the job was planned with")),
                  now);
  }
  // The job's next round: live processes never wait in a round while a process is lost (every
  // such round fails at once), so every existing round is below it and failed; the replacement
  // counts as having contributed to them, so that they can be released.
  uint64_t next = 0;
  for (int32_t q = 0; q < world_; ++q) {
    if (q != id && !processes_[q].lost) next = std::max(next, processes_[q].next_number);
  }
  std::vector<uint64_t> done;
  for (auto& [number, r] : rounds_) {
    if (r.contributed[id]) continue;
    r.contributed[id] = 1;
    r.answered[id] = 1;
    if (++r.count == world_) done.push_back(number);
  }
  for (uint64_t number : done) rounds_.erase(number);
  p.next_number = next;
  p.lost = false;
  p.lost_reason.clear();
  p.joined = true;
  c.phase = Phase::kJoined;
  entry.set_node_id(p.node_id);
  entry.set_address(std::move(*join.mutable_address()));
  roster_.set_epoch(roster_.epoch() + 1);
  roster_.set_next_collective(next);
  {
    absl::MutexLock lock(&mu_);
    ++counters_.joined;
    ++counters_.replaced;
  }
  control::Frame frame;
  *frame.mutable_roster() = roster_;
  auto encoded = PrepareFrame(frame, options_.max_frame_bytes);
  if (!encoded.ok()) return Drop(c, encoded.status().message());
  auto shared = *std::move(encoded);
  for (const Process& q : processes_) {
    if (q.connection != nullptr && q.connection->open) Enqueue(*q.connection, shared);
  }
}

void CoordinatorCore::FailRendezvous(const absl::Status& status, absl::Time now) {
  rendezvous_failed_ = true;
  WSYNC_LOG(kFault, kError, "coordinator: ", status.ToString());
  {
    absl::MutexLock lock(&mu_);
    rendezvous_status_ = status;
  }
  for (auto& [id, c] : connections_) {
    if (!c.open) continue;
    SendReject(c, status);
    CloseAfterWrites(c, now, std::nullopt, "rendezvous failed");
  }
}

}  // namespace wsync
