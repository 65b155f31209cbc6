#include "cost/link_model.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <random>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace wsync {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// Adds samples of `pattern` whose seconds follow alpha + bytes / bandwidth with +-2% noise,
// 3 repeats at 6 sizes from 64 KiB to 256 MiB.
void AddSamples(proto::Calibration& c, std::mt19937_64& rng, const std::string& pattern,
                int32_t from, int32_t to, const std::string& path, double alpha, double bandwidth,
                std::vector<int32_t> peers = {}) {
  std::uniform_real_distribution<double> noise(0.98, 1.02);
  for (int64_t bytes = int64_t{1} << 16; bytes <= int64_t{1} << 28; bytes <<= 2) {
    proto::CalibrationSample* s = c.add_samples();
    s->set_pattern(pattern);
    s->set_from(from);
    s->set_to(to);
    s->set_path(path);
    s->set_bytes(bytes);
    for (int32_t p : peers) s->add_peers(p);
    const double width = peers.empty() ? 1.0 : static_cast<double>(peers.size());
    for (int r = 0; r < 3; ++r) {
      s->add_seconds((alpha + width * static_cast<double>(bytes) / bandwidth) * noise(rng));
    }
  }
}

proto::Calibration Known() {
  std::mt19937_64 rng(7);
  proto::Calibration c;
  c.set_schema_version(kCalibrationSchemaVersion);
  c.set_processes(4);
  AddSamples(c, rng, "local", 0, 0, "local", 2e-6, 50e9);
  AddSamples(c, rng, "peer", 0, 1, "intra_node", 10e-6, 20e9);
  AddSamples(c, rng, "peer", 1, 0, "intra_node", 10e-6, 18e9);
  AddSamples(c, rng, "peer", 0, 2, "inter_node", 30e-6, 5e9);
  // Three senders into process 3 deliver 9 GB/s in all (3 GB/s each), not 3 x 5 GB/s.
  AddSamples(c, rng, "fan_in", 3, 3, "inter_node", 40e-6, 9e9, {0, 1, 2});
  AddSamples(c, rng, "both_ways", 0, 1, "intra_node", 12e-6, 15e9);
  return c;
}

void ExpectNear(const LinkFit& fit, double alpha, double bandwidth) {
  EXPECT_NEAR(fit.bytes_per_second / bandwidth, 1.0, 0.03);
  EXPECT_NEAR(fit.alpha_seconds, alpha, alpha * 0.5 + 2e-6);
  EXPECT_LT(fit.max_relative_error, 0.1);
  EXPECT_EQ(fit.sizes, 7);
}

TEST(LinkModelTest, FitsRecoverKnownLinkCosts) {
  absl::StatusOr<LinkFits> fits = FitLinks(Known());
  ASSERT_TRUE(fits.ok()) << fits.status();
  ExpectNear(fits->by_path.at("local"), 2e-6, 50e9);
  ExpectNear(fits->by_path.at("inter_node"), 30e-6, 5e9);
  ExpectNear(fits->by_pair.at({0, 1}), 10e-6, 20e9);
  ExpectNear(fits->by_pair.at({1, 0}), 10e-6, 18e9);  // Direction matters.
  ExpectNear(fits->both_ways.at({0, 1}), 12e-6, 15e9);
  const FanKey fan{"fan_in", 3, {0, 1, 2}};
  ExpectNear(fits->fan_aggregate.at(fan), 40e-6, 9e9);
  ExpectNear(fits->fans.at(fan), 40e-6, 3e9);  // Per message: a third of the aggregate.
}

TEST(LinkModelTest, RefusesOtherSchemasAndBadSamples) {
  proto::Calibration old = Known();
  old.set_schema_version(0);
  EXPECT_THAT(std::string(FitLinks(old).status().message()),
              HasSubstr("schema version 0 is not supported"));
  EXPECT_THAT(std::string(ParseCalibration(SerializeCalibration(old)).status().message()),
              HasSubstr("schema version 0"));
  EXPECT_TRUE(ParseCalibration(SerializeCalibration(Known())).ok());
  proto::Calibration empty_timing = Known();
  empty_timing.mutable_samples(0)->clear_seconds();
  EXPECT_THAT(std::string(FitLinks(empty_timing).status().message()), HasSubstr("no timing"));
  proto::Calibration flat = Known();
  for (auto& s : *flat.mutable_samples()) {
    for (double& t : *s.mutable_seconds()) t = 1.0;  // Time does not grow with size.
  }
  EXPECT_THAT(std::string(FitLinks(flat).status().message()), HasSubstr("does not grow"));
}

