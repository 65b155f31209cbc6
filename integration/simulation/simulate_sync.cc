#include "integration/simulation/simulate_sync.h"

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "executor/executor.h"
#include "simgrid/s4u.hpp"

namespace wsync::simulation {
namespace sg4 = simgrid::s4u;
using simgrid_backend::DeliveredMessage;

namespace {

static_assert(std::is_trivially_copyable_v<TransferStats>);
static_assert(std::is_trivially_copyable_v<DeliveredMessage>);

// The child's result travels to the parent as one byte string.
class Writer {
 public:
  template <typename T>
  void Put(const T& value) {
    static_assert(std::is_trivially_copyable_v<T>);
    bytes_.append(reinterpret_cast<const char*>(&value), sizeof(T));
  }
  void PutString(const std::string& text) {
    Put<uint64_t>(text.size());
    bytes_ += text;
  }
  template <typename T>
  void PutVector(const std::vector<T>& values) {
    Put<uint64_t>(values.size());
    bytes_.append(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
  }
  const std::string& bytes() const { return bytes_; }

 private:
  std::string bytes_;
};

class Reader {
 public:
  explicit Reader(const std::string& bytes) : bytes_(bytes) {}
  template <typename T>
  bool Get(T& value) {
    if (bytes_.size() - at_ < sizeof(T)) return false;
    std::memcpy(&value, bytes_.data() + at_, sizeof(T));
    at_ += sizeof(T);
    return true;
  }
  bool GetString(std::string& text) {
    uint64_t size = 0;
    if (!Get(size) || bytes_.size() - at_ < size) return false;
    text.assign(bytes_.data() + at_, size);
    at_ += size;
    return true;
  }
  template <typename T>
  bool GetVector(std::vector<T>& values) {
    uint64_t size = 0;
    if (!Get(size) || (bytes_.size() - at_) / sizeof(T) < size) return false;
    values.resize(size);
    std::memcpy(values.data(), bytes_.data() + at_, size * sizeof(T));
    at_ += size * sizeof(T);
    return true;
  }
  bool done() const { return at_ == bytes_.size(); }

