#include "planner/named_layouts.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "common/checked_math.h"
#include "common/dtype.h"
#include "common/status.h"
#include "planner/builders.h"
#include "planner/geometry.h"
#include "planner/layout_spec.h"
#include "planner/named_quant.h"
#include "planner/packed_buffers.h"
#include "planner/quant_layout.h"

namespace wsync {
namespace {

// vLLM's VocabParallelEmbedding pads the vocabulary to a multiple of this
// (DEFAULT_VOCAB_PADDING_SIZE).
constexpr int64_t kVllmVocabPadding = 64;
// Megatron pads the vocabulary to a multiple of this times tp (make-vocab-size-divisible-by).
constexpr int64_t kMegatronVocabPadding = 128;

// ---------------------------------------------------------------------------------------------
// Shared by the three layouts.

bool IsExpert(const TensorSpec& t) {
  return t.role == ShardRole::kExpertColumn || t.role == ShardRole::kExpertRow;
}

// The axis that tensor parallelism splits, or -1 when the tensor is whole on every TP rank:
// replicated tensors, and expert tensors when expert parallelism splits the expert axis instead.
int TpAxis(const TensorSpec& t, bool expert_parallel) {
  switch (t.role) {
    case ShardRole::kColumn:
    case ShardRole::kVocab:
      return 0;
    case ShardRole::kRow:
      return 1;
    case ShardRole::kExpertColumn:
      return expert_parallel ? -1 : 1;
    case ShardRole::kExpertRow:
      return expert_parallel ? -1 : 2;
    case ShardRole::kReplicated:
      break;
  }
  return -1;
}

// The box of a non-vocabulary tensor held by TP rank `tp_rank` of `tp` and EP rank `ep_rank` of
// `ep`: ep > 1 splits the expert axis and keeps experts whole.
Box ShardBox(const TensorSpec& t, int32_t tp, int32_t tp_rank, int32_t ep, int32_t ep_rank) {
  if (IsExpert(t) && ep > 1) return SplitBox(t.shape, 0, ep, ep_rank);
  const int axis = TpAxis(t, ep > 1);
  return axis < 0 ? WholeBox(t.shape) : SplitBox(t.shape, axis, tp, tp_rank);
}

// Checks that tp divides the axis TP splits (the vocabulary is padded instead).
absl::Status CheckTpSplit(const TensorSpec& t, int32_t tp, int32_t ep,
                          absl::string_view framework) {
  const int axis = TpAxis(t, ep > 1);
  if (axis < 0 || t.role == ShardRole::kVocab || t.shape[axis] % tp == 0) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(framework, ": tp=", tp, " does not divide axis ",
                                                 axis, " (", t.shape[axis], ") of ", t.name));
}

// The facts the layouts index by: layers in [-2, num_layers), the axes a role cuts, a valid dtype,
// head counts of fused qkv parts.
absl::Status CheckModel(const ModelSpec& model) {
  for (const TensorSpec& t : model.tensors) {
    int min_rank = 0;
    switch (t.role) {
      case ShardRole::kReplicated:
        break;
      case ShardRole::kColumn:
        min_rank = 1;
        break;
      case ShardRole::kRow:
      case ShardRole::kVocab:
        min_rank = 2;
        break;
      case ShardRole::kExpertColumn:
      case ShardRole::kExpertRow:
        min_rank = 3;
        break;
    }
    const int rank = static_cast<int>(t.shape.size());
    if (t.layer < -2 || t.layer >= model.num_layers || rank < min_rank || rank > kMaxAxes ||
        !IsValidDType(static_cast<int>(t.dtype))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model ", model.name, ": tensor ", t.name, " of layer ", t.layer, " and shape ",
          DimsToString(t.shape), " (", DTypeName(t.dtype), ") does not fit its role"));
    }
    if (t.fuse == FuseKind::kQkv && (t.heads <= 0 || t.shape[0] % t.heads != 0)) {
      return absl::InvalidArgumentError(absl::StrCat("model ", model.name, ": qkv part ", t.name,
                                                     " has ", t.heads, " heads for ", t.shape[0],
                                                     " rows"));
    }
  }
  return absl::OkStatus();
}

