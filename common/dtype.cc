#include "common/dtype.h"

#include <array>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace wsync {
namespace {

struct DTypeInfo {
  DType dtype;
  int64_t size;
  absl::string_view name;
  absl::string_view torch_name;
};

constexpr std::array<DTypeInfo, 8> kDTypes = {{
    {DType::kBFloat16, 2, "bf16", "bfloat16"},
    {DType::kFloat16, 2, "fp16", "float16"},
    {DType::kFloat32, 4, "fp32", "float32"},
    {DType::kFloat8E4M3, 1, "fp8_e4m3", "float8_e4m3fn"},
    {DType::kFloat8E5M2, 1, "fp8_e5m2", "float8_e5m2"},
    {DType::kInt8, 1, "int8", "int8"},
    {DType::kInt32, 4, "int32", "int32"},
    {DType::kInt64, 8, "int64", "int64"},
}};

const DTypeInfo* Find(DType dtype) {
  for (const DTypeInfo& info : kDTypes) {
    if (info.dtype == dtype) return &info;
  }
  return nullptr;
}

}  // namespace

int64_t DTypeSize(DType dtype) {
  const DTypeInfo* info = Find(dtype);
  return info == nullptr ? 0 : info->size;
}

absl::string_view DTypeName(DType dtype) {
  const DTypeInfo* info = Find(dtype);
  return info == nullptr ? "invalid" : info->name;
}

absl::StatusOr<DType> ParseDType(absl::string_view name) {
  for (const DTypeInfo& info : kDTypes) {
    if (name == info.name || name == info.torch_name) return info.dtype;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown dtype '", name, "'"));
}

bool IsValidDType(int value) {
  for (const DTypeInfo& info : kDTypes) {
    if (static_cast<int>(info.dtype) == value) return true;
  }
  return false;
}

}  // namespace wsync