TEST(LinkModelTest, PredictionNamesTheBindingResource) {
  const LinkFits fits = *FitLinks(Known());
  // Processes 0, 1, 2 each send 1 GB to process 3 over inter-node links of 5 GB/s each; process
  // 3's measured fan-in takes 9 GB/s in all: its ingress binds at 3 GB / 9 GB/s.
  Traffic traffic;
  for (int32_t p = 0; p < 3; ++p) traffic.pairs.push_back({p, 3, "inter_node", 1000000000, 10});
  traffic.rounds = 10;
  absl::StatusOr<Prediction> prediction = Predict(fits, traffic);
  ASSERT_TRUE(prediction.ok()) << prediction.status();
  EXPECT_EQ(prediction->binding, "ingress of process 3");
  EXPECT_NEAR(prediction->transfer_seconds,
              3e9 / fits.fan_aggregate.begin()->second.bytes_per_second, 1e-9);
  // The rounds' costs add to the transfer, two rounds in flight: 10 rounds cost 5 alpha.
  const double alpha = fits.by_path.at("inter_node").alpha_seconds;
  ASSERT_GT(alpha, 0);
  ASSERT_LT(10 * alpha / kRoundsInFlight, prediction->transfer_seconds);
  EXPECT_NEAR(prediction->latency_seconds, 10 * alpha / kRoundsInFlight, 1e-12);
  EXPECT_NEAR(prediction->seconds, prediction->transfer_seconds + prediction->latency_seconds,
              1e-12);
  // One round still costs its alpha in full.
  traffic.rounds = 1;
  absl::StatusOr<Prediction> one_round = Predict(fits, traffic);
  ASSERT_TRUE(one_round.ok());
  EXPECT_NEAR(one_round->latency_seconds, alpha, 1e-12);
  // Latency-bound: so many rounds that their chain outlasts the transfer; all of it shows.
  traffic.rounds = static_cast<int64_t>(4 * prediction->transfer_seconds / alpha) + 1;
  absl::StatusOr<Prediction> many_rounds = Predict(fits, traffic);
  ASSERT_TRUE(many_rounds.ok());
  EXPECT_NEAR(many_rounds->transfer_seconds, prediction->transfer_seconds, 1e-12);
  EXPECT_NEAR(many_rounds->latency_seconds, traffic.rounds * alpha / kRoundsInFlight, 1e-9);
  EXPECT_GT(many_rounds->seconds, 2 * prediction->transfer_seconds);

  // One pair alone: its own measured link (0 -> 1 at ~20 GB/s) binds.
  Traffic one;
  one.pairs.push_back({0, 1, "intra_node", 4000000000, 1});
  prediction = Predict(fits, one);
  ASSERT_TRUE(prediction.ok());
  EXPECT_EQ(prediction->binding, "link 0->1 (intra_node)");
  EXPECT_NEAR(prediction->transfer_seconds, 0.2, 0.01);

  Traffic unknown;
  unknown.pairs.push_back({5, 6, "rdma", 1, 1});
  EXPECT_THAT(std::string(Predict(fits, unknown).status().message()),
              HasSubstr("no fit for path 'rdma'"));
}

