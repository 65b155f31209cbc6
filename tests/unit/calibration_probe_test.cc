// CalibrateLinks over the loopback transport: every process (a thread here) returns the same
// calibration; every pattern is present with the expected sample counts, labels and repeats; the
// bytes the fabric delivered are exactly what the patterns move; bad options are refused.

#include <array>
#include <atomic>
#include <map>

#include "absl/status/status.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "calibration/probe.h"
#include "cost/link_model.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/loopback_threads.h"
#include "tests/testing/probe_samples.h"
#include "transport/loopback/loopback.h"

namespace wsync {
namespace {

using ::testing::HasSubstr;

// Runs CalibrateLinks on every process of a fresh loopback fabric, each in its own thread.
std::vector<absl::StatusOr<proto::Calibration>> RunAll(int32_t n, const ProbeOptions& options,
                                                       LoopbackCounters* counters = nullptr) {
  return test::RunOnLoopbackThreads<absl::StatusOr<proto::Calibration>>(
      n,
      [&](int32_t, std::unique_ptr<Transport> transport, Group& group) {
        return CalibrateLinks(options, *transport, group);
      },
      counters);
}

std::map<std::string, std::string> Settings(const proto::Calibration& calibration) {
  return {calibration.settings().begin(), calibration.settings().end()};
}

std::string UpDown(int32_t from, int32_t to) {
  if (from == to) return "local";
  return from < to ? "up" : "down";
}

TEST(CalibrationProbeTest, EveryPatternWithExpectedCountsLabelsAndBytes) {
  const int32_t n = 4;
  ProbeOptions options;
  options.sizes = {4096, 65536};
  options.repeats = 3;
  options.warmup = 1;
  options.nodes = {"a", "a", "b", "b"};
  options.path_of = PathOfNodes(options.nodes);
  options.fan_widths = {1, 3};
  options.node_link_messages = 3;
  options.settings["UCX_TLS"] = "none";
  LoopbackCounters counters;
  const auto results = RunAll(n, options, &counters);
  for (const auto& result : results) ASSERT_TRUE(result.ok()) << result.status();
  // The same samples and settings everywhere (the settings map serializes in any order).
  for (int32_t p = 1; p < n; ++p) {
    ASSERT_EQ(results[p]->samples_size(), results[0]->samples_size());
    for (int i = 0; i < results[0]->samples_size(); ++i) {
      EXPECT_TRUE(results[p]->samples(i).SerializeAsString() ==
                  results[0]->samples(i).SerializeAsString())
          << "process " << p << " sample " << i;
    }
    EXPECT_EQ(Settings(*results[p]), Settings(*results[0]));
  }
  const proto::Calibration& calibration = *results[0];
  EXPECT_EQ(calibration.schema_version(), kCalibrationSchemaVersion);
  EXPECT_EQ(calibration.processes(), n);
  EXPECT_EQ(calibration.transport(), "loopback");
  EXPECT_EQ(calibration.settings().at("UCX_TLS"), "none");
  EXPECT_EQ(calibration.settings().at("probe.node_link_messages"), "3");

  const int64_t sizes = 2, widths = 2;
  std::map<std::string, int64_t> count;
  for (const proto::CalibrationSample& s : calibration.samples()) {
    ++count[s.pattern()];
    EXPECT_EQ(s.seconds_size(), options.repeats);
    for (const double seconds : s.seconds()) EXPECT_GT(seconds, 0) << s.pattern();
    if (s.pattern() == "local") {
      EXPECT_EQ(s.from(), s.to());
      EXPECT_EQ(s.path(), "local");
    } else if (s.pattern() == "peer" || s.pattern() == "both_ways") {
      EXPECT_NE(s.from(), s.to());
      EXPECT_EQ(s.path(), options.path_of(s.from(), s.to()));
      if (s.pattern() == "both_ways") {
        EXPECT_LT(s.from(), s.to());
      }
    } else if (s.pattern() == "fan_out" || s.pattern() == "fan_in") {
      const std::vector<int32_t> peers(s.peers().begin(), s.peers().end());
      ASSERT_TRUE(peers.size() == 1 || peers.size() == 3);
      if (peers.size() == 1) {
        // Default peers: the same node first.
        EXPECT_EQ(options.nodes[peers[0]], options.nodes[s.from()]) << s.from();
        EXPECT_EQ(s.path(), "intra_node");
      } else {
        EXPECT_EQ(s.path(), "inter_node+intra_node");
      }
    } else if (s.pattern() == "relay") {
      // Shift 1: 0 <- 3 (inter) -> 1 (intra); 1 <- 0 (intra) -> 2 (inter); and so on.
      const int32_t p = s.from();
      EXPECT_EQ(s.path(), options.path_of((p + n - 1) % n, p));
      EXPECT_EQ(s.send_path(), options.path_of(p, (p + 1) % n));
    } else if (s.pattern() == "node_link" && s.from_node() != s.to_node()) {
      // Every process of one node sends to its own process of the other node at once.
      const std::vector<int32_t> senders(s.peers().begin(), s.peers().end());
      EXPECT_EQ(senders,
                s.from_node() == "a" ? std::vector<int32_t>({0, 1}) : std::vector<int32_t>({2, 3}));
      EXPECT_EQ(s.path(), "inter_node");
      EXPECT_EQ(s.messages(), 1);
    } else if (s.pattern() == "node_link") {
      // Inside a node, its first half sends to its second half: 0 -> 1 on a, 2 -> 3 on b.
      const std::vector<int32_t> senders(s.peers().begin(), s.peers().end());
      EXPECT_EQ(senders,
                s.from_node() == "a" ? std::vector<int32_t>({0}) : std::vector<int32_t>({2}));
      EXPECT_EQ(s.path(), "intra_node");
      EXPECT_EQ(s.messages(), 3);
    } else {
      ADD_FAILURE() << "unexpected pattern " << s.pattern();
    }
  }
  EXPECT_EQ(count,
            test::ExpectedProbeSamples(n, sizes, widths, /*node_pairs=*/2, /*nodes_inside=*/2));
  EXPECT_EQ(std::vector<std::string>(calibration.nodes().begin(), calibration.nodes().end()),
            options.nodes);

  // Messages per repeat and size: peer n(n-1), both ways n(n-1), fans 2 n (1 + 3), relay n,
  // node links 2 x 2, inside nodes 2 x 1 with each sender's 3 back to back.
  const int64_t messages_per_size = n * (n - 1) * 2 + 2 * n * 4 + n + 4 + 2 * 3;
  const int64_t repeats = options.warmup + options.repeats;
  EXPECT_EQ(counters.TotalBytes(), messages_per_size * repeats * (4096 + 65536));
  EXPECT_EQ(counters.largest_message_bytes, 65536);

  // The link model reads every label: with the timings replaced by an exact line (measured ones
  // are too noisy here to fit), every path class, pair, fan and relay pair gets its fit.
  proto::Calibration exact = calibration;
  for (proto::CalibrationSample& s : *exact.mutable_samples()) {
    for (double& seconds : *s.mutable_seconds()) seconds = 1e-6 + s.bytes() / 1e9;
  }
  const absl::StatusOr<LinkFits> fits = FitLinks(exact);
  ASSERT_TRUE(fits.ok()) << fits.status();
  // The three measured path classes, and same_device priced with intra_node's fit (a stand-in:
  // host-memory probes cannot measure one GPU's copy engine).
  EXPECT_EQ(fits->by_path.size(), 4u);
  EXPECT_EQ(fits->stand_ins, (std::map<std::string, std::string>{{"same_device", "intra_node"}}));
  EXPECT_EQ(fits->by_pair.size(), static_cast<size_t>(n * (n - 1)));
  EXPECT_EQ(fits->both_ways.size(), static_cast<size_t>(n * (n - 1) / 2));
  EXPECT_EQ(fits->fans.size(), static_cast<size_t>(2 * n * widths));
  EXPECT_EQ(fits->relay.size(), 2u);      // (inter, intra) and (intra, inter).
  EXPECT_EQ(fits->node_link.size(), 4u);  // a -> b, b -> a, inside a, inside b.
  EXPECT_EQ(fits->nodes, options.nodes);
}

TEST(CalibrationProbeTest, QuantizeRunsOnEveryProcessAloneAtItsInputSize) {
  const int32_t n = 3;
  constexpr int64_t kInput = int64_t{1} << 20;
  ProbeOptions options;
  options.sizes = {4096, 65536};
  options.repeats = 3;
  options.warmup = 1;
  options.nodes = {"a", "a", "b"};
  options.path_of = PathOfNodes(options.nodes);
  options.fan_widths = {1};
  std::array<std::atomic<int>, n> calls{};
  std::atomic<int> running{0};
  std::atomic<bool> overlapped{false};
  const auto results = test::RunOnLoopbackThreads<absl::StatusOr<proto::Calibration>>(
      n, [&](int32_t p, std::unique_ptr<Transport> transport, Group& group) {
        ProbeOptions mine = options;
        mine.quantize.input_bytes = kInput;
        mine.quantize.description = "fake kernel";
        mine.quantize.run = [&, p] {
          if (running.fetch_add(1) != 0) overlapped = true;
          ++calls[p];
          absl::SleepFor(absl::Milliseconds(2));
          running.fetch_sub(1);
          return absl::OkStatus();
        };
        return CalibrateLinks(mine, *transport, group);
      });
  for (const auto& result : results) ASSERT_TRUE(result.ok()) << result.status();
  for (int32_t p = 0; p < n; ++p) EXPECT_EQ(calls[p], options.warmup + options.repeats) << p;
  EXPECT_FALSE(overlapped) << "each process quantizes alone";
  const proto::Calibration& calibration = *results[0];
  EXPECT_EQ(calibration.settings().at("probe.quantize"), "fake kernel");
  std::map<std::string, int64_t> count;
  for (const proto::CalibrationSample& s : calibration.samples()) ++count[s.pattern()];
  EXPECT_EQ(count, test::ExpectedProbeSamples(n, /*sizes=*/2, /*widths=*/1, /*node_pairs=*/2,
                                              /*nodes_inside=*/1, /*quantize=*/true));
  int32_t next = 0;
  for (const proto::CalibrationSample& s : calibration.samples()) {
    if (s.pattern() != "quantize") continue;
    EXPECT_EQ(s.from(), next);
    EXPECT_EQ(s.to(), next);
    EXPECT_EQ(s.path(), "local");
    EXPECT_EQ(s.from_node(), options.nodes[next]);
    EXPECT_EQ(s.bytes(), kInput);
    ASSERT_EQ(s.seconds_size(), options.repeats);
    for (const double seconds : s.seconds()) EXPECT_GE(seconds, 0.002);
    ++next;
  }
  for (int32_t p = 1; p < n; ++p) {
    EXPECT_EQ(results[p]->SerializeAsString().size(), calibration.SerializeAsString().size());
  }
  // The link model fits every process's rate; the slowest prices. (The links' timings are
  // replaced by an exact line: measured ones are too noisy here to fit.)
  proto::Calibration exact = calibration;
  for (proto::CalibrationSample& s : *exact.mutable_samples()) {
    if (s.pattern() == "quantize") continue;
    for (double& seconds : *s.mutable_seconds()) seconds = 1e-6 + s.bytes() / 1e9;
  }
  const absl::StatusOr<LinkFits> fits = FitLinks(exact);
  ASSERT_TRUE(fits.ok()) << fits.status();
  ASSERT_EQ(fits->quantize.size(), static_cast<size_t>(n));
  EXPECT_GT(fits->quantize_bytes_per_second, 0);
  EXPECT_LE(fits->quantize_bytes_per_second, kInput / 0.002);
  for (const auto& [process, fit] : fits->quantize) {
    EXPECT_GE(fit.bytes_per_second, fits->quantize_bytes_per_second);
  }

  // A failing kernel ends the probe with its error on the first process to quantize (0); the
  // others fail at their deadline. No bytes: refused.
  options.quantize.input_bytes = kInput;
  options.quantize.run = [] { return absl::InvalidArgumentError("kernel says no"); };
  options.step_timeout = absl::Seconds(1);
  const auto failed = RunAll(n, options);
  EXPECT_THAT(failed[0].status().message(), HasSubstr("kernel says no"));
  for (int32_t p = 1; p < n; ++p) EXPECT_FALSE(failed[p].ok()) << p;
  options.quantize.input_bytes = 0;
  for (const auto& result : RunAll(n, options)) {
    EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(result.status().message(), HasSubstr("quantize probe of 0 input bytes"));
  }
}

TEST(CalibrationProbeTest, AsymmetricPathLabelsFanDirections) {
  const int32_t n = 3;
  ProbeOptions options;
  options.sizes = {1024, 8192};
  options.repeats = 1;
  options.warmup = 0;
  options.path_of = UpDown;
  options.fan_widths = {2};
  options.relay_shift = 0;  // No relay.
  const auto results = RunAll(n, options);
  ASSERT_TRUE(results[0].ok()) << results[0].status();
  int fans = 0;
  for (const proto::CalibrationSample& s : results[0]->samples()) {
    EXPECT_NE(s.pattern(), "relay");
    if (s.pattern() == "peer") {
      EXPECT_EQ(s.path(), UpDown(s.from(), s.to()));
    }
    if (s.pattern() != "fan_out" && s.pattern() != "fan_in") continue;
    ++fans;
    // Root 0 sends up and receives down; root 2 the opposite; root 1 both ways.
    const bool out = s.pattern() == "fan_out";
    const std::map<int32_t, std::string> expected =
        out ? std::map<int32_t, std::string>{{0, "up"}, {1, "down+up"}, {2, "down"}}
            : std::map<int32_t, std::string>{{0, "down"}, {1, "down+up"}, {2, "up"}};
    EXPECT_EQ(s.path(), expected.at(s.from())) << s.pattern() << " root " << s.from();
  }
  EXPECT_EQ(fans, 2 * n * 2);
}

TEST(CalibrationProbeTest, DefaultsFollowNodes) {
  const std::vector<std::string> nodes = {"x", "y", "x", "x", "y"};
  EXPECT_EQ(DefaultFanWidths(nodes), (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(DefaultFanWidths({"a", "b"}), (std::vector<int32_t>{1}));
  EXPECT_TRUE(DefaultFanWidths({"a"}).empty());
  const FanPeers peers = DefaultFanPeers(nodes);
  EXPECT_EQ(peers(0, 2), (std::vector<int32_t>{2, 3}));
  EXPECT_EQ(peers(3, 3), (std::vector<int32_t>{0, 2, 4}));  // 0, 2 on x, then 4 (y) nearest.
  EXPECT_EQ(peers(1, 1), (std::vector<int32_t>{4}));
  const std::vector<int64_t> sizes = DefaultProbeSizes(3, int64_t{1} << 30);
  EXPECT_EQ(sizes.front(), 4096);
  EXPECT_EQ(sizes.back(), int64_t{256} << 20);
  EXPECT_EQ(sizes.size(), 9u);
  EXPECT_EQ(ProbeMemoryNeed(sizes, 3), int64_t{1} << 30);
  EXPECT_EQ(DefaultProbeSizes(7, int64_t{1} << 30).back(), int64_t{64} << 20);
}

TEST(CalibrationProbeTest, RefusesBadOptions) {
  ProbeOptions options;
  options.sizes = {4096};
  options.path_of = UpDown;
  options.fan_widths = {3};  // Only 2 other processes.
  for (const auto& result : RunAll(3, options)) {
    EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(result.status().message(), HasSubstr("fan width 3"));
  }
  options.fan_widths = {1};
  options.fan_peers = [](int32_t root, int32_t) { return std::vector<int32_t>{root}; };
  for (const auto& result : RunAll(3, options)) {
    EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(result.status().message(), HasSubstr("fan_peers"));
  }
  options.fan_peers = nullptr;
  options.sizes = {int64_t{1} << 20};
  options.memory_budget_bytes = int64_t{1} << 20;
  for (const auto& result : RunAll(3, options)) {
    EXPECT_EQ(result.status().code(), absl::StatusCode::kResourceExhausted);
    EXPECT_THAT(result.status().message(), HasSubstr("2097152 bytes per process"));
  }
  options.memory_budget_bytes = kDefaultProbeMemoryBudgetBytes;
  options.node_link_messages = 0;
  for (const auto& result : RunAll(3, options)) {
    EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(result.status().message(), HasSubstr("node_link_messages must be >= 1"));
  }
  options.node_link_messages = 1;
  options.path_of = nullptr;
  EXPECT_EQ(RunAll(2, options)[0].status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace wsync
