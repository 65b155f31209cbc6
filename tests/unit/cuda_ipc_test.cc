// The CUDA IPC backend against FakeCudaFabric (device memory in memfds, IPC handles mapped at
// other addresses, lazy streams) with a loopback messenger: random messages between 2-4 processes
// (threads) land byte for byte where the reference puts them; sizes, deadlines, peer loss, abort,
// host memory fail as the contract says; every round is usable; a send completes only once its
// receiver copied; each allocation's handle is opened once per receiver. The real module without a
// GPU and pairs of forked processes: cuda_ipc_process_test.cc.

#include <algorithm>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "device/cuda_module.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/fake_cuda_fabric.h"
#include "transport/cuda_ipc/cuda_ipc_transport.h"
#include "transport/forwarding_transport.h"
#include "transport/loopback/loopback.h"

namespace wsync {
namespace {

using test::FakeCudaFabric;
using ::testing::AllOf;
using ::testing::HasSubstr;

// `n` CUDA IPC transports, processes 0..n-1, over one fake and one loopback messenger fabric.
struct Job {
  explicit Job(int32_t n) : messengers(n) {
    for (int32_t p = 0; p < n; ++p) {
      CudaIpcOptions options;
      options.process = p;
      absl::StatusOr<std::unique_ptr<Transport>> messenger = messengers.Connect(p);
      EXPECT_TRUE(messenger.ok()) << messenger.status();
      absl::StatusOr<std::unique_ptr<CudaIpcTransport>> t =
          CudaIpcTransport::Create(options, cuda.Api(), std::move(*messenger));
      EXPECT_TRUE(t.ok()) << t.status();
      transports.push_back(std::move(*t));
    }
  }
  // A device allocation of `bytes` filled with `seed`-derived bytes.
  char* Allocate(int64_t bytes, uint64_t seed) {
    absl::StatusOr<void*> memory = api->Malloc(bytes);
    EXPECT_TRUE(memory.ok()) << memory.status();
    char* data = static_cast<char*>(*memory);
    std::mt19937_64 rng(seed);
    for (int64_t i = 0; i < bytes; ++i) data[i] = static_cast<char>(rng());
    allocations.push_back(data);
    return data;
  }
  ~Job() {
    transports.clear();
    for (char* memory : allocations) EXPECT_TRUE(api->Free(memory).ok());
  }
  CudaIpcTransport& operator[](int32_t p) { return *transports[p]; }