TEST(LinkModelTest, RelaysGiveEachPathItsSharedCapacity) {
  // Four processes on one node: a pair alone moves 20 GB/s, but with all four receiving and
  // sending at once each moves 2 GB/s, so the node carries 8 GB/s in all.
  std::mt19937_64 rng(11);
  proto::Calibration c = Known();
  for (int32_t p = 0; p < 4; ++p) {
    const size_t first = c.samples_size();
    AddSamples(c, rng, "relay", p, -1, "intra_node", 50e-6, 2e9);
    for (size_t i = first; i < static_cast<size_t>(c.samples_size()); ++i) {
      c.mutable_samples(i)->set_send_path("intra_node");
    }
  }
  const LinkFits fits = *FitLinks(c);
  ExpectNear(fits.relay.at({"intra_node", "intra_node"}), 50e-6, 2e9);
  ExpectNear(fits.path_aggregate.at("intra_node"), 50e-6, 8e9);
  EXPECT_EQ(fits.path_aggregate.count("inter_node"), 0u);

  // Two disjoint pairs, 1 GB each: each link alone would take 0.05 s; together they share 8 GB/s.
  Traffic two;
  two.pairs.push_back({0, 1, "intra_node", 1000000000, 1});
  two.pairs.push_back({2, 3, "intra_node", 1000000000, 1});
  const absl::StatusOr<Prediction> prediction = Predict(fits, two);
  ASSERT_TRUE(prediction.ok()) << prediction.status();
  EXPECT_EQ(prediction->binding, "all intra_node traffic at once");
  EXPECT_NEAR(prediction->transfer_seconds, 0.25, 0.01);
}

// Known() on nodes a, a, b, b whose a -> b boundary carries 8 GB/s in all, shared by its two
// pairs (each pair alone: 5 GB/s, the inter_node path fit).
proto::Calibration KnownWithNodeLink() {
  std::mt19937_64 rng(13);
  proto::Calibration c = Known();
  for (const char* node : {"a", "a", "b", "b"}) c.add_nodes(node);
  const int first = c.samples_size();
  AddSamples(c, rng, "node_link", -1, -1, "inter_node", 40e-6, 8e9, {0, 1});
  for (int i = first; i < c.samples_size(); ++i) {
    c.mutable_samples(i)->set_from_node("a");
    c.mutable_samples(i)->set_to_node("b");
  }
  return c;
}

TEST(LinkModelTest, NodeLinkCountsEverySendersBackToBackMessages) {
  // Each of the two senders sent 4 messages of `bytes`: the boundary carried 8 x bytes in each
  // sample's time, so the fit must recover 8 GB/s from times of 8 x bytes / 8e9, not 2 x bytes.
  std::mt19937_64 rng(17);
  proto::Calibration streamed = Known();
  for (const char* node : {"a", "a", "b", "b"}) streamed.add_nodes(node);
  const int first = streamed.samples_size();
  AddSamples(streamed, rng, "node_link", -1, -1, "inter_node", 40e-6, 8e9 / 4, {0, 1});
  for (int i = first; i < streamed.samples_size(); ++i) {
    streamed.mutable_samples(i)->set_from_node("a");
    streamed.mutable_samples(i)->set_to_node("b");
    streamed.mutable_samples(i)->set_messages(4);
  }
  const absl::StatusOr<LinkFits> fits = FitLinks(streamed);
  ASSERT_TRUE(fits.ok()) << fits.status();
  ExpectNear(fits->node_link.at({"a", "b"}), 40e-6, 8e9);
}