// Checks ep against the model: ep > 1 needs routed experts, at least ep of them, and, when
// `even` (Megatron), a count ep divides. vLLM splits any count (SplitRange: the first E % ep EP
// ranks hold one expert more, as its determine_expert_map's linear placement does).
absl::Status CheckExperts(const ModelSpec& model, int32_t ep, absl::string_view framework,
                          bool even) {
  if (ep == 1) return absl::OkStatus();
  const auto expert = std::find_if(model.tensors.begin(), model.tensors.end(), IsExpert);
  if (expert == model.tensors.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat(framework, ": ep=", ep, " needs routed experts; ", model.name, " has none"));
  }
  if (expert->shape[0] < ep) {
    return absl::InvalidArgumentError(absl::StrCat(framework, ": ep=", ep, " exceeds the ",
                                                   expert->shape[0], " experts of ", model.name));
  }
  if (even && expert->shape[0] % ep != 0) {
    return absl::InvalidArgumentError(absl::StrCat(framework, ": ep=", ep, " does not divide the ",
                                                   expert->shape[0], " experts of ", model.name));
  }
  return absl::OkStatus();
}

void AddProcesses(LayoutBuilder& builder, int64_t count, const NamedLayoutOptions& options,
                  absl::string_view default_prefix) {
  const std::string prefix = options.colocated             ? std::string(kColocatedNodePrefix)
                             : options.node_prefix.empty() ? std::string(default_prefix)
                                                           : options.node_prefix;
  for (int64_t p = 0; p < count; ++p) {
    // Colocated engines put rank r on GPU r % ppn of its node; separate nodes say nothing of GPUs.
    const int32_t device =
        options.colocated ? static_cast<int32_t>(p % options.procs_per_node) : kUnknownDevice;
    builder.AddProcess(absl::StrCat(prefix, p / options.procs_per_node), device);
  }
}

// Registers every tensor of the model as a parameter; parameter i is tensor i.
void AddParams(LayoutBuilder& builder, const ModelSpec& model) {
  builder.mutable_layout().params.reserve(model.tensors.size());
  for (const TensorSpec& tensor : model.tensors) {
    builder.AddParam(tensor.name, tensor.dtype, tensor.shape);
  }
}

// Rows [begin, begin + size) of a vocabulary of `vocab` rows padded to a multiple of `multiple`
// that TP rank `rank` of `tp` holds, and the padded rows each rank's buffer reserves.
struct VocabShard {
  int64_t begin = 0;
  int64_t size = 0;
  int64_t reserved_rows = 0;
};
VocabShard ShardVocab(int64_t vocab, int64_t multiple, int32_t tp, int32_t rank) {
  VocabShard shard;
  shard.reserved_rows = RoundUp(vocab, multiple) / tp;
  shard.begin = rank * shard.reserved_rows;
  shard.size = std::clamp<int64_t>(vocab - shard.begin, 0, shard.reserved_rows);
  return shard;
}

Box VocabBox(const TensorSpec& tensor, const VocabShard& shard) {
  Box box = WholeBox(tensor.shape);
  box.origin[0] = shard.begin;
  box.extent[0] = shard.size;
  return box;
}

// ---------------------------------------------------------------------------------------------
// megatron(tp, pp, ep, dp)

struct MegatronConfig {
  int32_t tp = 1;
  int32_t pp = 1;
  int32_t ep = 1;
  int32_t dp = 1;
};

absl::Status CheckMegatron(const ModelSpec& model, const MegatronConfig& c) {
  if (c.pp > model.num_layers) {
    return absl::InvalidArgumentError(absl::StrCat("megatron: pp=", c.pp, " exceeds the ",
                                                   model.num_layers, " layers of ", model.name));
  }
  if (c.dp % c.ep != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("megatron: ep=", c.ep, " does not divide dp=", c.dp));
  }
  WSYNC_RETURN_IF_ERROR(CheckExperts(model, c.ep, "megatron", /*even=*/true));
  for (const TensorSpec& t : model.tensors) {
    if (t.heads > 0 && t.heads % c.tp != 0) {
      return absl::InvalidArgumentError(absl::StrCat("megatron: tp=", c.tp, " does not divide the ",
                                                     t.heads, " heads of ", t.name));
    }
    WSYNC_RETURN_IF_ERROR(CheckTpSplit(t, c.tp, c.ep, "megatron"));
  }
  return absl::OkStatus();
}

