// The job's data key (common/data_key.h): HKDF-SHA256 reproduces RFC 5869's test vectors, and
// DeriveDataKey gives every process of a job the same key and another job or secret another one.

#include "common/data_key.h"

#include <string>

#include "absl/strings/escaping.h"
#include "gtest/gtest.h"

namespace wsync {
namespace {

std::string Hex(absl::string_view bytes) { return absl::BytesToHexString(bytes); }
std::string Bytes(absl::string_view hex) { return absl::HexStringToBytes(hex); }
std::string KeyHex(const DataKey& key) {
  return Hex(
      absl::string_view(reinterpret_cast<const char*>(key.bytes().data()), key.bytes().size()));
}

// RFC 5869, appendix A, test cases 1 (salt and info) and 3 (neither).
TEST(DataKeyTest, HkdfSha256ReproducesTheRfc5869Vectors) {
  const std::string ikm = Bytes("0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b");
  absl::StatusOr<std::string> one =
      HkdfSha256(ikm, Bytes("000102030405060708090a0b0c"), Bytes("f0f1f2f3f4f5f6f7f8f9"), 42);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(Hex(*one),
            "3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf34007208d5b887185865");
  absl::StatusOr<std::string> three = HkdfSha256(ikm, "", "", 42);
  ASSERT_TRUE(three.ok()) << three.status();
  EXPECT_EQ(Hex(*three),
            "8da4e775a563c18f715f802a063c5a31b8a11f5c5ee1879ec3454e5f3c738d2d9d201395faa4b61a96c8");
}

TEST(DataKeyTest, HkdfSha256RefusesLengthsOutOfRange) {
  EXPECT_TRUE(absl::IsInvalidArgument(HkdfSha256("k", "", "", 0).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(HkdfSha256("k", "", "", 255 * 32 + 1).status()));
  EXPECT_TRUE(HkdfSha256("k", "", "", 255 * 32).ok());
}

TEST(DataKeyTest, TheDataKeyIsHkdfOfTheSecretLabelledWithTheJob) {
  const std::string secret = "0123456789abcdef0123456789abcdef";
  absl::StatusOr<DataKey> key = DeriveDataKey(secret, "job-1");
  ASSERT_TRUE(key.ok()) << key.status();
  absl::StatusOr<std::string> expected =
      HkdfSha256(secret, "", std::string("wsync-data-mac-v1\0job-1", 23), 32);
  ASSERT_TRUE(expected.ok());
  EXPECT_EQ(KeyHex(*key), Hex(*expected));
  // Every process of the job derives the same key; another job or secret another one.
  EXPECT_EQ(KeyHex(*DeriveDataKey(secret, "job-1")), KeyHex(*key));
  EXPECT_NE(KeyHex(*DeriveDataKey(secret, "job-2")), KeyHex(*key));
  EXPECT_NE(KeyHex(*DeriveDataKey(secret + "x", "job-1")), KeyHex(*key));
  // Copies are independent of the original.
  DataKey copy = *key;
  EXPECT_EQ(KeyHex(copy), KeyHex(*key));
  copy = *DeriveDataKey(secret, "job-2");
  EXPECT_NE(KeyHex(copy), KeyHex(*key));
}

TEST(DataKeyTest, AnEmptySecretOrJobIsRefused) {
  EXPECT_TRUE(absl::IsInvalidArgument(DeriveDataKey("", "job").status()));
  EXPECT_TRUE(absl::IsInvalidArgument(DeriveDataKey("secret", "").status()));
}

}  // namespace
}  // namespace wsync