TEST(LinkModelTest, NodeLinkIsTheCapacityAllPairsAcrossTwoNodesShare) {
  const absl::StatusOr<LinkFits> fits = FitLinks(KnownWithNodeLink());
  ASSERT_TRUE(fits.ok()) << fits.status();
  ExpectNear(fits->node_link.at({"a", "b"}), 40e-6, 8e9);
  EXPECT_EQ(fits->node_link.count({"b", "a"}), 0u);
  EXPECT_EQ(fits->nodes, (std::vector<std::string>{"a", "a", "b", "b"}));

  // Random a -> b traffic on pairs 0 -> 2 and 1 -> 3 (plus a little within node a): the
  // prediction is the larger of the slower pair's own link and all a -> b bytes over the shared
  // boundary, and it names the one that binds.
  std::mt19937_64 rng(5);
  std::uniform_int_distribution<int64_t> bytes(100000000, 2000000000);
  const double boundary = fits->node_link.at({"a", "b"}).bytes_per_second;
  const double link02 = fits->by_pair.at({0, 2}).bytes_per_second;
  const double link13 = fits->by_path.at("inter_node").bytes_per_second;  // No pair fit.
  int boundary_bound = 0;
  for (int trial = 0; trial < 40; ++trial) {
    Traffic traffic;
    traffic.pairs.push_back({0, 2, "inter_node", bytes(rng), 4});
    traffic.pairs.push_back({1, 3, "inter_node", bytes(rng), 4});
    traffic.pairs.push_back({0, 1, "intra_node", 1000000, 1});  // Stays on node a.
    const double b02 = static_cast<double>(traffic.pairs[0].bytes);
    const double b13 = static_cast<double>(traffic.pairs[1].bytes);
    const double shared = (b02 + b13) / boundary;
    const double alone = std::max(b02 / link02, b13 / link13);
    const absl::StatusOr<Prediction> prediction = Predict(*fits, traffic);
    ASSERT_TRUE(prediction.ok()) << prediction.status();
    EXPECT_NEAR(prediction->transfer_seconds, std::max(shared, alone), 1e-9);
    if (shared > alone * 1.001) {
      ++boundary_bound;
      EXPECT_EQ(prediction->binding, "node link a->b (all its pairs at once)");
    } else if (alone > shared * 1.001) {
      EXPECT_THAT(prediction->binding, Not(HasSubstr("node link")));
    }
  }
  EXPECT_GT(boundary_bound, 5);  // Both cases were exercised.
  EXPECT_LT(boundary_bound, 35);

  // Equal pairs of 1 GB: 0.2 s each alone, but 2 GB over 8 GB/s = 0.25 s together.
  Traffic equal;
  equal.pairs.push_back({0, 2, "inter_node", 1000000000, 1});
  equal.pairs.push_back({1, 3, "inter_node", 1000000000, 1});
  const absl::StatusOr<Prediction> together = Predict(*fits, equal);
  ASSERT_TRUE(together.ok());
  EXPECT_EQ(together->binding, "node link a->b (all its pairs at once)");
  EXPECT_NEAR(together->transfer_seconds, 0.25, 0.01);
  // b -> a has no node-link fit: its pairs are priced on their own links, as before.
  Traffic back;
  back.pairs.push_back({2, 0, "inter_node", 1000000000, 1});
  back.pairs.push_back({3, 1, "inter_node", 1000000000, 1});
  const absl::StatusOr<Prediction> unshared = Predict(*fits, back);
  ASSERT_TRUE(unshared.ok());
  EXPECT_NEAR(unshared->transfer_seconds, 0.2, 0.01);
  EXPECT_THAT(unshared->binding, Not(HasSubstr("node link")));
}

TEST(LinkModelTest, PairsInsideANodeShareTheNodesCapacity) {
  // Inside node a (processes 0 and 1 of nodes a, a, b, b), process 0 alone sending to 1 carried
  // 6 GB/s: every pair of distinct processes inside a shares it (cores and memory), although
  // the intra_node pair fits say 18-20 GB/s each. Local copies and bytes leaving a do not count.
  std::mt19937_64 rng(23);
  proto::Calibration c = KnownWithNodeLink();
  const int first = c.samples_size();
  AddSamples(c, rng, "node_link", -1, -1, "intra_node", 30e-6, 6e9, {0});
  for (int i = first; i < c.samples_size(); ++i) {
    c.mutable_samples(i)->set_from_node("a");
    c.mutable_samples(i)->set_to_node("a");
  }
  const absl::StatusOr<LinkFits> fits = FitLinks(c);
  ASSERT_TRUE(fits.ok()) << fits.status();
  ExpectNear(fits->node_link.at({"a", "a"}), 30e-6, 6e9);

  Traffic traffic;
  traffic.pairs.push_back({0, 1, "intra_node", 1000000000, 1});
  traffic.pairs.push_back({1, 0, "intra_node", 500000000, 1});
  traffic.pairs.push_back({0, 0, "local", 4000000000, 1});
  const absl::StatusOr<Prediction> inside = Predict(*fits, traffic);
  ASSERT_TRUE(inside.ok()) << inside.status();
  EXPECT_EQ(inside->binding, "all pairs inside node a at once");
  EXPECT_NEAR(inside->transfer_seconds, 1.5e9 / fits->node_link.at({"a", "a"}).bytes_per_second,
              1e-9);
  // Node b has no inside fit: its pair is priced on its own link.
  Traffic on_b;
  on_b.pairs.push_back({2, 3, "intra_node", 1000000000, 1});
  const absl::StatusOr<Prediction> unshared = Predict(*fits, on_b);
  ASSERT_TRUE(unshared.ok());
  EXPECT_THAT(unshared->binding, Not(HasSubstr("inside")));
}