Layout BuildMegatron(const ModelSpec& model, const MegatronConfig& c,
                     const NamedLayoutOptions& options) {
  LayoutBuilder builder(Role::kTrainer);
  const int64_t processes = int64_t{c.tp} * c.pp * c.dp;
  AddProcesses(builder, processes, options, "trainer-node");
  AddParams(builder, model);

  // Tensors of each stage, in model order; a tied embedding also sits on the last stage.
  std::vector<int32_t> stage_of_layer(model.num_layers);
  for (int32_t s = 0; s < c.pp; ++s) {
    const Range layers = SplitRange(model.num_layers, c.pp, s);
    for (int64_t l = layers.begin; l < layers.begin + layers.size; ++l) stage_of_layer[l] = s;
  }
  std::vector<std::vector<int32_t>> stage_tensors(c.pp);
  for (int32_t i = 0; i < static_cast<int32_t>(model.tensors.size()); ++i) {
    const int32_t layer = model.tensors[i].layer;
    const int32_t stage = layer >= 0 ? stage_of_layer[layer] : (layer == -1 ? 0 : c.pp - 1);
    stage_tensors[stage].push_back(i);
  }
  if (model.tied_embeddings && c.pp > 1) {
    for (int32_t i = 0; i < static_cast<int32_t>(model.tensors.size()); ++i) {
      if (model.tensors[i].role == ShardRole::kVocab) stage_tensors[c.pp - 1].push_back(i);
    }
  }

  builder.mutable_layout().pieces.reserve(processes * (model.tensors.size() / c.pp + 2));
  PackedBuffers buffers(builder, options.memory);
  for (int32_t p = 0; p < processes; ++p) {
    const int32_t tp_rank = p % c.tp;
    const int32_t dp_rank = (p / c.tp) % c.dp;
    const int32_t stage = p / (c.tp * c.dp);
    const int32_t ep_rank = dp_rank % c.ep;
    buffers.Begin(p);
    for (int32_t i : stage_tensors[stage]) {
      const TensorSpec& t = model.tensors[i];
      if (t.role == ShardRole::kVocab) {
        const VocabShard shard =
            ShardVocab(t.shape[0], kMegatronVocabPadding * c.tp, c.tp, tp_rank);
        buffers.Place(i, t.dtype, VocabBox(t, shard), shard.reserved_rows * t.shape[1]);
        continue;
      }
      const Box box = ShardBox(t, c.tp, tp_rank, c.ep, ep_rank);
      buffers.Place(i, t.dtype, box, Volume(box));
    }
  }
  buffers.Finish();
  return std::move(builder).Build();
}

// ---------------------------------------------------------------------------------------------
// vllm(tp, ep, dp)

struct VllmConfig {
  int32_t tp = 1;
  int32_t ep = 1;
  int32_t dp = 1;
  WeightQuant quant = WeightQuant::kNone;
};

// Wide expert parallelism: the routed experts spread over every rank of every DP replica.
bool IsWideEp(const VllmConfig& c) { return c.ep > 1 && c.ep == int64_t{c.tp} * c.dp; }

absl::Status CheckVllm(const ModelSpec& model, const VllmConfig& c) {
  if (c.ep != 1 && c.ep != c.tp && !IsWideEp(c)) {
    return absl::InvalidArgumentError(absl::StrCat("vllm: ep=", c.ep, " must be 1, tp=", c.tp,
                                                   " (per replica) or tp*dp=", int64_t{c.tp} * c.dp,
                                                   " (wide)"));
  }
  WSYNC_RETURN_IF_ERROR(CheckExperts(model, c.ep, "vllm", /*even=*/false));
  for (const TensorSpec& t : model.tensors) {
    if (t.fuse == FuseKind::kQkv && t.fuse_index > 0) {
      // GQA: kv heads are split when there are at least tp of them, else each is replicated over
      // tp / kv_heads ranks.
      if (t.heads >= c.tp ? t.heads % c.tp != 0 : c.tp % t.heads != 0) {
        return absl::InvalidArgumentError(absl::StrCat("vllm: tp=", c.tp, " and the ", t.heads,
                                                       " kv heads of ", t.name,
                                                       " do not divide one another"));
      }
      continue;
    }
    if (t.heads > 0 && t.heads < c.tp) {
      return absl::InvalidArgumentError(
          absl::StrCat("vllm: tp=", c.tp, " exceeds the ", t.heads, " heads of ", t.name));
    }
    if (t.role == ShardRole::kVocab && RoundUp(t.shape[0], kVllmVocabPadding) % c.tp != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("vllm: tp=", c.tp, " does not divide the padded vocabulary (",
                       RoundUp(t.shape[0], kVllmVocabPadding), " rows) of ", t.name));
    }
    WSYNC_RETURN_IF_ERROR(CheckTpSplit(t, c.tp, c.ep, "vllm"));
  }
  return absl::OkStatus();
}

