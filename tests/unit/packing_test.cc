// MessagePacker (executor/packing.h) on its own, over hand-made work: random 2-D segments cut into
// chunks and grouped into messages; packing every message into its slot and unpacking the slots
// writes each target exactly as an element-by-element copy from the sources does, and each slot
// holds its chunks row-major one after another. Copies touching CUDA memory go to the device (a
// fake that runs them only at Synchronize) and nothing else does.

#include "executor/packing.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "executor/copy.h"
#include "executor/work.h"
#include "gtest/gtest.h"
#include "planner/geometry.h"
#include "planner/plan.h"
#include "transport/device_memory.h"

namespace wsync::executor_internal {
namespace {

constexpr uint64_t kSource = 1;
constexpr uint64_t kTarget = 2;
constexpr int64_t kSourceRows = 40;
constexpr int64_t kSourceCols = 56;

// Runs enqueued copies only when synchronized; host memory stands in for the device's.
class DeferringDevice final : public DeviceMemory {
 public:
  MemoryKind kind() const override { return MemoryKind::kCuda; }
  absl::StatusOr<void*> Allocate(int64_t bytes) override { return nullptr; }
  void Free(void* memory) override {}
  absl::Status CopyStridedAsync(void* dst, absl::Span<const int64_t> dst_strides, const void* src,
                                absl::Span<const int64_t> src_strides,
                                absl::Span<const int64_t> shape, int64_t element_size) override {
    queued_.push_back({dst, Dims(dst_strides.begin(), dst_strides.end()), src,
                       Dims(src_strides.begin(), src_strides.end()),
                       Dims(shape.begin(), shape.end()), element_size});
    return absl::OkStatus();
  }
  absl::Status Synchronize(absl::Time deadline) override {
    ++synchronized_;
    for (const StridedCopy& copy : queued_) {
      CopyStrided(copy.dst, copy.dst_strides, copy.src, copy.src_strides, copy.shape,
                  copy.element_size);
    }
    enqueued_ += queued_.size();
    queued_.clear();
    return absl::OkStatus();
  }
  size_t enqueued() const { return enqueued_ + queued_.size(); }
  int synchronized() const { return synchronized_; }

