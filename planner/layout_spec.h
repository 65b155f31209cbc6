#ifndef WSYNC_PLANNER_LAYOUT_SPEC_H_
#define WSYNC_PLANNER_LAYOUT_SPEC_H_

// The grammar of named layout specs (named_layouts.h): kind [ "(" [ arg { "," arg } ] ")" ],
// arg = key "=" int | int | "quant=" name (vllm only: planner/models.h WeightQuant names), spaces
// ignored. Keys per kind, plus the placement keys every kind
// takes (ppn, colocated). Internal to the planner.

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "planner/named_layouts.h"

namespace wsync {

// Upper bound on any parallel size and on the processes of one layout.
inline constexpr int64_t kMaxNamedProcesses = int64_t{1} << 20;

struct NamedSpec {
  std::string kind;                                   // "megatron", "fsdp" or "vllm".
  std::vector<std::pair<std::string, int64_t>> args;  // In spec order, keys unique.
  WeightQuant quant = WeightQuant::kNone;             // vllm's quant=, not in args.
  bool quant_given = false;

  std::optional<int64_t> Get(absl::string_view key) const {
    for (const auto& [k, v] : args) {
      if (k == key) return v;
    }
    return std::nullopt;
  }
};

// InvalidArgument "layout \"<spec>\": <reason>".
absl::Status NamedSpecError(absl::string_view spec, absl::string_view reason);

// Parses and checks the keys: known for the kind, given once, sizes positive and at most
// kMaxNamedProcesses, colocated 0 or 1. InvalidArgument naming the spec and what is wrong.
absl::StatusOr<NamedSpec> ParseNamedSpec(absl::string_view spec);

// The placement keys of a parsed spec.
NamedPlacement NamedSpecPlacement(const NamedSpec& parsed);

}  // namespace wsync

#endif  // WSYNC_PLANNER_LAYOUT_SPEC_H_
