#include "integration/cuda/cuda_job.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/status.h"
#include "device/cuda_device_memory.h"
#include "device/cuda_module.h"
#include "integration/fill/fill.h"
#include "integration/harness/launcher.h"
#include "integration/model_config/hf_config.h"
#include "planner/layout_parts.h"
#include "planner/models.h"
#include "planner/named_layouts.h"
#include "plugin/session.h"
#include "transport/nccl/nccl_api.h"
#include "transport/selector/selector.h"

namespace wsync {
namespace {

// The factory's API, or the CUDA module's real one.
absl::StatusOr<std::unique_ptr<NcclApi>> MakeApi(const NcclApiFactory& factory) {
  if (factory) return factory();
  return LoadRealNcclApi();
}

// Device memory and blocking copies over the CUDA runtime calls of an NcclApi, on the calling
// thread's device (set by Create).
class Device {
 public:
  static absl::StatusOr<std::unique_ptr<Device>> Create(int device,
                                                        const NcclApiFactory& factory = nullptr) {
    WSYNC_ASSIGN_OR_RETURN(std::unique_ptr<NcclApi> api, MakeApi(factory));
    auto d = std::unique_ptr<Device>(new Device(std::move(api)));
    WSYNC_RETURN_IF_ERROR(RequireCudaDevice(*d->api_, device, "a CUDA job"));
    WSYNC_RETURN_IF_ERROR(d->api_->SetDevice(device));
    WSYNC_ASSIGN_OR_RETURN(d->stream_, d->api_->StreamCreate());
    WSYNC_ASSIGN_OR_RETURN(d->event_, d->api_->EventCreate());
    return d;
  }
  ~Device() {
    for (void* memory : owned_) api_->Free(memory).IgnoreError();
    if (event_ != nullptr) api_->EventDestroy(event_).IgnoreError();
    if (stream_ != nullptr) api_->StreamDestroy(stream_).IgnoreError();
  }
  absl::StatusOr<void*> Allocate(int64_t bytes) {
    WSYNC_ASSIGN_OR_RETURN(void* memory,
                           api_->Malloc(static_cast<size_t>(std::max<int64_t>(bytes, 1))));
    owned_.push_back(memory);
    return memory;
  }
  // Copies `bytes` bytes (any kinds, cudaMemcpyDefault) and waits for them.
  absl::Status Copy(void* dst, const void* src, int64_t bytes) {
    if (bytes == 0) return absl::OkStatus();
    const auto n = static_cast<size_t>(bytes);
    WSYNC_RETURN_IF_ERROR(api_->Memcpy2DAsync(dst, n, src, n, n, 1, stream_));
    return Wait();
  }
  absl::Status Wait() {
    WSYNC_RETURN_IF_ERROR(api_->EventRecord(event_, stream_));
    while (true) {
      WSYNC_ASSIGN_OR_RETURN(bool done, api_->EventQuery(event_));
      if (done) return absl::OkStatus();
      absl::SleepFor(absl::Microseconds(20));
    }
  }

