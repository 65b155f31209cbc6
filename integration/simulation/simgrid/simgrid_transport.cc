#include "integration/simulation/simgrid/simgrid_transport.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <mutex>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "simgrid/Exception.hpp"
#include "simgrid/s4u.hpp"

namespace wsync::simgrid_backend {
namespace sg4 = simgrid::s4u;

namespace {

constexpr double kInfinity = std::numeric_limits<double>::infinity();

// The mailbox of messages to `to` with `tag` (the tag's low bits name the sender, MakeTag).
sg4::Mailbox* MailboxOf(int32_t to, MessageTag tag) {
  return sg4::Mailbox::by_name(absl::StrCat("wsync:", to, ":", tag.value));
}

absl::Status FromException(const std::exception& error, absl::string_view what) {
  return absl::UnavailableError(absl::StrCat(what, ": SimGrid: ", error.what()));
}

}  // namespace

absl::Time SimulatedNow() { return absl::UnixEpoch() + absl::Seconds(sg4::Engine::get_clock()); }

double SimulatedSeconds(absl::Time time) {
  if (time == absl::InfiniteFuture()) return kInfinity;
  return absl::ToDoubleSeconds(time - absl::UnixEpoch());
}

// What travels as a message's payload: who sent it and how many bytes it claims.
struct SimFabric::Envelope {
  int32_t from = 0;
  int64_t bytes = 0;
};

// The numbered AllGather rounds of the group.
struct SimFabric::GroupState {
  struct Round {
    std::vector<std::string> payloads;
    std::vector<bool> contributed;
    int32_t count = 0;
  };
  sg4::MutexPtr mutex = sg4::Mutex::create();
  sg4::ConditionVariablePtr changed = sg4::ConditionVariable::create();
  std::map<int64_t, Round> rounds;
};

SimFabric::SimFabric(int32_t processes, bool record_messages)
    : processes_(processes),
      record_messages_(record_messages),
      sent_bytes_(processes, 0),
      received_bytes_(processes, 0),
      // Before the engine runs: SimGrid 3.32 crashes on the first lock of a mutex that an actor
      // created inside a heap object (seen with std::make_unique in an actor).
      group_(std::make_unique<GroupState>()) {}

SimFabric::~SimFabric() = default;

SimFabric::Envelope* SimFabric::NewEnvelope(int32_t from, int64_t bytes) {
  envelopes_.push_back(Envelope{from, bytes});
  return &envelopes_.back();
}

void SimFabric::Deliver(int32_t from, int32_t to, int64_t bytes) {
  sent_bytes_[from] += bytes;
  received_bytes_[to] += bytes;
  ++messages_;
  if (record_messages_) delivered_.push_back({from, to, bytes});
}

struct SimGridTransport::Request {
  sg4::CommPtr comm;
  int32_t peer = 0;
  bool send = false;
  int64_t bytes = 0;
  SimFabric::Envelope* received = nullptr;  // Set by a receive's communication.
};

SimGridTransport::SimGridTransport(SimFabric& fabric, int32_t process, bool needs_round_order)
    : fabric_(fabric), process_(process), needs_round_order_(needs_round_order) {}

// Outstanding communications are left to the engine: cancelling here could block an actor that
// is being killed.
SimGridTransport::~SimGridTransport() = default;

absl::StatusOr<RegistrationId> SimGridTransport::RegisterMemory(void* address, int64_t bytes,
                                                                MemoryKind kind) {
  return next_registration_++;
}

absl::Status SimGridTransport::DeregisterMemory(RegistrationId id) { return absl::OkStatus(); }

absl::StatusOr<RequestId> SimGridTransport::Post(int32_t peer, MessageTag tag, int64_t bytes,
                                                 bool send) {
  if (!aborted_.ok()) return aborted_;
  if (peer < 0 || peer >= fabric_.processes()) {
    return absl::InvalidArgumentError(absl::StrCat("simgrid: no process ", peer, " (job of ",
                                                   fabric_.processes(), " processes)"));
  }
  if (bytes < 0) return absl::InvalidArgumentError("simgrid: negative message size");
  auto request = std::make_unique<Request>();
  request->peer = peer;
  request->send = send;
  request->bytes = bytes;
  try {
    if (send) {
      request->comm = MailboxOf(peer, tag)->put_async(fabric_.NewEnvelope(process_, bytes),
                                                      static_cast<uint64_t>(bytes));
    } else {
      request->comm = MailboxOf(process_, tag)->get_async<SimFabric::Envelope>(&request->received);
    }
  } catch (const simgrid::Exception& error) {
    return FromException(error, absl::StrCat("process ", process_, ": post to ", peer));
  }
  const RequestId id = next_request_++;
  requests_.emplace(id, std::move(request));
  return id;
}

absl::StatusOr<RequestId> SimGridTransport::PostSend(int32_t peer, MessageTag tag, const void* data,
                                                     int64_t bytes) {
  return Post(peer, tag, bytes, /*send=*/true);
}

absl::StatusOr<RequestId> SimGridTransport::PostReceive(int32_t peer, MessageTag tag, void* data,
                                                        int64_t bytes) {
  return Post(peer, tag, bytes, /*send=*/false);
}

absl::Status SimGridTransport::Finish(RequestId id, Request& request) {
  absl::Status status;
  if (!request.send) {
    const SimFabric::Envelope* envelope = request.received;
    if (envelope == nullptr) {
      status = absl::InternalError(absl::StrCat("process ", process_, ": receive from ",
                                                request.peer, " completed without a message"));
    } else if (envelope->bytes != request.bytes) {
      status = absl::InvalidArgumentError(
          absl::StrCat("process ", process_, ": receive from ", request.peer, " expected ",
                       request.bytes, " bytes, the message has ", envelope->bytes));
    } else {
      fabric_.Deliver(envelope->from, process_, envelope->bytes);
    }
  }
  requests_.erase(id);
  return status;
}

void SimGridTransport::Cancel(RequestId id) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return;
  try {
    it->second->comm->cancel();
  } catch (const simgrid::Exception&) {
    // Already finished or failed: released all the same.
  }
  requests_.erase(it);
}

