#ifndef WSYNC_INTEGRATION_CUDA_CUDA_JOB_H_
#define WSYNC_INTEGRATION_CUDA_CUDA_JOB_H_

// A wsync job whose weights live in CUDA memory, every process a thread of this process driving a
// plugin Session (the coordinator hosted by trainer rank 0 on a free loopback port): what
// `wsync bench sync --memory cuda` times and what the gpu test GpuSessionTest checks. Needs a GPU
// and the NCCL backend (built only with WSYNC_HAVE_NCCL).
//
// Placement: process p's CUDA buffers are on device p % devices. NCCL refuses two ranks of one
// communicator on one device ("Duplicate GPU detected"), so when the job has more processes than
// the machine has GPUs the trainers keep their weights in host memory (trainer -> rollout pairs
// then travel in host memory over UCX and the rollouts stage them into device memory,
// executor/memory_kinds.h); with a GPU per process every buffer is CUDA memory and every pair goes
// over NCCL. CudaJobResult::placement says which ran.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace wsync {

struct CudaJobOptions {
  std::string model = "qwen2.5-0.5b";
  std::string from = "megatron(tp=1)";
  std::string to = "vllm(tp=1)";
  int32_t syncs = 3;   // Timed syncs after the verified one.
  bool verify = true;  // The first sync checks every element of every rollout buffer.
  absl::Duration deadline = absl::Seconds(120);
  std::string path_transports;  // Session path_transports; empty: NCCL for CUDA, UCX for host.
  // Every buffer in CUDA memory even when processes share a GPU (NCCL then refuses the
  // communicator: the gpu test of that refusal).
  bool all_cuda = false;
};

struct CudaJobResult {
  std::string placement;                 // "cuda->cuda (nccl)" or "host->cuda (ucx)".
  int32_t devices = 0;                   // GPUs seen.
  int64_t rollout_bytes = 0;             // Received per sync by the busiest rollout process.
  int64_t verified_elements_bytes = 0;   // Bytes of rollout buffers checked (0: not verified).
  int64_t rollout_buffer_bytes = 0;      // Bytes of all rollout buffers of the layout.
  std::vector<double> transfer_seconds;  // Per timed sync, the slowest process's transfer.
};

// Runs the job: connect, one verified sync (when options.verify), then options.syncs timed ones.
// FailedPrecondition "no CUDA device" on a machine without a GPU (before anything starts);
// Unimplemented in a build without NCCL; a process's error (a wrong element included) otherwise.
absl::StatusOr<CudaJobResult> RunCudaJob(const CudaJobOptions& options);

// Seconds of one cudaMemcpy device-to-device of `bytes` bytes on `device` (median of `repeats`).
absl::StatusOr<double> DeviceToDeviceCopySeconds(int device, int64_t bytes, int repeats);

}  // namespace wsync

#endif  // WSYNC_INTEGRATION_CUDA_CUDA_JOB_H_
