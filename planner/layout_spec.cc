#include "planner/layout_spec.h"

#include <algorithm>
#include <cctype>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace wsync {

absl::Status NamedSpecError(absl::string_view spec, absl::string_view reason) {
  return absl::InvalidArgumentError(absl::StrCat("layout \"", spec, "\": ", reason));
}

namespace {

struct KindInfo {
  absl::string_view kind;
  std::vector<absl::string_view> keys;
  absl::string_view positional_key;  // Key of a bare value ("fsdp(4)"); empty when none.
};

const std::vector<KindInfo>& Kinds() {
  static const auto* const kinds = new std::vector<KindInfo>{
      {"megatron", {"tp", "pp", "ep", "dp"}, ""},
      {"fsdp", {"n"}, "n"},
      {"vllm", {"tp", "ep", "dp", "quant"}, ""},
  };
  return *kinds;
}

// Placement keys every kind takes: processes per node, and colocation with the other side.
constexpr absl::string_view kPpnKey = "ppn";
constexpr absl::string_view kColocatedKey = "colocated";

// vllm's weight quantization: quant=none|fp8_block|fp8_channel|fp8_tensor.
constexpr absl::string_view kQuantKey = "quant";

bool IsPlacementKey(absl::string_view key) { return key == kPpnKey || key == kColocatedKey; }

}  // namespace

absl::StatusOr<NamedSpec> ParseNamedSpec(absl::string_view spec) {
  std::string text;
  for (char ch : spec) {
    if (!std::isspace(static_cast<unsigned char>(ch))) text.push_back(ch);
  }
  NamedSpec parsed;
  absl::string_view body;
  const size_t open = text.find('(');
  if (open == std::string::npos) {
    parsed.kind = text;
  } else {
    if (text.back() != ')') return NamedSpecError(spec, "expected ')' at the end");
    parsed.kind = text.substr(0, open);
    body = absl::string_view(text).substr(open + 1, text.size() - open - 2);
    if (body.find_first_of("()") != absl::string_view::npos) {
      return NamedSpecError(spec, "unexpected parenthesis inside the arguments");
    }
  }
  const KindInfo* info = nullptr;
  for (const KindInfo& candidate : Kinds()) {
    if (candidate.kind == parsed.kind) info = &candidate;
  }
  if (info == nullptr) {
    return NamedSpecError(spec, absl::StrCat("unknown layout kind \"", parsed.kind,
                                             "\"; expected megatron, fsdp or vllm"));
  }
  if (body.empty()) return parsed;
  int position = 0;
  for (absl::string_view arg : absl::StrSplit(body, ',')) {
    std::string key;
    absl::string_view value = arg;
    const size_t eq = arg.find('=');
    if (eq != absl::string_view::npos) {
      key = std::string(arg.substr(0, eq));
      value = arg.substr(eq + 1);
      if (std::find(info->keys.begin(), info->keys.end(), key) == info->keys.end() &&
          !IsPlacementKey(key)) {
        return NamedSpecError(spec, absl::StrCat("unknown key \"", key, "\" for ", parsed.kind,
                                                 "; expected ", absl::StrJoin(info->keys, ", "),
                                                 ", ", kPpnKey, " or ", kColocatedKey));
      }
    } else if (arg.empty()) {
      return NamedSpecError(spec, "empty argument");
    } else if (position == 0 && !info->positional_key.empty()) {
      key = std::string(info->positional_key);
    } else {
      return NamedSpecError(spec, absl::StrCat("argument \"", arg, "\" needs the form key=value"));
    }
    ++position;
    if (parsed.Get(key).has_value()) {
      return NamedSpecError(spec, absl::StrCat("key \"", key, "\" given twice"));
    }
    if (key == kQuantKey) {
      if (parsed.quant_given) {
        return NamedSpecError(spec, absl::StrCat("key \"", key, "\" given twice"));
      }
      absl::StatusOr<WeightQuant> quant = ParseWeightQuant(value);
      if (!quant.ok()) return NamedSpecError(spec, quant.status().message());
      parsed.quant = *quant;
      parsed.quant_given = true;
      continue;
    }
    int64_t number = 0;
    if (key == kColocatedKey) {
      if (value != "0" && value != "1") {
        return NamedSpecError(spec, absl::StrCat(key, " must be 0 or 1, got \"", value, "\""));
      }
      number = value == "1" ? 1 : 0;
    } else if (!absl::SimpleAtoi(value, &number) || number <= 0) {
      return NamedSpecError(spec,
                            absl::StrCat(key, " must be a positive integer, got \"", value, "\""));
    }
    if (number > kMaxNamedProcesses) {
      return NamedSpecError(spec, absl::StrCat(key, "=", number, " exceeds ", kMaxNamedProcesses));
    }
    parsed.args.emplace_back(std::move(key), number);
  }
  return parsed;
}

NamedPlacement NamedSpecPlacement(const NamedSpec& parsed) {
  NamedPlacement placement;
  if (std::optional<int64_t> ppn = parsed.Get(kPpnKey)) {
    placement.procs_per_node = static_cast<int32_t>(*ppn);
  }
  if (std::optional<int64_t> colocated = parsed.Get(kColocatedKey)) {
    placement.colocated = *colocated == 1;
  }
  return placement;
}

}  // namespace wsync