absl::StatusOr<bool> SimGridTransport::Test(RequestId id) {
  auto it = requests_.find(id);
  if (it == requests_.end()) {
    return absl::InvalidArgumentError(absl::StrCat("simgrid: unknown request ", id));
  }
  if (!aborted_.ok()) {
    Cancel(id);
    return aborted_;
  }
  Request& request = *it->second;
  try {
    if (!request.comm->test()) return false;
  } catch (const simgrid::Exception& error) {
    const absl::Status failed =
        FromException(error, absl::StrCat("process ", process_, ": message with ", request.peer));
    requests_.erase(id);
    return failed;
  }
  absl::Status finished = Finish(id, request);
  if (!finished.ok()) return finished;
  return true;
}

absl::Status SimGridTransport::WaitAny(absl::Span<const RequestId> requests, absl::Time deadline,
                                       std::vector<size_t>* finished) {
  if (requests.empty()) return absl::OkStatus();
  const double limit = SimulatedSeconds(deadline);
  for (;;) {
    absl::Status failure;
    bool any = false;
    std::vector<sg4::CommPtr> waiting;
    for (size_t i = 0; i < requests.size(); ++i) {
      absl::StatusOr<bool> done = Test(requests[i]);
      if (!done.ok() || *done) {
        finished->push_back(i);
        any = true;
        if (!done.ok() && failure.ok()) failure = done.status();
      } else {
        waiting.push_back(requests_.at(requests[i])->comm);
      }
    }
    if (any) return failure;
    const double now = sg4::Engine::get_clock();
    if (now >= limit) {
      return absl::DeadlineExceededError(absl::StrCat("process ", process_, ": none of ",
                                                      requests.size(),
                                                      " requests finished by the deadline"));
    }
    try {
      if (limit == kInfinity) {
        sg4::Comm::wait_any(waiting);  // The next pass tests what finished.
        continue;
      }
      // A timed wait_any_for leaves SimGrid 3.32's communications looking finished at its
      // timeout; a computation on this process's host that lasts until the deadline is the timer
      // instead, so that what is still in flight stays posted.
      sg4::ExecPtr timer =
          sg4::this_actor::exec_init((limit - now) * sg4::this_actor::get_host()->get_speed());
      timer->start();
      std::vector<sg4::ActivityPtr> activities(waiting.begin(), waiting.end());
      activities.push_back(timer);
      const ssize_t first = sg4::Activity::wait_any(activities);
      if (first == static_cast<ssize_t>(waiting.size())) continue;  // The deadline: next pass.
      timer->cancel();
    } catch (const simgrid::Exception&) {
      // A failed communication: the next pass's Test reports it.
    }
  }
}

absl::Status SimGridTransport::WaitAll(absl::Span<const RequestId> requests, absl::Time deadline) {
  const double limit = SimulatedSeconds(deadline);
  absl::Status failure;
  std::vector<int32_t> late_peers;
  for (RequestId id : requests) {
    auto it = requests_.find(id);
    if (it == requests_.end()) continue;
    if (!failure.ok() || !aborted_.ok()) {
      Cancel(id);
      if (failure.ok()) failure = aborted_;
      continue;
    }
    Request& request = *it->second;
    try {
      const double remaining = limit - sg4::Engine::get_clock();
      if (limit == kInfinity) {
        request.comm->wait();
      } else if (remaining > 0) {
        request.comm->wait_for(remaining);  // Not wait_until: a past limit would wait forever.
      }
      if (request.comm->get_state() != sg4::Activity::State::FINISHED && !request.comm->test()) {
        late_peers.push_back(request.peer);
        Cancel(id);
        continue;
      }
    } catch (const simgrid::TimeoutException&) {
      late_peers.push_back(request.peer);
      Cancel(id);
      continue;
    } catch (const simgrid::Exception& error) {
      failure =
          FromException(error, absl::StrCat("process ", process_, ": message with ", request.peer));
      requests_.erase(id);
      continue;
    }
    if (absl::Status done = Finish(id, request); !done.ok() && failure.ok()) failure = done;
  }
  if (failure.ok() && !late_peers.empty()) {
    std::sort(late_peers.begin(), late_peers.end());
    late_peers.erase(std::unique(late_peers.begin(), late_peers.end()), late_peers.end());
    return absl::DeadlineExceededError(
        absl::StrCat("process ", process_, ": requests with processes ",
                     absl::StrJoin(late_peers, ", "), " did not finish by the deadline"));
  }
  return failure;
}

