#include "transport/nccl/nccl_transport.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/status.h"

namespace wsync {
namespace {

constexpr uint64_t kSenderMask = 0xffffu;

uint64_t TagSync(MessageTag tag) { return tag.value >> 40; }
uint64_t TagRound(MessageTag tag) { return (tag.value >> 16) & 0xffffffu; }

}  // namespace

absl::StatusOr<NcclUniqueId> NcclTransport::NewUniqueId(NcclApi& api) { return api.GetUniqueId(); }

NcclTransport::NcclTransport(NcclOptions options, std::unique_ptr<NcclApi> api)
    : options_(std::move(options)), api_(std::move(api)) {}

absl::StatusOr<std::unique_ptr<NcclTransport>> NcclTransport::Create(NcclOptions options,
                                                                     std::unique_ptr<NcclApi> api) {
  if (api == nullptr) return absl::InvalidArgumentError("the NCCL transport needs an NcclApi");
  const auto self = std::find(options.members.begin(), options.members.end(), options.process);
  if (self == options.members.end() ||
      std::count(options.members.begin(), options.members.end(), options.process) != 1) {
    return absl::InvalidArgumentError(absl::StrCat("process ", options.process,
                                                   " must be a member of its NCCL communicator "
                                                   "exactly once (members: ",
                                                   absl::StrJoin(options.members, ","), ")"));
  }
  const int rank = static_cast<int>(self - options.members.begin());
  const int nranks = static_cast<int>(options.members.size());
  auto transport =
      std::unique_ptr<NcclTransport>(new NcclTransport(std::move(options), std::move(api)));
  NcclTransport& t = *transport;
  absl::MutexLock lock(&t.mu_);
  WSYNC_RETURN_IF_ERROR(t.api_->SetDevice(t.options_.device));
  WSYNC_ASSIGN_OR_RETURN(t.stream_, t.api_->StreamCreate());
  WSYNC_ASSIGN_OR_RETURN(t.comm_, t.api_->CommInitRank(nranks, t.options_.unique_id, rank));
  absl::Duration pause = absl::Microseconds(10);
  while (true) {
    absl::StatusOr<bool> ready = t.api_->CommAsyncError(t.comm_);
    if (!ready.ok()) {
      const absl::Status error(ready.status().code(),
                               absl::StrCat("NCCL communicator of ", nranks, " processes (rank ",
                                            rank, ") failed to form: ", ready.status().message()));
      t.AbortLocked(error);
      return error;
    }
    if (*ready) break;
    if (absl::Now() >= t.options_.connect_deadline) {
      const absl::Status error = absl::DeadlineExceededError(absl::StrCat(
          "NCCL communicator of ", nranks, " processes (rank ", rank,
          ") did not form by the deadline; members not yet joined are among processes ",
          absl::StrJoin(t.options_.members, ",")));
      t.AbortLocked(error);
      return error;
    }
    t.mu_.Unlock();
    absl::SleepFor(pause);
    t.mu_.Lock();
    pause = std::min(pause * 2, t.options_.max_poll_pause);
  }
  return transport;
}

NcclTransport::~NcclTransport() {
  absl::MutexLock lock(&mu_);
  bool busy = !recorded_.empty();
  for (const auto& [id, group] : groups_) busy |= group.stage != Stage::kDone;
  if (comm_ != nullptr) {
    if (busy) {
      // Operations still in flight: only an abort stops them.
      api_->CommAbort(comm_).IgnoreError();
    } else {
      for (const auto& [id, handle] : registrations_) {
        api_->CommDeregister(comm_, handle).IgnoreError();
      }
      api_->CommDestroy(comm_).IgnoreError();
    }
    comm_ = nullptr;
  }
  for (const auto& [id, group] : groups_) {
    if (group.event != nullptr) api_->EventDestroy(group.event).IgnoreError();
  }
  if (stream_ != nullptr) api_->StreamDestroy(stream_).IgnoreError();
}

int NcclTransport::RankOf(int32_t peer) const {
  const auto it = std::find(options_.members.begin(), options_.members.end(), peer);
  return it == options_.members.end() ? -1 : static_cast<int>(it - options_.members.begin());
}

int64_t NcclTransport::groups_issued() const {
  absl::MutexLock lock(&mu_);
  return next_group_;
}

absl::StatusOr<RegistrationId> NcclTransport::RegisterMemory(void* address, int64_t bytes,
                                                             MemoryKind kind) {
  if (kind != MemoryKind::kCuda) {
    return absl::UnimplementedError(absl::StrCat(
        "the NCCL transport carries CUDA memory only, not ", MemoryKindName(kind), " memory"));
  }
  if (bytes < 0) return absl::InvalidArgumentError("negative registration size");
  absl::MutexLock lock(&mu_);
  WSYNC_RETURN_IF_ERROR(failure_);
  void* handle = nullptr;
  if (bytes > 0) {
    // Registration only helps NCCL (zero-copy network p2p); unregistered memory works too, so a
    // refusal (e.g. memory NCCL cannot register) leaves the range unregistered.
    absl::StatusOr<void*> registered =
        api_->CommRegister(comm_, address, static_cast<size_t>(bytes));
    if (registered.ok()) handle = *registered;
  }
  const RegistrationId id = next_registration_++;
  registrations_[id] = handle;
  return id;
}

absl::Status NcclTransport::DeregisterMemory(RegistrationId id) {
  absl::MutexLock lock(&mu_);
  auto it = registrations_.find(id);
  if (it == registrations_.end()) return absl::NotFoundError(absl::StrCat("no registration ", id));
  void* handle = it->second;
  registrations_.erase(it);
  if (handle == nullptr || comm_ == nullptr) return absl::OkStatus();  // Aborted: freed with it.
  return api_->CommDeregister(comm_, handle);
}

absl::StatusOr<RequestId> NcclTransport::PostSend(int32_t peer, MessageTag tag, const void* data,
                                                  int64_t bytes) {
  return Post(Direction::kSend, peer, tag, const_cast<void*>(data), bytes);
}

absl::StatusOr<RequestId> NcclTransport::PostReceive(int32_t peer, MessageTag tag, void* data,
                                                     int64_t bytes) {
  return Post(Direction::kReceive, peer, tag, data, bytes);
}

absl::StatusOr<RequestId> NcclTransport::Post(Direction direction, int32_t peer, MessageTag tag,
                                              void* data, int64_t bytes) {
  const char* what = direction == Direction::kSend ? "send to" : "receive from";
  if (RankOf(peer) < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("NCCL ", what, " process ", peer, ": not a member of the communicator"));
  }
  if (bytes < 0) return absl::InvalidArgumentError(absl::StrCat("negative size ", bytes));
  const int32_t sender = direction == Direction::kSend ? options_.process : peer;
  const uint64_t sender_bits = tag.value & kSenderMask;
  if (sender_bits != 0 && sender_bits != (static_cast<uint64_t>(sender) & kSenderMask)) {
    return absl::InvalidArgumentError(absl::StrCat("NCCL ", what, " process ", peer, ": tag ",
                                                   tag.value, " names sender ", sender_bits,
                                                   ", not process ", sender));
  }
  absl::MutexLock lock(&mu_);
  WSYNC_RETURN_IF_ERROR(failure_);
  LastTag& last = last_tag_[{peer, direction}];
  if (last.any && last.sync == TagSync(tag) && TagRound(tag) < last.round) {
    return absl::InvalidArgumentError(absl::StrCat(
        "NCCL ", what, " process ", peer, ": round ", TagRound(tag), " (tag ", tag.value,
        ") posted after round ", last.round, " of sync ", last.sync,
        "; NCCL matches messages by order, so each pair must post its rounds in the executor's "
        "canonical order"));
  }
  if (bytes > 0) {
    WSYNC_ASSIGN_OR_RETURN(MemoryKind kind, api_->PointerKind(data));
    if (kind != MemoryKind::kCuda) {
      return absl::UnimplementedError(absl::StrCat("NCCL ", what, " process ", peer,
                                                   ": the NCCL transport carries CUDA memory "
                                                   "only, and this pointer is host memory"));
    }
  }
  last = LastTag{true, TagSync(tag), TagRound(tag)};
  const RequestId id = next_request_++;
  Request request{direction, peer};
  if (bytes == 0) {
    request.done = true;
  } else {
    recorded_.push_back(Operation{id, direction, peer, data, bytes, tag.value >> 16});
  }
  requests_.emplace(id, request);
  return id;
}

