// named_layout_dump MODEL LAYOUT [LAYERS]: prints the C++ named layout of an embedded model as
// JSON (parameters, then every piece with its process, box, buffer, offset and strides), so that
// the Python tests can compare wsync.layouts with planner/named_layouts piece for piece. LAYERS
// keeps the model's first LAYERS transformer layers (TruncateLayers). Exit status 1 with the
// reason on stderr when the model or layout is refused.

#include <cstdint>
#include <cstdio>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/dtype.h"
#include "planner/layout.h"
#include "planner/models.h"
#include "planner/named_layouts.h"

namespace {

std::string Json(const wsync::Dims& dims) {
  return absl::StrCat("[", absl::StrJoin(dims, ","), "]");
}

int Run(int argc, char** argv) {
  if (argc < 3 || argc > 4) {
    std::fprintf(stderr, "usage: %s MODEL LAYOUT [LAYERS]\n", argv[0]);
    return 2;
  }
  absl::StatusOr<wsync::ModelSpec> model = wsync::GetModel(argv[1]);
  int32_t layers = 0;
  if (model.ok() && argc == 4) {
    if (!absl::SimpleAtoi(argv[3], &layers)) {
      std::fprintf(stderr, "LAYERS must be an integer, got %s\n", argv[3]);
      return 2;
    }
    model = wsync::TruncateLayers(*model, layers);
  }
  if (!model.ok()) {
    std::fprintf(stderr, "%s\n", model.status().ToString().c_str());
    return 1;
  }
  const absl::StatusOr<wsync::Layout> layout = wsync::BuildNamedLayout(*model, argv[2]);
  if (!layout.ok()) {
    std::fprintf(stderr, "%s\n", layout.status().ToString().c_str());
    return 1;
  }
  std::printf("{\"processes\": %zu,\n\"params\": [\n", layout->processes.size());
  for (size_t i = 0; i < layout->params.size(); ++i) {
    const wsync::ParamInfo& p = layout->params[i];
    std::printf("{\"name\": \"%s\", \"dtype\": \"%s\", \"shape\": %s}%s\n", p.name.c_str(),
                std::string(wsync::DTypeName(p.dtype)).c_str(), Json(p.shape).c_str(),
                i + 1 < layout->params.size() ? "," : "");
  }
  std::printf("],\n\"pieces\": [\n");
  for (size_t i = 0; i < layout->pieces.size(); ++i) {
    const wsync::Piece& p = layout->pieces[i];
    std::printf(
        "{\"process\": %d, \"param\": %d, \"buffer\": %llu, \"origin\": %s, \"extent\": %s, "
        "\"offset\": %lld, \"strides\": %s}%s\n",
        p.process, p.param, static_cast<unsigned long long>(p.buffer), Json(p.box.origin).c_str(),
        Json(p.box.extent).c_str(), static_cast<long long>(p.offset), Json(p.strides).c_str(),
        i + 1 < layout->pieces.size() ? "," : "");
  }
  std::printf("]}\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return Run(argc, argv); }
