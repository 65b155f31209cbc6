// The delta sync encoding (executor/delta_codec.h) and a sender's bases (executor/delta_base.h).
#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <optional>
#include <random>
#include <vector>

#include "executor/delta_base.h"
#include "executor/delta_codec.h"
#include "gtest/gtest.h"

namespace wsync {
namespace {

std::vector<uint8_t> RandomBytes(int64_t size, std::mt19937_64& random) {
  std::vector<uint8_t> bytes(size);
  for (uint8_t& byte : bytes) byte = static_cast<uint8_t>(random());
  return bytes;
}

// `base` with about `fraction` of its elements changed (each one changed for certain: a changed
// element's bytes are flipped, never redrawn equal).
std::vector<uint8_t> Change(const std::vector<uint8_t>& base, int element_bytes, double fraction,
                            std::mt19937_64& random, int64_t* changed) {
  std::vector<uint8_t> current = base;
  std::bernoulli_distribution change(fraction);
  *changed = 0;
  for (size_t byte = 0; byte < current.size(); byte += element_bytes) {
    if (!change(random)) continue;
    current[byte + random() % element_bytes] ^= static_cast<uint8_t>(1 + random() % 255);
    ++*changed;
  }
  return current;
}

// `base` with about `fraction` of its elements nudged: each changed element's bit pattern, read as
// an unsigned integer, moves by +-1 or +-2 (modulo its size), as an optimizer step moves a bf16
// weight by an ulp or two.
std::vector<uint8_t> Nudge(const std::vector<uint8_t>& base, int element_bytes, double fraction,
                           std::mt19937_64& random, int64_t* changed) {
  std::vector<uint8_t> current = base;
  std::bernoulli_distribution change(fraction);
  *changed = 0;
  for (size_t byte = 0; byte < current.size(); byte += element_bytes) {
    if (!change(random)) continue;
    uint64_t bits = 0;
    std::memcpy(&bits, current.data() + byte, element_bytes);
    const int64_t steps[] = {-2, -1, 1, 2};
    bits += static_cast<uint64_t>(steps[random() % 4]);
    std::memcpy(current.data() + byte, &bits, element_bytes);
    ++*changed;
  }
  return current;
}

// A random chunk of elements of 1, 2, 4 or 8 bytes (by trial) and a copy with about `fraction` of
// them changed: odd trials nudge elements (small differences), even ones flip a random byte of
// each.
struct Trial {
  int element_bytes;
  int64_t elements;
  std::vector<uint8_t> base;
  std::vector<uint8_t> current;
  int64_t changed;
};
Trial MakeTrial(int trial, int64_t most_elements, double fraction, std::mt19937_64& random) {
  Trial t{1 << (trial % 4), static_cast<int64_t>(random() % most_elements), {}, {}, 0};
  t.base = RandomBytes(t.elements * t.element_bytes, random);
  t.current = trial % 2 == 1 ? Nudge(t.base, t.element_bytes, fraction, random, &t.changed)
                             : Change(t.base, t.element_bytes, fraction, random, &t.changed);
  return t;
}

TEST(DeltaCodecTest, RoundTripIsBitExactAndTheSmallestKindIsChosen) {
  std::mt19937_64 random(44);
  const double fractions[] = {0.0, 0.0005, 0.01, 0.1, 0.3, 0.49, 0.51, 0.9, 1.0};
  int kinds_seen[4] = {0, 0, 0, 0};
  for (int trial = 0; trial < 800; ++trial) {
    const auto [element_bytes, elements, base, current, changed] =
        MakeTrial(trial, 4000, fractions[trial % std::size(fractions)], random);
    std::vector<uint8_t> encoded;
    absl::StatusOr<DeltaEncodingSummary> summary =
        EncodeDelta(base, current, element_bytes, &encoded);
    ASSERT_TRUE(summary.ok()) << summary.status();
    EXPECT_EQ(summary->elements, elements);
    EXPECT_EQ(summary->encoded_bytes, static_cast<int64_t>(encoded.size()));
    EXPECT_EQ(summary->dense_bytes, kDeltaHeaderBytes + elements * element_bytes);
    EXPECT_EQ(summary->mostly_changed, changed * 2 > elements) << "trial " << trial;
    if (summary->mostly_changed) {
      EXPECT_EQ(summary->kind, DeltaKind::kDense);
      EXPECT_GT(summary->changed_elements * 2, elements);
      EXPECT_LE(summary->changed_elements, changed);
    } else {
      EXPECT_EQ(summary->changed_elements, changed);
      EXPECT_EQ(summary->bitmap_bytes,
                kDeltaHeaderBytes + (elements + 7) / 8 + changed * element_bytes);
      if (trial % 2 == 1) {  // A nudge's difference is one varint byte; the gaps are shared.
        EXPECT_EQ(summary->diffs_bytes, summary->indices_bytes - changed * element_bytes + changed);
      }
      const int64_t smallest = std::min({summary->dense_bytes, summary->bitmap_bytes,
                                         summary->indices_bytes, summary->diffs_bytes});
      EXPECT_EQ(summary->encoded_bytes, smallest) << "trial " << trial;
    }
    ++kinds_seen[static_cast<int>(summary->kind)];
    std::vector<uint8_t> target = base;
    ASSERT_TRUE(ApplyDelta(encoded, element_bytes, absl::MakeSpan(target)).ok()) << trial;
    ASSERT_EQ(target, current) << "trial " << trial;
  }
  for (const int seen : kinds_seen) EXPECT_GT(seen, 20);
}

// Realistic bf16: a step leaves most elements unchanged; the encoding is a few percent of dense.
TEST(DeltaCodecTest, SparseBf16ChangesTravelInAFewPercentOfTheDenseBytes) {
  std::mt19937_64 random(7);
  const std::vector<uint8_t> base = RandomBytes(2 * 1 << 20, random);
  int64_t changed = 0;
  const std::vector<uint8_t> current = Change(base, 2, 0.01, random, &changed);
  std::vector<uint8_t> encoded;
  absl::StatusOr<DeltaEncodingSummary> summary = EncodeDelta(base, current, 2, &encoded);
  ASSERT_TRUE(summary.ok());
  EXPECT_EQ(summary->kind, DeltaKind::kIndices);
  EXPECT_LT(static_cast<double>(encoded.size()), 0.045 * static_cast<double>(base.size()));
  std::vector<uint8_t> target = base;
  ASSERT_TRUE(ApplyDelta(encoded, 2, absl::MakeSpan(target)).ok());
  EXPECT_EQ(target, current);
}

// bf16 of an fp32 value, rounded to nearest even (finite values).
uint16_t ToBf16(float value) {
  uint32_t bits = 0;
  std::memcpy(&bits, &value, sizeof(bits));
  return static_cast<uint16_t>((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16);
}

// An RL step as issue 44 states it: fp32 master weights (normal, std 0.02) take an AdamW step of
// lr 1e-6 (Adam's normalized update is about +-lr per element whatever the gradient; random
// signs), and the rollouts get them cast to bf16. About 4.2 % of the bf16 elements change (the
// small weights' ulps are small), each by one ulp: the differences (kDiffs) take one byte where
// the values take two, so three consecutive steps each travel in about 4.2 % of the dense bytes
// (under issue 44's 6 % asserted; 6.3 % with the values), and patch bit-exact.
TEST(DeltaCodecTest, AnAdamWStepAtLr1e6TravelsInUnder6PercentOfTheBf16Bytes) {
  std::mt19937_64 random(1);
  std::normal_distribution<float> init(0.0f, 0.02f);
  std::vector<float> master(1 << 19);
  for (float& weight : master) weight = init(random);
  const auto cast = [&master] {
    std::vector<uint8_t> bytes(master.size() * 2);
    for (size_t i = 0; i < master.size(); ++i) {
      const uint16_t bf16 = ToBf16(master[i]);
      std::memcpy(bytes.data() + 2 * i, &bf16, 2);
    }
    return bytes;
  };
  std::vector<uint8_t> rollout = cast();
  for (int step = 0; step < 3; ++step) {
    for (float& weight : master) weight -= (random() & 1) != 0 ? 1e-6f : -1e-6f;
    const std::vector<uint8_t> current = cast();
    std::vector<uint8_t> encoded;
    absl::StatusOr<DeltaEncodingSummary> summary = EncodeDelta(rollout, current, 2, &encoded);
    ASSERT_TRUE(summary.ok());
    EXPECT_GT(summary->changed_elements, master.size() / 100);
    EXPECT_LT(summary->changed_elements, master.size() / 10);
    EXPECT_EQ(summary->kind, DeltaKind::kDiffs);
    EXPECT_LT(static_cast<double>(encoded.size()), 0.06 * static_cast<double>(current.size()))
        << "step " << step << ": " << summary->changed_elements << " of " << master.size()
        << " elements changed";
    std::cout << "step " << step << ": " << summary->changed_elements << " of " << master.size()
              << " elements changed, encoded/dense "
              << static_cast<double>(encoded.size()) / static_cast<double>(current.size())
              << " (with the values: "
              << static_cast<double>(summary->indices_bytes) / static_cast<double>(current.size())
              << ")\n";
    ASSERT_TRUE(ApplyDelta(encoded, 2, absl::MakeSpan(rollout)).ok());
    ASSERT_EQ(rollout, current);
  }
}

TEST(DeltaCodecTest, ElementsAreComparedBitwise) {
  // bf16 +0.0 (0x0000) and -0.0 (0x8000) are equal numbers but different bytes.
  std::vector<uint8_t> base(64, 0);
  std::vector<uint8_t> current = base;
  current[2 * 17 + 1] = 0x80;
  std::vector<uint8_t> encoded;
  absl::StatusOr<DeltaEncodingSummary> summary = EncodeDelta(base, current, 2, &encoded);
  ASSERT_TRUE(summary.ok());
  EXPECT_EQ(summary->changed_elements, 1);
  EXPECT_EQ(summary->kind, DeltaKind::kIndices);
  EXPECT_EQ(summary->encoded_bytes, kDeltaHeaderBytes + 1 + 2);
}

TEST(DeltaCodecTest, UnchangedChunkIsTheHeaderAlone) {
  const std::vector<uint8_t> base(4096, 3);
  std::vector<uint8_t> encoded;
  absl::StatusOr<DeltaEncodingSummary> summary = EncodeDelta(base, base, 4, &encoded);
  ASSERT_TRUE(summary.ok());
  EXPECT_EQ(summary->encoded_bytes, kDeltaHeaderBytes);
  std::vector<uint8_t> target = base;
  EXPECT_TRUE(ApplyDelta(encoded, 4, absl::MakeSpan(target)).ok());
  EXPECT_EQ(target, base);
}

TEST(DeltaCodecTest, EncodeRefusesMismatchedSizes) {
  std::vector<uint8_t> out;
  EXPECT_EQ(EncodeDelta(std::vector<uint8_t>(8), std::vector<uint8_t>(6), 2, &out).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(EncodeDelta(std::vector<uint8_t>(6), std::vector<uint8_t>(6), 4, &out).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(EncodeDelta(std::vector<uint8_t>(6), std::vector<uint8_t>(6), 3, &out).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Every corruption is refused with the target untouched.
TEST(DeltaCodecTest, ApplyRefusesEncodingsThatDoNotFitTheTarget) {
  std::mt19937_64 random(3);
  const std::vector<uint8_t> base = RandomBytes(2 * 100, random);
  int64_t changed = 0;
  // Three sign flips: differences of 2^15, three varint bytes against two of a value.
  std::vector<uint8_t> sparse = base;
  for (const int element : {3, 40, 77}) sparse[2 * element + 1] ^= 0x80;
  const std::vector<uint8_t> middling = Change(base, 2, 0.4, random, &changed);
  int64_t nudged = 0;
  const std::vector<uint8_t> small_steps = Nudge(base, 2, 0.05, random, &nudged);
  std::vector<uint8_t> indices, bitmap, dense, diffs;
  ASSERT_EQ(EncodeDelta(base, small_steps, 2, &diffs)->kind, DeltaKind::kDiffs);
  ASSERT_EQ(EncodeDelta(base, sparse, 2, &indices)->kind, DeltaKind::kIndices);
  ASSERT_EQ(EncodeDelta(base, middling, 2, &bitmap)->kind, DeltaKind::kBitmap);
  ASSERT_EQ(EncodeDelta(base, RandomBytes(200, random), 2, &dense)->kind, DeltaKind::kDense);

  const auto refused = [&](std::vector<uint8_t> encoded, int element_bytes, size_t target_bytes) {
    std::vector<uint8_t> target(base.begin(), base.begin() + target_bytes);
    const std::vector<uint8_t> before = target;
    const absl::Status status = ApplyDelta(encoded, element_bytes, absl::MakeSpan(target));
    return !status.ok() && target == before;
  };
  for (const std::vector<uint8_t>* encoded : {&indices, &bitmap, &dense, &diffs}) {
    std::vector<uint8_t> shorter(encoded->begin(), encoded->end() - 1);
    EXPECT_TRUE(refused(shorter, 2, 200));
    std::vector<uint8_t> longer = *encoded;
    longer.push_back(0);
    EXPECT_TRUE(refused(longer, 2, 200));
    EXPECT_TRUE(refused(*encoded, 1, 200));          // Another element size.
    if (encoded != &indices && encoded != &diffs) {  // Indices below 50 fit a smaller target.
      EXPECT_TRUE(refused(*encoded, 2, 100));
    }
    std::vector<uint8_t> kind = *encoded;
    kind[0] = 4;
    EXPECT_TRUE(refused(kind, 2, 200));
    std::vector<uint8_t> reserved = *encoded;
    reserved[5] = 1;
    EXPECT_TRUE(refused(reserved, 2, 200));
    std::vector<uint8_t> count = *encoded;
    count[8] ^= 1;
    EXPECT_TRUE(refused(count, 2, 200));
  }
  EXPECT_TRUE(refused(std::vector<uint8_t>(kDeltaHeaderBytes - 1), 2, 200));
  // An index past the end: the first gap set to 100 in a chunk of 100 elements.
  std::vector<uint8_t> past(kDeltaHeaderBytes + 1 + 2, 0);
  past[0] = static_cast<uint8_t>(DeltaKind::kIndices);
  past[1] = 2;
  past[8] = 1;
  past[kDeltaHeaderBytes] = 100;
  EXPECT_TRUE(refused(past, 2, 200));
  past[kDeltaHeaderBytes] = 99;  // The last element: accepted.
  std::vector<uint8_t> target = base;
  EXPECT_TRUE(ApplyDelta(past, 2, absl::MakeSpan(target)).ok());
  std::vector<uint8_t> expected = base;
  expected[198] = expected[199] = 0;
  EXPECT_EQ(target, expected);
  // A difference wider than a bf16 element: +32768 (zigzag 65536, varint 80 80 04) at element 0.
  std::vector<uint8_t> wide(kDeltaHeaderBytes, 0);
  wide[0] = static_cast<uint8_t>(DeltaKind::kDiffs);
  wide[1] = 2;
  wide[8] = 1;
  wide.insert(wide.end(), {0x00, 0x80, 0x80, 0x04});
  EXPECT_TRUE(refused(wide, 2, 200));
  wide.back() = 0x03;  // 0xFFFF (zigzag 65535: -32768), the widest that fits: accepted.
  wide[kDeltaHeaderBytes + 1] = 0xFF;
  wide[kDeltaHeaderBytes + 2] = 0xFF;
  target = base;
  ASSERT_TRUE(ApplyDelta(wide, 2, absl::MakeSpan(target)).ok());
  uint16_t patched = 0, first_base = 0;
  std::memcpy(&patched, target.data(), 2);
  std::memcpy(&first_base, base.data(), 2);
  EXPECT_EQ(patched, static_cast<uint16_t>(first_base - 32768));
  EXPECT_TRUE(std::equal(target.begin() + 2, target.end(), base.begin() + 2));
  // A bitmap that sets bit 100 of 100 elements in place of one of its bits.
  std::vector<uint8_t> stray = bitmap;
  uint8_t* bits = stray.data() + kDeltaHeaderBytes;
  const int first = std::countr_zero(bits[0] != 0 ? bits[0] : bits[1]) + (bits[0] != 0 ? 0 : 8);
  bits[first / 8] &= ~(1 << (first % 8));
  bits[12] |= 1 << 4;
  EXPECT_TRUE(refused(stray, 2, 200));
}

// The sender's one pass: the same bytes as EncodeDelta, appended, and the base left holding the
// current bytes, for every element size, chunks with a tail shorter than the 64-byte block, and
// chunks the comparison stops in (mostly changed).
TEST(DeltaCodecTest, AdvancingTheBaseEncodesAlikeAndLeavesTheBaseCurrent) {
  std::mt19937_64 random(45);
  const double fractions[] = {0.0, 0.01, 0.04, 0.3, 0.6, 1.0};
  for (int trial = 0; trial < 400; ++trial) {
    const auto [element_bytes, elements, base, current, changed] =
        MakeTrial(trial, 3000, fractions[trial % std::size(fractions)], random);
    std::vector<uint8_t> expected;
    absl::StatusOr<DeltaEncodingSummary> summary =
        EncodeDelta(base, current, element_bytes, &expected);
    ASSERT_TRUE(summary.ok());
    std::vector<uint8_t> advanced = base;
    std::vector<uint8_t> appended = {1, 2, 3};  // Kept: the encoding is appended.
    absl::StatusOr<DeltaEncodingSummary> again =
        AppendDeltaAdvancingBase(absl::MakeSpan(advanced), current, element_bytes, &appended);
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(again->kind, summary->kind) << "trial " << trial;
    EXPECT_EQ(again->changed_elements, summary->changed_elements) << "trial " << trial;
    ASSERT_EQ(appended.size(), 3 + expected.size()) << "trial " << trial;
    EXPECT_TRUE(std::equal(expected.begin(), expected.end(), appended.begin() + 3))
        << "trial " << trial;
    EXPECT_EQ(advanced, current) << "trial " << trial;
  }
  std::vector<uint8_t> odd(6), out;
  EXPECT_FALSE(AppendDeltaAdvancingBase(absl::MakeSpan(odd), odd, 4, &out).ok());
  EXPECT_TRUE(out.empty());
}

TEST(DeltaBaseStoreTest, AnAdvancedBaseIsPendingUntilItsSyncCommits) {
  DeltaBaseStore store(1000);
  ASSERT_TRUE(store.Record(1, std::vector<uint8_t>(100, 1)));
  EXPECT_FALSE(store.Advance(1, 5).has_value());  // Pending: no version yet.
  store.Commit(5);
  EXPECT_FALSE(store.Advance(1, 4).has_value());
  std::optional<absl::Span<uint8_t>> base = store.Advance(1, 5);
  ASSERT_TRUE(base.has_value());
  ASSERT_EQ(base->size(), 100u);
  std::fill(base->begin(), base->end(), 2);    // What sync 6 sends.
  EXPECT_FALSE(store.Base(1, 5).has_value());  // Pending now.
  store.Commit(6);
  ASSERT_TRUE(store.Base(1, 6).has_value());
  EXPECT_EQ(std::vector<uint8_t>(store.Base(1, 6)->begin(), store.Base(1, 6)->end()),
            std::vector<uint8_t>(100, 2));
  ASSERT_TRUE(store.Advance(1, 6).has_value());
  store.Abort();  // The aborted sync's advanced base is dropped: the receiver may be dirty.
  EXPECT_FALSE(store.Base(1, 6).has_value());
  EXPECT_EQ(store.held_bytes(), 0);
  // A base of several huge pages (DeltaBaseStore::Entry) holds its bytes like any other.
  std::vector<uint8_t> large(int64_t{9} << 20);
  for (size_t i = 0; i < large.size(); i += 4096) large[i] = static_cast<uint8_t>(i >> 12);
  DeltaBaseStore big(int64_t{16} << 20);
  ASSERT_TRUE(big.Record(2, large));
  big.Commit(1);
  ASSERT_TRUE(big.Base(2, 1).has_value());
  EXPECT_TRUE(std::equal(large.begin(), large.end(), big.Base(2, 1)->begin()));
  EXPECT_EQ(big.held_bytes(), int64_t{9} << 20);
}

TEST(DeltaBaseStoreTest, ABaseServesOnlyTheVersionItsSyncCommitted) {
  DeltaBaseStore store(1000);
  const std::vector<uint8_t> sent(100, 7);
  EXPECT_TRUE(store.Record(1, sent));
  EXPECT_FALSE(store.Base(1, 5).has_value());  // Pending: no version yet.
  store.Commit(5);
  ASSERT_TRUE(store.Base(1, 5).has_value());
  EXPECT_TRUE(std::equal(store.Base(1, 5)->begin(), store.Base(1, 5)->end(), sent.begin()));
  EXPECT_FALSE(store.Base(1, 4).has_value());
  EXPECT_FALSE(store.Base(2, 5).has_value());
  EXPECT_EQ(store.held_bytes(), 100);
}

TEST(DeltaBaseStoreTest, AnAbortedSyncLeavesNoBaseForWhatItSent) {
  DeltaBaseStore store(1000);
  ASSERT_TRUE(store.Record(1, std::vector<uint8_t>(100, 1)));
  ASSERT_TRUE(store.Record(2, std::vector<uint8_t>(100, 2)));
  store.Commit(5);
  ASSERT_TRUE(store.Record(1, std::vector<uint8_t>(100, 3)));  // Sync 6 sends chunk 1 only.
  store.Abort();
  EXPECT_FALSE(store.Base(1, 5).has_value());
  EXPECT_FALSE(store.Base(1, 6).has_value());
  EXPECT_TRUE(store.Base(2, 5).has_value());
  EXPECT_EQ(store.held_bytes(), 100);
}

TEST(DeltaCodecTest, SamplingTellsAChunkThatChangedEverywhere) {
  std::mt19937_64 random(7);
  const std::vector<uint8_t> base = RandomBytes(4000 * 2, random);
  int64_t changed = 0;
  EXPECT_TRUE(SampledMostlyChanged(base, Change(base, 2, 1.0, random, &changed), 2));
  EXPECT_FALSE(SampledMostlyChanged(base, Change(base, 2, 0.02, random, &changed), 2));
  EXPECT_FALSE(SampledMostlyChanged(base, base, 2));
  EXPECT_FALSE(SampledMostlyChanged({}, {}, 4));
  // Fewer elements than samples: each one looked at.
  const std::vector<uint8_t> small = RandomBytes(3 * 4, random);
  EXPECT_TRUE(SampledMostlyChanged(small, Change(small, 4, 1.0, random, &changed), 4));
}

TEST(DeltaBaseStoreTest, ARecordOfTheSameSizeReplacesTheCommittedBase) {
  DeltaBaseStore store(150);
  ASSERT_TRUE(store.Record(1, std::vector<uint8_t>(100, 1)));
  store.Commit(5);
  const uint8_t* before = store.Base(1, 5)->data();
  ASSERT_TRUE(store.Record(1, std::vector<uint8_t>(100, 2)));  // Overwritten in place.
  EXPECT_FALSE(store.Base(1, 5).has_value());                  // Pending: no base at all.
  EXPECT_EQ(store.held_bytes(), 100);
  store.Commit(6);
  ASSERT_TRUE(store.Base(1, 6).has_value());
  EXPECT_EQ(store.Base(1, 6)->data(), before);
  EXPECT_EQ(std::vector<uint8_t>(store.Base(1, 6)->begin(), store.Base(1, 6)->end()),
            std::vector<uint8_t>(100, 2));
  ASSERT_TRUE(store.Record(1, std::vector<uint8_t>(100, 3)));
  store.Abort();  // What the aborted sync recorded is dropped, in place or not.
  EXPECT_FALSE(store.Base(1, 6).has_value());
  EXPECT_EQ(store.held_bytes(), 0);
}

TEST(DeltaBaseStoreTest, AChunkOverTheBudgetHoldsNoBase) {
  DeltaBaseStore store(250);
  EXPECT_TRUE(store.Record(1, std::vector<uint8_t>(100, 1)));
  EXPECT_TRUE(store.Record(2, std::vector<uint8_t>(100, 2)));
  EXPECT_FALSE(store.Record(3, std::vector<uint8_t>(100, 3)));
  store.Commit(1);
  EXPECT_FALSE(store.Base(3, 1).has_value());
  EXPECT_EQ(store.held_bytes(), 200);
  EXPECT_TRUE(store.Record(2, std::vector<uint8_t>(150, 2)));  // Replaces its own 100 bytes.
  EXPECT_EQ(store.held_bytes(), 250);
  store.Forget(1);
  EXPECT_EQ(store.held_bytes(), 150);
  EXPECT_TRUE(store.Record(3, std::vector<uint8_t>(100, 3)));
  store.Commit(2);
  EXPECT_TRUE(store.Base(3, 2).has_value());
  EXPECT_TRUE(store.Base(2, 2).has_value());
}

}  // namespace
}  // namespace wsync
