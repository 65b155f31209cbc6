#include "integration/cuda/cuda_job.h"

#include <stdlib.h>

#include <algorithm>
#include <memory>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status.h"
#include "integration/harness/launcher.h"
#include "planner/layout_parts.h"
#include "planner/models.h"
#include "planner/named_layouts.h"
#include "plugin/session.h"
#include "tests/testing/reference.h"
#include "transport/nccl/cuda_device_memory.h"
#include "transport/nccl/cuda_module.h"
#include "transport/nccl/nccl_api.h"

namespace wsync {
namespace {

// Device memory and blocking copies over the CUDA runtime calls of an NcclApi, on the calling
// thread's device (set by Create).
class Device {
 public:
  static absl::StatusOr<std::unique_ptr<Device>> Create(int device) {
    WSYNC_ASSIGN_OR_RETURN(std::unique_ptr<NcclApi> api, LoadRealNcclApi());
    auto d = std::unique_ptr<Device>(new Device(std::move(api), device));
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
  Device(std::unique_ptr<NcclApi> api, int device) : api_(std::move(api)), device_(device) {}
  std::unique_ptr<NcclApi> api_;
  const int device_;
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
  WSYNC_ASSIGN_OR_RETURN(ModelSpec model, GetModel(options.model));
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
  config.secret = SecretSource::Environment(kSecretEnv);
  config.node_id = "local";
  config.deadline = options.deadline;
  config.path_transports = options.path_transports;
  WSYNC_ASSIGN_OR_RETURN(std::unique_ptr<Session> session, Session::Create(config));
  std::unique_ptr<Device> gpu;
  if (kind == MemoryKind::kCuda) {
    WSYNC_ASSIGN_OR_RETURN(gpu, Device::Create(device));
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

}  // namespace

absl::StatusOr<CudaJobResult> RunCudaJob(const CudaJobOptions& options) {
  CudaJobResult result;
  {
    WSYNC_ASSIGN_OR_RETURN(std::unique_ptr<NcclApi> api, LoadRealNcclApi());
    WSYNC_RETURN_IF_ERROR(RequireCudaDevice(*api, 0, "a CUDA job"));
    result.devices = api->DeviceCount();
  }
  WSYNC_ASSIGN_OR_RETURN(ModelSpec model, GetModel(options.model));
  WSYNC_ASSIGN_OR_RETURN(Layout from, BuildNamedLayout(model, options.from));
  WSYNC_ASSIGN_OR_RETURN(Layout to, BuildNamedLayout(model, options.to));
  const auto trainers = static_cast<int32_t>(from.processes.size());
  const auto rollouts = static_cast<int32_t>(to.processes.size());
  const bool cuda_trainers = options.all_cuda || trainers + rollouts <= result.devices;
  result.placement = cuda_trainers ? "cuda->cuda (nccl)" : "host->cuda (ucx, rollouts stage)";
  for (const BufferInfo& buffer : to.buffers) result.rollout_buffer_bytes += buffer.bytes;
  WSYNC_ASSIGN_OR_RETURN(int port, harness::PickFreePort());
  if (getenv(kSecretEnv) == nullptr) setenv(kSecretEnv, "cuda-job-secret-0123456789", 0);
  std::vector<ProcessResult> processes(trainers + rollouts);
  std::vector<std::thread> threads;
  for (int32_t p = 0; p < trainers + rollouts; ++p) {
    threads.emplace_back([&, p] {
      const bool trainer = p < trainers;
      const MemoryKind kind = trainer && !cuda_trainers ? MemoryKind::kHost : MemoryKind::kCuda;
      processes[p].status =
          RunProcess(options, trainer ? Role::kTrainer : Role::kRollout, trainer ? p : p - trainers,
                     trainers, rollouts, port, p % std::max(result.devices, 1), kind, processes[p]);
    });
  }
  for (std::thread& thread : threads) thread.join();
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