// A module tensor of the engine: one buffer holding one tensor or several fused parts.
struct Module {
  std::vector<int32_t> parts;  // Tensor indices in fuse_index order.
  int axis = 0;                // Axis along which the parts are concatenated.
};

std::vector<Module> VllmModules(const ModelSpec& model) {
  std::vector<Module> modules;
  absl::flat_hash_map<absl::string_view, size_t> fused;  // fused_name -> index in modules.
  for (int32_t i = 0; i < static_cast<int32_t>(model.tensors.size()); ++i) {
    const TensorSpec& t = model.tensors[i];
    if (t.fuse == FuseKind::kNone) {
      modules.push_back(Module{{i}, 0});
      continue;
    }
    const auto [it, inserted] = fused.try_emplace(t.fused_name, modules.size());
    if (inserted) modules.push_back(Module{{}, t.fuse == FuseKind::kExpertW13 ? 1 : 0});
    modules[it->second].parts.push_back(i);
  }
  for (Module& module : modules) {
    std::sort(module.parts.begin(), module.parts.end(), [&](int32_t a, int32_t b) {
      return model.tensors[a].fuse_index < model.tensors[b].fuse_index;
    });
  }
  return modules;
}

// The box of non-vocabulary tensor `t` that process `rank` (DP replica rank / tp, TP rank
// rank % tp) holds. The EP rank is the TP rank when ep == tp, and the process rank itself
// (dp_rank * tp + tp_rank) when ep == tp * dp. A kv head is replicated over tp / kv_heads ranks
// when kv_heads < tp.
Box VllmBox(const TensorSpec& t, const VllmConfig& c, int32_t rank) {
  const int32_t tp_rank = rank % c.tp;
  if (t.fuse == FuseKind::kQkv && t.fuse_index > 0 && t.heads < c.tp) {
    const int64_t head = int64_t{tp_rank} * t.heads / c.tp;
    const int64_t head_dim = t.shape[0] / t.heads;
    Box box = WholeBox(t.shape);
    box.origin[0] = head * head_dim;
    box.extent[0] = head_dim;
    return box;
  }
  return ShardBox(t, c.tp, tp_rank, c.ep, IsWideEp(c) ? rank : tp_rank);
}

// vLLM's block-FP8 partition rule (CheckVllmBlockPartitions) for every module of `c`.
absl::Status CheckVllmBlocks(const ModelSpec& model, const VllmConfig& c) {
  if (c.quant != WeightQuant::kFp8Block) return absl::OkStatus();
  for (const Module& module : VllmModules(model)) {
    WSYNC_RETURN_IF_ERROR(
        CheckVllmBlockPartitions(model, c.quant, c.tp, module.parts,
                                 [&](int32_t i) { return VllmBox(model.tensors[i], c, 0); }));
  }
  return absl::OkStatus();
}

// CheckVllm and CheckVllmBlocks; a block refusal names the layouts of as many processes that vLLM
// serves: experts kept whole (ep) or a smaller tp with more DP replicas.
absl::Status CheckVllmWithBlocks(const ModelSpec& model, const VllmConfig& c) {
  WSYNC_RETURN_IF_ERROR(CheckVllm(model, c));
  const absl::Status blocks = CheckVllmBlocks(model, c);
  if (blocks.ok()) return blocks;
  std::vector<std::string> works;
  auto consider = [&](const VllmConfig& other) {
    if (CheckVllm(model, other).ok() && CheckVllmBlocks(model, other).ok()) {
      works.push_back(absl::StrCat("vllm(tp=", other.tp, ",ep=", other.ep, ",dp=", other.dp,
                                   ",quant=fp8_block)"));
    }
  };
  if (c.ep == 1 && c.tp > 1) consider(VllmConfig{c.tp, c.tp, c.dp, c.quant});
  for (int32_t tp = c.tp / 2; tp >= 1 && works.size() < 2; --tp) {
    if (c.tp % tp != 0) continue;
    const int32_t dp = c.dp * (c.tp / tp);
    consider(VllmConfig{tp, c.ep == 1 ? 1 : (IsWideEp(c) ? tp * dp : tp), dp, c.quant});
  }
  return absl::InvalidArgumentError(
      absl::StrCat(blocks.message(), "; ",
                   works.empty() ? "no vllm layout of as many processes is whole blocks"
                                 : absl::StrCat("whole blocks: ", absl::StrJoin(works, " or ")),
                   "; fp8_channel and fp8_tensor have no such rule"));
}