absl::Status NcclTransport::Flush() {
  absl::MutexLock lock(&mu_);
  return FlushLocked({});
}

absl::Status NcclTransport::FlushLocked(absl::Span<const RequestId> needed) {
  WSYNC_RETURN_IF_ERROR(failure_);
  if (recorded_.empty()) return absl::OkStatus();
  // Rounds in the order of their first post; `last` is the last one to issue.
  std::vector<uint64_t> rounds;
  for (const Operation& op : recorded_) {
    if (std::find(rounds.begin(), rounds.end(), op.round_key) == rounds.end()) {
      rounds.push_back(op.round_key);
    }
  }
  size_t last = needed.empty() ? rounds.size() : 0;
  for (const Operation& op : recorded_) {
    if (std::find(needed.begin(), needed.end(), op.request) != needed.end()) {
      const size_t position =
          std::find(rounds.begin(), rounds.end(), op.round_key) - rounds.begin() + 1;
      last = std::max(last, position);
    }
  }
  for (size_t i = 0; i < last; ++i) {
    // A non-blocking communicator takes no new operations while one is still being enqueued
    // (ncclInProgress): the remaining rounds stay recorded and a later Test or WaitAll issues them.
    if (EnqueuingLocked()) {
      WSYNC_RETURN_IF_ERROR(ProgressLocked());
      if (EnqueuingLocked()) return absl::OkStatus();
    }
    std::vector<Operation> group;
    std::vector<Operation> rest;
    for (Operation& op : recorded_) {
      (op.round_key == rounds[i] ? group : rest).push_back(op);
    }
    recorded_ = std::move(rest);
    WSYNC_RETURN_IF_ERROR(IssueGroupLocked(std::move(group)));
  }
  return absl::OkStatus();
}