TEST(LinkModelTest, TrafficLoadsAddAndTakeBackExactly) {
  // Random traffic on four processes of two nodes (with fans, relays and the a -> b node link
  // fitted), added in pieces: All equals PriceResources of the summed traffic, Touched gives
  // exactly All's loads of the resources a pair uses, and taking a piece back restores every load.
  const absl::StatusOr<LinkFits> fits = FitLinks(KnownWithNodeLink());
  ASSERT_TRUE(fits.ok()) << fits.status();
  std::mt19937_64 rng(17);
  std::uniform_int_distribution<int32_t> process(0, 3);
  std::uniform_int_distribution<int64_t> bytes(1, 1 << 30);
  const auto path = [](int32_t from, int32_t to) {
    return from == to ? "local" : (from / 2 == to / 2 ? "intra_node" : "inter_node");
  };
  const auto same = [](const std::vector<ResourceLoad>& a, const std::vector<ResourceLoad>& b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i) {
      if (a[i].key() != b[i].key() || a[i].seconds != b[i].seconds) return false;
    }
    return true;
  };
  for (int trial = 0; trial < 20; ++trial) {
    TrafficLoads loads(&*fits);
    std::map<std::pair<int32_t, int32_t>, int64_t> sums;
    for (int piece = 0; piece < 8; ++piece) {
      const int32_t from = process(rng), to = process(rng);
      const int64_t n = bytes(rng);
      ASSERT_TRUE(loads.Add(from, to, path(from, to), n).ok());
      sums[{from, to}] += n;
    }
    Traffic traffic;
    for (const auto& [pair, n] : sums) {
      traffic.pairs.push_back({pair.first, pair.second, path(pair.first, pair.second), n, 1});
    }
    const std::vector<ResourceLoad> all = loads.All();
    EXPECT_TRUE(same(all, *PriceResources(*fits, traffic)));
    for (const auto& [pair, n] : sums) {
      for (const ResourceLoad& touched : loads.Touched(pair.first, pair.second)) {
        auto it = std::find_if(all.begin(), all.end(),
                               [&](const ResourceLoad& r) { return r.key() == touched.key(); });
        ASSERT_NE(it, all.end()) << touched.Name();
        EXPECT_EQ(it->seconds, touched.seconds) << touched.Name();
      }
    }
    const int32_t from = process(rng), to = process(rng);
    ASSERT_TRUE(loads.Add(from, to, path(from, to), 12345).ok());
    EXPECT_FALSE(same(all, loads.All()));
    ASSERT_TRUE(loads.Add(from, to, path(from, to), -12345).ok());
    EXPECT_TRUE(same(all, loads.All()));
  }
  // A pair without a pair fit whose path has no fit is refused and changes nothing.
  TrafficLoads loads(&*fits);
  EXPECT_EQ(loads.Add(7, 8, "nvlink", 100).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(loads.All().empty());
}

TEST(LinkModelTest, SchemaOneFilesReadWithoutNodeLinks) {
  // A version-1 file (before node ids and node_link samples) is read and fits as it did.
  proto::Calibration old = Known();
  old.set_schema_version(1);
  const absl::StatusOr<proto::Calibration> parsed = ParseCalibration(SerializeCalibration(old));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const absl::StatusOr<LinkFits> fits = FitLinks(*parsed);
  ASSERT_TRUE(fits.ok()) << fits.status();
  EXPECT_TRUE(fits->node_link.empty());
  EXPECT_TRUE(fits->nodes.empty());
  ExpectNear(fits->by_pair.at({0, 2}), 30e-6, 5e9);

  // node_link samples did not exist in version 1; a later version is not read.
  proto::Calibration mixed = KnownWithNodeLink();
  mixed.set_schema_version(1);
  EXPECT_THAT(std::string(FitLinks(mixed).status().message()),
              HasSubstr("unknown pattern 'node_link' for schema 1"));
  proto::Calibration future = Known();
  future.set_schema_version(kCalibrationSchemaVersion + 1);
  EXPECT_THAT(std::string(ParseCalibration(SerializeCalibration(future)).status().message()),
              HasSubstr("is not supported (this build reads 1 to 3)"));

  // Node ids that do not cover the processes, and node links without their nodes, are refused.
  proto::Calibration short_nodes = KnownWithNodeLink();
  short_nodes.mutable_nodes()->RemoveLast();
  EXPECT_THAT(std::string(FitLinks(short_nodes).status().message()),
              HasSubstr("names 3 nodes for 4 processes"));
  proto::Calibration unnamed = KnownWithNodeLink();
  unnamed.mutable_samples(unnamed.samples_size() - 1)->clear_to_node();
  EXPECT_THAT(std::string(FitLinks(unnamed).status().message()),
              HasSubstr("lacks its nodes or senders"));
}

