#ifndef WSYNC_COMMON_DTYPE_H_
#define WSYNC_COMMON_DTYPE_H_

#include <cstdint>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace wsync {

// Element types a parameter may have. The numeric values are stable: they are written into
// manifests and plan digests.
enum class DType : uint8_t {
  kBFloat16 = 1,
  kFloat16 = 2,
  kFloat32 = 3,
  kFloat8E4M3 = 4,
  kFloat8E5M2 = 5,
  kInt8 = 6,
  kInt32 = 7,
  kInt64 = 8,
};

// Size of one element in bytes. Returns 0 for a value outside the enum (e.g. decoded from the
// wire).
int64_t DTypeSize(DType dtype);

// Canonical lower-case name ("bf16", "fp16", "fp32", "fp8_e4m3", "fp8_e5m2", "int8", "int32",
// "int64"); "invalid" for a value outside the enum.
absl::string_view DTypeName(DType dtype);

// Inverse of DTypeName; also accepts the torch spellings ("bfloat16", "float16", "float32",
// "float8_e4m3fn", "float8_e5m2"). InvalidArgument for anything else.
absl::StatusOr<DType> ParseDType(absl::string_view name);

// True when `value` is one of the enum's values.
bool IsValidDType(int value);

}  // namespace wsync

#endif  // WSYNC_COMMON_DTYPE_H_
