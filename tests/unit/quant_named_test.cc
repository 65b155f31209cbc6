// FP8 named layouts (vllm(..., quant=...)), their validation, manifests, digests and wire bytes.

#include <string>

#include "common/checked_math.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/builders.h"
#include "planner/manifest_codec.h"
#include "planner/named_layouts.h"
#include "planner/named_quant.h"
#include "planner/policy.h"
#include "planner/quant_layout.h"
#include "planner/quant_plan.h"
#include "quant/fp8.h"

namespace wsync {
namespace {

using ::testing::HasSubstr;

const ParamInfo* FindParam(const Layout& layout, absl::string_view name) {
  for (const ParamInfo& param : layout.params) {
    if (param.name == name) return &param;
  }
  return nullptr;
}

ModelSpec Model(absl::string_view name) {
  absl::StatusOr<ModelSpec> model = GetModel(name);
  EXPECT_TRUE(model.ok()) << model.status();
  return *model;
}

struct Planned {
  Job job;
  Plan plan;
};
Planned PlanNamed(const ModelSpec& model, absl::string_view source, absl::string_view target) {
  absl::StatusOr<NamedJobLayouts> layouts = BuildNamedJobLayouts(model, source, target);
  EXPECT_TRUE(layouts.ok()) << layouts.status();
  absl::StatusOr<Job> job = Job::Create(layouts->source, layouts->target);
  EXPECT_TRUE(job.ok()) << job.status();
  absl::StatusOr<Plan> plan = MakePlan(*job, *MakeFirstHolderPolicy());
  EXPECT_TRUE(plan.ok()) << plan.status();
  return Planned{*std::move(job), *std::move(plan)};
}

TEST(QuantNamedTest, BlockQuantMakesWeightsFp8WithVllmScaleNames) {
  const ModelSpec model = Model("qwen2.5-tiny");
  absl::StatusOr<Layout> layout = BuildNamedLayout(model, "vllm(dp=2, quant=fp8_block)");
  ASSERT_TRUE(layout.ok()) << layout.status();
  const int64_t rows = model.quantization.weight_block_rows;  // 64 x 128 (models.cc).
  const int64_t cols = model.quantization.weight_block_cols;
  int quantized = 0;
  for (const TensorSpec& t : model.tensors) {
    const ParamInfo* param = FindParam(*layout, t.name);
    ASSERT_NE(param, nullptr) << t.name;
    const bool expected = *IsQuantizedParameter(model, t.name, WeightQuant::kFp8Block);
    EXPECT_EQ(param->quant.quantized(), expected) << t.name;
    if (!expected) {
      EXPECT_EQ(param->dtype, t.dtype) << t.name;
      continue;
    }
    ++quantized;
    EXPECT_EQ(param->dtype, DType::kFloat8E4M3);
    EXPECT_EQ(param->quant.scale_param, t.name + "_scale_inv");
    const ParamInfo* scale = FindParam(*layout, param->quant.scale_param);
    ASSERT_NE(scale, nullptr);
    EXPECT_EQ(scale->dtype, DType::kFloat32);
    EXPECT_EQ(scale->shape, (Dims{CeilDiv(t.shape[0], rows), CeilDiv(t.shape[1], cols)}));
  }
  EXPECT_GT(quantized, 4);
  EXPECT_FALSE(FindParam(*layout, "model.embed_tokens.weight")->quant.quantized());
  EXPECT_EQ(FindParam(*layout, "model.layers.0.self_attn.k_proj.weight_scale_inv")->shape,
            (Dims{1, 1}));
  EXPECT_EQ(FindParam(*layout, "model.layers.0.mlp.down_proj.weight_scale_inv")->shape,
            (Dims{2, 3}));  // [128, 320]: 320 columns end in a ragged block.
}

TEST(QuantNamedTest, ChannelAndTensorScalesAndExperts) {
  const ModelSpec model = Model("deepseek-v3-tiny");
  std::string expert;
  for (const TensorSpec& t : model.tensors) {
    if (t.shape.size() == 3) expert = t.name;
  }
  ASSERT_FALSE(expert.empty());
  const Dims shape = FindParam(*BuildNamedLayout(model, "vllm"), expert)->shape;
  const int64_t rows = model.quantization.weight_block_rows;  // 8 x 8 (models.cc).
  const int64_t cols = model.quantization.weight_block_cols;
  struct Case {
    const char* spec;
    const char* suffix;
    Dims scale;
  };
  const Case cases[] = {
      {"vllm(tp=2, ep=2, quant=fp8_block)",
       "_scale_inv",
       {shape[0], CeilDiv(shape[1], rows), CeilDiv(shape[2], cols)}},
      {"vllm(tp=2, quant=fp8_channel)", "_scale", {shape[0], shape[1], 1}},
      {"vllm(quant=fp8_tensor)", "_scale", {shape[0], 1, 1}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.spec);
    absl::StatusOr<Layout> layout = BuildNamedLayout(model, c.spec);
    ASSERT_TRUE(layout.ok()) << layout.status();
    const ParamInfo* scale = FindParam(*layout, expert + c.suffix);
    ASSERT_NE(scale, nullptr);
    EXPECT_EQ(scale->shape, c.scale);
    // The whole job plans and proves.
    const Planned planned = PlanNamed(model, "megatron(tp=2, ep=2, dp=2)", c.spec);
    EXPECT_FALSE(planned.plan.quant.transforms.empty());
  }
}

TEST(QuantNamedTest, SpecRefusals) {
  const ModelSpec model = Model("qwen2.5-tiny");
  EXPECT_THAT(BuildNamedLayout(model, "vllm(quant=fp9)").status().message(),
              HasSubstr("fp8_block"));
  EXPECT_THAT(BuildNamedLayout(model, "megatron(quant=fp8_block)").status().message(),
              HasSubstr("unknown key"));
  EXPECT_THAT(BuildNamedLayout(model, "vllm(quant=fp8_block, quant=none)").status().message(),
              HasSubstr("twice"));
  EXPECT_TRUE(BuildNamedLayout(model, "vllm(quant=none)").ok());
}

TEST(QuantNamedTest, DigestsCoverTheQuantization) {
  const ModelSpec model = Model("qwen2.5-tiny");
  const Planned none = PlanNamed(model, "megatron(tp=2)", "vllm(dp=2)");
  const Planned block = PlanNamed(model, "megatron(tp=2)", "vllm(dp=2, quant=fp8_block)");
  const Planned channel = PlanNamed(model, "megatron(tp=2)", "vllm(dp=2, quant=fp8_channel)");
  EXPECT_NE(none.job.layouts_digest(), block.job.layouts_digest());
  EXPECT_NE(block.job.layouts_digest(), channel.job.layouts_digest());
  EXPECT_NE(none.plan.digest, block.plan.digest);
  EXPECT_NE(block.plan.digest, channel.plan.digest);
  // Same inputs, same digest.
  EXPECT_EQ(block.plan.digest,
            PlanNamed(model, "megatron(tp=2)", "vllm(dp=2, quant=fp8_block)").plan.digest);
  // A layout whose block size differs (another process's build) differs too.
  absl::StatusOr<Layout> other = BuildNamedLayout(model, "vllm(dp=2, quant=fp8_block)");
  ASSERT_TRUE(other.ok());
  for (ParamInfo& param : other->params) {
    if (param.quant.quantized()) param.quant.block_cols = 64;
  }
  EXPECT_NE(LayoutsDigest(block.job.source(), block.job.target()),
            LayoutsDigest(block.job.source(), *other));
}

TEST(QuantNamedTest, ManifestCarriesTheQuantization) {
  const ModelSpec model = Model("qwen2.5-tiny");
  absl::StatusOr<Layout> layout = BuildNamedLayout(model, "vllm(tp=2, quant=fp8_channel)");
  ASSERT_TRUE(layout.ok());
  absl::StatusOr<Layout> decoded = ParseLayout(SerializeLayout(*layout));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  ASSERT_EQ(decoded->params.size(), layout->params.size());
  for (size_t i = 0; i < layout->params.size(); ++i) {
    EXPECT_EQ(decoded->params[i].quant, layout->params[i].quant) << layout->params[i].name;
    EXPECT_EQ(decoded->params[i].dtype, layout->params[i].dtype);
  }
}

TEST(QuantNamedTest, BlockFp8HalvesTheBytes) {
  const ModelSpec model = Model("qwen2.5-0.5b");
  const Planned planned = PlanNamed(model, "megatron", "vllm(quant=fp8_block)");
  const QuantWireBytes bytes = CountQuantWireBytes(planned.job, planned.plan.quant);
  // One trainer holds everything: every block is quantized by the sender.
  EXPECT_EQ(bytes.gathered, 0);
  EXPECT_GT(bytes.fp8, 0);
  EXPECT_LE(static_cast<double>(bytes.total()), 0.52 * static_cast<double>(bytes.unquantized));
  EXPECT_EQ(bytes.without_sender_quant, bytes.unquantized);
}

// Layouts that break the quantization rules are refused, naming the parameter.
TEST(QuantNamedTest, ValidationRefusals) {
  const ModelSpec model = Model("qwen2.5-tiny");
  absl::StatusOr<NamedJobLayouts> good =
      BuildNamedJobLayouts(model, "megatron(tp=2)", "vllm(dp=2, quant=fp8_block)");
  ASSERT_TRUE(good.ok());
  const std::string q = "model.layers.0.self_attn.q_proj.weight";
  auto param_of = [&](Layout& layout, const std::string& name) -> ParamInfo& {
    for (ParamInfo& param : layout.params) {
      if (param.name == name) return param;
    }
    return layout.params.front();
  };
  auto refused = [&](const Layout& source, const Layout& target) {
    absl::StatusOr<Job> job = Job::Create(source, target);
    EXPECT_FALSE(job.ok());
    return std::string(job.status().message());
  };
  {  // A trainer that quantizes.
    Layout source = good->source;
    param_of(source, q).quant = ParamQuant{128, 128, q + "_scale_inv"};
    EXPECT_THAT(refused(source, good->target), HasSubstr("only rollout layouts quantize"));
  }
  {  // A scale tensor of the wrong shape.
    Layout target = good->target;
    param_of(target, q + "_scale_inv").shape = {3, 1};  // q's 128 rows are 2 blocks.
    EXPECT_THAT(refused(good->source, target), HasSubstr("scale parameter"));
  }
  {  // A scale the layout does not declare.
    Layout target = good->target;
    param_of(target, q).quant.scale_param = "nowhere";
    EXPECT_THAT(refused(good->source, target), HasSubstr("does not declare"));
  }
  {  // An FP8 parameter whose trainer side is not bf16 or fp32.
    Layout source = good->source;
    param_of(source, q).dtype = DType::kFloat16;
    EXPECT_THAT(refused(source, good->target), HasSubstr("from bf16 or fp32"));
  }
  {  // A process missing its scale piece.
    Layout target = good->target;
    int32_t scale_index = -1;
    for (size_t i = 0; i < target.params.size(); ++i) {
      if (target.params[i].name == q + "_scale_inv") scale_index = static_cast<int32_t>(i);
    }
    std::erase_if(target.pieces, [&](const Piece& piece) {
      return piece.param == scale_index && piece.process == 1;
    });
    EXPECT_THAT(refused(good->source, target), HasSubstr("none holds them"));
  }
  {  // The trainer declaring a scale parameter.
    Layout source = good->source;
    source.params.push_back(ParamInfo{q + "_scale_inv", DType::kFloat32, {1, 1}, ParamQuant{}, 0});
    EXPECT_FALSE(Job::Create(source, good->target).ok());
  }
}

}  // namespace
}  // namespace wsync
