// Checks of the UCX transport (transport/ucx): refused registrations and arguments, the TCP
// receive segment, and UcxDefaultSettings (which transport lists may select TCP, where the
// settings apply; a shared-memory transport starts without UCX warnings; every setting names its
// environment variable).

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/ucx_test_fixture.h"
#include "transport/ucx/ucx_impl.h"
#include "transport/ucx/ucx_transport.h"

namespace wsync {
namespace {

using test::Fabric;
using test::FabricName;
using test::Drain;
using test::In;
using test::Pattern;
using test::RunConcurrently;
using ::testing::HasSubstr;
using ::testing::Not;

// The checks run over the same transport lists as UcxTest, as their own suite.
class UcxChecksTest : public test::UcxTest {};

TEST_P(UcxChecksTest, RegistrationAndArgumentChecks) {
  auto made = UcxTransport::Create(Options(0));
  ASSERT_TRUE(made.ok()) << made.status();
  UcxTransport& t = **made;
  std::vector<uint8_t> buf(4096);
  EXPECT_EQ(t.PostSend(0, MakeTag(1, 1, 0), buf.data(), 16).status().code(),
            absl::StatusCode::kFailedPrecondition);  // Before ConnectPeers.
  EXPECT_EQ(t.ConnectPeers({}).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(t.ConnectPeers({"", ""}).ok());  // Only self is known.
  EXPECT_THAT(t.MemoryTypes(), testing::HasSubstr("host"));
  EXPECT_EQ(t.CarriesCudaMemory(), absl::StrContains(t.MemoryTypes(), "cuda"));
  if (!t.CarriesCudaMemory()) {  // Debian's UCX: a CUDA registration is refused with the reason.
    absl::StatusOr<RegistrationId> cuda = t.RegisterMemory(buf.data(), 4096, MemoryKind::kCuda);
    EXPECT_EQ(cuda.status().code(), absl::StatusCode::kUnimplemented);
    EXPECT_THAT(cuda.status().message(), testing::HasSubstr(t.MemoryTypes()));
  }
  EXPECT_EQ(t.RegisterMemory(nullptr, 16, MemoryKind::kHost).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(t.RegisterMemory(buf.data(), -1, MemoryKind::kHost).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto empty = t.RegisterMemory(nullptr, 0, MemoryKind::kHost);
  EXPECT_TRUE(empty.ok()) << empty.status();
  auto reg = t.RegisterMemory(buf.data(), 4096, MemoryKind::kHost);
  ASSERT_TRUE(reg.ok()) << reg.status();
  EXPECT_EQ(t.DeregisterMemory(12345).code(), absl::StatusCode::kNotFound);

  EXPECT_EQ(t.PostSend(2, MakeTag(1, 1, 0), buf.data(), 16).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(t.PostSend(1, MakeTag(1, 1, 0), buf.data(), 16).status().code(),
            absl::StatusCode::kFailedPrecondition);  // No address for process 1.
  EXPECT_EQ(t.PostSend(0, MakeTag(1, 1, 0), buf.data(), -1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(t.PostReceive(0, MakeTag(1, 1, 0), nullptr, 8).status().code(),
            absl::StatusCode::kInvalidArgument);
  // A tag naming another sender would match that sender's messages: refused.
  EXPECT_EQ(t.PostSend(0, MakeTag(1, 1, 5), buf.data(), 16).status().code(),
            absl::StatusCode::kInvalidArgument);

  // Self-sends between registered ranges, empty ones included; a registration in use by an
  // unfinished request cannot be deregistered.
  std::vector<uint8_t> got(2048, 0);
  auto reg_got = t.RegisterMemory(got.data(), got.size(), MemoryKind::kHost);
  ASSERT_TRUE(reg_got.ok()) << reg_got.status();
  auto r1 = t.PostReceive(0, MessageTag{0x50000}, got.data(), 2048);
  auto r2 = t.PostReceive(0, MessageTag{0x60000}, nullptr, 0);
  ASSERT_TRUE(r1.ok() && r2.ok()) << r1.status() << r2.status();
  EXPECT_EQ(t.DeregisterMemory(*reg_got).code(), absl::StatusCode::kFailedPrecondition);
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<uint8_t>(i * 3);
  auto s1 = t.PostSend(0, MessageTag{0x50000}, buf.data() + 1024, 2048);
  auto s2 = t.PostSend(0, MessageTag{0x60000}, nullptr, 0);
  ASSERT_TRUE(s1.ok() && s2.ok()) << s1.status() << s2.status();
  absl::Status w = t.WaitAll({*r1, *r2, *s1, *s2, *r1}, In(absl::Seconds(5)));
  EXPECT_TRUE(w.ok()) << w;
  EXPECT_TRUE(std::equal(got.begin(), got.end(), buf.begin() + 1024));
  EXPECT_TRUE(t.DeregisterMemory(*reg_got).ok());
  EXPECT_TRUE(t.DeregisterMemory(*reg).ok());
  EXPECT_TRUE(t.DeregisterMemory(*empty).ok());

  // A receive matching a message already queued completes inside the post; sizes still count.
  for (int64_t bytes : {int64_t{8}, int64_t{2048}}) {
    std::vector<uint8_t> small(bytes, 7), into(bytes + 8, 0);
    auto s = t.PostSend(0, MessageTag{0x90000}, small.data(), bytes);
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_TRUE(t.WaitAll({*s}, In(absl::Seconds(5))).ok());
    Drain(t, 0, absl::Milliseconds(20));
    auto r = t.PostReceive(0, MessageTag{0x90000}, into.data(), bytes + 8);  // Longer: mismatch.
    ASSERT_TRUE(r.ok()) << r.status();
    absl::Status got_status = t.WaitAll({*r}, In(absl::Seconds(5)));
    EXPECT_EQ(got_status.code(), absl::StatusCode::kInvalidArgument) << got_status;
    EXPECT_THAT(got_status.message(), HasSubstr(absl::StrCat("has ", bytes, " bytes")));
    s = t.PostSend(0, MessageTag{0x90000}, small.data(), bytes);
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_TRUE(t.WaitAll({*s}, In(absl::Seconds(5))).ok());
    Drain(t, 0, absl::Milliseconds(20));
    r = t.PostReceive(0, MessageTag{0x90000}, into.data(), bytes);
    ASSERT_TRUE(r.ok()) << r.status();
    got_status = t.WaitAll({*r}, In(absl::Seconds(5)));
    EXPECT_TRUE(got_status.ok()) << got_status;
    EXPECT_TRUE(std::equal(small.begin(), small.end(), into.begin()));
  }

  // Equal tags match in posting order; an unknown id fails WaitAll and releases the others.
  std::vector<uint8_t> a(8, 1), b(8, 2), ga(8), gb(8);
  auto sa = t.PostSend(0, MessageTag{0x70000}, a.data(), 8);
  auto sb = t.PostSend(0, MessageTag{0x70000}, b.data(), 8);
  auto ra = t.PostReceive(0, MessageTag{0x70000}, ga.data(), 8);
  auto rb = t.PostReceive(0, MessageTag{0x70000}, gb.data(), 8);
  EXPECT_TRUE(t.WaitAll({*sa, *sb, *ra, *rb}, In(absl::Seconds(5))).ok());
  EXPECT_EQ(ga, a);
  EXPECT_EQ(gb, b);
  auto lone = t.PostReceive(0, MessageTag{0x80000}, ga.data(), 8);
  ASSERT_TRUE(lone.ok());
  EXPECT_EQ(t.WaitAll({*lone, 999999}, In(absl::Seconds(5))).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(t.Test(*lone).status().code(), absl::StatusCode::kNotFound);

  UcxOptions bad = Options(70000);
  EXPECT_EQ(UcxTransport::Create(bad).status().code(), absl::StatusCode::kInvalidArgument);
}

// wsync's UCX defaults (a 1 MiB TCP receive segment) and an override of them through
// UcxOptions::config: messages below, at and across segment sizes arrive exactly both ways.
TEST_P(UcxChecksTest, ReceiveSegmentDefaultAndOverridesMoveExactBytes) {
  const std::vector<int64_t> sizes = {1, (64 << 10) + 3, (1 << 20) - 1, (1 << 20) + 1,
                                      (3 << 20) + 5};
  for (const std::string segment : {"", "64k", "4m"}) {
    // Only TCP has the setting; UCX warns of it elsewhere.
    if (!segment.empty() && !UcxTlsMaySelect(GetParam().transports, "tcp")) continue;
    SCOPED_TRACE(segment.empty() ? std::string("wsync's defaults") : "RX_SEG_SIZE=" + segment);
    std::vector<std::unique_ptr<UcxTransport>> job;
    std::vector<std::string> addresses;
    for (int32_t p = 0; p < 2; ++p) {
      UcxOptions options = Options(p);
      if (!segment.empty()) options.config.emplace_back("RX_SEG_SIZE", segment);
      absl::StatusOr<std::unique_ptr<UcxTransport>> t = UcxTransport::Create(options);
      ASSERT_TRUE(t.ok()) << t.status();
      addresses.push_back((*t)->WorkerAddress());
      job.push_back(std::move(*t));
    }
    for (auto& t : job) ASSERT_TRUE(t->ConnectPeers(addresses).ok());
    std::vector<std::function<void()>> fns;
    for (int32_t me = 0; me < 2; ++me) {
      fns.push_back([&, me] {
        Transport& t = *job[me];
        const int32_t peer = 1 - me;
        std::vector<std::vector<uint8_t>> out, in;
        std::vector<RequestId> ids;
        for (size_t i = 0; i < sizes.size(); ++i) {
          out.push_back(Pattern(sizes[i], me * 10 + i));
          in.emplace_back(static_cast<size_t>(sizes[i]), 0);
        }
        for (size_t i = 0; i < sizes.size(); ++i) {
          auto r = t.PostReceive(peer, MakeTag(5, static_cast<int64_t>(i), peer), in[i].data(),
                                 sizes[i]);
          auto s =
              t.PostSend(peer, MakeTag(5, static_cast<int64_t>(i), me), out[i].data(), sizes[i]);
          ASSERT_TRUE(r.ok() && s.ok()) << r.status() << s.status();
          ids.push_back(*r);
          ids.push_back(*s);
        }
        ASSERT_TRUE(t.WaitAll(ids, In(absl::Seconds(20))).ok());
        for (size_t i = 0; i < sizes.size(); ++i) {
          EXPECT_EQ(in[i], Pattern(sizes[i], peer * 10 + i)) << "message " << i;
        }
      });
    }
    RunConcurrently(fns);
  }
}

TEST(UcxDefaultSettingsTest, TlsListsSelectTransportsAsUcxDoes) {
  EXPECT_TRUE(UcxTlsMaySelect("", "tcp"));
  EXPECT_TRUE(UcxTlsMaySelect("all", "tcp"));
  EXPECT_TRUE(UcxTlsMaySelect("tcp", "tcp"));
  EXPECT_TRUE(UcxTlsMaySelect("sm, tcp ,self", "tcp"));
  EXPECT_TRUE(UcxTlsMaySelect("^sm,cma", "tcp"));
  EXPECT_TRUE(UcxTlsMaySelect("^", "tcp"));
  EXPECT_FALSE(UcxTlsMaySelect("sm,cma,self", "tcp"));
  EXPECT_FALSE(UcxTlsMaySelect("^tcp", "tcp"));
  EXPECT_FALSE(UcxTlsMaySelect("^sm,tcp", "tcp"));
  EXPECT_FALSE(UcxTlsMaySelect("tcp_sockcm", "tcp"));
}

// A transport over shared memory only starts without UCX's "invalid configuration" warning, which
// the TCP receive segment of UcxDefaultSettings() raised in every such process.
TEST(UcxDefaultSettingsTest, SharedMemoryTransportStartsWithoutAWarning) {
  if (getenv("UCX_TCP_RX_SEG_SIZE") != nullptr) GTEST_SKIP() << "UCX_TCP_RX_SEG_SIZE is set";
  ::testing::internal::CaptureStdout();
  ::testing::internal::CaptureStderr();
  UcxOptions options;
  options.process = 0;
  options.transports = "sm,cma,self";
  absl::StatusOr<std::unique_ptr<UcxTransport>> transport = UcxTransport::Create(options);
  const std::string out = ::testing::internal::GetCapturedStdout();
  const std::string err = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(transport.ok()) << transport.status();
  EXPECT_THAT(out + err, Not(HasSubstr("invalid configuration"))) << out << err;
  EXPECT_THAT(out + err, Not(HasSubstr("WARN"))) << out << err;
}

TEST(UcxDefaultSettingsTest, EachNamesItsEnvironmentVariableAndAValue) {
  const std::vector<UcxDefaultSetting> defaults = UcxDefaultSettings();
  ASSERT_FALSE(defaults.empty());
  for (const UcxDefaultSetting& d : defaults) {
    EXPECT_FALSE(d.name.empty());
    EXPECT_FALSE(d.value.empty());
    // The variable ends with the name UCX matches (after the transport's prefix).
    EXPECT_TRUE(absl::StartsWith(d.environment, "UCX_")) << d.environment;
    EXPECT_TRUE(absl::EndsWith(d.environment, "_" + d.name)) << d.environment;
  }
}

INSTANTIATE_TEST_SUITE_P(Fabrics, UcxChecksTest,
                         ::testing::Values(Fabric{"shm", "sm,cma,self", ""},
                                           Fabric{"tcp", "tcp", "lo"}),
                         FabricName);

}  // namespace
}  // namespace wsync
