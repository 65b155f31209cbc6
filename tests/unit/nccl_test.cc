// The NCCL backend's bookkeeping against a fake of the NCCL and CUDA calls it makes (NcclApi):
// round grouping, tag and peer checks, deadlines, asynchronous errors and abort. The fake moves no
// bytes; tests/gpu runs the real thing.

#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "device/cuda_copy.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "transport/nccl/nccl_transport.h"

namespace wsync {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// What the fake did and how it behaves; shared between the test and the transport owning the fake.
struct FakeState {
  absl::Mutex mu;
  std::vector<std::string> log;         // NCCL calls in order ("GroupStart", "Send(1,8)", ...).
  std::set<const void*> host_pointers;  // PointerKind reports these as host memory.
  bool events_complete = false;         // EventQuery result.
  int init_polls = 0;                   // CommAsyncError in progress this many times after init.
  int enqueue_polls = 0;                // GroupEnd in progress, then this many in-progress polls.
  absl::Status async_error;             // CommAsyncError's error, once set.
  int aborts = 0;
  int destroys = 0;
  int events_alive = 0;

  std::vector<std::string> Nccl() {
    absl::MutexLock lock(&mu);
    return log;
  }
};

class FakeNcclApi final : public NcclApi {
 public:
  explicit FakeNcclApi(std::shared_ptr<FakeState> state) : s_(std::move(state)) {}

  int DeviceCount() override { return 1; }
  absl::Status SetDevice(int) override { return absl::OkStatus(); }
  absl::StatusOr<void*> Malloc(size_t) override { return absl::UnimplementedError("fake"); }
  absl::Status Free(void*) override { return absl::OkStatus(); }
  absl::StatusOr<CudaStream> StreamCreate() override { return reinterpret_cast<CudaStream>(0x5); }
  absl::Status StreamDestroy(CudaStream) override { return absl::OkStatus(); }
  absl::StatusOr<CudaEvent> EventCreate() override {
    absl::MutexLock lock(&s_->mu);
    ++s_->events_alive;
    return reinterpret_cast<CudaEvent>(++next_event_);
  }
  absl::Status EventDestroy(CudaEvent) override {
    absl::MutexLock lock(&s_->mu);
    --s_->events_alive;
    return absl::OkStatus();
  }
  absl::Status EventRecord(CudaEvent, CudaStream) override { return Log("EventRecord"); }
  absl::StatusOr<bool> EventQuery(CudaEvent) override {
    absl::MutexLock lock(&s_->mu);
    return s_->events_complete;
  }
  absl::StatusOr<MemoryKind> PointerKind(const void* pointer) override {
    absl::MutexLock lock(&s_->mu);
    return s_->host_pointers.count(pointer) ? MemoryKind::kHost : MemoryKind::kCuda;
  }
  absl::Status Memcpy2DAsync(void* dst, size_t dst_pitch, const void* src, size_t src_pitch,
                             size_t width, size_t height, CudaStream) override {
    EXPECT_GE(dst_pitch, width);
    EXPECT_GE(src_pitch, width);
    for (size_t row = 0; row < height; ++row) {
      std::memcpy(static_cast<char*>(dst) + row * dst_pitch,
                  static_cast<const char*>(src) + row * src_pitch, width);
    }
    ++copies_;
    return absl::OkStatus();
  }
  absl::StatusOr<NcclUniqueId> GetUniqueId() override {
    NcclUniqueId id;
    id.bytes[0] = 42;
    return id;
  }
  absl::StatusOr<NcclComm> CommInitRank(int nranks, const NcclUniqueId&, int rank) override {
    Log(absl::StrCat("CommInitRank(", nranks, ",", rank, ")")).IgnoreError();
    return reinterpret_cast<NcclComm>(0xc0);
  }
  absl::StatusOr<bool> CommAsyncError(NcclComm) override {
    absl::MutexLock lock(&s_->mu);
    if (!s_->async_error.ok()) return s_->async_error;
    if (s_->init_polls > 0) {
      if (s_->init_polls < 1000000) --s_->init_polls;
      return false;
    }
    if (s_->enqueue_polls > 0) {
      --s_->enqueue_polls;
      return false;
    }
    return true;
  }
  absl::Status CommAbort(NcclComm) override {
    absl::MutexLock lock(&s_->mu);
    ++s_->aborts;
    s_->log.push_back("CommAbort");
    return absl::OkStatus();
  }
  absl::Status CommDestroy(NcclComm) override {
    absl::MutexLock lock(&s_->mu);
    ++s_->destroys;
    return absl::OkStatus();
  }
  absl::StatusOr<void*> CommRegister(NcclComm, void* buffer, size_t bytes) override {
    Log(absl::StrCat("CommRegister(", bytes, ")")).IgnoreError();
    return buffer;
  }
  absl::Status CommDeregister(NcclComm, void*) override { return Log("CommDeregister"); }
  absl::Status GroupStart() override { return Log("GroupStart"); }
  absl::StatusOr<bool> GroupEnd() override {
    Log("GroupEnd").IgnoreError();
    absl::MutexLock lock(&s_->mu);
    return s_->enqueue_polls == 0;
  }
  absl::Status Send(const void*, size_t bytes, int peer, NcclComm, CudaStream) override {
    return Log(absl::StrCat("Send(", peer, ",", bytes, ")"));
  }
  absl::Status Recv(void*, size_t bytes, int peer, NcclComm, CudaStream) override {
    return Log(absl::StrCat("Recv(", peer, ",", bytes, ")"));
  }