TEST(LinkModelTest, SyntheticCalibrationStatesLinkConstants) {
  absl::StatusOr<proto::Calibration> c =
      SyntheticCalibration("intra_node=5us,200GB/s; inter_node=20us,25GB/s; local=1us,400GB/s");
  ASSERT_TRUE(c.ok()) << c.status();
  const LinkFits fits = *FitLinks(*c);
  EXPECT_NEAR(fits.by_path.at("intra_node").bytes_per_second, 200e9, 1e3);
  EXPECT_NEAR(fits.by_path.at("inter_node").alpha_seconds, 20e-6, 1e-9);
  EXPECT_NEAR(fits.by_path.at("local").bytes_per_second, 400e9, 1e3);
  EXPECT_TRUE(fits.by_pair.empty());  // Stated per path class, not per pair.
  EXPECT_THAT(std::string(SyntheticCalibration("inter_node=20us").status().message()),
              HasSubstr("is not <path>=<alpha>,<bandwidth>"));
  EXPECT_THAT(std::string(SyntheticCalibration("x=1parsec,1GB/s").status().message()),
              HasSubstr("cannot read '1parsec'"));
}

// The calibration of one node: a local copy and intra_node pairs, nothing between nodes.
proto::Calibration OneNode() {
  std::mt19937_64 rng(11);
  proto::Calibration c;
  c.set_schema_version(kCalibrationSchemaVersion);
  c.set_processes(2);
  AddSamples(c, rng, "local", 0, 0, "local", 2e-6, 50e9);
  AddSamples(c, rng, "peer", 0, 1, "intra_node", 10e-6, 20e9);
  return c;
}

TEST(LinkModelTest, PredictPricedLeavesOutAndNamesPathsWithoutFits) {
  const absl::StatusOr<LinkFits> fits = FitLinks(OneNode());
  ASSERT_TRUE(fits.ok()) << fits.status();
  Traffic intra;
  intra.pairs = {{0, 1, "intra_node", 1 << 28, 4}};
  intra.rounds = 4;
  Traffic mixed = intra;
  mixed.pairs.push_back({2, 3, "inter_node", 3 << 28, 4});
  mixed.pairs.push_back({3, 2, "inter_node", 1 << 20, 1});
  mixed.pairs.push_back({4, 5, "nvlink", 7, 1});

  // Predict refuses the mixed traffic; PredictPriced prices the intra_node pair exactly as
  // Predict prices it alone and names the rest by path class with its bytes.
  EXPECT_EQ(Predict(*fits, mixed).status().code(), absl::StatusCode::kFailedPrecondition);
  const absl::StatusOr<Prediction> alone = Predict(*fits, intra);
  const absl::StatusOr<Prediction> priced = PredictPriced(*fits, mixed);
  ASSERT_TRUE(alone.ok()) << alone.status();
  ASSERT_TRUE(priced.ok()) << priced.status();
  EXPECT_GT(priced->seconds, 0);
  EXPECT_EQ(priced->seconds, alone->seconds);
  EXPECT_EQ(priced->binding, alone->binding);
  EXPECT_TRUE(alone->unpriced_bytes.empty());
  EXPECT_EQ(priced->unpriced_bytes,
            (std::map<std::string, int64_t>{{"inter_node", (3 << 28) + (1 << 20)}, {"nvlink", 7}}));

  // Nothing priceable: 0 s, everything named.
  Traffic none;
  none.pairs = {{2, 3, "inter_node", 1000, 1}};
  const absl::StatusOr<Prediction> nothing = PredictPriced(*fits, none);
  ASSERT_TRUE(nothing.ok()) << nothing.status();
  EXPECT_EQ(nothing->seconds, 0);
  EXPECT_EQ(nothing->unpriced_bytes.at("inter_node"), 1000);
}

