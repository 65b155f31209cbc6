// LocalLayoutBuilder (plugin/local_layout.h) on its own, without a session: a layout built call by
// call, a manifest and a named layout cut to this rank, FP8 parameters and waves, rebinds, and
// every refusal, each leaving the layout as it was.

#include "plugin/local_layout.h"

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/layout_parts.h"
#include "planner/manifest_codec.h"
#include "planner/models.h"
#include "planner/named_layouts.h"

namespace wsync {
namespace {

using ::testing::HasSubstr;

constexpr char kModel[] = "qwen2.5-tiny";

// What a refused call must leave alone.
struct Snapshot {
  size_t buffers, params, pieces;
  std::vector<void*> addresses;
  int32_t cuda_device;
  std::string node_id;
};

Snapshot Take(const LocalLayoutBuilder& builder) {
  return {builder.part().buffers.size(), builder.part().params.size(), builder.part().pieces.size(),
          builder.buffer_addresses(),    builder.cuda_device(),        builder.node_id()};
}

void ExpectUnchanged(const LocalLayoutBuilder& builder, const Snapshot& before) {
  const Snapshot now = Take(builder);
  EXPECT_EQ(now.buffers, before.buffers);
  EXPECT_EQ(now.params, before.params);
  EXPECT_EQ(now.pieces, before.pieces);
  EXPECT_EQ(now.addresses, before.addresses);
  EXPECT_EQ(now.cuda_device, before.cuda_device);
  EXPECT_EQ(now.node_id, before.node_id);
}

// Expects `status` refused with InvalidArgument mentioning `text`.
void ExpectRefused(const absl::Status& status, const std::string& text) {
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr(text));
}

TEST(LocalLayoutBuilderTest, BuildsTheLayoutCallByCall) {
  LocalLayoutBuilder builder(Role::kTrainer, 1, "node-a", 3);
  ASSERT_EQ(builder.part().role, Role::kTrainer);
  ASSERT_EQ(builder.part().processes.size(), 1u);
  EXPECT_EQ(builder.part().processes[0].rank, 1);
  EXPECT_EQ(builder.part().processes[0].node_id, "node-a");
  EXPECT_EQ(builder.part().processes[0].device, 3);
  EXPECT_EQ(builder.cuda_device(), -1);

  std::vector<char> host(64), other(32);
  char* device_memory = reinterpret_cast<char*>(0x1000);  // Never read through.
  ASSERT_TRUE(builder.RegisterBuffer(7, host.data(), 64, MemoryKind::kHost, -5).ok());
  ASSERT_TRUE(builder.RegisterBuffer(9, device_memory, 128, MemoryKind::kCuda, 2).ok());
  ASSERT_TRUE(builder.RegisterBuffer(11, nullptr, 0, MemoryKind::kHost, 0).ok());
  ASSERT_TRUE(builder.DeclareParameter("w", DType::kBFloat16, {4, 8}).ok());
  ASSERT_TRUE(builder.DeclareParameter("b", DType::kFloat32, {8}).ok());
  ASSERT_TRUE(builder.DeclarePiece("b", 7, Box{{0}, {8}}, 0, {1}).ok());
  ASSERT_TRUE(builder.DeclarePiece("w", 9, Box{{0, 0}, {4, 8}}, 0, {8, 1}).ok());

  const Layout& part = builder.part();
  ASSERT_EQ(part.buffers.size(), 3u);
  EXPECT_EQ(part.buffers[0].id, 7u);
  EXPECT_EQ(part.buffers[0].process, 1);
  EXPECT_EQ(part.buffers[0].bytes, 64);
  EXPECT_EQ(part.buffers[1].kind, MemoryKind::kCuda);
  EXPECT_EQ(builder.buffer_addresses(), (std::vector<void*>{host.data(), device_memory, nullptr}));
  EXPECT_EQ(builder.cuda_device(), 2);
  ASSERT_EQ(part.params.size(), 2u);
  EXPECT_EQ(part.params[1].name, "b");
  ASSERT_EQ(part.pieces.size(), 2u);
  EXPECT_EQ(part.pieces[0].param, 1);  // "b": the index of its declaration.
  EXPECT_EQ(part.pieces[0].process, 1);
  EXPECT_EQ(part.pieces[1].param, 0);
  EXPECT_EQ(part.pieces[1].buffer, 9u);
  EXPECT_EQ(part.pieces[1].strides, (Dims{8, 1}));

  // A rebind moves the address of the buffer it names only.
  ASSERT_TRUE(builder.RebindAddress(7, other.data()).ok());
  EXPECT_EQ(builder.buffer_addresses(), (std::vector<void*>{other.data(), device_memory, nullptr}));
  const Snapshot before = Take(builder);
  ExpectRefused(builder.RebindAddress(8, host.data()), "buffer 8");
  ExpectUnchanged(builder, before);
}

TEST(LocalLayoutBuilderTest, RefusesBuffersAndPiecesItCannotTake) {
  LocalLayoutBuilder builder(Role::kRollout, 0, "node", kUnknownDevice);
  std::vector<char> host(16);
  char* device_memory = reinterpret_cast<char*>(0x2000);
  ASSERT_TRUE(builder.RegisterBuffer(1, host.data(), 16, MemoryKind::kHost, 0).ok());
  ASSERT_TRUE(builder.RegisterBuffer(2, device_memory, 16, MemoryKind::kCuda, 0).ok());
  ASSERT_TRUE(builder.DeclareParameter("p", DType::kBFloat16, {8}).ok());
  const Snapshot before = Take(builder);

  ExpectRefused(builder.RegisterBuffer(1, host.data(), 16, MemoryKind::kHost, 0),
                "buffer 1 is registered twice");
  ExpectRefused(builder.RegisterBuffer(3, nullptr, 16, MemoryKind::kHost, 0),
                "buffer 3 has no address");
  ExpectRefused(builder.RegisterBuffer(4, device_memory, 16, MemoryKind::kCuda, -1),
                "needs a device ordinal");
  ExpectRefused(builder.RegisterBuffer(5, device_memory, 16, MemoryKind::kCuda, 1),
                "one process uses one device");
  ExpectRefused(builder.RegisterBuffer(6, host.data(), 16, static_cast<MemoryKind>(77), 0),
                "unknown memory kind");
  ExpectRefused(builder.DeclareParameter("p", DType::kFloat32, {2}), "declared twice");
  ExpectRefused(builder.DeclarePiece("q", 1, Box{{0}, {8}}, 0, {1}),
                "piece of undeclared parameter 'q'");
  ExpectUnchanged(builder, before);
  EXPECT_EQ(builder.cuda_device(), 0);
}

TEST(LocalLayoutBuilderTest, Fp8ParametersAndTheirRefusals) {
  const ParamQuant quant{128, 128, "w_scale"};
  LocalLayoutBuilder trainer(Role::kTrainer, 0, "node", kUnknownDevice);
  ASSERT_TRUE(trainer.DeclareParameter("w", DType::kFloat8E4M3, {256, 256}).ok());
  ExpectRefused(trainer.DeclareFp8Parameter("w", quant, DType::kFloat32, {2, 2}),
                "a trainer holds its parameters unquantized");

  LocalLayoutBuilder builder(Role::kRollout, 0, "node", kUnknownDevice);
  ASSERT_TRUE(builder.DeclareParameter("w", DType::kFloat8E4M3, {256, 256}).ok());
  ASSERT_TRUE(builder.DeclareParameter("bf", DType::kBFloat16, {256, 256}).ok());
  ASSERT_TRUE(builder.DeclareParameter("flat", DType::kFloat8E4M3, {256}).ok());
  const Snapshot before = Take(builder);
  ExpectRefused(builder.DeclareFp8Parameter("x", quant, DType::kFloat32, {2, 2}), "not declared");
  ExpectRefused(builder.DeclareFp8Parameter("bf", {128, 128, "bf_scale"}, DType::kFloat32, {2, 2}),
                "not fp8_e4m3");
  ExpectRefused(builder.DeclareFp8Parameter("flat", {128, 128, "f_scale"}, DType::kFloat32, {2}),
                "has 1 axes");
  ExpectRefused(builder.DeclareFp8Parameter("w", {0, 128, "w_scale"}, DType::kFloat32, {2, 2}),
                "both must be at least 1");
  ExpectRefused(builder.DeclareFp8Parameter("w", {128, 128, ""}, DType::kFloat32, {2, 2}),
                "needs a name of its own");
  ExpectRefused(builder.DeclareFp8Parameter("w", {128, 128, "bf"}, DType::kFloat32, {2, 2}),
                "already declared as a parameter");
  ExpectRefused(builder.DeclareFp8Parameter("w", quant, DType::kBFloat16, {2, 2}),
                "scales are fp32");
  ExpectRefused(builder.DeclareFp8Parameter("w", quant, DType::kFloat32, {3, 2}), "need (2, 2)");
  ExpectUnchanged(builder, before);

  ASSERT_TRUE(builder.DeclareFp8Parameter("w", quant, DType::kFloat32, {2, 2}).ok());
  ASSERT_EQ(builder.part().params.size(), 4u);
  EXPECT_EQ(builder.part().params[0].quant, quant);
  EXPECT_EQ(builder.part().params[3].name, "w_scale");
  EXPECT_EQ(builder.part().params[3].dtype, DType::kFloat32);
  EXPECT_EQ(builder.part().params[3].shape, (Dims{2, 2}));
  ExpectRefused(builder.DeclareFp8Parameter("w", {128, 128, "w_s2"}, DType::kFloat32, {2, 2}),
                "declared FP8 twice");
  ExpectRefused(builder.DeclareFp8Parameter("w_scale", quant, DType::kFloat32, {2, 2}),
                "is the scale tensor of 'w'");
}

TEST(LocalLayoutBuilderTest, WavesAndTheirRefusals) {
  LocalLayoutBuilder trainer(Role::kTrainer, 0, "node", kUnknownDevice);
  ASSERT_TRUE(trainer.DeclareParameter("p", DType::kBFloat16, {8}).ok());
  ExpectRefused(trainer.SetParameterWave("p", 1), "waves are the rollouts'");

  LocalLayoutBuilder builder(Role::kRollout, 0, "node", kUnknownDevice);
  ASSERT_TRUE(builder.DeclareParameter("p", DType::kBFloat16, {8}).ok());
  ASSERT_TRUE(builder.DeclareParameter("w", DType::kFloat8E4M3, {128, 128}).ok());
  ASSERT_TRUE(builder.DeclareFp8Parameter("w", {128, 128, "s"}, DType::kFloat32, {1, 1}).ok());
  ExpectRefused(builder.SetParameterWave("p", -1), "outside [0, 4096)");
  ExpectRefused(builder.SetParameterWave("p", kMaxWaves), "outside");
  ExpectRefused(builder.SetParameterWave("q", 1), "not declared");
  ExpectRefused(builder.SetParameterWave("w", 1), "it is FP8-quantized");
  ExpectRefused(builder.SetParameterWave("s", 1), "holds the scales of FP8 parameter 'w'");
  EXPECT_EQ(builder.part().params[0].wave, 0);
  ASSERT_TRUE(builder.SetParameterWave("p", 3).ok());
  ASSERT_TRUE(builder.SetParameterWave("w", 0).ok());
  EXPECT_EQ(builder.part().params[0].wave, 3);
}

TEST(LocalLayoutBuilderTest, ManifestCutToThisRankKeepsTheRegisteredBuffers) {
  absl::StatusOr<Layout> whole = BuildNamedLayout(*GetModel(kModel), "megatron(tp=2)");
  ASSERT_TRUE(whole.ok()) << whole.status();
  const std::string manifest = SerializeLayout(*whole);

  LocalLayoutBuilder rollout(Role::kRollout, 0, "node", kUnknownDevice);
  ExpectRefused(rollout.SetManifest(manifest), "the manifest is a trainer layout");

  LocalLayoutBuilder builder(Role::kTrainer, 1, "node-b", kUnknownDevice);
  std::vector<char> host(8);
  ASSERT_TRUE(builder.RegisterBuffer(42, host.data(), 8, MemoryKind::kHost, 0).ok());
  ASSERT_TRUE(builder.DeclareParameter("gone", DType::kBFloat16, {4}).ok());
  ASSERT_TRUE(builder.SetManifest(manifest).ok());
  const Layout expected = LayoutPart(*whole, 1);
  EXPECT_EQ(builder.part().params.size(), expected.params.size());
  EXPECT_EQ(builder.part().pieces.size(), expected.pieces.size());
  ASSERT_EQ(builder.part().buffers.size(), 1u);  // The registered ones, not the manifest's.
  EXPECT_EQ(builder.part().buffers[0].id, 42u);
  ASSERT_EQ(builder.part().processes.size(), 1u);
  EXPECT_EQ(builder.part().processes[0].node_id, "node-b");
}

TEST(LocalLayoutBuilderTest, NamedLayoutPlacesTheProcessAsItsKeysSay) {
  LocalLayoutBuilder trainer(Role::kTrainer, 0, "host", kUnknownDevice);
  ExpectRefused(trainer.SetNamedLayout(kModel, "vllm(tp=2)"), "is a rollout layout");
  LocalLayoutBuilder far(Role::kRollout, 5, "host", kUnknownDevice);
  ExpectRefused(far.SetNamedLayout(kModel, "vllm(tp=2)"), "has no rollout rank 5");

  LocalLayoutBuilder plain(Role::kRollout, 1, "host", kUnknownDevice);
  ASSERT_TRUE(plain.SetNamedLayout(kModel, "vllm(tp=2)").ok());
  EXPECT_EQ(plain.node_id(), "host");
  EXPECT_EQ(plain.part().processes[0].node_id, "host");
  EXPECT_EQ(plain.part().processes[0].device, kUnknownDevice);
  EXPECT_FALSE(plain.part().pieces.empty());

  LocalLayoutBuilder keyed(Role::kRollout, 1, "host", kUnknownDevice);
  ASSERT_TRUE(keyed.SetNamedLayout(kModel, "vllm(tp=2,ppn=1,colocated=1)").ok());
  EXPECT_EQ(keyed.node_id(), "node1");
  EXPECT_EQ(keyed.part().processes[0].node_id, "node1");
  EXPECT_EQ(keyed.part().processes[0].device, 0);

  // A configured GPU other than the one the layout places this rank on.
  LocalLayoutBuilder clash(Role::kRollout, 1, "host", 3);
  const Snapshot before = Take(clash);
  ExpectRefused(clash.SetNamedLayout(kModel, "vllm(tp=2,ppn=1,colocated=1)"), "device_index is 3");
  ExpectUnchanged(clash, before);
}

}  // namespace
}  // namespace wsync