  FakeCudaFabric cuda;
  std::unique_ptr<NcclApi> api = cuda.Api();
  LoopbackFabric messengers;
  std::vector<std::unique_ptr<CudaIpcTransport>> transports;
  std::vector<char*> allocations;
};

struct Message {
  int32_t from, to;
  int64_t round;
  const char* source;
  char* destination;
  int64_t bytes;
};

// Random messages between 2-4 processes: random allocations, offsets and sizes (empty messages
// and self-sends included, several messages of one pair in one round sometimes), rounds
// ascending; each process posts its part in message order and waits (WaitAll or WaitAny). Every
// byte of every destination allocation is checked against a host reference.
TEST(CudaIpcTest, RandomMessagesLandWhereTheReferencePutsThem) {
  for (uint64_t seed = 1; seed <= 24; ++seed) {
    SCOPED_TRACE(absl::StrCat("seed ", seed));
    std::mt19937_64 rng(seed);
    const int32_t n = 2 + static_cast<int32_t>(rng() % 3);
    Job job(n);
    struct Region {
      char* memory;
      int64_t bytes;
      std::string reference;
      int64_t cursor = 0;  // Destination bytes handed out so far.
    };
    // Per process: allocations that send and allocations that receive (sources never change).
    std::vector<std::vector<Region>> sources(n), destinations(n);
    for (int32_t p = 0; p < n; ++p) {
      for (auto* regions : {&sources[p], &destinations[p]}) {
        const int count = 1 + static_cast<int>(rng() % 3);
        for (int a = 0; a < count; ++a) {
          const int64_t bytes = 1 + static_cast<int64_t>(rng() % 20000);
          char* memory = job.Allocate(bytes, rng());
          regions->push_back(Region{memory, bytes, std::string(memory, bytes)});
        }
      }
    }
    std::vector<Message> messages;
    int64_t round = static_cast<int64_t>(rng() % 1000) + (seed % 3 == 0 ? kMaxRounds - 60000 : 0);
    const int count = 5 + static_cast<int>(rng() % 40);
    for (int m = 0; m < count; ++m) {
      if (rng() % 3 != 0) round += 1 + static_cast<int64_t>(rng() % 50000);
      round = std::min(round, kMaxRounds - 1);
      const int32_t from = static_cast<int32_t>(rng() % n);
      const int32_t to = rng() % 5 == 0 ? from : static_cast<int32_t>(rng() % n);
      const Region& src = sources[from][rng() % sources[from].size()];
      Region& dst = destinations[to][rng() % destinations[to].size()];
      const int64_t room = dst.bytes - dst.cursor;
      int64_t bytes = rng() % 6 == 0 ? 0 : 1 + static_cast<int64_t>(rng() % 4096);
      bytes = std::min({bytes, room, src.bytes});
      const int64_t src_offset = static_cast<int64_t>(rng() % (src.bytes - bytes + 1));
      const int64_t skip = static_cast<int64_t>(rng() % (room - bytes + 1)) / 4;
      const int64_t dst_offset = dst.cursor + skip;
      dst.cursor = dst_offset + bytes;
      std::memcpy(dst.reference.data() + dst_offset, src.reference.data() + src_offset, bytes);
      messages.push_back(
          Message{from, to, round, src.memory + src_offset, dst.memory + dst_offset, bytes});
    }
    const bool use_wait_any = seed % 2 == 0;
    std::vector<absl::Status> results(n);
    std::vector<std::thread> threads;
    for (int32_t p = 0; p < n; ++p) {
      threads.emplace_back([&, p] {
        std::vector<RequestId> ids;
        for (const Message& m : messages) {
          const MessageTag tag = MakeTag(7, m.round, m.from);
          if (m.from == p) {
            absl::StatusOr<RequestId> id = job[p].PostSend(m.to, tag, m.source, m.bytes);
            if (!id.ok()) return void(results[p] = id.status());
            ids.push_back(*id);
          }
          if (m.to == p) {
            absl::StatusOr<RequestId> id = job[p].PostReceive(m.from, tag, m.destination, m.bytes);
            if (!id.ok()) return void(results[p] = id.status());
            ids.push_back(*id);
          }
        }
        const absl::Time deadline = absl::Now() + absl::Seconds(60);
        if (!use_wait_any) return void(results[p] = job[p].WaitAll(ids, deadline));
        while (!ids.empty()) {
          std::vector<size_t> finished;
          absl::Status status = job[p].WaitAny(ids, deadline, &finished);
          if (!status.ok()) {
            job[p].WaitAll(ids, absl::InfinitePast()).IgnoreError();
            return void(results[p] = status);
          }
          std::vector<RequestId> left;
          for (size_t i = 0; i < ids.size(); ++i) {
            if (std::find(finished.begin(), finished.end(), i) == finished.end()) {
              left.push_back(ids[i]);
            }
          }
          ids = std::move(left);
        }
      });
    }
    for (std::thread& t : threads) t.join();
    for (int32_t p = 0; p < n; ++p) EXPECT_TRUE(results[p].ok()) << p << ": " << results[p];
    for (int32_t p = 0; p < n; ++p) {
      for (const Region& r : destinations[p]) {
        ASSERT_EQ(std::string(r.memory, r.bytes), r.reference) << "process " << p;
      }
    }
  }
}

TEST(CudaIpcTest, SendCompletesOnlyAfterTheReceiverCopied) {
  Job job(2);
  char* source = job.Allocate(4096, 1);
  char* destination = job.Allocate(4096, 2);
  const std::string expected(source + 100, 1000);
  const MessageTag tag = MakeTag(1, 3, 0);
  absl::StatusOr<RequestId> receive = job[1].PostReceive(0, tag, destination + 50, 1000);
  absl::StatusOr<RequestId> send = job[0].PostSend(1, tag, source + 100, 1000);
  ASSERT_TRUE(receive.ok() && send.ok());
  // The descriptor is delivered (loopback copies at the second post), but process 1 has not
  // copied yet: the send must not complete, however often it is tested.
  for (int i = 0; i < 20; ++i) {
    absl::StatusOr<bool> done = job[0].Test(*send);
    ASSERT_TRUE(done.ok()) << done.status();
    ASSERT_FALSE(*done);
  }
  ASSERT_TRUE(job[1].WaitAll({*receive}, absl::Now() + absl::Seconds(10)).ok());
  ASSERT_TRUE(job[0].WaitAll({*send}, absl::Now() + absl::Seconds(10)).ok());
  EXPECT_EQ(std::string(destination + 50, 1000), expected);
}

// A messenger whose first posted receive looks unfinished to its first Test: the descriptor of an
// earlier receive is seen after that of a later one with the same tag, as happens between threads.
class WithholdingMessenger final : public ForwardingTransport {
 public:
  using ForwardingTransport::ForwardingTransport;
  absl::StatusOr<RequestId> PostReceive(int32_t peer, MessageTag tag, void* data,
                                        int64_t bytes) override {
    absl::StatusOr<RequestId> id = ForwardingTransport::PostReceive(peer, tag, data, bytes);
    if (id.ok() && first_ == 0) first_ = *id;
    return id;
  }
  absl::StatusOr<bool> Test(RequestId request) override {
    if (request == first_ && !withheld_) {
      withheld_ = true;
      return false;
    }
    return ForwardingTransport::Test(request);
  }