  int copies_ = 0;

 private:
  absl::Status Log(std::string entry) {
    absl::MutexLock lock(&s_->mu);
    s_->log.push_back(std::move(entry));
    return absl::OkStatus();
  }
  std::shared_ptr<FakeState> s_;
  uintptr_t next_event_ = 0x100;
};

// Process 0 of members {0, 2, 1}: ranks are positions, so process 2 is rank 1 and 1 is rank 2.
std::unique_ptr<NcclTransport> MakeTransport(std::shared_ptr<FakeState> state,
                                             absl::Time connect_deadline = absl::InfiniteFuture()) {
  NcclOptions options;
  options.process = 0;
  options.members = {0, 2, 1};
  options.connect_deadline = connect_deadline;
  absl::StatusOr<std::unique_ptr<NcclTransport>> transport =
      NcclTransport::Create(options, std::make_unique<FakeNcclApi>(state));
  EXPECT_TRUE(transport.ok()) << transport.status();
  return transport.ok() ? std::move(*transport) : nullptr;
}

// Device pointers are never dereferenced by the fake: any distinct addresses will do.
char buffer[4096];

TEST(NcclTransportTest, RoundIsOneGroupIssuedOnFirstTest) {
  auto state = std::make_shared<FakeState>();
  auto t = MakeTransport(state);
  ASSERT_NE(t, nullptr);
  const size_t after_init = state->Nccl().size();
  RequestId a = *t->PostSend(1, MakeTag(7, 0, 0), buffer, 8);
  RequestId b = *t->PostReceive(1, MakeTag(7, 0, 1), buffer + 8, 16);
  // Round 1 posted early (the executor overlaps rounds): it must not join round 0's group.
  RequestId early = *t->PostSend(1, MakeTag(7, 1, 0), buffer + 64, 2);
  RequestId c = *t->PostSend(2, MakeTag(7, 0, 0), buffer + 32, 4);
  EXPECT_EQ(state->Nccl().size(), after_init);  // Posting only records.
  EXPECT_EQ(t->groups_issued(), 0);
  EXPECT_EQ(t->Test(a).value_or(true), false);
  std::vector<std::string> log = state->Nccl();
  log.erase(log.begin(), log.begin() + after_init);
  EXPECT_THAT(log, ElementsAre("GroupStart", "Send(2,8)", "Recv(2,16)", "Send(1,4)", "GroupEnd",
                               "EventRecord"));
  EXPECT_EQ(t->groups_issued(), 1);
  {
    absl::MutexLock lock(&state->mu);
    state->events_complete = true;
  }
  EXPECT_TRUE(t->WaitAll({a, b, c}, absl::Now() + absl::Seconds(5)).ok());
  EXPECT_EQ(t->groups_issued(), 1);
  // Round 1 is its own group, issued when it is waited for, with the ops posted since.
  {
    absl::MutexLock lock(&state->mu);
    state->events_complete = false;
  }
  RequestId d = *t->PostReceive(2, MakeTag(7, 1, 2), buffer, 8);
  EXPECT_EQ(t->Test(d).value_or(true), false);
  EXPECT_EQ(t->groups_issued(), 2);
  log = state->Nccl();
  log.erase(log.begin(), log.end() - 5);
  EXPECT_THAT(log, ElementsAre("GroupStart", "Send(2,2)", "Recv(1,8)", "GroupEnd", "EventRecord"));
  {
    absl::MutexLock lock(&state->mu);
    state->events_complete = true;
  }
  EXPECT_EQ(t->Test(d).value_or(false), true);
  EXPECT_EQ(t->Test(d).status().code(), absl::StatusCode::kNotFound);  // Released.
  EXPECT_TRUE(t->WaitAll({early}, absl::Now() + absl::Seconds(5)).ok());
  // An explicit Flush issues every recorded round, one group each.
  RequestId e = *t->PostSend(1, MakeTag(8, 0, 0), buffer, 8);
  RequestId f = *t->PostSend(1, MakeTag(8, 1, 0), buffer, 8);
  ASSERT_TRUE(t->Flush().ok());
  EXPECT_EQ(t->groups_issued(), 4);
  EXPECT_TRUE(t->WaitAll({e, f}, absl::Now() + absl::Seconds(5)).ok());
  t.reset();
  EXPECT_EQ(state->destroys, 1);
  EXPECT_EQ(state->aborts, 0);
  EXPECT_EQ(state->events_alive, 0);
}

TEST(NcclTransportTest, EventRecordedOnlyOnceTheGroupIsEnqueued) {
  auto state = std::make_shared<FakeState>();
  auto t = MakeTransport(state);
  {
    absl::MutexLock lock(&state->mu);
    state->enqueue_polls = 2;
    state->events_complete = true;
  }
  RequestId a = *t->PostReceive(2, MakeTag(1, 0, 2), buffer, 8);
  RequestId b = *t->PostReceive(2, MakeTag(1, 1, 2), buffer, 8);
  EXPECT_EQ(t->Test(a).value_or(true), false);  // First poll: still enqueuing.
  std::vector<std::string> log = state->Nccl();
  EXPECT_EQ(std::count(log.begin(), log.end(), "EventRecord"), 0);
  // Round 1 is not issued while round 0 is being enqueued.
  EXPECT_EQ(t->Test(b).value_or(true), false);
  EXPECT_EQ(t->groups_issued(), 1);
  EXPECT_TRUE(t->WaitAll({a, b}, absl::Now() + absl::Seconds(5)).ok());
  EXPECT_EQ(t->groups_issued(), 2);
  log = state->Nccl();
  EXPECT_EQ(std::count(log.begin(), log.end(), "EventRecord"), 2);
}

TEST(NcclTransportTest, ChecksTagOrderPerPeerAndDirection) {
  auto state = std::make_shared<FakeState>();
  auto t = MakeTransport(state);
  ASSERT_TRUE(t->PostReceive(1, MakeTag(3, 5, 1), buffer, 8).ok());
  absl::StatusOr<RequestId> late = t->PostReceive(1, MakeTag(3, 4, 1), buffer, 8);
  EXPECT_EQ(late.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(late.status().message()), HasSubstr("receive from process 1: round 4"));
  EXPECT_THAT(std::string(late.status().message()), HasSubstr("after round 5"));
  // Equal rounds keep their order; other directions and peers are independent; a new sync starts
  // over.
  EXPECT_TRUE(t->PostReceive(1, MakeTag(3, 5, 1), buffer, 8).ok());
  EXPECT_TRUE(t->PostSend(1, MakeTag(3, 0, 0), buffer, 8).ok());
  EXPECT_TRUE(t->PostReceive(2, MakeTag(3, 1, 2), buffer, 8).ok());
  EXPECT_TRUE(t->PostReceive(1, MakeTag(4, 0, 1), buffer, 8).ok());
  // Sender bits must be the sender's.
  absl::StatusOr<RequestId> wrong = t->PostReceive(1, MakeTag(4, 1, 2), buffer, 8);
  EXPECT_THAT(std::string(wrong.status().message()), HasSubstr("names sender 2, not process 1"));
  EXPECT_EQ(t->PostSend(2, MakeTag(4, 1, 1), buffer, 8).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(NcclTransportTest, RefusesStrangersAndHostMemory) {
  auto state = std::make_shared<FakeState>();
  auto t = MakeTransport(state);
  EXPECT_THAT(std::string(t->PostSend(5, MakeTag(1, 0, 0), buffer, 8).status().message()),
              HasSubstr("process 5: not a member"));
  EXPECT_EQ(t->RegisterMemory(buffer, 64, MemoryKind::kHost).status().code(),
            absl::StatusCode::kUnimplemented);
  {
    absl::MutexLock lock(&state->mu);
    state->host_pointers.insert(buffer + 64);
  }
  EXPECT_EQ(t->PostSend(1, MakeTag(1, 0, 0), buffer + 64, 8).status().code(),
            absl::StatusCode::kUnimplemented);
  absl::StatusOr<RegistrationId> reg = t->RegisterMemory(buffer, 64, MemoryKind::kCuda);
  ASSERT_TRUE(reg.ok());
  EXPECT_TRUE(t->DeregisterMemory(*reg).ok());
  std::vector<std::string> log = state->Nccl();
  EXPECT_EQ(std::count(log.begin(), log.end(), "CommRegister(64)"), 1);
  EXPECT_EQ(std::count(log.begin(), log.end(), "CommDeregister"), 1);
}

TEST(NcclTransportTest, EmptyMessagesCompleteWithoutNccl) {
  auto state = std::make_shared<FakeState>();
  auto t = MakeTransport(state);
  RequestId a = *t->PostSend(0, MakeTag(1, 0, 0), nullptr, 0);
  RequestId b = *t->PostReceive(0, MakeTag(1, 0, 0), nullptr, 0);
  EXPECT_TRUE(t->WaitAll({a, b}, absl::Now()).ok());
  EXPECT_EQ(t->groups_issued(), 0);
}

TEST(NcclTransportTest, DeadlineAbortsTheCommunicatorAndNamesPeers) {
  auto state = std::make_shared<FakeState>();
  auto t = MakeTransport(state);
  RequestId a = *t->PostReceive(1, MakeTag(1, 0, 1), buffer, 8);
  RequestId b = *t->PostSend(2, MakeTag(1, 0, 0), buffer, 8);
  const absl::Time start = absl::Now();
  absl::Status status = t->WaitAll({a, b}, start + absl::Milliseconds(50));
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(status.message()), HasSubstr("process 1 (receive)"));
  EXPECT_THAT(std::string(status.message()), HasSubstr("process 2 (send)"));
  EXPECT_EQ(state->aborts, 1);
  // Aborted for good: later posts fail, ids were released.
  EXPECT_FALSE(t->PostSend(1, MakeTag(2, 0, 0), buffer, 8).ok());
  EXPECT_EQ(t->Test(a).status().code(), absl::StatusCode::kNotFound);
  t.reset();
  EXPECT_EQ(state->destroys, 0);  // An aborted communicator is freed by the abort.
  EXPECT_EQ(state->aborts, 1);
  EXPECT_EQ(state->events_alive, 0);
}

TEST(NcclTransportTest, AsyncErrorFailsRequestsNamingPeers) {
  auto state = std::make_shared<FakeState>();
  auto t = MakeTransport(state);
  RequestId a = *t->PostReceive(2, MakeTag(1, 0, 2), buffer, 8);
  RequestId b = *t->PostReceive(1, MakeTag(1, 0, 1), buffer + 8, 8);
  ASSERT_TRUE(t->Flush().ok());
  {
    absl::MutexLock lock(&state->mu);
    state->async_error = absl::UnavailableError("ncclRemoteError: remote process exited");
  }
  absl::StatusOr<bool> first = t->Test(a);
  EXPECT_EQ(first.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(first.status().message()), HasSubstr("process 2 (receive)"));
  EXPECT_THAT(std::string(first.status().message()), HasSubstr("process 1 (receive)"));
  EXPECT_THAT(std::string(first.status().message()), HasSubstr("remote process exited"));
  absl::Status rest = t->WaitAll({b}, absl::InfiniteFuture());
  EXPECT_EQ(rest.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(state->aborts, 1);
}

TEST(NcclTransportTest, AbortFromAnotherThreadEndsAWait) {
  auto state = std::make_shared<FakeState>();
  auto t = MakeTransport(state);
  RequestId a = *t->PostReceive(1, MakeTag(1, 0, 1), buffer, 8);
  std::thread aborter([&] {
    absl::SleepFor(absl::Milliseconds(30));
    t->Abort(absl::CancelledError("trainer gave up"));
    t->Abort(absl::CancelledError("again"));  // Idempotent.
  });
  absl::Status status = t->WaitAll({a}, absl::InfiniteFuture());
  aborter.join();
  EXPECT_EQ(status.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(std::string(status.message()), HasSubstr("trainer gave up"));
  EXPECT_EQ(state->aborts, 1);
}

TEST(NcclTransportTest, ConnectDeadlineAbortsTheForming) {
  auto state = std::make_shared<FakeState>();
  state->init_polls = 1 << 30;  // Never ready.
  NcclOptions options;
  options.process = 1;
  options.members = {0, 1};
  options.connect_deadline = absl::Now() + absl::Milliseconds(30);
  absl::StatusOr<std::unique_ptr<NcclTransport>> t =
      NcclTransport::Create(options, std::make_unique<FakeNcclApi>(state));
  EXPECT_EQ(t.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(t.status().message()), HasSubstr("did not form by the deadline"));
  EXPECT_EQ(state->aborts, 1);
  options.members = {0, 2};
  EXPECT_EQ(NcclTransport::Create(options, std::make_unique<FakeNcclApi>(state)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(NcclUniqueIdTest, RoundTripsItsBytes) {
  NcclUniqueId id;
  for (size_t i = 0; i < id.bytes.size(); ++i) id.bytes[i] = static_cast<char>(i * 7);
  absl::StatusOr<NcclUniqueId> back = NcclUniqueId::FromBytes(id.ToBytes());
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->bytes, id.bytes);
  EXPECT_FALSE(NcclUniqueId::FromBytes("short").ok());
}

// Pack and unpack through the 2-D copy decomposition (the fake's copy is a host memcpy) against a
// direct element loop.
void ReferenceCopy(char* dst, const std::vector<int64_t>& ds, const char* src,
                   const std::vector<int64_t>& ss, const std::vector<int64_t>& shape, int64_t es) {
  int64_t total = 1;
  for (int64_t e : shape) total *= e;
  std::vector<int64_t> index(shape.size(), 0);
  for (int64_t n = 0; n < total; ++n) {
    int64_t d = 0, s = 0;
    for (size_t a = 0; a < shape.size(); ++a) {
      d += index[a] * ds[a];
      s += index[a] * ss[a];
    }
    std::memcpy(dst + d * es, src + s * es, es);
    for (int a = static_cast<int>(shape.size()) - 1; a >= 0; --a) {
      if (++index[a] < shape[a]) break;
      index[a] = 0;
    }
  }
}

TEST(CudaCopyTest, MatchesReferenceForManyGeometries) {
  struct Case {
    std::vector<int64_t> shape, src_strides;
    int64_t es;
    int64_t expected_copies;
  };
  const std::vector<Case> cases = {
      {{4, 6}, {6, 1}, 2, 1},           // Contiguous: merged into one row.
      {{4, 6}, {10, 1}, 2, 1},          // Row slice of a wider matrix: one 2-D copy.
      {{3, 4, 5}, {40, 10, 1}, 4, 1},   // Outer axes merge: still 2-D.
      {{3, 4, 5}, {100, 10, 1}, 4, 3},  // 3-D: one 2-D copy per outer index.
      {{3, 1, 5}, {50, 7, 1}, 4, 1},    // Extent-1 axis ignored.
      {{4, 3}, {1, 4}, 2, 4},           // Transposed: element rows.
      {{2, 3, 4}, {24, 8, 1}, 8, 1},    // Fused qkv slice with a gap: 2-D after merging.
      {{2, 3, 4}, {30, 8, 1}, 8, 2},    // Gaps on two axes.
      {{0, 3}, {3, 1}, 4, 0},           // Empty.
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::PrintToString(c.shape) + " " + ::testing::PrintToString(c.src_strides));
    int64_t src_span = 1, count = 1;
    for (size_t a = 0; a < c.shape.size(); ++a) {
      src_span += (std::max<int64_t>(c.shape[a], 1) - 1) * c.src_strides[a];
      count *= c.shape[a];
    }
    std::vector<char> src(src_span * c.es);
    for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<char>(i * 13 + 1);
    std::vector<int64_t> packed_strides(c.shape.size(), 1);
    for (int a = static_cast<int>(c.shape.size()) - 2; a >= 0; --a) {
      packed_strides[a] = packed_strides[a + 1] * c.shape[a + 1];
    }
    std::vector<char> expected(count * c.es + 1, 0), packed(count * c.es + 1, 0);
    ReferenceCopy(expected.data(), packed_strides, src.data(), c.src_strides, c.shape, c.es);
    auto state = std::make_shared<FakeState>();
    FakeNcclApi api(state);
    ASSERT_TRUE(
        PackRegionAsync(api, nullptr, packed.data(), src.data(), c.src_strides, c.shape, c.es)
            .ok());
    EXPECT_EQ(packed, expected);
    EXPECT_EQ(api.copies_, c.expected_copies);
    EXPECT_EQ(CountCopies2D(packed_strides, c.src_strides, c.shape, c.es), c.expected_copies);
    std::vector<char> back(src.size(), 0), back_expected(src.size(), 0);
    ReferenceCopy(back_expected.data(), c.src_strides, packed.data(), packed_strides, c.shape,
                  c.es);
    ASSERT_TRUE(
        UnpackRegionAsync(api, nullptr, back.data(), c.src_strides, packed.data(), c.shape, c.es)
            .ok());
    EXPECT_EQ(back, back_expected);
  }
}

}  // namespace
}  // namespace wsync
