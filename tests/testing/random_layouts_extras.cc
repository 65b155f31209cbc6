// The parts of random_layouts.h that are not generators: LayoutToString, the random replica
// policy (RandomAnswersPolicy) and the hand-made jobs.

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/hash.h"
#include "planner/builders.h"
#include "planner/geometry.h"
#include "tests/testing/random_layouts.h"

namespace wsync::test {

std::string LayoutToString(const Layout& layout) {
  std::string text = absl::StrCat(RoleName(layout.role), " layout\n  processes:");
  for (const ProcessInfo& process : layout.processes) {
    absl::StrAppend(&text, " ", process.rank, "@", process.node_id);
  }
  absl::StrAppend(&text, "\n  buffers:");
  for (const BufferInfo& buffer : layout.buffers) {
    absl::StrAppend(&text, " p", buffer.process, "/b", buffer.id, ":", buffer.bytes, "B");
  }
  absl::StrAppend(&text, "\n");
  for (size_t i = 0; i < layout.params.size(); ++i) {
    const ParamInfo& param = layout.params[i];
    absl::StrAppend(&text, "  param ", i, " ", param.name, " ", DTypeName(param.dtype), " ",
                    DimsToString(param.shape), "\n");
  }
  for (const Piece& piece : layout.pieces) {
    absl::StrAppend(&text, "  piece param ", piece.param, " p", piece.process, "/b", piece.buffer,
                    " box ", BoxToString(piece.box), " offset ", piece.offset, " strides ",
                    DimsToString(piece.strides), "\n");
  }
  return text;
}

absl::StatusOr<std::vector<ReplicaAnswer>> RandomAnswersPolicy::Choose(
    const Job& job, absl::Span<const ReplicaRequest> requests,
    absl::Span<const FixedPairTraffic>) const {
  std::vector<ReplicaAnswer> answers;
  answers.reserve(requests.size());
  for (const ReplicaRequest& request : requests) {
    if (request.holder_pieces.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "random_answers: request for ", BoxToString(request.region), " has no holder"));
    }
    CanonicalHasher hasher(seed_);
    hasher.AddInt(request.param);
    for (int64_t v : request.region.origin) hasher.AddInt(v);
    for (int64_t v : request.region.extent) hasher.AddInt(v);
    hasher.AddInt(request.target_process);
    for (int32_t holder : request.holder_pieces) hasher.AddInt(holder);
    std::mt19937_64 rng(hasher.Digest());
    const int64_t holders = static_cast<int64_t>(request.holder_pieces.size());
    auto random_holder = [&]() { return static_cast<int32_t>(UniformInt(rng, 0, holders - 1)); };

    ReplicaAnswer answer;
    const bool has_axis = request.region.rank() > 0;
    const int64_t begin = has_axis ? request.region.origin[0] : 0;
    const int64_t extent = has_axis ? request.region.extent[0] : 1;
    if (has_axis && extent >= 2 && Chance(rng, 0.5)) {
      const int64_t parts = UniformInt(rng, 2, std::min<int64_t>(4, extent));
      std::set<int64_t> cuts;
      while (static_cast<int64_t>(cuts.size()) < parts - 1) {
        cuts.insert(begin + UniformInt(rng, 1, extent - 1));
      }
      cuts.insert(begin + extent);
      int64_t start = begin;
      for (int64_t end : cuts) {
        answer.parts.push_back(ReplicaPart{random_holder(), start, end});
        start = end;
      }
    } else {
      // A rank-0 region has no axis 0; its single part is [0, 1).
      answer.parts.push_back(ReplicaPart{random_holder(), begin, begin + extent});
    }
    answers.push_back(std::move(answer));
  }
  return answers;
}

Job RowsToColumnsJob() {
  LayoutBuilder source(Role::kTrainer);
  LayoutBuilder target(Role::kRollout);
  for (LayoutBuilder* b : {&source, &target}) {
    const int32_t w = b->AddParam("w", DType::kFloat32, {8, 8});
    const bool rows = b == &source;
    for (int p = 0; p < (rows ? 2 : 4); ++p) {
      b->AddProcess("n");
      const Box box = SplitBox({8, 8}, rows ? 0 : 1, rows ? 2 : 4, p);
      b->AddPackedPiece(w, p, b->AddBuffer(p, Volume(box) * 4), box, 0);
    }
  }
  return *Job::Create(std::move(source).Build(), std::move(target).Build());
}

Job OneTrainerToWholeCopies(const Dims& shape, const std::vector<std::string>& rollout_nodes) {
  LayoutBuilder source(Role::kTrainer);
  LayoutBuilder target(Role::kRollout);
  const int64_t bytes = Volume(shape) * 4;
  const int32_t t = source.AddProcess("a");
  source.AddPackedPiece(source.AddParam("w", DType::kFloat32, shape), t, source.AddBuffer(t, bytes),
                        WholeBox(shape), 0);
  const int32_t w = target.AddParam("w", DType::kFloat32, shape);
  for (const std::string& node : rollout_nodes) {
    const int32_t p = target.AddProcess(node);
    target.AddPackedPiece(w, p, target.AddBuffer(p, bytes), WholeBox(shape), 0);
  }
  return *Job::Create(std::move(source).Build(), std::move(target).Build());
}

}  // namespace wsync::test