bool NcclTransport::EnqueuingLocked() const {
  for (const auto& [id, group] : groups_) {
    if (group.stage == Stage::kEnqueuing) return true;
  }
  return false;
}

absl::Status NcclTransport::IssueGroupLocked(std::vector<Operation> operations) {
  const int64_t group_id = next_group_++;
  GroupState& group = groups_[group_id];
  for (const Operation& op : operations) requests_[op.request].group = group_id;
  group.outstanding = static_cast<int64_t>(operations.size());
  absl::Status status = api_->SetDevice(options_.device);
  if (status.ok()) {
    absl::StatusOr<CudaEvent> event = api_->EventCreate();
    if (event.ok()) {
      group.event = *event;
    } else {
      status = event.status();
    }
  }
  absl::StatusOr<bool> enqueued = false;
  if (status.ok()) status = api_->GroupStart();
  if (status.ok()) {
    for (const Operation& op : operations) {
      const int rank = RankOf(op.peer);
      status = op.direction == Direction::kSend
                   ? api_->Send(op.data, static_cast<size_t>(op.bytes), rank, comm_, stream_)
                   : api_->Recv(op.data, static_cast<size_t>(op.bytes), rank, comm_, stream_);
      if (!status.ok()) break;
    }
    enqueued = api_->GroupEnd();  // Always closes the group, even after a failed operation.
    if (status.ok()) status = enqueued.status();
  }
  if (status.ok() && *enqueued) {
    status = api_->EventRecord(group.event, stream_);
    if (status.ok()) group.stage = Stage::kRecorded;
  }
  if (!status.ok()) {
    std::vector<RequestId> ids;
    for (const Operation& op : operations) ids.push_back(op.request);
    AbortLocked(
        absl::Status(status.code(), absl::StrCat("issuing an NCCL group with ", DescribeLocked(ids),
                                                 " failed: ", status.message())));
    return failure_;
  }
  return absl::OkStatus();
}

absl::Status NcclTransport::ProgressLocked() {
  WSYNC_RETURN_IF_ERROR(failure_);
  bool any_busy = false;
  for (const auto& [id, group] : groups_) any_busy |= group.stage != Stage::kDone;
  if (!any_busy) return absl::OkStatus();
  absl::Status status;
  absl::StatusOr<bool> idle = api_->CommAsyncError(comm_);
  if (!idle.ok()) status = idle.status();
  for (auto& [id, group] : groups_) {
    if (!status.ok()) break;
    if (group.stage == Stage::kEnqueuing && *idle) {
      status = api_->EventRecord(group.event, stream_);
      if (status.ok()) group.stage = Stage::kRecorded;
    }
    if (status.ok() && group.stage == Stage::kRecorded) {
      absl::StatusOr<bool> done = api_->EventQuery(group.event);
      if (!done.ok()) {
        status = done.status();
      } else if (*done) {
        group.stage = Stage::kDone;
      }
    }
  }
  if (status.ok()) return status;
  std::vector<RequestId> outstanding;
  for (const auto& [id, request] : requests_) {
    if (request.group >= 0 && groups_[request.group].stage != Stage::kDone) {
      outstanding.push_back(id);
    }
  }
  AbortLocked(absl::Status(
      status.code(),
      absl::StrCat("NCCL communicator of process ", options_.process,
                   " failed with requests outstanding with ", DescribeLocked(outstanding), ": ",
                   status.message(), "; the communicator was aborted")));
  return failure_;
}

absl::StatusOr<bool> NcclTransport::DoneLocked(RequestId request) {
  auto it = requests_.find(request);
  if (it == requests_.end()) return absl::NotFoundError(absl::StrCat("no request ", request));
  if (it->second.done) return true;
  WSYNC_RETURN_IF_ERROR(failure_);
  if (it->second.group < 0) return false;
  return groups_[it->second.group].stage == Stage::kDone;
}

