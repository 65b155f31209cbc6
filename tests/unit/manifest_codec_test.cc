#include "planner/manifest_codec.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/builders.h"
#include "planner/job.h"
#include "planner/layout_parts.h"
#include "planner/models.h"
#include "planner/named_layouts.h"
#include "planner/validate.h"
#include "quant/fp8.h"

namespace wsync {
namespace {

using ::testing::HasSubstr;

Layout Sample() {
  LayoutBuilder b(Role::kRollout);
  const int32_t q = b.AddParam("q", DType::kBFloat16, {4, 6});
  const int32_t k = b.AddParam("k", DType::kBFloat16, {2, 6});
  b.AddProcess("node-a");
  b.AddProcess("node-b");
  for (int p = 0; p < 2; ++p) {
    const uint64_t buffer =
        b.AddBuffer(p, 2 * (2 * 6 + 6), p == 0 ? MemoryKind::kHost : MemoryKind::kCuda);
    b.AddFusedPieces({{q, SplitBox({4, 6}, 0, 2, p)}, {k, SplitBox({2, 6}, 0, 2, p)}}, 0, p, buffer,
                     0);
  }
  return std::move(b).Build();
}

void ExpectSameLayout(const Layout& a, const Layout& b) {
  ASSERT_EQ(a.role, b.role);
  ASSERT_EQ(a.processes.size(), b.processes.size());
  for (size_t i = 0; i < a.processes.size(); ++i) {
    EXPECT_EQ(a.processes[i].rank, b.processes[i].rank);
    EXPECT_EQ(a.processes[i].node_id, b.processes[i].node_id);
  }
  ASSERT_EQ(a.buffers.size(), b.buffers.size());
  for (size_t i = 0; i < a.buffers.size(); ++i) {
    EXPECT_EQ(a.buffers[i].process, b.buffers[i].process);
    EXPECT_EQ(a.buffers[i].id, b.buffers[i].id);
    EXPECT_EQ(a.buffers[i].bytes, b.buffers[i].bytes);
    EXPECT_EQ(a.buffers[i].kind, b.buffers[i].kind);
  }
  ASSERT_EQ(a.params.size(), b.params.size());
  for (size_t i = 0; i < a.params.size(); ++i) {
    EXPECT_EQ(a.params[i].name, b.params[i].name);
    EXPECT_EQ(a.params[i].dtype, b.params[i].dtype);
    EXPECT_EQ(a.params[i].shape, b.params[i].shape);
  }
  ASSERT_EQ(a.pieces.size(), b.pieces.size());
  for (size_t i = 0; i < a.pieces.size(); ++i) {
    EXPECT_EQ(a.pieces[i].param, b.pieces[i].param);
    EXPECT_EQ(a.pieces[i].process, b.pieces[i].process);
    EXPECT_EQ(a.pieces[i].buffer, b.pieces[i].buffer);
    EXPECT_EQ(a.pieces[i].box, b.pieces[i].box);
    EXPECT_EQ(a.pieces[i].offset, b.pieces[i].offset);
    EXPECT_EQ(a.pieces[i].strides, b.pieces[i].strides);
  }
}

TEST(ManifestCodecTest, RoundTrips) {
  const Layout layout = Sample();
  ASSERT_TRUE(ValidateLayout(layout).ok());
  absl::StatusOr<Layout> decoded = ParseLayout(SerializeLayout(layout));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  ExpectSameLayout(layout, *decoded);
}

TEST(ManifestCodecTest, RefusesOtherSchemaVersion) {
  proto::Manifest manifest = ToManifest(Sample());
  manifest.set_schema_version(kManifestSchemaVersion + 1);
  EXPECT_THAT(std::string(FromManifest(manifest).status().message()),
              HasSubstr("schema version 2 is not supported"));
}

TEST(ManifestCodecTest, RefusesGarbageAndOversizedInput) {
  EXPECT_FALSE(ParseLayout("\xff\xff\xff garbage").ok());
  ManifestLimits limits;
  limits.max_bytes = 8;
  EXPECT_THAT(std::string(ParseLayout(SerializeLayout(Sample()), limits).status().message()),
              HasSubstr("exceeds the limit of 8"));
}

TEST(ManifestCodecTest, BoundsCountsAndAxes) {
  ManifestLimits limits;
  limits.max_pieces = 3;
  EXPECT_THAT(std::string(FromManifest(ToManifest(Sample()), limits).status().message()),
              HasSubstr("4 pieces, more than the limit of 3"));

  proto::Manifest manifest = ToManifest(Sample());
  for (int i = 0; i < 9; ++i) manifest.mutable_parameters(0)->add_shape(1);
  EXPECT_THAT(std::string(FromManifest(manifest).status().message()), HasSubstr("axes"));

  manifest = ToManifest(Sample());
  manifest.mutable_pieces(0)->add_strides(1);
  EXPECT_THAT(std::string(FromManifest(manifest).status().message()), HasSubstr("strides"));
}

TEST(ManifestCodecTest, RefusesBadEnums) {
  proto::Manifest manifest = ToManifest(Sample());
  manifest.set_role(proto::ROLE_UNSPECIFIED);
  EXPECT_THAT(std::string(FromManifest(manifest).status().message()), HasSubstr("role"));
  manifest = ToManifest(Sample());
  manifest.mutable_buffers(0)->set_kind(static_cast<proto::MemoryKind>(7));
  EXPECT_THAT(std::string(FromManifest(manifest).status().message()), HasSubstr("memory kind"));
  manifest = ToManifest(Sample());
  manifest.mutable_parameters(0)->set_dtype(99);
  EXPECT_THAT(std::string(FromManifest(manifest).status().message()), HasSubstr("invalid dtype"));
}

TEST(LayoutPartsTest, PartsSentOverTheWireMergeBackIntoTheSameJob) {
  const ModelSpec model = *GetModel("qwen2.5-0.5b");
  const Layout trainer = *BuildNamedLayout(model, "megatron(tp=2,dp=2)");
  const Layout rollout = *BuildNamedLayout(model, "vllm(tp=2)");
  auto reassemble = [](const Layout& layout) {
    std::vector<Layout> parts;
    // Arrival order differs from rank order.
    for (int32_t rank = static_cast<int32_t>(layout.processes.size()) - 1; rank >= 0; --rank) {
      parts.push_back(*ParseLayout(SerializeLayout(LayoutPart(layout, rank))));
    }
    return *MergeLayoutParts(parts);
  };
  const Job original = *Job::Create(trainer, rollout);
  absl::StatusOr<Job> merged = Job::Create(reassemble(trainer), reassemble(rollout));
  ASSERT_TRUE(merged.ok()) << merged.status();
  EXPECT_EQ(merged->layouts_digest(), original.layouts_digest());
}

TEST(LayoutPartsTest, RefusesConflictingParts) {
  Layout a = Sample();
  Layout b = LayoutPart(a, 1);
  a = LayoutPart(a, 0);
  b.params[0].shape = {4, 7};
  EXPECT_THAT(std::string(MergeLayoutParts({a, b}).status().message()),
              HasSubstr("parameter 'q' is bf16(4, 6) in the part of rollout rank 0 but "
                        "bf16(4, 7) in the part of rank 1"));
  b = LayoutPart(Sample(), 1);
  b.role = Role::kTrainer;
  EXPECT_THAT(std::string(MergeLayoutParts({a, b}).status().message()),
              HasSubstr("part 1 is a trainer layout"));
  EXPECT_THAT(std::string(MergeLayoutParts({Sample()}).status().message()),
              HasSubstr("lists 2 processes"));
}

TEST(LayoutPartsTest, RefusesPartsThatQuantizeAParameterDifferently) {
  Layout a = LayoutPart(Sample(), 0);
  Layout b = LayoutPart(Sample(), 1);
  a.params[0].quant = ParamQuant{128, 128, "q_scale_inv"};
  EXPECT_THAT(std::string(MergeLayoutParts({a, b}).status().message()),
              HasSubstr("parameter 'q' is quantized as fp8_e4m3 blocks 128 x 128, scales "
                        "'q_scale_inv' in the part of rollout rank 0 but as not quantized in the "
                        "part of rank 1"));
  b.params[0].quant = ParamQuant{1, quant::kWholeAxis, "q_scale_inv"};
  EXPECT_THAT(std::string(MergeLayoutParts({a, b}).status().message()),
              HasSubstr("but as fp8_e4m3 blocks 1 x all, scales 'q_scale_inv'"));
  b.params[0].quant = a.params[0].quant;
  EXPECT_TRUE(MergeLayoutParts({a, b}).ok());
}

}  // namespace
}  // namespace wsync
