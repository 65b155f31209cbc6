#ifndef WSYNC_EXECUTOR_MEMORY_KINDS_H_
#define WSYNC_EXECUTOR_MEMORY_KINDS_H_

// Which memory each buffer of a job lives in, and which memory the messages between two processes
// travel in. Decided from the layouts alone, so every process computes the same answers.
//
// Rules: a process is a CUDA process when it holds at least one CUDA buffer. Messages between two
// CUDA processes travel in CUDA memory (the transport chosen for CUDA memory, NCCL by default, sees
// only device pointers); every other pair exchanges host memory. A chunk whose buffer on a side is
// of the other kind is staged on that side, its arena in the pair's kind, and the pack or unpack is
// the copy between the kinds. A CUDA process's relay arena, quantization arena and quantization
// staging are CUDA memory.

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "common/memory_kind.h"
#include "planner/job.h"

namespace wsync {

// Thread-safe. Built from the layouts once per job and process: constructions for a job whose
// layouts digest (which covers every buffer's kind) equals the previous construction's share
// that one's tables, as the processes of one simulated job (integration/simulation) do, which
// run in one OS thread and would otherwise each build them over the whole job.
// The last job's tables stay held (one per OS process) until a construction for another job.
class JobMemoryKinds {
 public:
  explicit JobMemoryKinds(const Job& job);

  // Whether any buffer of the job is CUDA memory.
  bool any_cuda() const { return !tables_->cuda_processes.empty(); }
  // kCuda for a CUDA process (global id).
  MemoryKind Process(int32_t process) const;
  // The kind of buffer `buffer` of `process`; the relay arena and the quantization arena and
  // staging (kRelayArenaBuffer, kQuantArenaBuffer, kQuantStagingBuffer) are of the process's kind.
  MemoryKind Buffer(int32_t process, uint64_t buffer) const;
  // The kind of the messages between `a` and `b`: kCuda when both are CUDA processes.
  MemoryKind Pair(int32_t a, int32_t b) const;
  // The CUDA processes in ascending global id.
  std::vector<int32_t> CudaProcesses() const;

  struct Tables {
    absl::flat_hash_set<int32_t> cuda_processes;
    absl::flat_hash_set<std::pair<int32_t, uint64_t>> cuda_buffers;
  };

 private:
  std::shared_ptr<const Tables> tables_;
};

}  // namespace wsync

#endif  // WSYNC_EXECUTOR_MEMORY_KINDS_H_
