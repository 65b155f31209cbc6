#ifndef WSYNC_PLANNER_JOB_H_
#define WSYNC_PLANNER_JOB_H_

// A job joins the source layout (trainer) and the target layout (rollout) after validating both and
// gives every process a global id: source ranks 0..S-1 are ids 0..S-1, target ranks are S..S+T-1.
// Immutable after Create; thread-safe for concurrent reads.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "planner/layout.h"
#include "planner/quant_layout.h"

namespace wsync {

inline constexpr absl::string_view kPathLocal = "local";
inline constexpr absl::string_view kPathIntraNode = "intra_node";
// Two processes of one node on one known GPU (ProcessInfo::device): CUDA IPC within one GPU, one
// copy engine and no link between them.
inline constexpr absl::string_view kPathSameDevice = "same_device";
inline constexpr absl::string_view kPathInterNode = "inter_node";
// Every path class, in a fixed order: PathClassIndex's numbering.
inline constexpr absl::string_view kPathClasses[] = {kPathLocal, kPathSameDevice, kPathIntraNode,
                                                     kPathInterNode};
inline constexpr int kPathClassCount = 4;
// The index of `path_class` in kPathClasses; -1 for another string.
inline int PathClassIndex(absl::string_view path_class) {
  for (int c = 0; c < kPathClassCount; ++c) {
    if (kPathClasses[c] == path_class) return c;
  }
  return -1;
}

struct JobProcess {
  Role role;
  int32_t rank;  // Rank within its layout.
  std::string node_id;
  int32_t device = kUnknownDevice;
};

class Job {
 public:
  // Validates both layouts (ValidateLayout) and their compatibility (ValidatePair): the source is a
  // trainer layout and the target a rollout layout; same parameter names, dtypes and shapes; the
  // source covers every parameter. Errors name the parameter,
  // process, box and reason. Pieces are put in canonical order so that the order in which a caller
  // listed them does not change anything downstream.
  static absl::StatusOr<Job> Create(Layout source, Layout target);

  const Layout& source() const { return source_; }
  const Layout& target() const { return target_; }
  const std::vector<JobProcess>& processes() const { return processes_; }
  int32_t num_processes() const { return static_cast<int32_t>(processes_.size()); }

  int32_t SourceId(int32_t rank) const { return rank; }
  int32_t TargetId(int32_t rank) const { return num_source_ + rank; }
  bool IsSource(int32_t id) const { return id < num_source_; }

  // Index of the target layout's parameter that the source parameter `source_param` matches, and
  // back; SourceParamOf is -1 for a scale parameter (quant_layout.h), which no source holds.
  int32_t TargetParamOf(int32_t source_param) const {
    return source_to_target_param_[source_param];
  }
  int32_t SourceParamOf(int32_t target_param) const {
    return target_to_source_param_[target_param];
  }

  // "local" for the same process; "same_device" for equal node ids and equal known devices (both
  // not kUnknownDevice); "intra_node" for other equal node ids; else "inter_node".
  absl::string_view PathClass(int32_t from, int32_t to) const;
  // Dense index of the process's node (equal node ids, equal index), in order of first appearance.
  int32_t NodeIndex(int32_t id) const { return node_index_[id]; }

  // xxh3-64 of a canonical encoding of both (canonicalised) layouts, computed once by Create.
  uint64_t layouts_digest() const { return layouts_digest_; }

  // For target parameters: the scale parameter of a quantized parameter and the parameter a scale
  // parameter scales (-1: none).
  const QuantLinks& quant_links() const { return quant_links_; }
  bool HasQuantizedParams() const;

  // Byte size of one element of target parameter `param`.
  int64_t ElementSize(int32_t target_param) const;

 private:
  Job() = default;
  Layout source_;
  Layout target_;
  int32_t num_source_ = 0;
  std::vector<JobProcess> processes_;
  std::vector<int32_t> source_to_target_param_;
  std::vector<int32_t> target_to_source_param_;
  std::vector<int32_t> node_index_;
  QuantLinks quant_links_;
  uint64_t layouts_digest_ = 0;
};

// The digest Job::layouts_digest holds (planner/digest.cc).
uint64_t LayoutsDigest(const Layout& source, const Layout& target);

}  // namespace wsync

#endif  // WSYNC_PLANNER_JOB_H_