// The scales of an FP8 module on process `p`: one fp32 buffer, the parts' scale boxes (of their
// whole-block boxes) concatenated along the module's axis (named_quant.h).
void AddVllmScales(LayoutBuilder& builder, const ModelSpec& model, const VllmConfig& c,
                   const Module& module, const std::vector<int32_t>& scale_of, int32_t p) {
  std::vector<std::pair<int32_t, Box>> scale_parts;
  for (int32_t i : module.parts) {
    const ParamInfo& param = builder.layout().params[i];
    const Dims blocks = QuantBlockDims(param.quant, static_cast<int>(param.shape.size()));
    const Box box = VllmBox(model.tensors[i], c, p);
    scale_parts.emplace_back(
        scale_of[i], ScaleBox(blocks, param.shape, WholeBlockBox(blocks, param.shape, box)));
  }
  const MemoryKind kind = builder.layout().buffers.back().kind;
  const uint64_t buffer = builder.AddBuffer(p, 0, kind);
  const int64_t elements = builder.AddFusedPieces(scale_parts, module.axis, p, buffer, 0);
  builder.mutable_layout().buffers.back().bytes = elements * DTypeSize(DType::kFloat32);
}

absl::StatusOr<Layout> BuildVllm(const ModelSpec& model, const VllmConfig& c,
                                 const NamedLayoutOptions& options) {
  LayoutBuilder builder(Role::kRollout);
  const int64_t processes = int64_t{c.tp} * c.dp;
  AddProcesses(builder, processes, options, "rollout-node");
  AddParams(builder, model);
  WSYNC_ASSIGN_OR_RETURN(const std::vector<int32_t> scale_of,
                         AddQuantParams(builder, model, c.quant));
  const std::vector<Module> modules = VllmModules(model);
  builder.mutable_layout().buffers.reserve(processes * modules.size());
  builder.mutable_layout().pieces.reserve(processes * model.tensors.size());

  std::vector<std::pair<int32_t, Box>> parts;
  for (int32_t p = 0; p < processes; ++p) {
    const int32_t tp_rank = p % c.tp;
    for (const Module& module : modules) {
      const TensorSpec& first = model.tensors[module.parts.front()];
      const uint64_t buffer = builder.AddBuffer(p, 0, options.memory);
      int64_t elements = 0;
      if (first.role == ShardRole::kVocab) {
        const VocabShard shard = ShardVocab(first.shape[0], kVllmVocabPadding, c.tp, tp_rank);
        const Box box = VocabBox(first, shard);
        if (shard.size > 0) builder.AddPackedPiece(module.parts.front(), p, buffer, box, 0);
        elements = shard.reserved_rows * first.shape[1];
      } else if (module.parts.size() == 1) {
        elements = builder.AddPackedPiece(module.parts.front(), p, buffer, VllmBox(first, c, p), 0);
      } else {
        parts.clear();
        for (int32_t i : module.parts) parts.emplace_back(i, VllmBox(model.tensors[i], c, p));
        elements = builder.AddFusedPieces(parts, module.axis, p, buffer, 0);
      }
      const DType dtype = builder.layout().params[module.parts.front()].dtype;
      builder.mutable_layout().buffers.back().bytes = elements * DTypeSize(dtype);
      if (scale_of[module.parts.front()] >= 0)
        AddVllmScales(builder, model, c, module, scale_of, p);
    }
  }
  return std::move(builder).Build();
}

// ---------------------------------------------------------------------------------------------
// fsdp(n)

Layout BuildFsdp(const ModelSpec& model, int32_t n, const NamedLayoutOptions& options) {
  LayoutBuilder builder(Role::kTrainer);
  AddProcesses(builder, n, options, "trainer-node");
  AddParams(builder, model);
  PackedBuffers buffers(builder, options.memory);
  for (int32_t r = 0; r < n; ++r) {
    buffers.Begin(r);
    for (int32_t i = 0; i < static_cast<int32_t>(model.tensors.size()); ++i) {
      const TensorSpec& t = model.tensors[i];
      const int64_t numel = Volume(t.shape);
      const int64_t chunk = CeilDiv(numel, n);
      const int64_t begin = std::min(r * chunk, numel);
      const int64_t end = std::min(begin + chunk, numel);
      buffers.PlaceFlat(i, t.dtype, begin, end, chunk);
    }
  }
  buffers.Finish();
  return std::move(builder).Build();
}

}  // namespace

