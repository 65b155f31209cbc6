// The sealing of control frames (frame_seal.h, channel_keys.h, framing.h): per-connection,
// per-direction keys that change with every input; and sealed
// frames over a socket pair, with random bodies and sizes, that arrive intact and in order, while
// any flipped bit of a body or tag, a replay, a reordering, a frame of another key, or a frame too
// short for its tag is refused with Unauthenticated before its body is parsed.

#include "control/frame_seal.h"

#include <sys/socket.h>

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "control/channel_keys.h"
#include "control/framing.h"
#include "control/socket.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace wsync {
namespace {

using ::testing::HasSubstr;

constexpr char kSecret[] = "correct-horse-battery-staple-42-0123";

struct Pair {
  UniqueFd a, b;
};
Pair MakePair() {
  int fds[2];
  EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, fds), 0);
  return Pair{UniqueFd(fds[0]), UniqueFd(fds[1])};
}

std::string RandomBytesOf(std::mt19937_64& rng, size_t size) {
  std::string out(size, '\0');
  for (char& c : out) c = static_cast<char>(rng());
  return out;
}

control::Frame PayloadFrame(std::string payload, uint64_t number) {
  control::Frame frame;
  frame.mutable_contribute()->set_number(number);
  frame.mutable_contribute()->set_payload(std::move(payload));
  return frame;
}

// The sealed wire bytes of `frames`, as a writer sealing with `key` sends them.
std::string SealedWire(const std::string& key, const std::vector<control::Frame>& frames) {
  Pair p = MakePair();
  FrameWriter writer;
  writer.Seal(std::make_unique<FrameSealer>(key));
  for (const control::Frame& f : frames) {
    absl::StatusOr<std::shared_ptr<const OutgoingFrame>> prepared =
        PrepareFrame(f, kDefaultMaxFrameBytes);
    EXPECT_TRUE(prepared.ok());
    writer.Enqueue(*prepared);
  }
  EXPECT_TRUE(FlushFrames(p.a.get(), writer, absl::Now() + absl::Seconds(5)).ok());
  p.a.Reset();
  std::string wire;
  char buffer[4096];
  for (;;) {
    const ssize_t got = recv(p.b.get(), buffer, sizeof(buffer), 0);
    if (got <= 0) break;
    wire.append(buffer, static_cast<size_t>(got));
  }
  return wire;
}

// Feeds `wire` to a reader opening with `key` and returns each frame's outcome, up to the first
// error (included).
std::vector<absl::StatusOr<control::Frame>> OpenWire(const std::string& key,
                                                     const std::string& wire) {
  Pair p = MakePair();
  std::thread writer([&] {
    FrameWriter w;
    w.EnqueueUnsealed(std::make_shared<const std::string>(wire));
    EXPECT_TRUE(FlushFrames(p.a.get(), w, absl::Now() + absl::Seconds(5)).ok());
    p.a.Reset();
  });
  FrameReader reader(kDefaultMaxFrameBytes);
  reader.Open(std::make_unique<FrameOpener>(key, "the peer"));
  std::vector<absl::StatusOr<control::Frame>> out;
  for (;;) {
    absl::StatusOr<control::Frame> got =
        ReadFrame(p.b.get(), reader, absl::Now() + absl::Seconds(5));
    if (!got.ok() && absl::IsUnavailable(got.status())) break;  // The end of the wire.
    out.push_back(got);
    if (!got.ok()) break;
  }
  writer.join();
  return out;
}

TEST(ChannelKeysTest, EachDirectionAndEveryInputGivesOtherKeys) {
  const std::string nonce(32, 'n'), client_nonce(32, 'c');
  absl::StatusOr<ChannelKeys> base = DeriveChannelKeys(kSecret, nonce, client_nonce, "job", 3);
  ASSERT_TRUE(base.ok());
  EXPECT_EQ(base->client_to_coordinator.size(), static_cast<size_t>(kChannelKeyBytes));
  EXPECT_EQ(base->coordinator_to_client.size(), static_cast<size_t>(kChannelKeyBytes));
  EXPECT_NE(base->client_to_coordinator, base->coordinator_to_client);
  absl::StatusOr<ChannelKeys> again = DeriveChannelKeys(kSecret, nonce, client_nonce, "job", 3);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->client_to_coordinator, base->client_to_coordinator);
  EXPECT_EQ(again->coordinator_to_client, base->coordinator_to_client);
  std::string other_nonce = nonce;
  other_nonce[31] = 'm';
  std::vector<absl::StatusOr<ChannelKeys>> variants;
  variants.push_back(
      DeriveChannelKeys("incorrect-donkey-battery-staple-7-xx", nonce, client_nonce, "job", 3));
  variants.push_back(DeriveChannelKeys(kSecret, other_nonce, client_nonce, "job", 3));
  variants.push_back(DeriveChannelKeys(kSecret, nonce, other_nonce, "job", 3));
  variants.push_back(DeriveChannelKeys(kSecret, client_nonce, nonce, "job", 3));  // Swapped.
  variants.push_back(DeriveChannelKeys(kSecret, nonce, client_nonce, "jobb", 3));
  variants.push_back(DeriveChannelKeys(kSecret, nonce, client_nonce, "job", 4));
  for (size_t i = 0; i < variants.size(); ++i) {
    ASSERT_TRUE(variants[i].ok());
    EXPECT_NE(variants[i]->client_to_coordinator, base->client_to_coordinator) << i;
    EXPECT_NE(variants[i]->coordinator_to_client, base->coordinator_to_client) << i;
  }
}