 private:
  std::vector<StridedCopy> queued_;
  size_t enqueued_ = 0;
  int synchronized_ = 0;
};

// Random work of one process: segments from a row-major source into disjoint column-major
// regions of the target, each cut into chunks of whole rows, the chunks shuffled into messages of
// one send lane and one receive lane (the same messages: one process's round trip).
struct RandomWork {
  std::vector<Segment> segments;
  Work work;
  int64_t element_size = 0;
  int64_t target_elements = 0;
};

RandomWork MakeWork(std::mt19937& rng, int64_t element_size, MemoryKind lane_kind,
                    MemoryKind buffer_kind) {
  RandomWork out;
  out.element_size = element_size;
  auto uniform = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  const int segments = static_cast<int>(uniform(1, 8));
  std::vector<int32_t> chunk_order;
  for (int i = 0; i < segments; ++i) {
    const int64_t rows = uniform(1, 12), cols = uniform(1, 20);
    const int64_t row0 = uniform(0, kSourceRows - rows), col0 = uniform(0, kSourceCols - cols);
    Segment s;
    s.box = Box{{0, 0}, {rows, cols}};
    s.from = Endpoint{0, kSource, row0 * kSourceCols + col0, {kSourceCols, 1}};
    s.to = Endpoint{0, kTarget, out.target_elements, {1, rows}};  // Column-major, disjoint.
    out.target_elements += rows * cols;
    out.segments.push_back(s);
    for (int64_t first = 0; first < rows;) {
      const int64_t count = uniform(1, rows - first);
      Chunk chunk;
      chunk.segment = i;
      chunk.shape = {count, cols};
      chunk.from_offset = s.from.offset + first * kSourceCols;
      chunk.to_offset = s.to.offset + first;
      chunk.element_size = element_size;
      chunk.bytes = count * cols * element_size;
      chunk.from_kind = chunk.to_kind = buffer_kind;
      chunk_order.push_back(static_cast<int32_t>(out.work.chunks.size()));
      out.work.chunks.push_back(chunk);
      first += count;
    }
  }
  std::shuffle(chunk_order.begin(), chunk_order.end(), rng);
  Lane send;
  send.direction = Direction::kSend;
  send.kind = lane_kind;
  send.slots = 1;
  for (size_t at = 0; at < chunk_order.size();) {
    const size_t count = std::min<size_t>(uniform(1, 4), chunk_order.size() - at);
    Message message;
    message.round = static_cast<int32_t>(send.messages.size());
    message.slot = 0;
    for (size_t c = at; c < at + count; ++c) {
      message.chunks.push_back(chunk_order[c]);
      message.bytes += out.work.chunks[chunk_order[c]].bytes;
    }
    send.slot_bytes = std::max(send.slot_bytes, message.bytes);
    send.messages.push_back(message);
    at += count;
  }
  Lane receive = send;
  receive.direction = Direction::kReceive;
  out.work.lanes = {send, receive};
  return out;
}

// Element (r, c) of a 2-D region at `base` with element strides `strides`.
template <typename Byte>
Byte* At(Byte* base, const Dims& strides, int64_t r, int64_t c, int64_t element_size) {
  return base + (r * strides[0] + c * strides[1]) * element_size;
}

class PackingTest : public ::testing::TestWithParam<int> {};

TEST_P(PackingTest, PackThenUnpackEqualsADirectCopy) {
  std::mt19937 rng(GetParam());
  const int64_t element_size = int64_t{1} << (GetParam() % 4);  // 1, 2, 4, 8 bytes.
  const RandomWork random = MakeWork(rng, element_size, MemoryKind::kHost, MemoryKind::kHost);
  std::vector<char> source(kSourceRows * kSourceCols * element_size);
  for (char& byte : source) byte = static_cast<char>(rng());
  std::vector<char> target(random.target_elements * element_size, 0);
  auto address = [&](const Endpoint& end, int64_t offset, int64_t size) -> char* {
    return (end.buffer == kSource ? source.data() : target.data()) + offset * size;
  };
  MessagePacker packer(random.work, random.segments, address, /*device=*/nullptr);

  const Lane& send = random.work.lanes[0];
  const Lane& receive = random.work.lanes[1];
  std::vector<std::vector<char>> slots;
  for (const Message& message : send.messages) slots.emplace_back(message.bytes);
  std::vector<StridedCopy> packs;
  for (size_t m = 0; m < send.messages.size(); ++m) {
    ASSERT_TRUE(packer.AppendPack(send, send.messages[m], slots[m].data(), packs).ok());
  }
  CopyStridedBatch(packs);
  // Each slot: its chunks, row-major, one after another.
  for (size_t m = 0; m < send.messages.size(); ++m) {
    const char* cursor = slots[m].data();
    for (int32_t index : send.messages[m].chunks) {
      const Chunk& chunk = random.work.chunks[index];
      const Dims from_strides = {kSourceCols, 1};
      for (int64_t r = 0; r < chunk.shape[0]; ++r) {
        for (int64_t c = 0; c < chunk.shape[1]; ++c) {
          ASSERT_EQ(0, std::memcmp(cursor,
                                   At(source.data() + chunk.from_offset * element_size,
                                      from_strides, r, c, element_size),
                                   element_size));
          cursor += element_size;
        }
      }
    }
  }
  std::vector<StridedCopy> unpacks;
  for (size_t m = 0; m < receive.messages.size(); ++m) {
    ASSERT_TRUE(packer.AppendUnpack(receive, receive.messages[m], slots[m].data(), unpacks).ok());
  }
  CopyStridedBatch(unpacks);
  EXPECT_FALSE(packer.device_pending());
  ASSERT_TRUE(packer.Synchronize(absl::InfiniteFuture()).ok());  // No device: nothing to wait for.

  // The same segments copied element by element.
  std::vector<char> expected(target.size(), 0);
  for (const Segment& s : random.segments) {
    for (int64_t r = 0; r < s.box.extent[0]; ++r) {
      for (int64_t c = 0; c < s.box.extent[1]; ++c) {
        std::memcpy(
            At(expected.data() + s.to.offset * element_size, s.to.strides, r, c, element_size),
            At(source.data() + s.from.offset * element_size, s.from.strides, r, c, element_size),
            element_size);
      }
    }
  }
  EXPECT_EQ(target, expected);
}

INSTANTIATE_TEST_SUITE_P(Seeds, PackingTest, ::testing::Range(0, 24));

TEST(MessagePackerTest, CopiesTouchingCudaMemoryGoToTheDeviceUntilSynchronized) {
  std::mt19937 rng(7);
  // A CUDA lane over host buffers: every pack and unpack is the device's, none batched.
  const RandomWork random = MakeWork(rng, 4, MemoryKind::kCuda, MemoryKind::kHost);
  std::vector<char> source(kSourceRows * kSourceCols * 4);
  for (char& byte : source) byte = static_cast<char>(rng());
  std::vector<char> target(random.target_elements * 4, 0);
  auto address = [&](const Endpoint& end, int64_t offset, int64_t size) -> char* {
    return (end.buffer == kSource ? source.data() : target.data()) + offset * size;
  };
  DeferringDevice device;
  MessagePacker packer(random.work, random.segments, address, &device);
  const Lane& send = random.work.lanes[0];
  std::vector<std::vector<char>> slots;
  for (const Message& message : send.messages) slots.emplace_back(message.bytes, 0);
  std::vector<StridedCopy> batch;
  for (size_t m = 0; m < send.messages.size(); ++m) {
    ASSERT_TRUE(packer.AppendPack(send, send.messages[m], slots[m].data(), batch).ok());
  }
  EXPECT_TRUE(batch.empty());
  EXPECT_EQ(device.enqueued(), random.work.chunks.size());
  EXPECT_TRUE(packer.device_pending());
  ASSERT_TRUE(packer.Synchronize(absl::InfiniteFuture()).ok());
  EXPECT_FALSE(packer.device_pending());
  ASSERT_TRUE(packer.Synchronize(absl::InfiniteFuture()).ok());  // Nothing pending: no call.
  EXPECT_EQ(device.synchronized(), 1);
  const Lane& receive = random.work.lanes[1];
  for (size_t m = 0; m < receive.messages.size(); ++m) {
    ASSERT_TRUE(packer.AppendUnpack(receive, receive.messages[m], slots[m].data(), batch).ok());
  }
  EXPECT_TRUE(batch.empty());
  ASSERT_TRUE(packer.Synchronize(absl::InfiniteFuture()).ok());
  EXPECT_EQ(device.synchronized(), 2);

  // Host to host: Copy runs at once, without the device.
  std::vector<char> copied(8, 0);
  ASSERT_TRUE(packer
                  .Copy(copied.data(), MemoryKind::kHost, {1}, source.data(), MemoryKind::kHost,
                        {1}, {8}, 1)
                  .ok());
  EXPECT_EQ(0, std::memcmp(copied.data(), source.data(), 8));
  EXPECT_FALSE(packer.device_pending());
  EXPECT_EQ(device.enqueued(), 2 * random.work.chunks.size());

  // What went through the device is still exactly the segments' elements.
  for (const Segment& s : random.segments) {
    for (int64_t r = 0; r < s.box.extent[0]; ++r) {
      for (int64_t c = 0; c < s.box.extent[1]; ++c) {
        ASSERT_EQ(0,
                  std::memcmp(At(target.data() + s.to.offset * 4, s.to.strides, r, c, 4),
                              At(source.data() + s.from.offset * 4, s.from.strides, r, c, 4), 4));
      }
    }
  }
}

}  // namespace
}  // namespace wsync::executor_internal