absl::StatusOr<NamedPlacement> ParseNamedPlacement(absl::string_view spec) {
  WSYNC_ASSIGN_OR_RETURN(const NamedSpec parsed, ParseNamedSpec(spec));
  return NamedSpecPlacement(parsed);
}

absl::StatusOr<Layout> BuildNamedLayout(const ModelSpec& model, absl::string_view spec,
                                        const NamedLayoutOptions& given) {
  WSYNC_ASSIGN_OR_RETURN(const NamedSpec parsed, ParseNamedSpec(spec));
  NamedLayoutOptions options = given;
  const NamedPlacement placement = NamedSpecPlacement(parsed);
  options.procs_per_node = placement.procs_per_node.value_or(options.procs_per_node);
  options.colocated = placement.colocated.value_or(options.colocated);
  if (options.procs_per_node <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("procs_per_node must be positive, got ", options.procs_per_node));
  }
  WSYNC_RETURN_IF_ERROR(CheckModel(model));
  auto get = [&](absl::string_view key, int64_t fallback) {
    return static_cast<int32_t>(parsed.Get(key).value_or(fallback));
  };
  auto check_processes = [&](int64_t processes) -> absl::Status {
    if (processes <= kMaxNamedProcesses) return absl::OkStatus();
    return NamedSpecError(spec, absl::StrCat(processes, " processes exceed ", kMaxNamedProcesses));
  };
  if (parsed.kind == "megatron") {
    MegatronConfig c;
    c.tp = get("tp", 1);
    c.pp = get("pp", 1);
    c.ep = get("ep", 1);
    c.dp = get("dp", c.ep);
    WSYNC_RETURN_IF_ERROR(check_processes(int64_t{c.tp} * c.pp * c.dp));
    WSYNC_RETURN_IF_ERROR(CheckMegatron(model, c));
    return BuildMegatron(model, c, options);
  }
  if (parsed.kind == "vllm") {
    VllmConfig c;
    c.tp = get("tp", 1);
    c.ep = get("ep", 1);
    c.dp = get("dp", 1);
    c.quant = parsed.quant;
    WSYNC_RETURN_IF_ERROR(check_processes(int64_t{c.tp} * c.dp));
    WSYNC_RETURN_IF_ERROR(CheckVllmWithBlocks(model, c));
    return BuildVllm(model, c, options);
  }
  return BuildFsdp(model, get("n", 1), options);
}

absl::StatusOr<NamedJobLayouts> BuildNamedJobLayouts(const ModelSpec& model,
                                                     absl::string_view source_spec,
                                                     absl::string_view target_spec,
                                                     const NamedLayoutOptions& options) {
  WSYNC_ASSIGN_OR_RETURN(const NamedPlacement source, ParseNamedPlacement(source_spec));
  WSYNC_ASSIGN_OR_RETURN(const NamedPlacement target, ParseNamedPlacement(target_spec));
  if (source.colocated.has_value() && target.colocated.has_value() &&
      *source.colocated != *target.colocated) {
    return absl::InvalidArgumentError(absl::StrCat("layouts \"", source_spec, "\" and \"",
                                                   target_spec, "\" disagree on colocated"));
  }
  NamedLayoutOptions both = options;
  both.colocated = source.colocated.value_or(target.colocated.value_or(options.colocated));
  if (both.colocated) {
    // Rank r of each side on node r / ppn, GPU r % ppn: one ppn for both sides.
    if (source.procs_per_node && target.procs_per_node &&
        *source.procs_per_node != *target.procs_per_node) {
      return absl::InvalidArgumentError(absl::StrCat(
          "colocated layouts \"", source_spec, "\" and \"", target_spec,
          "\" need the same ppn, got ", *source.procs_per_node, " and ", *target.procs_per_node));
    }
    both.procs_per_node =
        source.procs_per_node.value_or(target.procs_per_node.value_or(options.procs_per_node));
  }
  NamedJobLayouts pair;
  WSYNC_ASSIGN_OR_RETURN(pair.source, BuildNamedLayout(model, source_spec, both));
  WSYNC_ASSIGN_OR_RETURN(pair.target, BuildNamedLayout(model, target_spec, both));
  return pair;
}

}  // namespace wsync
