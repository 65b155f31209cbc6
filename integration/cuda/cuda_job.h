#ifndef WSYNC_INTEGRATION_CUDA_CUDA_JOB_H_
#define WSYNC_INTEGRATION_CUDA_CUDA_JOB_H_

// A wsync job whose weights live in CUDA memory, every process a thread of this process driving a
// plugin Session (the coordinator hosted by trainer rank 0 on a free loopback port): what
// `wsync-bench sync --memory cuda` times and what the gpu test GpuSessionTest checks. Needs a GPU
// and the NCCL backend (built only with WSYNC_HAVE_NCCL).
//
// Placement: process p's CUDA buffers are on device p % devices, every buffer in CUDA memory, and
// the pairs (all on one node) go over CUDA IPC, the default within a node (transport/cuda_ipc;
// threads of one process use each other's device pointers directly, forked processes map them).
// With `path_transports` routing intra_node to NCCL: NCCL refuses two ranks of one communicator on
// one device ("Duplicate GPU detected"), so when the job has more processes than the machine has
// GPUs the trainers keep their weights in host memory (trainer -> rollout pairs then travel in host
// memory over UCX and the rollouts stage them into device memory, executor/memory_kinds.h), unless
// `all_cuda`. CudaJobResult::placement says which ran.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "plugin/cuda_setup.h"

namespace wsync {

struct CudaJobOptions {
  std::string model = "qwen2.5-0.5b";
  std::string from = "megatron(tp=1)";
  std::string to = "vllm(tp=1)";
  int32_t syncs = 3;   // Timed syncs after the verified one.
  bool verify = true;  // The first sync checks every element of every rollout buffer.
  absl::Duration deadline = absl::Seconds(120);
  // Session path_transports; empty: CUDA IPC for CUDA pairs (one node), UCX for host ones.
  std::string path_transports;
  // With intra_node routed to NCCL: every buffer in CUDA memory even when processes share a GPU
  // (NCCL then refuses the communicator: the gpu test of that refusal).
  bool all_cuda = false;
  // Each process of the job a forked child of the caller instead of a thread (CUDA IPC then maps
  // the peers' allocations, as between an RL trainer and a colocated rollout engine). The caller
  // must not have initialised CUDA (a forked child cannot use it then).
  bool forked_processes = false;
  // The CUDA calls of the job (devices, copies, the session's NCCL and CUDA IPC); empty: the CUDA
  // module's real API. Tests pass a fake (tests/unit/fake_cuda_fabric.h).
  NcclApiFactory api;
};

struct CudaJobResult {
  // "cuda->cuda (cuda_ipc, threads)", "cuda->cuda (nccl, processes)", "host->cuda (ucx, ...)".
  std::string placement;
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