 private:
  const std::string& bytes_;
  size_t at_ = 0;
};

std::string Encode(const SimulationResult& result) {
  Writer out;
  out.Put(result.sync_seconds);
  out.Put<uint64_t>(result.processes.size());
  for (const ProcessOutcome& process : result.processes) {
    out.Put<int32_t>(static_cast<int32_t>(process.status.code()));
    out.PutString(std::string(process.status.message()));
    out.Put(process.finish_seconds);
    out.Put(process.stats);
    out.Put(process.device_copy_bytes);
  }
  out.PutVector(result.messages);
  out.PutVector(result.sent_bytes);
  out.PutVector(result.received_bytes);
  out.Put(result.message_count);
  return out.bytes();
}

absl::StatusOr<SimulationResult> Decode(const std::string& bytes) {
  SimulationResult result;
  Reader in(bytes);
  uint64_t processes = 0;
  bool ok = in.Get(result.sync_seconds) && in.Get(processes);
  for (uint64_t p = 0; ok && p < processes; ++p) {
    ProcessOutcome outcome;
    int32_t code = 0;
    std::string message;
    ok = in.Get(code) && in.GetString(message) && in.Get(outcome.finish_seconds) &&
         in.Get(outcome.stats) && in.Get(outcome.device_copy_bytes);
    outcome.status = absl::Status(static_cast<absl::StatusCode>(code), message);
    result.processes.push_back(std::move(outcome));
  }
  ok = ok && in.GetVector(result.messages) && in.GetVector(result.sent_bytes) &&
       in.GetVector(result.received_bytes) && in.Get(result.message_count) && in.done();
  if (!ok) return absl::InternalError("simulation: the child's result is truncated");
  return result;
}

// Every buffer of process `p`, at unmapped addresses (never dereferenced: device memory only).
LocalBuffers UnmappedBuffers(const Job& job, int32_t p) {
  const Layout& layout = job.IsSource(p) ? job.source() : job.target();
  const int32_t rank = job.processes()[p].rank;
  LocalBuffers buffers;
  int64_t index = 0;
  for (const BufferInfo& info : layout.buffers) {
    if (info.process == rank) buffers[info.id] = simgrid_backend::UnmappedBufferAddress(index++);
  }
  return buffers;
}

// The simulation itself, in the child: one engine, one actor per process.
absl::StatusOr<SimulationResult> RunEngine(const Job& job, absl::Span<const Segment> segments,
                                           const SimulationOptions& options) {
  std::string program = "wsync-simulation";
  std::string log = "--log=root.thres:critical";
  std::vector<char*> argv = {program.data(), log.data(), nullptr};
  int argc = 2;
  // Never destroyed: the child exits once it wrote its result, and tearing a large platform
  // down would only cost time.
  sg4::Engine* engine = new sg4::Engine(&argc, argv.data());
  // Links as stated: no TCP bandwidth/latency factors (CM02), no window limit (TCP-gamma), no
  // acknowledgement traffic on the reverse direction.
  sg4::Engine::set_config("network/model:CM02");
  sg4::Engine::set_config("network/crosstraffic:0");
  sg4::Engine::set_config("network/TCP-gamma:0");
  for (const std::string& setting : options.simgrid_config) {
    try {
      sg4::Engine::set_config(setting);
    } catch (const std::exception& error) {
      return absl::InvalidArgumentError(
          absl::StrCat("simulation: SimGrid setting '", setting, "': ", error.what()));
    }
  }
  WSYNC_ASSIGN_OR_RETURN(std::vector<sg4::Host*> hosts,
                         options.platform->Build(job.num_processes()));

  const int32_t n = job.num_processes();
  simgrid_backend::SimFabric fabric(n, options.record_messages);
  SimulationResult result;
  result.processes.resize(n);
  std::vector<bool> finished(n, false);
  Endpoints endpoints;
  for (int32_t p = 0; p < n; ++p) endpoints.processes.push_back(p);
  for (int32_t p = 0; p < n; ++p) {
    sg4::Actor::create(absl::StrCat("process", p), hosts[p], [&, p] {
      simgrid_backend::SimGridTransport transport(fabric, p, options.needs_round_order);
      std::unique_ptr<Transport> wrapped;
      if (options.wrap_transport) wrapped = options.wrap_transport(p, transport);
      simgrid_backend::SimGridGroup group(fabric, p);
      simgrid_backend::VirtualDeviceMemory device(options.copy_bytes_per_second);
      const LocalBuffers buffers = UnmappedBuffers(job, p);
      SyncRequest sync;
      sync.sync_id = 1;
      sync.plan_digest = options.plan_digest;
      sync.deadline = options.deadline == absl::InfiniteDuration()
                          ? absl::InfiniteFuture()
                          : simgrid_backend::SimulatedNow() + options.deadline;
      ExecutorHooks hooks;
      hooks.now = simgrid_backend::SimulatedNow;
      if (options.quant != nullptr) {
        hooks.simulated_quantize = [&device, &options, deadline = sync.deadline](int64_t bytes) {
          device.Occupy(static_cast<double>(bytes) / options.quantize_bytes_per_second);
          return device.Synchronize(deadline);
        };
      }
      Executor executor(job, segments, options.quant, endpoints, options.budget, p, buffers,
                        wrapped ? *wrapped : transport, group, ExecutorDeps{.device = &device},
                        std::move(hooks));
      absl::StatusOr<TransferStats> stats = executor.Run(sync);
      ProcessOutcome& outcome = result.processes[p];
      outcome.finish_seconds = sg4::Engine::get_clock();
      outcome.status = stats.status();
      if (stats.ok()) outcome.stats = *stats;
      outcome.device_copy_bytes = device.copied_bytes();
      finished[p] = true;
    });
  }
  engine->run();
  for (int32_t p = 0; p < n; ++p) {
    ProcessOutcome& outcome = result.processes[p];
    if (!finished[p]) {
      outcome.finish_seconds = sg4::Engine::get_clock();
      outcome.status = absl::InternalError(absl::StrCat(
          "process ", p, " never finished: SimGrid found the simulation deadlocked at ",
          outcome.finish_seconds, " s (a message or collective its peers never posted)"));
    }
    result.sync_seconds = std::max(result.sync_seconds, outcome.finish_seconds);
  }
  result.messages = fabric.delivered();
  result.sent_bytes = fabric.sent_bytes();
  result.received_bytes = fabric.received_bytes();
  result.message_count = fabric.messages();
  return result;
}

bool WriteAll(int fd, const std::string& bytes) {
  size_t at = 0;
  while (at < bytes.size()) {
    const ssize_t wrote = write(fd, bytes.data() + at, bytes.size() - at);
    if (wrote < 0 && errno == EINTR) continue;
    if (wrote <= 0) return false;
    at += static_cast<size_t>(wrote);
  }
  return true;
}

}  // namespace

absl::Status SimulationResult::FirstFailure() const {
  for (size_t p = 0; p < processes.size(); ++p) {
    if (!processes[p].status.ok()) {
      return absl::Status(processes[p].status.code(),
                          absl::StrCat("process ", p, ": ", processes[p].status.message()));
    }
  }
  return absl::OkStatus();
}

Layout InDeviceMemory(Layout layout) {
  for (BufferInfo& buffer : layout.buffers) buffer.kind = MemoryKind::kCuda;
  return layout;
}

absl::StatusOr<SimulationResult> SimulateSync(const Job& job, absl::Span<const Segment> segments,
                                              const SimulationOptions& options) {
  if (options.platform == nullptr) return absl::InvalidArgumentError("simulation: no platform");
  if (options.quant != nullptr && !(options.quantize_bytes_per_second > 0)) {
    return absl::InvalidArgumentError("simulation: quantization steps without a quantize rate");
  }
  for (const Layout* layout : {&job.source(), &job.target()}) {
    for (const BufferInfo& buffer : layout->buffers) {
      if (buffer.kind != MemoryKind::kCuda) {
        return absl::InvalidArgumentError(
            absl::StrCat("simulation: buffer ", buffer.id, " of ", RoleName(layout->role), " rank ",
                         buffer.process,
                         " is host memory; the simulation holds no bytes and runs device "
                         "memory only (InDeviceMemory)"));
      }
    }
  }
  int pipe_fds[2];
  if (pipe(pipe_fds) != 0) return absl::InternalError("simulation: pipe failed");
  std::fflush(nullptr);
  const auto start = std::chrono::steady_clock::now();
  const pid_t child = fork();
  if (child < 0) return absl::InternalError("simulation: fork failed");
  if (child == 0) {
    close(pipe_fds[0]);
    absl::StatusOr<SimulationResult> result = RunEngine(job, segments, options);
    if (!result.ok()) {  // The parent reads the reason from the pipe (exit status 3).
      _exit(WriteAll(pipe_fds[1], std::string(result.status().message())) ? 3 : 4);
    }
    _exit(WriteAll(pipe_fds[1], Encode(*result)) ? 0 : 4);
  }
  close(pipe_fds[1]);
  std::string bytes;
  char chunk[1 << 16];
  for (;;) {
    const ssize_t got = read(pipe_fds[0], chunk, sizeof(chunk));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    bytes.append(chunk, static_cast<size_t>(got));
  }
  close(pipe_fds[0]);
  int wait_status = 0;
  rusage usage{};
  while (wait4(child, &wait_status, 0, &usage) < 0 && errno == EINTR) {
  }
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (WIFSIGNALED(wait_status)) {
    return absl::InternalError(
        absl::StrCat("simulation: the simulating process died of signal ", WTERMSIG(wait_status)));
  }
  if (WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 3) {
    return absl::InternalError(absl::StrCat("simulation: ", bytes));
  }
  if (!WIFEXITED(wait_status) || WEXITSTATUS(wait_status) != 0) {
    return absl::InternalError(
        absl::StrCat("simulation: the simulating process exited with ", WEXITSTATUS(wait_status)));
  }
  WSYNC_ASSIGN_OR_RETURN(SimulationResult result, Decode(bytes));
  result.wall_seconds = wall;
  result.peak_rss_bytes = static_cast<int64_t>(usage.ru_maxrss) * 1024;
  return result;
}

}  // namespace wsync::simulation
