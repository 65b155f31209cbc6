#include <cstdint>
#include <set>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "common/checked_math.h"
#include "common/dtype.h"
#include "common/hash.h"
#include "common/status.h"
#include "gtest/gtest.h"

namespace wsync {
namespace {

TEST(DTypeTest, SizesAndNamesRoundTrip) {
  const struct {
    DType dtype;
    int64_t size;
    const char* name;
  } kExpected[] = {{DType::kBFloat16, 2, "bf16"},       {DType::kFloat16, 2, "fp16"},
                   {DType::kFloat32, 4, "fp32"},        {DType::kFloat8E4M3, 1, "fp8_e4m3"},
                   {DType::kFloat8E5M2, 1, "fp8_e5m2"}, {DType::kInt8, 1, "int8"},
                   {DType::kInt32, 4, "int32"},         {DType::kInt64, 8, "int64"}};
  for (const auto& e : kExpected) {
    EXPECT_EQ(DTypeSize(e.dtype), e.size) << e.name;
    EXPECT_EQ(DTypeName(e.dtype), e.name);
    absl::StatusOr<DType> parsed = ParseDType(e.name);
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, e.dtype);
    EXPECT_TRUE(IsValidDType(static_cast<int>(e.dtype)));
  }
  EXPECT_EQ(*ParseDType("bfloat16"), DType::kBFloat16);
  EXPECT_EQ(*ParseDType("float8_e4m3fn"), DType::kFloat8E4M3);
}

TEST(DTypeTest, RefusesUnknown) {
  EXPECT_EQ(ParseDType("fp12").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(IsValidDType(0));
  EXPECT_FALSE(IsValidDType(9));
  EXPECT_EQ(DTypeSize(static_cast<DType>(42)), 0);
  EXPECT_EQ(DTypeName(static_cast<DType>(42)), "invalid");
}

TEST(HashTest, Xxh3IsStableAndSeeded) {
  const std::string data = "wsync";
  // XXH3_64bits of the empty input is a published constant of xxHash.
  EXPECT_EQ(Xxh3("", 0), 0x2D06800538D394C2ull);
  EXPECT_EQ(Xxh3(data.data(), data.size()), Xxh3(data.data(), data.size()));
  EXPECT_NE(Xxh3(data.data(), data.size(), 0), Xxh3(data.data(), data.size(), 1));
  EXPECT_EQ(DigestHex(0x2D06800538D394C2ull), "2d06800538d394c2");
  EXPECT_EQ(DigestHex(1), "0000000000000001");
}

TEST(HashTest, CanonicalEncodingSeparatesFields) {
  CanonicalHasher a;
  a.AddString("ab");
  a.AddString("c");
  CanonicalHasher b;
  b.AddString("a");
  b.AddString("bc");
  EXPECT_NE(a.Digest(), b.Digest());
  CanonicalHasher c;
  c.AddString("ab");
  c.AddString("c");
  EXPECT_EQ(a.Digest(), c.Digest());
  CanonicalHasher d;
  d.AddInt(1);
  CanonicalHasher e;
  e.AddInt(256);
  EXPECT_NE(d.Digest(), e.Digest());
}

TEST(CheckedMathTest, DetectsOverflow) {
  EXPECT_EQ(CheckedAdd(1, 2), 3);
  EXPECT_FALSE(CheckedAdd(INT64_MAX, 1).has_value());
  EXPECT_EQ(CheckedMul(int64_t{1} << 31, int64_t{1} << 31), int64_t{1} << 62);
  EXPECT_FALSE(CheckedMul(int64_t{1} << 32, int64_t{1} << 32).has_value());
  EXPECT_EQ(CeilDiv(7, 2), 4);
  EXPECT_EQ(RoundUp(151936, 128), 151936);
  EXPECT_EQ(RoundUp(151937, 64), 152000);
}

absl::StatusOr<int> Half(int value) {
  if (value % 2 != 0) return absl::InvalidArgumentError("odd");
  return value / 2;
}

absl::Status Quarter(int value, int* out) {
  WSYNC_ASSIGN_OR_RETURN(int half, Half(value));
  WSYNC_ASSIGN_OR_RETURN(*out, Half(half));
  WSYNC_RETURN_IF_ERROR(absl::OkStatus());
  return absl::OkStatus();
}

TEST(StatusMacrosTest, PropagateErrorsAndValues) {
  int out = 0;
  EXPECT_TRUE(Quarter(8, &out).ok());
  EXPECT_EQ(out, 2);
  EXPECT_EQ(Quarter(6, &out).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Quarter(7, &out).message(), "odd");
}

// Every code and every known kind lands in its class; an unknown kind falls back to the code.
TEST(ErrorClassTest, KindsDecideThenCodes) {
  const absl::Status internal = absl::InternalError("x");
  EXPECT_EQ(ClassifyError(WithErrorKind(internal, kErrorWrongState)), ErrorClass::kWrongState);
  EXPECT_EQ(ClassifyError(WithErrorKind(internal, kErrorLayoutRefused)),
            ErrorClass::kLayoutRefused);
  EXPECT_EQ(ClassifyError(WithErrorKind(internal, kErrorRanksDisagree)),
            ErrorClass::kRanksDisagree);
  EXPECT_EQ(ClassifyError(WithErrorKind(absl::NotFoundError("no secret"), kErrorAuthentication)),
            ErrorClass::kAuthentication);
  EXPECT_EQ(ClassifyError(WithErrorKind(absl::UnavailableError("x"), "unknown_kind")),
            ErrorClass::kPeerLost);
  const std::pair<absl::StatusCode, ErrorClass> by_code[] = {
      {absl::StatusCode::kInvalidArgument, ErrorClass::kInvalidArgument},
      {absl::StatusCode::kOutOfRange, ErrorClass::kInvalidArgument},
      {absl::StatusCode::kAlreadyExists, ErrorClass::kInvalidArgument},
      {absl::StatusCode::kFailedPrecondition, ErrorClass::kInvalidArgument},
      {absl::StatusCode::kNotFound, ErrorClass::kInvalidArgument},
      {absl::StatusCode::kDeadlineExceeded, ErrorClass::kTimedOut},
      {absl::StatusCode::kUnavailable, ErrorClass::kPeerLost},
      {absl::StatusCode::kAborted, ErrorClass::kAborted},
      {absl::StatusCode::kCancelled, ErrorClass::kAborted},
      {absl::StatusCode::kUnauthenticated, ErrorClass::kAuthentication},
      {absl::StatusCode::kPermissionDenied, ErrorClass::kAuthentication},
      {absl::StatusCode::kUnimplemented, ErrorClass::kUnsupported},
      {absl::StatusCode::kResourceExhausted, ErrorClass::kNoMemory},
      {absl::StatusCode::kDataLoss, ErrorClass::kDataLoss},
      {absl::StatusCode::kInternal, ErrorClass::kInternal},
      {absl::StatusCode::kUnknown, ErrorClass::kInternal},
  };
  for (const auto& [code, error_class] : by_code) {
    EXPECT_EQ(ClassifyError(absl::Status(code, "x")), error_class)
        << absl::StatusCodeToString(code);
  }
  // Names are distinct, lower case, and cover every class.
  std::set<std::string> names;
  for (int i = 0; i < kErrorClassCount; ++i) {
    const std::string name(ErrorClassName(static_cast<ErrorClass>(i)));
    EXPECT_EQ(name, absl::AsciiStrToLower(name));
    EXPECT_TRUE(names.insert(name).second) << name;
  }
}

}  // namespace
}  // namespace wsync
