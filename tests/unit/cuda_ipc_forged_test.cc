// Forged CUDA IPC descriptors (issue 26), against FakeCudaFabric with a loopback messenger that
// rewrites descriptors on the way: an offset past the mapped allocation, a bigger size, a forged
// "same process" descriptor and an equal pid of another pid namespace are refused, nothing is
// written past the receive, and no memory but a posted send is read. Part of cuda_ipc_test.

#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "common/process_identity.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/fake_cuda_fabric.h"
#include "transport/cuda_ipc/cuda_ipc_impl.h"
#include "transport/cuda_ipc/cuda_ipc_transport.h"
#include "transport/forwarding_transport.h"
#include "transport/loopback/loopback.h"

namespace wsync {
namespace {

using test::FakeCudaFabric;
using ::testing::AllOf;
using ::testing::HasSubstr;

// The descriptor as the transport lays it out, for a messenger that forges fields on the way (an
// attacker on the host transport).
using WireDescriptor = cuda_ipc_internal::Descriptor;

// Forwards everything; descriptors (messages of sizeof(WireDescriptor) bytes) leave as forged
// copies.
class ForgingMessenger : public ForwardingTransport {
 public:
  ForgingMessenger(std::unique_ptr<Transport> inner, std::function<void(WireDescriptor&)> forge)
      : ForwardingTransport(std::move(inner)), forge_(std::move(forge)) {}
  absl::StatusOr<RequestId> PostSend(int32_t peer, MessageTag tag, const void* data,
                                     int64_t bytes) override {
    if (bytes != static_cast<int64_t>(sizeof(WireDescriptor))) {
      return ForwardingTransport::PostSend(peer, tag, data, bytes);
    }
    auto copy = std::make_unique<WireDescriptor>();
    std::memcpy(copy.get(), data, sizeof(WireDescriptor));
    forge_(*copy);
    forged_.push_back(std::move(copy));
    return ForwardingTransport::PostSend(peer, tag, forged_.back().get(), bytes);
  }

 private:
  std::function<void(WireDescriptor&)> forge_;
  std::vector<std::unique_ptr<WireDescriptor>> forged_;
};

// Process 0 sends `bytes` from the start of a 4096-byte allocation to process 1 through a
// messenger that forges its descriptors; returns process 1's receive status. The receive buffer
// is followed by guard bytes that must stay untouched.
absl::Status ForgedReceive(std::function<void(WireDescriptor&)> forge, bool opens_own_handles,
                           std::string* received = nullptr) {
  FakeCudaFabric cuda;
  cuda.set_opens_own_ipc_handles(opens_own_handles);
  std::unique_ptr<NcclApi> api = cuda.Api();
  LoopbackFabric messengers(2);
  std::vector<std::unique_ptr<CudaIpcTransport>> t;
  for (int32_t p = 0; p < 2; ++p) {
    CudaIpcOptions options;
    options.process = p;
    std::unique_ptr<Transport> messenger = *messengers.Connect(p);
    if (p == 0) messenger = std::make_unique<ForgingMessenger>(std::move(messenger), forge);
    t.push_back(*CudaIpcTransport::Create(options, cuda.Api(), std::move(messenger)));
  }
  char* source = static_cast<char*>(*api->Malloc(4096));
  char* destination = static_cast<char*>(*api->Malloc(4096));
  std::memset(source, 's', 4096);
  std::memset(destination, 'g', 4096);
  const MessageTag tag = MakeTag(1, 0, 0);
  absl::StatusOr<RequestId> receive = t[1]->PostReceive(0, tag, destination, 1000);
  absl::StatusOr<RequestId> send = t[0]->PostSend(1, tag, source, 1000);
  EXPECT_TRUE(receive.ok() && send.ok());
  const absl::Status status = t[1]->WaitAll({*receive}, absl::Now() + absl::Seconds(10));
  if (received != nullptr) *received = std::string(destination, 1000);
  EXPECT_EQ(std::string(destination + 1000, 3096), std::string(3096, 'g')) << "guard bytes";
  t[0]->WaitAll({*send}, absl::Now() + absl::Milliseconds(200)).IgnoreError();
  t.clear();
  EXPECT_TRUE(api->Free(source).ok());
  EXPECT_TRUE(api->Free(destination).ok());
  return status;
}

TEST(CudaIpcTest, AnHonestDescriptorThroughTheForgingMessengerLands) {
  std::string received;
  EXPECT_TRUE(ForgedReceive([](WireDescriptor&) {}, true, &received).ok());
  EXPECT_EQ(received, std::string(1000, 's'));
}

// The bug: the offset was checked against the allocation size the same descriptor claims, so a
// forged pair read past the sender's mapping.
TEST(CudaIpcTest, AForgedOffsetPastTheMappedAllocationIsRefused) {
  const absl::Status status = ForgedReceive(
      [](WireDescriptor& d) {
        d.offset = 3500;  // 3500 + 1000 > 4096
        d.allocation_bytes = int64_t{1} << 30;
      },
      true);
  EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied) << status;
  EXPECT_THAT(status.message(), AllOf(HasSubstr("process 0"), HasSubstr("offset 3500"),
                                      HasSubstr("allocation of 4096 bytes")));
  const absl::Status negative = ForgedReceive([](WireDescriptor& d) { d.offset = -8; }, true);
  EXPECT_EQ(negative.code(), absl::StatusCode::kPermissionDenied) << negative;
}

// A bigger size than the receive's: refused, nothing written past the receive (guard bytes).
TEST(CudaIpcTest, AForgedBiggerSizeIsRefused) {
  const absl::Status status = ForgedReceive([](WireDescriptor& d) { d.bytes = 4000; }, true);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(), AllOf(HasSubstr("4000"), HasSubstr("1000")));
}

