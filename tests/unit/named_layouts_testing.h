#ifndef WSYNC_TESTS_UNIT_NAMED_LAYOUTS_TESTING_H_
#define WSYNC_TESTS_UNIT_NAMED_LAYOUTS_TESTING_H_

// Helpers of the named-layout tests (named_layouts_test.cc, named_layouts_trainer_test.cc,
// named_placement_test.cc): models by name, layouts by spec, and lookups of a layout's
// parameters, pieces and buffers. Failures are reported to gtest where they happen.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "planner/geometry.h"
#include "planner/layout.h"
#include "planner/models.h"
#include "planner/named_layouts.h"

namespace wsync::test::named {

inline ModelSpec Model(const std::string& name) {
  absl::StatusOr<ModelSpec> model = GetModel(name);
  EXPECT_TRUE(model.ok()) << model.status();
  return *std::move(model);
}

inline Layout Build(const ModelSpec& model, const std::string& spec,
                    const NamedLayoutOptions& options = {}) {
  absl::StatusOr<Layout> layout = BuildNamedLayout(model, spec, options);
  EXPECT_TRUE(layout.ok()) << spec << ": " << layout.status();
  return layout.ok() ? *std::move(layout) : Layout{};
}

inline int32_t ParamIndex(const Layout& layout, const std::string& name) {
  for (size_t i = 0; i < layout.params.size(); ++i) {
    if (layout.params[i].name == name) return static_cast<int32_t>(i);
  }
  ADD_FAILURE() << "no parameter " << name;
  return -1;
}

inline std::vector<Piece> PiecesOf(const Layout& layout, const std::string& name, int32_t process) {
  const int32_t param = ParamIndex(layout, name);
  std::vector<Piece> pieces;
  for (const Piece& piece : layout.pieces) {
    if (piece.param == param && piece.process == process) pieces.push_back(piece);
  }
  return pieces;
}

inline const BufferInfo* BufferOf(const Layout& layout, int32_t process, uint64_t id) {
  for (const BufferInfo& buffer : layout.buffers) {
    if (buffer.process == process && buffer.id == id) return &buffer;
  }
  return nullptr;
}

inline int BuffersOf(const Layout& layout, int32_t process) {
  int count = 0;
  for (const BufferInfo& buffer : layout.buffers) count += buffer.process == process;
  return count;
}

inline Box MakeBox(Dims origin, Dims extent) { return Box{std::move(origin), std::move(extent)}; }

// A two-tensor model with a vocabulary that is not a multiple of the padding.
inline ModelSpec TinyVocabModel(int64_t vocab) {
  ModelSpec model;
  model.name = "tiny";
  model.num_layers = 1;
  model.vocab = vocab;
  model.tied_embeddings = true;
  TensorSpec embed;
  embed.name = "model.embed_tokens.weight";
  embed.shape = {vocab, 8};
  embed.role = ShardRole::kVocab;
  embed.layer = -1;
  TensorSpec norm;
  norm.name = "model.layers.0.input_layernorm.weight";
  norm.shape = {8};
  norm.layer = 0;
  model.tensors = {embed, norm};
  return model;
}

// q [q_heads * 4, 8], k and v [kv_heads * 4, 8], as one fused qkv.
inline ModelSpec TinyAttentionModel(int64_t q_heads, int64_t kv_heads) {
  ModelSpec model;
  model.name = "tiny-attention";
  model.num_layers = 1;
  for (const char* name : {"q", "k", "v"}) {
    TensorSpec& t = model.tensors.emplace_back();
    t.name = name;
    t.fuse_index = static_cast<int32_t>(model.tensors.size()) - 1;
    t.heads = t.fuse_index == 0 ? q_heads : kv_heads;
    t.shape = {t.heads * 4, 8};
    t.role = ShardRole::kColumn;
    t.layer = 0;
    t.fuse = FuseKind::kQkv;
    t.fused_name = "qkv";
  }
  return model;
}

}  // namespace wsync::test::named

#endif  // WSYNC_TESTS_UNIT_NAMED_LAYOUTS_TESTING_H_