TEST(FrameTagTest, BindsKeySequenceLengthAndDigest) {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const std::string key = RandomBytesOf(rng, 32);
    const std::string body = RandomBytesOf(rng, rng() % 300);
    const uint64_t sequence = rng() % 1000;
    const FrameDigest digest = DigestFrameBody(body);
    const std::string tag = FrameTag(key, sequence, body.size(), digest);
    ASSERT_EQ(tag.size(), static_cast<size_t>(kFrameTagBytes));
    EXPECT_EQ(tag, FrameTag(key, sequence, body.size(), digest));
    EXPECT_NE(tag, FrameTag(key, sequence + 1, body.size(), digest));
    EXPECT_NE(tag, FrameTag(key, sequence, body.size() + 1, digest));
    std::string other_key = key;
    other_key[rng() % 32] ^= 0x40;
    EXPECT_NE(tag, FrameTag(other_key, sequence, body.size(), digest));
    std::string other_body = body + "x";
    EXPECT_NE(tag, FrameTag(key, sequence, body.size(), DigestFrameBody(other_body)));
  }
}

// Random frames (sizes from empty to past the socket buffer) sealed on one side arrive intact and
// in order on the other; one shared OutgoingFrame queued on two writers with their own keys opens
// on each connection with its own key only.
TEST(SealedFramingTest, RandomFramesArriveIntactAndInOrder) {
  std::mt19937_64 rng(11);
  const std::string key = RandomBytesOf(rng, 32);
  std::vector<control::Frame> frames;
  for (uint64_t i = 0; i < 40; ++i) {
    const size_t size = i % 10 == 9 ? (size_t{1} << 20) + rng() % 1000 : rng() % 2000;
    frames.push_back(PayloadFrame(RandomBytesOf(rng, size), i));
  }
  Pair p = MakePair();
  std::thread writer([&] {
    FrameWriter w;
    w.Seal(std::make_unique<FrameSealer>(key));
    for (const control::Frame& f : frames) {
      ASSERT_TRUE(
          WriteFrame(p.a.get(), w, f, kDefaultMaxFrameBytes, absl::Now() + absl::Seconds(10)).ok());
    }
  });
  FrameReader reader(kDefaultMaxFrameBytes);
  reader.Open(std::make_unique<FrameOpener>(key, "the peer"));
  for (const control::Frame& expected : frames) {
    absl::StatusOr<control::Frame> got =
        ReadFrame(p.b.get(), reader, absl::Now() + absl::Seconds(10));
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->SerializeAsString(), expected.SerializeAsString());
  }
  writer.join();

  // One body, two connections, two keys: a spliced frame fails on the other connection.
  absl::StatusOr<std::shared_ptr<const OutgoingFrame>> shared =
      PrepareFrame(PayloadFrame("roster", 0), kDefaultMaxFrameBytes);
  ASSERT_TRUE(shared.ok());
  const std::string key_b = RandomBytesOf(rng, 32);
  for (const auto& [seal_key, open_key, ok] :
       std::vector<std::tuple<std::string, std::string, bool>>{
           {key, key, true}, {key_b, key_b, true}, {key, key_b, false}, {key_b, key, false}}) {
    Pair q = MakePair();
    FrameWriter w;
    w.Seal(std::make_unique<FrameSealer>(seal_key));
    w.Enqueue(*shared);
    ASSERT_TRUE(FlushFrames(q.a.get(), w, absl::Now() + absl::Seconds(5)).ok());
    FrameReader r(kDefaultMaxFrameBytes);
    r.Open(std::make_unique<FrameOpener>(open_key, "the peer"));
    absl::StatusOr<control::Frame> got = ReadFrame(q.b.get(), r, absl::Now() + absl::Seconds(5));
    EXPECT_EQ(got.ok(), ok) << got.status();
    if (!ok) {
      EXPECT_TRUE(absl::IsUnauthenticated(got.status())) << got.status();
    }
  }
}