 private:
  explicit Device(std::unique_ptr<NcclApi> api) : api_(std::move(api)) {}
  std::unique_ptr<NcclApi> api_;
  CudaStream stream_ = nullptr;
  CudaEvent event_ = nullptr;
  std::vector<void*> owned_;
};

struct ProcessResult {
  absl::Status status;
  std::vector<double> seconds;  // Transfer seconds per sync (the verified one first).
  int64_t received_bytes = 0;
  int64_t checked_bytes = 0;
};

constexpr char kSecretEnv[] = "WSYNC_CUDA_JOB_SECRET";

absl::Status RunProcess(const CudaJobOptions& options, Role role, int32_t rank, int32_t trainers,
                        int32_t rollouts, int port, int device, MemoryKind kind,
                        ProcessResult& result) {
  WSYNC_ASSIGN_OR_RETURN(ModelSpec model, LoadModel(options.model));
  WSYNC_ASSIGN_OR_RETURN(
      Layout whole, BuildNamedLayout(model, role == Role::kTrainer ? options.from : options.to));
  const Layout part = LayoutPart(whole, rank);
  SessionConfig config;
  config.role = role;
  config.rank = rank;
  config.num_trainers = trainers;
  config.num_rollouts = rollouts;
  config.job_id = "cuda-job";
  config.coordinator_port = port;
  config.host_coordinator = role == Role::kTrainer && rank == 0;
  // By value: the library removes a variable it reads from the environment, and the job's
  // processes may be threads of this one.
  const char* secret = std::getenv(kSecretEnv);
  config.secret = SecretSource::Value(secret != nullptr ? secret : "");
  config.node_id = "local";
  config.deadline = options.deadline;
  config.path_transports = options.path_transports;
  config.nccl_api = options.api;
  WSYNC_ASSIGN_OR_RETURN(std::unique_ptr<Session> session, Session::Create(config));
  std::unique_ptr<Device> gpu;
  if (kind == MemoryKind::kCuda) {
    WSYNC_ASSIGN_OR_RETURN(gpu, Device::Create(device, options.api));
  }
  // The logical values live on the host; CUDA buffers get them by copy (and give them back).
  test::HostBuffers host(part, test::kPoison);
  std::vector<std::pair<uint64_t, void*>> buffers;
  for (const BufferInfo& buffer : part.buffers) {
    void* address = host.data({rank, buffer.id});
    if (gpu != nullptr) {
      WSYNC_ASSIGN_OR_RETURN(address, gpu->Allocate(buffer.bytes));
      WSYNC_RETURN_IF_ERROR(gpu->Copy(address, host.data({rank, buffer.id}), buffer.bytes));
    }
    buffers.emplace_back(buffer.id, address);
    WSYNC_RETURN_IF_ERROR(session->RegisterBuffer(buffer.id, address, buffer.bytes, kind, device));
  }
  WSYNC_RETURN_IF_ERROR(
      session->SetNamedLayout(options.model, role == Role::kTrainer ? options.from : options.to));
  WSYNC_RETURN_IF_ERROR(session->Connect());
  const int64_t first = options.verify ? 1 : 2;
  for (int64_t version = first; version <= 1 + options.syncs; ++version) {
    if (role == Role::kTrainer && version == 1) {
      WSYNC_RETURN_IF_ERROR(test::FillLogical(part, 1, &host));
      if (gpu != nullptr) {
        for (const auto& [id, address] : buffers) {
          WSYNC_RETURN_IF_ERROR(gpu->Copy(address, host.data({rank, id}), host.bytes({rank, id})));
        }
      }
    }
    WSYNC_RETURN_IF_ERROR(session->Sync(version));
    const Session::SyncStats stats = session->LastStats();
    result.seconds.push_back(stats.stats.seconds);
    result.received_bytes = stats.stats.received_bytes;
    if (role == Role::kRollout && version == 1) {
      if (gpu != nullptr) {
        for (const auto& [id, address] : buffers) {
          WSYNC_RETURN_IF_ERROR(gpu->Copy(host.data({rank, id}), address, host.bytes({rank, id})));
        }
      }
      WSYNC_RETURN_IF_ERROR(test::CheckLogical(part, host, 1));
      for (const BufferInfo& buffer : part.buffers) result.checked_bytes += buffer.bytes;
    }
  }
  session->Finalize();
  return absl::OkStatus();
}

// A ProcessResult as one line of text, for a forked process's pipe, and back.
std::string EncodeResult(const ProcessResult& result) {
  return absl::StrCat(static_cast<int>(result.status.code()), "\t",
                      absl::CEscape(result.status.message()), "\t", result.received_bytes, "\t",
                      result.checked_bytes, "\t", absl::StrJoin(result.seconds, ","));
}

ProcessResult DecodeResult(absl::string_view text) {
  ProcessResult result;
  const std::vector<std::string> fields = absl::StrSplit(text, '\t');
  int code = 0;
  std::string message;
  if (fields.size() != 5 || !absl::SimpleAtoi(fields[0], &code) ||
      !absl::CUnescape(fields[1], &message) ||
      !absl::SimpleAtoi(fields[2], &result.received_bytes) ||
      !absl::SimpleAtoi(fields[3], &result.checked_bytes)) {
    result.status = absl::InternalError(
        absl::StrCat("the forked process died or sent an unreadable result: '", text, "'"));
    return result;
  }
  result.status = absl::Status(static_cast<absl::StatusCode>(code), message);
  for (absl::string_view second : absl::StrSplit(fields[4], ',', absl::SkipEmpty())) {
    double value = 0;
    if (absl::SimpleAtod(second, &value)) result.seconds.push_back(value);
  }
  return result;
}

// Starts `body` in a forked child, which writes the line `body` returns into a pipe and exits;
// `read_end` is the pipe's end for FinishChild.
template <typename Body>
absl::StatusOr<pid_t> StartChild(Body body, int& read_end) {
  int fds[2];
  if (pipe(fds) != 0) return absl::InternalError("pipe failed");
  std::fflush(nullptr);  // Every stream: nothing buffered is written by both processes.
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError("fork failed");
  if (pid == 0) {
    close(fds[0]);
    const std::string line = body();
    size_t written = 0;
    while (written < line.size()) {
      const ssize_t n = write(fds[1], line.data() + written, line.size() - written);
      if (n <= 0) break;
      written += static_cast<size_t>(n);
    }
    _exit(0);
  }
  close(fds[1]);
  read_end = fds[0];
  return pid;
}

// What the child wrote (empty when it died before writing), once it exited.
std::string FinishChild(pid_t pid, int read_end) {
  std::string text;
  char chunk[4096];
  ssize_t n = 0;
  while ((n = read(read_end, chunk, sizeof(chunk))) > 0) text.append(chunk, static_cast<size_t>(n));
  close(read_end);
  int status = 0;
  waitpid(pid, &status, 0);
  return text;
}

// CUDA devices of this machine; in a forked child when `fork` (so this process stays free of CUDA).
absl::StatusOr<int> CountDevices(bool fork, const NcclApiFactory& factory) {
  auto count = [&factory]() -> absl::StatusOr<int> {
    WSYNC_ASSIGN_OR_RETURN(std::unique_ptr<NcclApi> api, MakeApi(factory));
    WSYNC_RETURN_IF_ERROR(RequireCudaDevice(*api, 0, "a CUDA job"));
    return api->DeviceCount();
  };
  if (!fork) return count();
  int read_end = -1;
  WSYNC_ASSIGN_OR_RETURN(pid_t pid, StartChild(
                                        [&] {
                                          ProcessResult probe;
                                          absl::StatusOr<int> devices = count();
                                          probe.status = devices.status();
                                          probe.received_bytes = devices.ok() ? *devices : 0;
                                          return EncodeResult(probe);
                                        },
                                        read_end));
  const ProcessResult probe = DecodeResult(FinishChild(pid, read_end));
  WSYNC_RETURN_IF_ERROR(probe.status);
  return static_cast<int>(probe.received_bytes);
}

}  // namespace

absl::StatusOr<CudaJobResult> RunCudaJob(const CudaJobOptions& options) {
  CudaJobResult result;
  WSYNC_ASSIGN_OR_RETURN(result.devices, CountDevices(options.forked_processes, options.api));
  WSYNC_ASSIGN_OR_RETURN(ModelSpec model, LoadModel(options.model));
  WSYNC_ASSIGN_OR_RETURN(Layout from, BuildNamedLayout(model, options.from));
  WSYNC_ASSIGN_OR_RETURN(Layout to, BuildNamedLayout(model, options.to));
  WSYNC_ASSIGN_OR_RETURN(PathTransports paths, ParsePathTransports(options.path_transports));
  const auto trainers = static_cast<int32_t>(from.processes.size());
  const auto rollouts = static_cast<int32_t>(to.processes.size());
  // The job's pairs are all on one node: intra_node decides the backend of CUDA pairs.
  const TransportChoice& intra = paths.For("intra_node");
  const bool explicit_intra = paths.by_path.count("intra_node") > 0 || paths.fallback_given;
  const std::string backend = explicit_intra ? intra.backend : "cuda_ipc";
  const bool cuda_trainers =
      options.all_cuda || backend != "nccl" || trainers + rollouts <= result.devices;
  const std::string how = options.forked_processes ? "processes" : "threads";
  result.placement = cuda_trainers ? absl::StrCat("cuda->cuda (", backend, ", ", how, ")")
                                   : absl::StrCat("host->cuda (ucx, rollouts stage, ", how, ")");
  for (const BufferInfo& buffer : to.buffers) result.rollout_buffer_bytes += buffer.bytes;
  WSYNC_ASSIGN_OR_RETURN(int port, harness::PickFreePort());
  if (getenv(kSecretEnv) == nullptr) setenv(kSecretEnv, "cuda-job-secret-0123456789abcdef0123", 0);
  std::vector<ProcessResult> processes(trainers + rollouts);
  auto run = [&](int32_t p) {
    const bool trainer = p < trainers;
    const MemoryKind kind = trainer && !cuda_trainers ? MemoryKind::kHost : MemoryKind::kCuda;
    processes[p].status =
        RunProcess(options, trainer ? Role::kTrainer : Role::kRollout, trainer ? p : p - trainers,
                   trainers, rollouts, port, p % std::max(result.devices, 1), kind, processes[p]);
  };
  if (options.forked_processes) {
    std::vector<std::pair<pid_t, int>> children;
    for (int32_t p = 0; p < trainers + rollouts; ++p) {
      int read_end = -1;
      absl::StatusOr<pid_t> pid = StartChild(
          [&] {
            run(p);
            return EncodeResult(processes[p]);
          },
          read_end);
      if (!pid.ok()) {
        for (const auto& [started, fd] : children) kill(started, SIGKILL);
        for (const auto& [started, fd] : children) FinishChild(started, fd);
        return pid.status();
      }
      children.emplace_back(*pid, read_end);
    }
    for (int32_t p = 0; p < trainers + rollouts; ++p) {
      processes[p] = DecodeResult(FinishChild(children[p].first, children[p].second));
    }
  } else {
    std::vector<std::thread> threads;
    for (int32_t p = 0; p < trainers + rollouts; ++p) threads.emplace_back(run, p);
    for (std::thread& thread : threads) thread.join();
  }
  for (int32_t p = 0; p < trainers + rollouts; ++p) {
    if (!processes[p].status.ok()) {
      return absl::Status(processes[p].status.code(),
                          absl::StrCat("process ", p, ": ", processes[p].status.message()));
    }
  }
  const size_t first_timed = options.verify ? 1 : 0;
  for (size_t sync = first_timed; sync < processes[0].seconds.size(); ++sync) {
    double slowest = 0;
    for (const ProcessResult& process : processes)
      slowest = std::max(slowest, process.seconds[sync]);
    result.transfer_seconds.push_back(slowest);
  }
  for (int32_t p = trainers; p < trainers + rollouts; ++p) {
    result.rollout_bytes = std::max(result.rollout_bytes, processes[p].received_bytes);
    result.verified_elements_bytes += processes[p].checked_bytes;
  }
  return result;
}

absl::StatusOr<double> DeviceToDeviceCopySeconds(int device, int64_t bytes, int repeats) {
  WSYNC_ASSIGN_OR_RETURN(std::unique_ptr<Device> gpu, Device::Create(device));
  WSYNC_ASSIGN_OR_RETURN(void* from, gpu->Allocate(bytes));
  WSYNC_ASSIGN_OR_RETURN(void* to, gpu->Allocate(bytes));
  WSYNC_RETURN_IF_ERROR(gpu->Copy(to, from, bytes));  // Warm-up.
  std::vector<double> seconds;
  for (int r = 0; r < std::max(repeats, 1); ++r) {
    const absl::Time start = absl::Now();
    WSYNC_RETURN_IF_ERROR(gpu->Copy(to, from, bytes));
    seconds.push_back(absl::ToDoubleSeconds(absl::Now() - start));
  }
  std::sort(seconds.begin(), seconds.end());
  return seconds[seconds.size() / 2];
}

}  // namespace wsync