// The bug: `sender_pid == getpid()` was proof of "same process", and the receiver then read a raw
// address off the wire. A forged descriptor naming this process (pid and pid namespace) and some
// other memory of it is refused: the address is no send posted to this receiver.
TEST(CudaIpcTest, AForgedSameProcessDescriptorIsRefused) {
  std::string secret(1000, 'S');
  std::string received;
  const absl::Status status = ForgedReceive(
      [&](WireDescriptor& d) {
        d.sender_pid = getpid();
        d.sender_namespace = OwnPidNamespace();
        d.source_address = reinterpret_cast<uintptr_t>(secret.data());
      },
      /*opens_own_handles=*/false, &received);
  EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied) << status;
  EXPECT_THAT(status.message(), HasSubstr("no send to this receiver posted"));
  EXPECT_EQ(received.find('S'), std::string::npos);
}

// Equal pids in another pid namespace (another container, another host) are not this process: the
// receiver goes through the IPC handle, which (as with CUDA) does not open in its own process.
TEST(CudaIpcTest, AnEqualPidOfAnotherNamespaceIsNotThisProcess) {
  std::string secret(1000, 'S');
  std::string received;
  const absl::Status status = ForgedReceive(
      [&](WireDescriptor& d) {
        d.sender_pid = getpid();
        d.sender_namespace = OwnPidNamespace() + 1;
        d.source_address = reinterpret_cast<uintptr_t>(secret.data());
      },
      /*opens_own_handles=*/false, &received);
  EXPECT_FALSE(status.ok());
  EXPECT_THAT(status.message(), HasSubstr("cannot open the sender's allocation"));
  EXPECT_EQ(received.find('S'), std::string::npos);
}

TEST(CudaIpcTest, AMessengerOfAnotherProcessIsRefused) {
  FakeCudaFabric cuda;
  LoopbackFabric messengers(2);
  CudaIpcOptions options;
  options.process = 0;
  absl::StatusOr<std::unique_ptr<CudaIpcTransport>> t =
      CudaIpcTransport::Create(options, cuda.Api(), *messengers.Connect(1));
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  absl::StatusOr<std::unique_ptr<CudaIpcTransport>> good =
      CudaIpcTransport::Create(options, cuda.Api(), *messengers.Connect(0));
  ASSERT_TRUE(good.ok());
  EXPECT_EQ((*good)->name(), "cuda_ipc");
  EXPECT_EQ((*good)->process(), 0);
  EXPECT_EQ((*good)->messenger().process(), 0);
}

}  // namespace
}  // namespace wsync