void NcclTransport::ReleaseLocked(RequestId request) {
  auto it = requests_.find(request);
  if (it == requests_.end()) return;
  const int64_t group_id = it->second.group;
  requests_.erase(it);
  if (group_id < 0) {
    // Recorded but never issued (only after a failure): forget the operation.
    recorded_.erase(std::remove_if(recorded_.begin(), recorded_.end(),
                                   [&](const Operation& op) { return op.request == request; }),
                    recorded_.end());
    return;
  }
  auto group = groups_.find(group_id);
  if (group == groups_.end()) return;
  if (--group->second.outstanding > 0) return;
  // Once aborted, the communicator's work is stopped; the event may be destroyed either way.
  if (group->second.stage == Stage::kDone || !failure_.ok()) {
    if (group->second.event != nullptr) api_->EventDestroy(group->second.event).IgnoreError();
    groups_.erase(group);
  }
}

std::string NcclTransport::DescribeLocked(absl::Span<const RequestId> requests) const {
  std::vector<std::string> parts;
  for (RequestId id : requests) {
    auto it = requests_.find(id);
    if (it == requests_.end()) continue;
    std::string part =
        absl::StrCat("process ", it->second.peer,
                     it->second.direction == Direction::kSend ? " (send)" : " (receive)");
    if (std::find(parts.begin(), parts.end(), part) == parts.end()) parts.push_back(part);
  }
  if (parts.empty()) return "no peer";
  return absl::StrJoin(parts, ", ");
}

absl::StatusOr<bool> NcclTransport::Test(RequestId request) {
  absl::MutexLock lock(&mu_);
  auto it = requests_.find(request);
  if (it == requests_.end()) return absl::NotFoundError(absl::StrCat("no request ", request));
  absl::Status status;
  if (!it->second.done && it->second.group < 0) status = FlushLocked({request});
  if (status.ok()) status = ProgressLocked();
  absl::StatusOr<bool> done = status.ok() ? DoneLocked(request) : absl::StatusOr<bool>(status);
  if (!done.ok() || *done) ReleaseLocked(request);
  return done;
}

absl::Status NcclTransport::WaitAll(absl::Span<const RequestId> requests, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  absl::Status status;
  std::vector<RequestId> pending;
  bool unissued = false;
  for (RequestId id : requests) {
    auto it = requests_.find(id);
    if (it == requests_.end()) {
      status.Update(absl::NotFoundError(absl::StrCat("no request ", id)));
      continue;
    }
    pending.push_back(id);
    unissued |= !it->second.done && it->second.group < 0;
  }
  absl::Status wait;
  absl::Duration pause = absl::ZeroDuration();
  while (wait.ok()) {
    if (unissued) {
      // Issues the rounds of `pending` (possibly over several calls: see FlushLocked).
      wait = FlushLocked(pending);
      if (!wait.ok()) break;
      unissued = false;
      for (RequestId id : pending) {
        const Request& request = requests_.at(id);
        unissued |= !request.done && request.group < 0;
      }
    }
    wait = ProgressLocked();
    if (!wait.ok()) break;
    std::vector<RequestId> left;
    for (RequestId id : pending) {
      absl::StatusOr<bool> done = DoneLocked(id);
      if (!done.ok()) {
        wait = done.status();
        break;
      }
      if (*done) {
        ReleaseLocked(id);
      } else {
        left.push_back(id);
      }
    }
    pending = std::move(left);
    if (!wait.ok() || pending.empty()) break;
    if (absl::Now() >= deadline) {
      wait = absl::DeadlineExceededError(
          absl::StrCat("NCCL requests with ", DescribeLocked(pending),
                       " missed the deadline; the communicator was aborted"));
      AbortLocked(wait);
      break;
    }
    pause = std::min(pause + absl::Microseconds(10), options_.max_poll_pause);
    mu_.Unlock();
    absl::SleepFor(pause);
    mu_.Lock();
  }
  for (RequestId id : pending) ReleaseLocked(id);
  status.Update(wait);
  return status;
}

void NcclTransport::Abort(const absl::Status& reason) {
  absl::MutexLock lock(&mu_);
  AbortLocked(absl::AbortedError(absl::StrCat("NCCL transport aborted: ", reason.message())));
}

void NcclTransport::AbortLocked(const absl::Status& reason) {
  if (!failure_.ok()) return;
  failure_ = reason.ok() ? absl::AbortedError("NCCL transport aborted") : reason;
  recorded_.clear();
  if (comm_ != nullptr) {
    // ncclCommAbort stops the communicator's kernels and frees it; registrations go with it.
    api_->CommAbort(comm_).IgnoreError();
    comm_ = nullptr;
  }
}

}  // namespace wsync