void SimGridTransport::Abort(const absl::Status& reason) {
  if (!aborted_.ok()) return;
  aborted_ =
      absl::AbortedError(absl::StrCat("process ", process_, " aborted: ", reason.ToString()));
  std::vector<RequestId> ids;
  for (const auto& [id, request] : requests_) ids.push_back(id);
  for (RequestId id : ids) Cancel(id);
}

SimGridGroup::SimGridGroup(SimFabric& fabric, int32_t process)
    : fabric_(fabric), process_(process) {}

int32_t SimGridGroup::size() const { return fabric_.processes(); }

absl::StatusOr<std::vector<std::string>> SimGridGroup::AllGather(absl::string_view payload,
                                                                 absl::Time deadline) {
  SimFabric::GroupState& state = *fabric_.group_;
  const int32_t n = fabric_.processes();
  std::unique_lock<sg4::Mutex> lock(*state.mutex);
  SimFabric::GroupState::Round& round = state.rounds[next_round_++];
  if (round.payloads.empty()) {
    round.payloads.resize(n);
    round.contributed.assign(n, false);
  }
  round.payloads[process_] = std::string(payload);
  round.contributed[process_] = true;
  if (++round.count == n) state.changed->notify_all();
  const double limit = SimulatedSeconds(deadline);
  while (round.count < n) {
    if (limit == kInfinity) {
      state.changed->wait(lock);
    } else if (state.changed->wait_until(lock, limit) == std::cv_status::timeout &&
               round.count < n) {
      std::vector<int32_t> missing;
      for (int32_t p = 0; p < n; ++p) {
        if (!round.contributed[p]) missing.push_back(p);
      }
      return absl::DeadlineExceededError(
          absl::StrCat("process ", process_, ": AllGather without processes ",
                       absl::StrJoin(missing, ", "), " by the deadline"));
    }
  }
  return round.payloads;
}

VirtualDeviceMemory::VirtualDeviceMemory(double copy_bytes_per_second)
    : copy_bytes_per_second_(copy_bytes_per_second), next_address_(uintptr_t{1} << 62) {}

absl::StatusOr<void*> VirtualDeviceMemory::Allocate(int64_t bytes) {
  if (bytes < 0) return absl::InvalidArgumentError("virtual device: negative allocation");
  void* address = reinterpret_cast<void*>(next_address_);
  // Page-aligned, with a page between allocations.
  next_address_ += (static_cast<uintptr_t>(bytes) + 8191) / 4096 * 4096;
  allocated_bytes_ += bytes;
  return address;
}

absl::Status VirtualDeviceMemory::CopyStridedAsync(void* dst, absl::Span<const int64_t> dst_strides,
                                                   const void* src,
                                                   absl::Span<const int64_t> src_strides,
                                                   absl::Span<const int64_t> shape,
                                                   int64_t element_size) {
  int64_t bytes = element_size;
  for (int64_t extent : shape) bytes *= extent;
  copied_bytes_ += bytes;
  const double start = std::max(stream_idle_at_, sg4::Engine::get_clock());
  stream_idle_at_ = start + static_cast<double>(bytes) / copy_bytes_per_second_;
  return absl::OkStatus();
}

void VirtualDeviceMemory::Occupy(double seconds) {
  if (!(seconds > 0)) return;
  stream_idle_at_ = std::max(stream_idle_at_, sg4::Engine::get_clock()) + seconds;
}

absl::Status VirtualDeviceMemory::Synchronize(absl::Time deadline) {
  const double limit = SimulatedSeconds(deadline);
  if (stream_idle_at_ <= sg4::Engine::get_clock()) return absl::OkStatus();
  if (limit < stream_idle_at_) {
    sg4::this_actor::sleep_until(limit);
    return absl::DeadlineExceededError("virtual device: copies still running at the deadline");
  }
  sg4::this_actor::sleep_until(stream_idle_at_);
  return absl::OkStatus();
}

void* UnmappedBufferAddress(int64_t index) {
  return reinterpret_cast<void*>((uintptr_t{1} << 48) +
                                 static_cast<uintptr_t>(index) * (uintptr_t{1} << 40));
}

}  // namespace wsync::simgrid_backend
