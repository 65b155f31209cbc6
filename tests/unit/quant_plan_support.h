#ifndef WSYNC_TESTS_UNIT_QUANT_PLAN_SUPPORT_H_
#define WSYNC_TESTS_UNIT_QUANT_PLAN_SUPPORT_H_

// Helpers of the quantization-plan tests: a trainer/rollout pair of one quantized parameter "w"
// cut at arbitrary positions, and a host simulation of a plan's quantization steps (the sender
// quantizes its blocks with quant::QuantizeFp8 and sends, the receiver gathers bf16 into an arena
// and quantizes there), compared element by element with the reference quantizer of the whole
// tensor.

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/status.h"
#include "gtest/gtest.h"
#include "planner/builders.h"
#include "planner/models.h"
#include "planner/named_layouts.h"
#include "planner/plan.h"
#include "planner/policy.h"
#include "planner/quant_layout.h"
#include "quant/fp8.h"
#include "tests/unit/fp8_test_support.h"

namespace wsync::quant_plan_test {

// Cuts of each axis: the boundaries [0, c1, ..., extent] of its parts.
using AxisCuts = std::vector<std::vector<int64_t>>;

// Sorted distinct cut points in (0, extent), at most `max_cuts`; sometimes at block boundaries.
inline std::vector<int64_t> RandomCuts(std::mt19937_64& rng, int64_t extent, int64_t block,
                                       int max_cuts) {
  std::vector<int64_t> cuts = {0, extent};
  const int count = static_cast<int>(rng() % (max_cuts + 1));
  for (int i = 0; i < count && extent > 1; ++i) {
    int64_t cut = 1 + static_cast<int64_t>(rng() % (extent - 1));
    if (rng() % 2 == 0 && block < extent) cut = std::max<int64_t>(1, cut / block * block);
    cuts.push_back(cut);
  }
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  return cuts;
}

// 128 x 128 blocks, per channel, per tensor, or small blocks (many ragged ones).
inline ParamQuant RandomQuant(std::mt19937_64& rng) {
  switch (rng() % 4) {
    case 0:
      return ParamQuant{128, 128, ""};
    case 1:
      return ParamQuant{1, quant::kWholeAxis, ""};
    case 2:
      return ParamQuant{quant::kWholeAxis, quant::kWholeAxis, ""};
    default:
      return ParamQuant{1 + static_cast<int64_t>(rng() % 12), 1 + static_cast<int64_t>(rng() % 12),
                        ""};
  }
}

inline AxisCuts Uncut(const Dims& shape) {
  AxisCuts cuts;
  for (int64_t extent : shape) cuts.push_back({0, extent});
  return cuts;
}

// The boxes of the grid that `cuts` makes, in row-major order of their cells.
inline std::vector<Box> GridBoxes(const Dims& shape, const AxisCuts& cuts) {
  std::vector<Box> boxes = {WholeBox(shape)};
  for (size_t a = 0; a < shape.size(); ++a) {
    std::vector<Box> next;
    for (const Box& box : boxes) {
      for (size_t c = 0; c + 1 < cuts[a].size(); ++c) {
        Box part = box;
        part.origin[a] = cuts[a][c];
        part.extent[a] = cuts[a][c + 1] - cuts[a][c];
        next.push_back(part);
      }
    }
    boxes = std::move(next);
  }
  return boxes;
}

// Row-major strides of `extent` with the last axis padded by `pad` elements (a strided piece).
inline Dims PaddedStrides(const Dims& extent, int64_t pad) {
  Dims padded = extent;
  padded.back() += pad;
  return RowMajorStrides(padded);
}

inline int64_t SpanElements(const Dims& extent, const Dims& strides) {
  int64_t last = 0;
  for (size_t a = 0; a < extent.size(); ++a) last += (extent[a] - 1) * strides[a];
  return last + 1;
}

// A random quantized parameter "w" and how each side cuts it: a random blocking (RandomQuant), 2
// axes or, one time in three, 3 (an expert axis of 1 to `max_experts`), up to 300 rows and
// columns with 128 x 128 blocks (40 otherwise); TP cuts rows or columns and EP cuts experts, the
// sides independently and often inside blocks (the trainer up to `source_max_cuts` per axis, the
// rollout up to 2).
struct Geometry {
  ParamQuant quant;
  bool experts = false;
  Dims shape;
  AxisCuts source_cuts;
  AxisCuts target_cuts;
};
inline Geometry RandomGeometry(std::mt19937_64& rng, int max_experts, int source_max_cuts) {
  Geometry g;
  g.quant = RandomQuant(rng);
  g.experts = rng() % 3 == 0;
  const int64_t big = g.quant.block_rows == 128 ? 300 : 40;
  if (g.experts) g.shape.push_back(1 + static_cast<int64_t>(rng() % max_experts));
  g.shape.push_back(1 + static_cast<int64_t>(rng() % big));
  g.shape.push_back(1 + static_cast<int64_t>(rng() % big));
  const Dims blocks = QuantBlockDims(g.quant, static_cast<int>(g.shape.size()));
  g.source_cuts = Uncut(g.shape);
  g.target_cuts = Uncut(g.shape);
  for (size_t a = 0; a < g.shape.size(); ++a) {
    if (rng() % 2 == 0) g.source_cuts[a] = RandomCuts(rng, g.shape[a], blocks[a], source_max_cuts);
    if (rng() % 3 == 0) g.target_cuts[a] = RandomCuts(rng, g.shape[a], blocks[a], 2);
  }
  return g;
}

// The trainer: "w" (bf16, `shape`) in the grid of `cuts`, each box on its own process and buffer
// (rows padded by `pad`), all of it `replicas` times.
inline Layout QuantSource(const Dims& shape, const AxisCuts& cuts, int replicas, int64_t pad) {
  LayoutBuilder b(Role::kTrainer);
  const int32_t w = b.AddParam("w", DType::kBFloat16, shape);
  for (int r = 0; r < replicas; ++r) {
    for (const Box& box : GridBoxes(shape, cuts)) {
      const int32_t p = b.AddProcess("trainer-node");
      const Dims strides = PaddedStrides(box.extent, pad);
      const uint64_t buffer = b.AddBuffer(p, SpanElements(box.extent, strides) * 2);
      b.AddPiece(w, p, buffer, box, 0, strides);
    }
  }
  return std::move(b).Build();
}

// The rollout: "w" FP8 with `quant` and its scales "w_scale", the grid of `cuts`, each box on its
// own process: one e4m3 buffer (rows padded by `pad`) and one fp32 buffer holding the scales of
// the box's whole blocks; `replicas` times.
inline Layout QuantTarget(const Dims& shape, const ParamQuant& quant, const AxisCuts& cuts,
                          int replicas, int64_t pad) {
  LayoutBuilder b(Role::kRollout);
  const int32_t w = b.AddParam("w", DType::kFloat8E4M3, shape);
  b.mutable_layout().params[w].quant = quant;
  b.mutable_layout().params[w].quant.scale_param = "w_scale";
  const Dims blocks = QuantBlockDims(quant, static_cast<int>(shape.size()));
  const int32_t s = b.AddParam("w_scale", DType::kFloat32, QuantScaleShape(shape, blocks));
  for (int r = 0; r < replicas; ++r) {
    for (const Box& box : GridBoxes(shape, cuts)) {
      const int32_t p = b.AddProcess("rollout-node");
      const Dims strides = PaddedStrides(box.extent, pad);
      b.AddPiece(w, p, b.AddBuffer(p, SpanElements(box.extent, strides)), box, 0, strides);
      const Box scales = ScaleBox(blocks, shape, WholeBlockBox(blocks, shape, box));
      b.AddPackedPiece(s, p, b.AddBuffer(p, Volume(scales) * 4), scales, 0);
    }
  }
  return std::move(b).Build();
}

// A case with both sides: w [256, 300] in 128 x 128 blocks; the trainer cuts the columns at 150
// (inside block column 1), the rollout cuts the rows at 100 (inside block row 0).
struct FixedCase {
  Job job;
  Plan plan;
};
inline FixedCase MakeFixedCase(const Dims& shape = {256, 300},
                               const AxisCuts& source_cuts = {{0, 256}, {0, 150, 300}},
                               const AxisCuts& target_cuts = {{0, 100, 256}, {0, 300}}) {
  const ParamQuant quant{128, 128, ""};
  absl::StatusOr<Job> job = Job::Create(QuantSource(shape, source_cuts, 1, 0),
                                        QuantTarget(shape, quant, target_cuts, 1, 0));
  EXPECT_TRUE(job.ok()) << job.status();
  absl::StatusOr<Plan> plan = MakePlan(*job, *MakeFirstHolderPolicy());
  EXPECT_TRUE(plan.ok()) << plan.status();
  return FixedCase{*std::move(job), *std::move(plan)};
}

// Calls fn(index) for every index of `box`, row-major.
inline void ForEachIndex(const Box& box, const std::function<void(const Dims&)>& fn) {
  if (Volume(box) == 0) return;
  Dims index = box.origin;
  while (true) {
    fn(index);
    int a = box.rank() - 1;
    for (; a >= 0; --a) {
      if (++index[a] < box.origin[a] + box.extent[a]) break;
      index[a] = box.origin[a];
    }
    if (a < 0) return;
  }
}

// Element index of `index` (absolute) in a region mapping `box`'s origin to `offset`.
inline int64_t At(const Box& box, int64_t offset, const Dims& strides, const Dims& index) {
  return AddressOf(box, offset, strides, index);
}

// Memory of every process's buffers: (global process, buffer id) -> bytes.
using Memory = std::map<std::pair<int32_t, uint64_t>, std::vector<uint8_t>>;

// The element of `size` bytes holding bf16 `bits`: the bf16 itself, or for 4 bytes the fp32 of the
// same value (which quantizes as the bf16 does).
inline uint32_t ElementBits(uint16_t bits, int64_t size) {
  EXPECT_TRUE(size == 2 || size == 4) << size;
  return size == 4 ? uint32_t{bits} << 16 : bits;
}

// Allocates every buffer of the job; trainer pieces of source parameter i hold tensors[i] (bf16
// bits, row-major over the parameter's shape, as ElementBits of the parameter's dtype), rollout
// buffers 0xff bytes (an e4m3 NaN, a NaN scale) to show unwritten elements.
inline Memory AllocateMemory(const Job& job, const std::vector<fp8_test::Tensor>& tensors) {
  Memory memory;
  for (const BufferInfo& buffer : job.source().buffers) {
    memory[{job.SourceId(buffer.process), buffer.id}].assign(buffer.bytes, 0);
  }
  for (const BufferInfo& buffer : job.target().buffers) {
    memory[{job.TargetId(buffer.process), buffer.id}].assign(buffer.bytes, 0xff);
  }
  for (const Piece& piece : job.source().pieces) {
    std::vector<uint8_t>& bytes = memory[{job.SourceId(piece.process), piece.buffer}];
    const ParamInfo& param = job.source().params[piece.param];
    const int64_t size = DTypeSize(param.dtype);
    const Dims strides = RowMajorStrides(param.shape);
    ForEachIndex(piece.box, [&](const Dims& index) {
      const int64_t flat = AddressOf(WholeBox(param.shape), 0, strides, index);
      const uint32_t bits = ElementBits(tensors[piece.param].bits[flat], size);
      std::memcpy(&bytes[At(piece.box, piece.offset, piece.strides, index) * size], &bits, size);
    });
  }
  return memory;
}

// The same for a job of one parameter "w" holding `tensor` (bf16 bits of [e, r, c] or [r, c]).
inline Memory AllocateMemory(const Job& job, const fp8_test::Tensor& tensor) {
  return AllocateMemory(job, std::vector<fp8_test::Tensor>{tensor});
}

// quant::Fp8Blocking of a parameter's ParamQuant.
inline quant::Fp8Blocking BlockingOf(const ParamQuant& quant) {
  return quant::Fp8Blocking{quant.block_rows, quant.block_cols};
}

// Quantizes `blocks` read at (base, strides) and writes the step's e4m3 box and scales.
inline void QuantizeAndWrite(const Job& job, const QuantTransform& step, const void* base,
                             const Dims& strides, Memory& memory) {
  const ParamInfo& param = job.target().params[step.param];
  const Dims packed = RowMajorStrides(step.blocks.extent);
  std::vector<uint8_t> fp8(Volume(step.blocks));
  std::vector<float> scales(Volume(step.scale_box));
  quant::ConstRegion in;
  quant::MutableRegion out, scale_out;
  ASSERT_TRUE(quant::MakeRegion(base, strides, step.blocks.extent, in).ok());
  ASSERT_TRUE(quant::MakeRegion<void*>(fp8.data(), packed, step.blocks.extent, out).ok());
  ASSERT_TRUE(quant::MakeRegion<void*>(scales.data(), RowMajorStrides(step.scale_box.extent),
                                       step.scale_box.extent, scale_out)
                  .ok());
  const absl::Status status =
      quant::QuantizeFp8(BlockingOf(param.quant), DType::kBFloat16, in, out, scale_out, "w");
  ASSERT_TRUE(status.ok()) << status;
  std::vector<uint8_t>& target = memory[{step.to.process, step.to.buffer}];
  ForEachIndex(step.box, [&](const Dims& index) {
    target[At(step.box, step.to.offset, step.to.strides, index)] =
        fp8[At(step.blocks, 0, packed, index)];
  });
  std::vector<uint8_t>& scale_target = memory[{step.scale_to.process, step.scale_to.buffer}];
  const Dims scale_packed = RowMajorStrides(step.scale_box.extent);
  ForEachIndex(step.scale_box, [&](const Dims& index) {
    std::memcpy(
        &scale_target[At(step.scale_box, step.scale_to.offset, step.scale_to.strides, index) * 4],
        &scales[At(step.scale_box, 0, scale_packed, index)], 4);
  });
}

// Runs the plan's quantization steps over `memory`: gathers into per-receiver arenas first, then
// every transform.
inline void RunQuantSteps(const Job& job, const QuantPlan& plan, Memory& memory) {
  std::map<int32_t, std::vector<uint16_t>> arenas;
  for (const Segment& gather : plan.gathers) {
    std::vector<uint16_t>& arena = arenas[gather.to.process];
    const std::vector<uint8_t>& source = memory[{gather.from.process, gather.from.buffer}];
    ForEachIndex(gather.box, [&](const Dims& index) {
      const int64_t to = At(gather.box, gather.to.offset, gather.to.strides, index);
      if (static_cast<int64_t>(arena.size()) <= to) arena.resize(to + 1, 0xffff);
      std::memcpy(&arena[to],
                  &source[At(gather.box, gather.from.offset, gather.from.strides, index) * 2], 2);
    });
  }
  for (const QuantTransform& step : plan.transforms) {
    if (step.side == QuantSide::kSender) {
      const std::vector<uint8_t>& source = memory[{step.from.process, step.from.buffer}];
      QuantizeAndWrite(job, step, source.data() + step.from.offset * 2, step.from.strides, memory);
    } else {
      std::vector<uint16_t>& arena = arenas[step.to.process];
      ASSERT_LE(step.from.offset + Volume(step.blocks), static_cast<int64_t>(arena.size()));
      QuantizeAndWrite(job, step, arena.data() + step.from.offset, step.from.strides, memory);
    }
  }
}

// Every rollout piece of a quantized parameter and of its scales equals the reference
// quantization of the whole source tensor (tensors[source parameter]), bit for bit; every piece
// of another parameter holds the source tensor's elements (ElementBits).
inline void ExpectMatchesReference(const Job& job, const std::vector<fp8_test::Tensor>& tensors,
                                   const Memory& memory) {
  const Layout& target = job.target();
  const QuantLinks& links = job.quant_links();
  std::map<int32_t, fp8_test::ReferenceFp8> refs;  // By quantized parameter.
  for (const Piece& piece : target.pieces) {
    const int32_t q =
        links.scale_of[piece.param] >= 0 ? piece.param : links.quantized_of[piece.param];
    const Dims& shape = target.params[piece.param].shape;
    const Dims strides = RowMajorStrides(shape);
    const std::vector<uint8_t>& bytes = memory.at({job.TargetId(piece.process), piece.buffer});
    const int32_t source = job.SourceParamOf(q < 0 ? piece.param : q);
    if (q >= 0 && !refs.contains(q)) {
      refs[q] = fp8_test::Reference(BlockingOf(target.params[q].quant), tensors[source]);
    }
    ForEachIndex(piece.box, [&](const Dims& index) {
      const int64_t flat = AddressOf(WholeBox(shape), 0, strides, index);
      const int64_t at = At(piece.box, piece.offset, piece.strides, index);
      const std::string where = target.params[piece.param].name + " " + DimsToString(index) +
                                " on process " + std::to_string(job.TargetId(piece.process));
      if (q < 0) {
        const int64_t size = DTypeSize(target.params[piece.param].dtype);
        uint32_t bits = 0;
        std::memcpy(&bits, &bytes[at * size], size);
        ASSERT_EQ(bits, ElementBits(tensors[source].bits[flat], size)) << "copied " << where;
      } else if (piece.param != q) {
        uint32_t bits;
        std::memcpy(&bits, &bytes[at * 4], 4);
        ASSERT_EQ(bits, fp8_test::Bits(refs[q].scales[flat])) << "scale " << where;
      } else {
        ASSERT_EQ(bytes[at], refs[q].fp8[flat]) << "e4m3 " << where;
      }
    });
  }
}

inline void ExpectMatchesReference(const Job& job, const fp8_test::Tensor& tensor,
                                   const Memory& memory) {
  ExpectMatchesReference(job, std::vector<fp8_test::Tensor>{tensor}, memory);
}

// Named layouts (planner/named_layouts.h): `model`, `source` -> `target`.
struct NamedSpec {
  const char* model;
  const char* source;
  const char* target;
};

// A job of named layouts and its first-holder plan; the errors of the layouts, the job or the plan.
struct NamedJob {
  Job job;
  Plan plan;
};
inline absl::StatusOr<NamedJob> MakeNamedJob(const NamedSpec& spec) {
  WSYNC_ASSIGN_OR_RETURN(const ModelSpec model, GetModel(spec.model));
  WSYNC_ASSIGN_OR_RETURN(const NamedJobLayouts layouts,
                         BuildNamedJobLayouts(model, spec.source, spec.target));
  WSYNC_ASSIGN_OR_RETURN(Job job, Job::Create(layouts.source, layouts.target));
  WSYNC_ASSIGN_OR_RETURN(Plan plan, MakePlan(job, *MakeFirstHolderPolicy()));
  return NamedJob{std::move(job), std::move(plan)};
}

// Random bf16 tensors (fp8_test::RandomTensor) for every source parameter of `job`, in order.
inline std::vector<fp8_test::Tensor> RandomSourceTensors(const Job& job, std::mt19937_64& rng) {
  std::vector<fp8_test::Tensor> tensors;
  for (const ParamInfo& param : job.source().params) {
    const Dims& shape = param.shape;
    const int64_t cols = shape.back();
    const int64_t rows = shape.size() >= 2 ? shape[shape.size() - 2] : 1;
    tensors.push_back(
        fp8_test::RandomTensor(rng, Volume(WholeBox(shape)) / (rows * cols), rows, cols));
  }
  return tensors;
}

}  // namespace wsync::quant_plan_test

#endif  // WSYNC_TESTS_UNIT_QUANT_PLAN_SUPPORT_H_