// Every single-bit flip of a sealed frame's body or tag is refused; so is a body that would not
// parse (the tag is checked first: Unauthenticated, not DataLoss).
TEST(SealedFramingTest, AnyFlippedBitOfBodyOrTagIsRefusedBeforeParsing) {
  const std::string key(32, 'k');
  const std::string wire = SealedWire(key, {PayloadFrame("abc", 5)});
  ASSERT_GT(wire.size(), static_cast<size_t>(kFrameHeaderBytes + kFrameTagBytes));
  ASSERT_EQ(OpenWire(key, wire).size(), 1u);
  ASSERT_TRUE(OpenWire(key, wire)[0].ok());
  for (size_t byte = kFrameHeaderBytes; byte < wire.size(); ++byte) {
    for (int bit = 0; bit < 8; ++bit) {
      std::string altered = wire;
      altered[byte] = static_cast<char>(altered[byte] ^ (1 << bit));
      const std::vector<absl::StatusOr<control::Frame>> got = OpenWire(key, altered);
      ASSERT_EQ(got.size(), 1u);
      EXPECT_TRUE(absl::IsUnauthenticated(got[0].status())) << byte << "." << bit;
    }
  }
  // A body of garbage (it would not parse) under a wrong tag: refused as unauthenticated.
  std::string garbage = std::string{0, 0, 0, 40} + std::string(8, '\xff') + std::string(32, 't');
  const std::vector<absl::StatusOr<control::Frame>> got = OpenWire(key, garbage);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_TRUE(absl::IsUnauthenticated(got[0].status())) << got[0].status();
}

// Replays, reorderings, drops, frames of another key and frames too short for a tag are refused,
// naming the frame's number and the peer; the reader stays failed.
TEST(SealedFramingTest, ReplayedReorderedDroppedForeignAndShortFramesAreRefused) {
  const std::string key(32, 'k');
  std::vector<control::Frame> frames;
  for (uint64_t i = 1; i <= 3; ++i) frames.push_back(PayloadFrame(absl::StrCat("frame ", i), i));
  const std::string wire = SealedWire(key, frames);
  // Split into the three frames (same length each).
  const size_t one = wire.size() / 3;
  const std::string f0 = wire.substr(0, one), f1 = wire.substr(one, one), f2 = wire.substr(2 * one);
  ASSERT_EQ(OpenWire(key, f0 + f1 + f2).size(), 3u);
  struct Bad {
    std::string name, wire;
    size_t good_before;  // Frames accepted before the refused one.
  };
  const std::vector<Bad> bad = {
      {"replayed", f0 + f1 + f1, 2},
      {"replayed first", f0 + f0, 1},
      {"reordered", f1 + f0, 0},
      {"dropped", f0 + f2, 1},
      {"foreign key", SealedWire(std::string(32, 'j'), frames), 0},
      {"too short", std::string{0, 0, 0, 5} + "abcde", 0},
  };
  for (const Bad& b : bad) {
    const std::vector<absl::StatusOr<control::Frame>> got = OpenWire(key, b.wire);
    ASSERT_EQ(got.size(), b.good_before + 1) << b.name;
    for (size_t i = 0; i < b.good_before; ++i) EXPECT_TRUE(got[i].ok()) << b.name << " " << i;
    const absl::Status refused = got.back().status();
    EXPECT_TRUE(absl::IsUnauthenticated(refused)) << b.name << ": " << refused;
    EXPECT_THAT(refused.message(),
                HasSubstr(absl::StrCat("control frame ", b.good_before,
                                       " from the peer failed authentication: forged, replayed or "
                                       "reordered")))
        << b.name;
  }
}

// The cap counts the body: a sealed reader takes a body of exactly the cap (plus its tag) and
// refuses one byte more before allocating it.
TEST(SealedFramingTest, TheCapCountsTheBodyNotTheTag) {
  const std::string key(32, 'k');
  control::Frame frame = PayloadFrame(std::string(1000, 'x'), 1);
  const int64_t body = static_cast<int64_t>(frame.ByteSizeLong());
  const std::string wire = SealedWire(key, {frame});
  for (const auto& [cap, ok] :
       std::vector<std::pair<int64_t, bool>>{{body, true}, {body - 1, false}}) {
    Pair p = MakePair();
    FrameWriter w;
    w.EnqueueUnsealed(std::make_shared<const std::string>(wire));
    ASSERT_TRUE(FlushFrames(p.a.get(), w, absl::Now() + absl::Seconds(5)).ok());
    FrameReader reader(cap);
    reader.Open(std::make_unique<FrameOpener>(key, "the peer"));
    absl::StatusOr<control::Frame> got =
        ReadFrame(p.b.get(), reader, absl::Now() + absl::Seconds(5));
    EXPECT_EQ(got.ok(), ok) << cap << ": " << got.status();
    if (!ok) {
      EXPECT_TRUE(absl::IsResourceExhausted(got.status())) << got.status();
      EXPECT_EQ(reader.allocated_bytes(), 0);
    }
  }
}

}  // namespace
}  // namespace wsync
