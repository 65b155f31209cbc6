#ifndef WSYNC_PLUGIN_NCCL_COMMUNICATORS_H_
#define WSYNC_PLUGIN_NCCL_COMMUNICATORS_H_

// Which NCCL communicators a job forms. NCCL refuses a communicator with two ranks on one GPU
// ("Duplicate GPU detected"), and colocated RL jobs put a trainer and a rollout on every GPU: when
// their CUDA pairs across nodes go over NCCL, one communicator over all of them cannot form. The
// job then forms several, none holding two processes of one GPU, and each NCCL pair travels in
// one that holds both of its processes.
//
// Pure and deterministic: every process of a job computes the same answer from the same pairs
// and GPU identities (plugin/cuda_setup.h gathers the identities).

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace wsync {

// Two processes whose CUDA messages go over NCCL, first < second.
using NcclPair = std::pair<int32_t, int32_t>;

struct NcclCommunicators {
  // Each communicator's members in ascending global id (its root is the first); none holds two
  // processes of one GPU.
  std::vector<std::vector<int32_t>> members;
  // For each pair given, in order: the index of the communicator its messages travel in.
  std::vector<int32_t> of_pair;
};

// `pairs`: distinct, each first < second. `gpu_of[p]`: an identity of process p's GPU, equal for
// processes on one GPU and different otherwise (node and device UUID); only the processes of
// `pairs` are read. When no two of those processes share a GPU the answer is one communicator
// over all of them (in ascending order); otherwise pairs are placed in ascending order, each in
// the first communicator it fits without a second process on one GPU, else in a new one.
// Unimplemented naming both processes and the GPU when the two processes of a pair share a GPU
// (no communicator can connect them: CUDA IPC can), InvalidArgument for a malformed pair.
absl::StatusOr<NcclCommunicators> PlanNcclCommunicators(absl::Span<const NcclPair> pairs,
                                                        absl::Span<const std::string> gpu_of);

}  // namespace wsync

#endif  // WSYNC_PLUGIN_NCCL_COMMUNICATORS_H_
