// The chunk hash of verify=true (executor/verify.h): hashing a strided region element by element
// in row-major order equals hashing its packed copy, for random shapes, strides (padded, permuted
// axes) and element sizes; and any single flipped byte of the region changes the hash. Regions in
// device memory, hashed through a bounce buffer of any size, hash the same as in host memory.

#include "executor/verify.h"

#include <algorithm>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "common/hash.h"
#include "executor/copy.h"
#include "gtest/gtest.h"
#include "tests/testing/random_regions.h"

namespace wsync::executor_internal {
namespace {

using Region = test::StridedRegion;

Region RandomRegion(std::mt19937_64& rng) {
  constexpr int64_t kElementSizes[] = {1, 2, 4, 8, 3};
  return test::RandomStridedRegion(rng, kElementSizes);
}

TEST(VerifyTest, HashOfAStridedRegionEqualsHashOfItsPackedCopy) {
  std::mt19937_64 rng(20261129);
  for (int trial = 0; trial < 2000; ++trial) {
    const Region r = RandomRegion(rng);
    std::vector<unsigned char> memory(r.span_elements * r.element_size);
    for (unsigned char& byte : memory) byte = static_cast<unsigned char>(rng());
    const int64_t bytes = Volume(Box{Dims(r.shape.size(), 0), r.shape}) * r.element_size;
    std::vector<unsigned char> packed(bytes);
    PackRegion(packed.data(), memory.data(), r.strides, r.shape, r.element_size);
    const uint64_t expected = Xxh3(packed.data(), packed.size());
    ASSERT_EQ(HashRegion(memory.data(), r.strides, r.shape, r.element_size), expected)
        << "trial " << trial;
    // Flip one byte of one element of the region: the hash changes.
    const size_t flip = rng() % packed.size();
    packed[flip] ^= 0x01;
    UnpackRegion(memory.data(), r.strides, packed.data(), r.shape, r.element_size);
    EXPECT_NE(HashRegion(memory.data(), r.strides, r.shape, r.element_size), expected)
        << "trial " << trial;
  }
}

TEST(VerifyTest, AnEmptyRegionHashesLikeNoBytes) {
  EXPECT_EQ(HashRegion(nullptr, {4, 1}, {0, 4}, 2), Xxh3(nullptr, 0));
}

// Device memory that is host memory, with copies that run only at Synchronize, in order (as on a
// stream): a hash fed before its copy landed would see stale bounce bytes.
class LazyHostDevice final : public DeviceMemory {
 public:
  MemoryKind kind() const override { return MemoryKind::kCuda; }
  absl::StatusOr<void*> Allocate(int64_t bytes) override { return new char[bytes]; }
  void Free(void* memory) override { delete[] static_cast<char*>(memory); }
  absl::Status CopyStridedAsync(void* dst, absl::Span<const int64_t> dst_strides, const void* src,
                                absl::Span<const int64_t> src_strides,
                                absl::Span<const int64_t> shape, int64_t element_size) override {
    queue_.push_back([dst, src, element_size, dst_at = Dims(dst_strides.begin(), dst_strides.end()),
                      src_at = Dims(src_strides.begin(), src_strides.end()),
                      extent = Dims(shape.begin(), shape.end())] {
      CopyStrided(dst, dst_at, src, src_at, extent, element_size);
    });
    ++copies_;
    return absl::OkStatus();
  }
  absl::Status Synchronize(absl::Time) override {
    for (const auto& copy : queue_) copy();
    queue_.clear();
    ++synchronizations_;
    return absl::OkStatus();
  }
  int64_t copies() const { return copies_; }
  int64_t synchronizations() const { return synchronizations_; }

 private:
  std::vector<std::function<void()>> queue_;
  int64_t copies_ = 0;
  int64_t synchronizations_ = 0;
};

TEST(VerifyTest, DeviceRegionsHashAsInHostMemoryWhateverTheBounceSize) {
  std::mt19937_64 rng(7);
  LazyHostDevice device;
  int64_t split_regions = 0;
  for (int trial = 0; trial < 800; ++trial) {
    const int count = 1 + static_cast<int>(rng() % 4);
    std::vector<Region> regions;
    std::vector<std::vector<unsigned char>> memory;
    std::vector<DeviceRegion> on_device;
    std::vector<uint64_t> expected;
    for (int i = 0; i < count; ++i) {
      regions.push_back(RandomRegion(rng));
      const Region& r = regions.back();
      memory.emplace_back(r.span_elements * r.element_size);
      for (unsigned char& byte : memory.back()) byte = static_cast<unsigned char>(rng());
      on_device.push_back(DeviceRegion{memory.back().data(), r.strides, r.shape, r.element_size});
      expected.push_back(HashRegion(memory.back().data(), r.strides, r.shape, r.element_size));
    }
    // From one element of the largest size (8 bytes) to more than any region.
    std::vector<char> bounce(8 + rng() % 300, 0);
    for (const Region& r : regions) {
      split_regions += Volume(Box{Dims(r.shape.size(), 0), r.shape}) * r.element_size >
                       static_cast<int64_t>(bounce.size());
    }
    std::vector<uint64_t> hashes(count, 0);
    const int64_t copies_before = device.copies();
    ASSERT_TRUE(HashDeviceRegions(device, on_device, absl::MakeSpan(bounce), absl::InfiniteFuture(),
                                  absl::MakeSpan(hashes))
                    .ok());
    EXPECT_GE(device.copies() - copies_before, count);
    EXPECT_EQ(hashes, expected) << "trial " << trial << ", bounce " << bounce.size() << " bytes";
  }
  EXPECT_GT(split_regions, 100);  // Regions larger than the bounce buffer were cut into pieces.
  EXPECT_GT(device.synchronizations(), 800);  // Several fills per call where needed.
}

TEST(VerifyTest, EmptyDeviceRegionsHashLikeNoBytesAndTooSmallABounceIsRefused) {
  LazyHostDevice device;
  std::vector<char> bounce(16);
  uint64_t hash = 1;
  const DeviceRegion empty{nullptr, {4, 1}, {0, 4}, 2};
  ASSERT_TRUE(HashDeviceRegions(device, {&empty, 1}, absl::MakeSpan(bounce), absl::InfiniteFuture(),
                                {&hash, 1})
                  .ok());
  EXPECT_EQ(hash, Xxh3(nullptr, 0));
  EXPECT_EQ(device.copies(), 0);
  std::vector<int64_t> data(4);
  const DeviceRegion wide{data.data(), {1}, {4}, 8};
  std::vector<char> tiny(4);
  EXPECT_TRUE(absl::IsInvalidArgument(HashDeviceRegions(device, {&wide, 1}, absl::MakeSpan(tiny),
                                                        absl::InfiniteFuture(), {&hash, 1})));
}

}  // namespace
}  // namespace wsync::executor_internal