 private:
  RequestId first_ = 0;
  bool withheld_ = false;
};

// Two messages of one pair with equal tags: the receiver acknowledges them in posting order even
// when the later descriptor is seen first, so the sender's first send does not complete on the
// second receive's acknowledgement while its own bytes are still to be read.
TEST(CudaIpcTest, EqualTagsAcknowledgeInPostingOrder) {
  FakeCudaFabric cuda;
  std::unique_ptr<NcclApi> api = cuda.Api();
  LoopbackFabric messengers(2);
  CudaIpcOptions options;
  auto sender = CudaIpcTransport::Create(options, cuda.Api(), *messengers.Connect(0));
  options.process = 1;
  auto receiver = CudaIpcTransport::Create(
      options, cuda.Api(), std::make_unique<WithholdingMessenger>(*messengers.Connect(1)));
  ASSERT_TRUE(sender.ok() && receiver.ok());
  char* memory = static_cast<char*>(*api->Malloc(4096));
  for (int i = 0; i < 4096; ++i) memory[i] = static_cast<char>(i * 7 + 1);
  const std::string first(memory, 100), second(memory + 100, 100);
  const MessageTag tag = MakeTag(3, 9, 0);
  const RequestId r1 = *(*receiver)->PostReceive(0, tag, memory + 1000, 100);
  const RequestId r2 = *(*receiver)->PostReceive(0, tag, memory + 2000, 100);
  const RequestId s1 = *(*sender)->PostSend(1, tag, memory, 100);
  const RequestId s2 = *(*sender)->PostSend(1, tag, memory + 100, 100);
  EXPECT_FALSE(*(*receiver)->Test(r2));  // Waits for r1, whose descriptor looked late.
  absl::StatusOr<bool> first_sent = (*sender)->Test(s1);
  ASSERT_TRUE(first_sent.ok());
  EXPECT_FALSE(*first_sent) << "the first send completed before its bytes were read";
  if (*first_sent) std::memset(memory, 0, 100);  // What a caller may do once a send completed.
  EXPECT_TRUE((*receiver)->WaitAll({r1, r2}, absl::Now() + absl::Seconds(10)).ok());
  const std::vector<RequestId> sends =
      *first_sent ? std::vector<RequestId>{s2} : std::vector<RequestId>{s1, s2};
  EXPECT_TRUE((*sender)->WaitAll(sends, absl::Now() + absl::Seconds(10)).ok());
  EXPECT_EQ(std::string(memory + 1000, 100), first);
  EXPECT_EQ(std::string(memory + 2000, 100), second);
  sender->reset();
  receiver->reset();
  EXPECT_TRUE(api->Free(memory).ok());
}

TEST(CudaIpcTest, SizeMismatchFailsNamingThePeerAndBothSizes) {
  Job job(2);
  char* source = job.Allocate(256, 1);
  char* destination = job.Allocate(256, 2);
  const std::string before(destination, 256);
  const MessageTag tag = MakeTag(1, 0, 0);
  absl::StatusOr<RequestId> send = job[0].PostSend(1, tag, source, 100);
  absl::StatusOr<RequestId> receive = job[1].PostReceive(0, tag, destination, 64);
  ASSERT_TRUE(receive.ok() && send.ok());
  const absl::Status received = job[1].WaitAll({*receive}, absl::Now() + absl::Seconds(10));
  EXPECT_EQ(received.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(received.message(), AllOf(HasSubstr("process 0"), HasSubstr("100"), HasSubstr("64")));
  const absl::Status sent = job[0].WaitAll({*send}, absl::Now() + absl::Seconds(10));
  EXPECT_EQ(sent.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(sent.message(), AllOf(HasSubstr("process 1"), HasSubstr("100"), HasSubstr("64")));
  EXPECT_EQ(std::string(destination, 256), before);  // Nothing copied.
}

TEST(CudaIpcTest, DeadlineWhenThePeerNeverPostsNamesThePeer) {
  Job job(3);
  char* memory = job.Allocate(1024, 1);
  absl::StatusOr<RequestId> receive = job[1].PostReceive(2, MakeTag(1, 0, 2), memory, 10);
  absl::StatusOr<RequestId> send = job[0].PostSend(2, MakeTag(1, 0, 0), memory + 100, 10);
  ASSERT_TRUE(receive.ok() && send.ok());
  for (auto [p, id, peer] : {std::tuple{1, *receive, 2}, std::tuple{0, *send, 2}}) {
    const absl::Time start = absl::Now();
    const absl::Status status = job[p].WaitAll({id}, start + absl::Milliseconds(300));
    const absl::Duration took = absl::Now() - start;
    EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
    EXPECT_THAT(status.message(), HasSubstr(absl::StrCat("process ", peer)));
    EXPECT_GE(took, absl::Milliseconds(300));
    EXPECT_LT(took, absl::Seconds(5));
    EXPECT_EQ(job[p].Test(id).status().code(), absl::StatusCode::kNotFound);  // Released.
  }
}

TEST(CudaIpcTest, WaitAnyReturnsAtItsDeadlineReleasingNothing) {
  Job job(2);
  char* memory = job.Allocate(64, 1);
  absl::StatusOr<RequestId> receive = job[1].PostReceive(0, MakeTag(2, 1, 0), memory, 8);
  ASSERT_TRUE(receive.ok());
  std::vector<size_t> finished;
  const absl::Status status =
      job[1].WaitAny({*receive}, absl::Now() + absl::Milliseconds(50), &finished);
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(finished.empty());
  absl::StatusOr<RequestId> send = job[0].PostSend(1, MakeTag(2, 1, 0), memory + 32, 8);
  ASSERT_TRUE(send.ok());
  EXPECT_TRUE(job[1].WaitAll({*receive}, absl::Now() + absl::Seconds(10)).ok());
  EXPECT_TRUE(job[0].WaitAll({*send}, absl::Now() + absl::Seconds(10)).ok());
  EXPECT_EQ(std::string(memory, 8), std::string(memory + 32, 8));
}

// WaitAny reports a failed request with its position and error, and leaves the others posted.
TEST(CudaIpcTest, WaitAnyReportsAFailureByPosition) {
  Job job(2);
  char* memory = job.Allocate(256, 1);
  absl::StatusOr<RequestId> never = job[1].PostReceive(0, MakeTag(2, 1, 0), memory, 8);
  absl::StatusOr<RequestId> mismatched = job[1].PostReceive(0, MakeTag(2, 2, 0), memory + 8, 8);
  absl::StatusOr<RequestId> send = job[0].PostSend(1, MakeTag(2, 2, 0), memory + 64, 16);
  ASSERT_TRUE(never.ok() && mismatched.ok() && send.ok());
  std::vector<size_t> finished;
  const absl::Status status =
      job[1].WaitAny({*never, *mismatched}, absl::Now() + absl::Seconds(10), &finished);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_EQ(finished, std::vector<size_t>{1});
  EXPECT_EQ(job[1].Test(*mismatched).status().code(), absl::StatusCode::kNotFound);
  absl::StatusOr<bool> still = job[1].Test(*never);
  ASSERT_TRUE(still.ok()) << still.status();
  EXPECT_FALSE(*still);
  EXPECT_EQ(job[0].WaitAll({*send}, absl::Now() + absl::Seconds(10)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(job[1].WaitAll({*never}, absl::InfinitePast()).code(),
            absl::StatusCode::kDeadlineExceeded);
}

// A wait blocked on a peer ends promptly, far before its deadline, when the peer is lost or the
// transport aborted; later posts fail after Abort.
TEST(CudaIpcTest, PeerLostAndAbortEndInFlightWaitsPromptly) {
  for (const bool abort : {false, true}) {
    SCOPED_TRACE(abort ? "abort" : "peer lost");
    Job job(2);
    char* memory = job.Allocate(1024, 1);
    absl::StatusOr<RequestId> receive = job[1].PostReceive(0, MakeTag(1, 0, 0), memory, 10);
    absl::StatusOr<RequestId> send = job[1].PostSend(0, MakeTag(1, 0, 1), memory + 100, 10);
    ASSERT_TRUE(receive.ok() && send.ok());
    std::thread killer([&] {
      absl::SleepFor(absl::Milliseconds(100));
      if (abort) {
        job[1].Abort(absl::CancelledError("test abort"));
      } else {
        job[1].PeerLost(0, absl::UnavailableError("process 0 died"));
      }
    });
    const absl::Time start = absl::Now();
    const absl::Status status = job[1].WaitAll({*receive, *send}, start + absl::Seconds(60));
    killer.join();
    EXPECT_FALSE(status.ok());
    EXPECT_NE(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
    EXPECT_LT(absl::Now() - start, absl::Seconds(10));
    if (abort) {
      EXPECT_EQ(status.code(), absl::StatusCode::kAborted) << status;
      EXPECT_EQ(job[1].PostReceive(0, MakeTag(1, 1, 0), memory, 10).status().code(),
                absl::StatusCode::kAborted);
    }
  }
}

TEST(CudaIpcTest, AKilledSenderFailsTheReceiveWithUnavailable) {
  Job job(2);
  char* memory = job.Allocate(1024, 1);
  absl::StatusOr<RequestId> receive = job[1].PostReceive(0, MakeTag(1, 0, 0), memory, 10);
  ASSERT_TRUE(receive.ok());
  std::thread killer([&] {
    absl::SleepFor(absl::Milliseconds(100));
    job.messengers.Kill(0);
  });
  const absl::Time start = absl::Now();
  const absl::Status status = job[1].WaitAll({*receive}, start + absl::Seconds(60));
  killer.join();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_THAT(status.message(), HasSubstr("process 0"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
}

// DiscardStaleMessages reaches the messenger: a descriptor of an earlier sync is dropped, so a
// late receive of that sync never sees it.
TEST(CudaIpcTest, StaleDescriptorsAreDiscarded) {
  Job job(2);
  char* memory = job.Allocate(64, 1);
  absl::StatusOr<RequestId> send = job[0].PostSend(1, MakeTag(1, 4, 0), memory, 8);
  ASSERT_TRUE(send.ok());
  EXPECT_EQ(job[1].DiscardStaleMessages(2), 1);
  absl::StatusOr<RequestId> receive = job[1].PostReceive(0, MakeTag(1, 4, 0), memory + 32, 8);
  ASSERT_TRUE(receive.ok());
  EXPECT_EQ(job[1].WaitAll({*receive}, absl::Now() + absl::Milliseconds(100)).code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(job[0].WaitAll({*send}, absl::Now() + absl::Milliseconds(100)).code(),
            absl::StatusCode::kDeadlineExceeded);
}

TEST(CudaIpcTest, HostMemoryIsRefused) {
  Job job(2);
  std::vector<char> host(64);
  EXPECT_EQ(job[0].PostSend(1, MakeTag(1, 0, 0), host.data(), 8).status().code(),
            absl::StatusCode::kUnimplemented);
  EXPECT_EQ(job[0].PostReceive(1, MakeTag(1, 0, 1), host.data(), 8).status().code(),
            absl::StatusCode::kUnimplemented);
  EXPECT_EQ(job[0].RegisterMemory(host.data(), 64, MemoryKind::kHost).status().code(),
            absl::StatusCode::kUnimplemented);
  EXPECT_EQ(job[0].RegisterMemory(host.data(), 64, MemoryKind::kCuda).status().code(),
            absl::StatusCode::kUnimplemented);
}

// Every round is carried, the last one (the executor's verification round) included, with
// messages both ways in one round: descriptors and acknowledgements never match each other.
TEST(CudaIpcTest, EveryRoundIsCarriedBothWays) {
  Job job(2);
  char* memory = job.Allocate(1024, 1);
  for (const int64_t round : {int64_t{0}, kMaxRounds / 2 - 1, kMaxRounds / 2, kMaxRounds - 1}) {
    SCOPED_TRACE(absl::StrCat("round ", round));
    std::memset(memory + 512, 0, 512);
    std::vector<RequestId> zero, one;
    for (int32_t p : {0, 1}) {
      const int32_t peer = 1 - p;
      std::vector<RequestId>& ids = p == 0 ? zero : one;
      ids.push_back(*job[p].PostSend(peer, MakeTag(9, round, p), memory + 100 * p, 64));
      ids.push_back(*job[p].PostReceive(peer, MakeTag(9, round, peer), memory + 512 + 100 * p, 64));
    }
    // Each side's send completes once the other copied: both wait at once.
    absl::Status waited_one;
    std::thread other([&] { waited_one = job[1].WaitAll(one, absl::Now() + absl::Seconds(10)); });
    EXPECT_TRUE(job[0].WaitAll(zero, absl::Now() + absl::Seconds(10)).ok());
    other.join();
    EXPECT_TRUE(waited_one.ok()) << waited_one;
    EXPECT_EQ(std::string(memory + 512, 64), std::string(memory + 100, 64));
    EXPECT_EQ(std::string(memory + 612, 64), std::string(memory, 64));
  }
}

// Each receiver opens a sender's allocation once, whatever the number of messages and syncs,
// and closes it when destroyed; a registered range's handle is made once, at registration.
TEST(CudaIpcTest, HandlesAreOpenedOncePerAllocation) {
  auto job = std::make_unique<Job>(3);
  char* a = job->Allocate(8192, 1);
  char* b = job->Allocate(8192, 2);
  char* destination = job->Allocate(1 << 16, 3);
  absl::StatusOr<RegistrationId> registered =
      (*job)[0].RegisterMemory(b + 64, 4096, MemoryKind::kCuda);
  ASSERT_TRUE(registered.ok()) << registered.status();
  EXPECT_EQ(job->cuda.ipc_handles_made(), 1);
  int64_t landed = 0;
  for (uint64_t sync = 1; sync <= 3; ++sync) {
    for (int32_t receiver : {1, 2}) {
      std::vector<RequestId> sends, receives;
      for (int m = 0; m < 6; ++m) {
        const char* source = (m % 2 == 0 ? a : b + 64) + 100 * m;
        const MessageTag tag = MakeTag(sync, m, 0);
        receives.push_back(*(*job)[receiver].PostReceive(0, tag, destination + landed, 50));
        sends.push_back(*(*job)[0].PostSend(receiver, tag, source, 50));
        landed += 50;
      }
      ASSERT_TRUE((*job)[receiver].WaitAll(receives, absl::Now() + absl::Seconds(10)).ok());
      ASSERT_TRUE((*job)[0].WaitAll(sends, absl::Now() + absl::Seconds(10)).ok());
      for (int m = 0; m < 6; ++m) {
        const char* source = (m % 2 == 0 ? a : b + 64) + 100 * m;
        ASSERT_EQ(std::string(destination + landed - 50 * (6 - m), 50), std::string(source, 50));
      }
    }
  }
  EXPECT_EQ(job->cuda.ipc_opens(), 4);  // Two allocations, two receivers.
  EXPECT_EQ(job->cuda.ipc_closes(), 0);
  // Sends from `a` (unregistered) ask for its handle each time; sends from `b` never.
  EXPECT_EQ(job->cuda.ipc_handles_made(), 1 + 3 * 2 * 3);
  EXPECT_TRUE((*job)[0].DeregisterMemory(*registered).ok());
  EXPECT_EQ((*job)[0].DeregisterMemory(*registered).code(), absl::StatusCode::kNotFound);
  FakeCudaFabric& cuda = job->cuda;
  job->transports.clear();
  EXPECT_EQ(cuda.ipc_closes(), 4);
}

// A sender that frees a buffer and allocates a new one between syncs: the receiver opens the new
// allocation's handle (never a stale mapping of the old one) and, at the sync boundary after the
// old one went unused for a sync, closes the old mapping.
TEST(CudaIpcTest, MappingsUnusedForASyncCloseAtTheSyncBoundary) {
  Job job(2);
  char* destination = job.Allocate(4096, 1);
  std::unique_ptr<NcclApi>& api = job.api;
  char* old_source = static_cast<char*>(*api->Malloc(1024));
  std::memset(old_source, 'o', 1024);
  auto transfer = [&](uint64_t sync, const char* source) {
    EXPECT_EQ(job[1].DiscardStaleMessages(sync), 0);
    const MessageTag tag = MakeTag(sync, 0, 0);
    absl::StatusOr<RequestId> receive = job[1].PostReceive(0, tag, destination, 64);
    absl::StatusOr<RequestId> send = job[0].PostSend(1, tag, source, 64);
    ASSERT_TRUE(receive.ok() && send.ok());
    ASSERT_TRUE(job[1].WaitAll({*receive}, absl::Now() + absl::Seconds(10)).ok());
    ASSERT_TRUE(job[0].WaitAll({*send}, absl::Now() + absl::Seconds(10)).ok());
    EXPECT_EQ(std::string(destination, 64), std::string(source, 64));
  };
  transfer(1, old_source);
  EXPECT_EQ(job.cuda.ipc_opens(), 1);
  ASSERT_TRUE(api->Free(old_source).ok());
  char* new_source = job.Allocate(1024, 2);  // Often at the freed address, with a new handle.
  transfer(2, new_source);
  EXPECT_EQ(job.cuda.ipc_opens(), 2);
  EXPECT_EQ(job.cuda.ipc_closes(), 0);  // Sync 1 is the one before sync 2.
  transfer(3, new_source);
  EXPECT_EQ(job.cuda.ipc_opens(), 2);
  EXPECT_EQ(job.cuda.ipc_closes(), 1);  // The old allocation's mapping, unused in syncs 2 and 3.
  transfer(4, new_source);
  EXPECT_EQ(job.cuda.ipc_closes(), 1);  // Used by sync 3, the one before.
  transfer(6, new_source);  // Sync 5 copied nothing: closed at sync 6's start, opened again.
  EXPECT_EQ(job.cuda.ipc_closes(), 2);
  EXPECT_EQ(job.cuda.ipc_opens(), 3);
}

// Threads of one OS process standing in for processes, with an API that (like CUDA) cannot open
// handles this OS process made: the receiver copies from the sender's own address, opening
// nothing, and every byte lands.
TEST(CudaIpcTest, PeersOfThisOsProcessAreReadAtTheirOwnAddresses) {
  Job job(2);
  job.cuda.set_opens_own_ipc_handles(false);
  char* source = job.Allocate(4096, 1);
  char* destination = job.Allocate(4096, 2);
  for (int i = 0; i < 4096; ++i) source[i] = static_cast<char>(i * 7 + 3);
  std::memset(destination, 0, 4096);
  for (int round = 0; round < 3; ++round) {
    const MessageTag tag = MakeTag(1, round, 0);
    const int64_t offset = 1000 * round;
    absl::StatusOr<RequestId> receive = job[1].PostReceive(0, tag, destination + offset + 5, 999);
    absl::StatusOr<RequestId> send = job[0].PostSend(1, tag, source + offset, 999);
    ASSERT_TRUE(receive.ok() && send.ok());
    ASSERT_TRUE(job[1].WaitAll({*receive}, absl::Now() + absl::Seconds(10)).ok());
    ASSERT_TRUE(job[0].WaitAll({*send}, absl::Now() + absl::Seconds(10)).ok());
    EXPECT_EQ(std::string(destination + offset + 5, 999), std::string(source + offset, 999));
  }
  EXPECT_EQ(job.cuda.ipc_opens(), 0);
}

}  // namespace
}  // namespace wsync