TEST(LinkModelTest, PairFitsApplyOnlyOnThePathTheyWereMeasuredOn) {
  const absl::StatusOr<LinkFits> fits = FitLinks(OneNode());
  ASSERT_TRUE(fits.ok()) << fits.status();
  EXPECT_EQ(fits->pair_path.at({0, 1}), "intra_node");
  // Processes 0 and 1 shared a node in the calibration; in a job that puts them on two nodes
  // their pair fit does not price the inter_node pair.
  EXPECT_TRUE(CanPrice(*fits, 0, 1, "intra_node"));
  EXPECT_FALSE(CanPrice(*fits, 0, 1, "inter_node"));
  EXPECT_FALSE(CanPrice(*fits, 1, 0, "inter_node"));
  EXPECT_TRUE(CanPrice(*fits, 5, 6, "intra_node"));  // The path fit.
  TrafficLoads loads(&*fits);
  EXPECT_EQ(loads.Add(0, 1, "inter_node", 100).code(), absl::StatusCode::kFailedPrecondition);
  // A pair fit without a recorded path applies on any path.
  LinkFits stated = *fits;
  stated.pair_path.clear();
  EXPECT_TRUE(CanPrice(stated, 0, 1, "inter_node"));
}

TEST(LinkModelTest, SameDeviceBorrowsIntraNodesFitAndSaysSo) {
  const absl::StatusOr<LinkFits> fits = FitLinks(OneNode());
  ASSERT_TRUE(fits.ok()) << fits.status();
  EXPECT_EQ(fits->stand_ins, (std::map<std::string, std::string>{{"same_device", "intra_node"}}));
  Traffic traffic;
  traffic.pairs = {{0, 1, "intra_node", 1 << 20, 1}, {2, 3, "same_device", 1 << 28, 4}};
  traffic.rounds = 4;
  const absl::StatusOr<Prediction> priced = PredictPriced(*fits, traffic);
  ASSERT_TRUE(priced.ok()) << priced.status();
  EXPECT_TRUE(priced->unpriced_bytes.empty());
  // Priced as intra_node traffic of the same pairs would be.
  Traffic as_intra = traffic;
  as_intra.pairs[1].path = "intra_node";
  EXPECT_EQ(priced->seconds, Predict(*fits, as_intra)->seconds);
  EXPECT_EQ(priced->stand_in_bytes, (std::map<std::string, int64_t>{{"same_device", 1 << 28}}));
  EXPECT_EQ(StandInNote(*fits, *priced),
            "same_device 268435456 B priced with intra_node's fit (the calibration has none of "
            "its own)");
  // A pair fit measured on intra_node does not price the pair on same_device: the stand-in does.
  EXPECT_TRUE(CanPrice(*fits, 0, 1, "same_device"));

  // Its own fit: no stand-in, and its constants.
  absl::StatusOr<proto::Calibration> stated =
      SyntheticCalibration("intra_node=5us,20GB/s; same_device=2us,400GB/s");
  ASSERT_TRUE(stated.ok()) << stated.status();
  const LinkFits own = *FitLinks(*stated);
  EXPECT_TRUE(own.stand_ins.empty());
  EXPECT_NEAR(own.by_path.at("same_device").bytes_per_second, 400e9, 1e3);
  EXPECT_TRUE(PredictPriced(own, traffic)->stand_in_bytes.empty());

  // Without an intra_node fit nothing stands in: same_device is unpriced and named.
  const LinkFits inter = *FitLinks(*SyntheticCalibration("inter_node=20us,25GB/s"));
  EXPECT_TRUE(inter.stand_ins.empty());
  const absl::StatusOr<Prediction> unpriced = PredictPriced(inter, traffic);
  ASSERT_TRUE(unpriced.ok()) << unpriced.status();
  EXPECT_EQ(unpriced->unpriced_bytes.at("same_device"), 1 << 28);
  EXPECT_TRUE(StandInNote(inter, *unpriced).empty());
}

}  // namespace
}  // namespace wsync
