#include "planner/job.h"

#include <algorithm>
#include <numeric>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/status.h"
#include "planner/validate.h"

namespace wsync {
namespace {

// Puts a validated layout in canonical order: parameters by name, processes by rank, buffers by
// (process, id), pieces by (parameter, process, buffer, offset, box).
void Canonicalize(Layout& layout) {
  std::vector<int32_t> order(layout.params.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(),
            [&](int32_t a, int32_t b) { return layout.params[a].name < layout.params[b].name; });
  std::vector<int32_t> new_index(layout.params.size());
  std::vector<ParamInfo> params;
  params.reserve(order.size());
  for (int32_t i = 0; i < static_cast<int32_t>(order.size()); ++i) {
    new_index[order[i]] = i;
    params.push_back(std::move(layout.params[order[i]]));
  }
  layout.params = std::move(params);
  for (Piece& piece : layout.pieces) piece.param = new_index[piece.param];

  std::sort(layout.processes.begin(), layout.processes.end(),
            [](const ProcessInfo& a, const ProcessInfo& b) { return a.rank < b.rank; });
  std::sort(layout.buffers.begin(), layout.buffers.end(),
            [](const BufferInfo& a, const BufferInfo& b) {
              return std::tie(a.process, a.id) < std::tie(b.process, b.id);
            });
  std::sort(layout.pieces.begin(), layout.pieces.end(), [](const Piece& a, const Piece& b) {
    return std::tie(a.param, a.process, a.buffer, a.offset, a.box) <
           std::tie(b.param, b.process, b.buffer, b.offset, b.box);
  });
}

}  // namespace

absl::StatusOr<Job> Job::Create(Layout source, Layout target) {
  if (source.role != Role::kTrainer || target.role != Role::kRollout) {
    return absl::InvalidArgumentError(
        absl::StrCat("weights move from a trainer layout to a rollout layout, not from ",
                     RoleName(source.role), " to ", RoleName(target.role)));
  }
  WSYNC_RETURN_IF_ERROR(ValidateLayout(source));
  WSYNC_RETURN_IF_ERROR(ValidateLayout(target));
  WSYNC_RETURN_IF_ERROR(ValidatePair(source, target));
  Canonicalize(source);
  Canonicalize(target);

  Job job;
  job.num_source_ = static_cast<int32_t>(source.processes.size());
  absl::flat_hash_map<std::string, int32_t> nodes;
  for (const Layout* layout : {&source, &target}) {
    for (const ProcessInfo& process : layout->processes) {
      job.processes_.push_back(
          JobProcess{layout->role, process.rank, process.node_id, process.device});
      auto [it, inserted] = nodes.emplace(process.node_id, static_cast<int32_t>(nodes.size()));
      job.node_index_.push_back(it->second);
    }
  }
  // Both layouts are sorted by name and hold the same names, but for the target's scale
  // parameters: a merge of the two sorted lists.
  job.source_to_target_param_.assign(source.params.size(), -1);
  job.target_to_source_param_.assign(target.params.size(), -1);
  for (size_t s = 0, t = 0; s < source.params.size() && t < target.params.size(); ++t) {
    if (source.params[s].name != target.params[t].name) continue;
    job.source_to_target_param_[s] = static_cast<int32_t>(t);
    job.target_to_source_param_[t] = static_cast<int32_t>(s);
    ++s;
  }
  job.quant_links_ = LinkQuantParams(target);
  job.layouts_digest_ = LayoutsDigest(source, target);
  job.source_ = std::move(source);
  job.target_ = std::move(target);
  return job;
}

absl::string_view Job::PathClass(int32_t from, int32_t to) const {
  if (from == to) return kPathLocal;
  if (node_index_[from] != node_index_[to]) return kPathInterNode;
  const int32_t device = processes_[from].device;
  return device != kUnknownDevice && device == processes_[to].device ? kPathSameDevice
                                                                     : kPathIntraNode;
}

bool Job::HasQuantizedParams() const {
  for (int32_t scale : quant_links_.scale_of) {
    if (scale >= 0) return true;
  }
  return false;
}

int64_t Job::ElementSize(int32_t target_param) const {
  return DTypeSize(target_.params[target_param].dtype);
}

}  // namespace wsync
