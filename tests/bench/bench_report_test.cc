#include "integration/bench/bench_report.h"

#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace wsync::bench {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

Measured Contestant(const std::string& id, std::vector<double> seconds,
                    const std::string& link = "") {
  Measured m;
  m.id = id;
  m.transport = "t";
  m.link_limit = link;
  m.verified = true;
  m.seconds = std::move(seconds);
  return m;
}

Measured Limit(const std::string& id, std::vector<double> seconds) {
  Measured m = Contestant(id, std::move(seconds));
  m.limit = true;
  m.verified = id == "memcpy";
  return m;
}

Scenario Example() {
  Scenario s;
  s.model = "m";
  s.from = "megatron(tp=2)";
  s.to = "vllm(tp=2)";
  s.trainers = 2;
  s.rollouts = 2;
  s.rollout_bytes = 1000000000;
  s.results = {Contestant("fast", {3, 1, 2}, "perftest-tcp"), Contestant("slow", {4, 4}),
               Limit("perftest-tcp", {0.5}), Limit("memcpy", {0.25})};
  s.results[0].peak_rss_bytes = {{"trainer 0", 3 << 20}, {"rollout 0", 5 << 20}};
  return s;
}

TEST(BenchReportTest, MedianMinMax) {
  EXPECT_EQ(Median({}), 0);
  EXPECT_EQ(Median({5}), 5);
  EXPECT_EQ(Median({3, 1, 2}), 2);
  EXPECT_EQ(Median({4, 1, 3, 2}), 2.5);
  EXPECT_EQ(Min({3, -1, 2}), -1);
  EXPECT_EQ(Max({3, -1, 2}), 3);
  EXPECT_EQ(Min({}), 0);
  EXPECT_EQ(Max({}), 0);
}

// The limit of a child job grows with its versions and the bytes its busiest process holds; the
// element check adds its own allowance (issue 27: the default run's 1->1 job of 2 versions,
// 0.99 GB per process, ran past a fixed 90 s filling and checking every element).
TEST(BenchReportTest, JobLimitScalesWithVersionsAndBytes) {
  EXPECT_DOUBLE_EQ(JobLimitSeconds(60, 0, 4'000'000'000, true), 60);
  EXPECT_DOUBLE_EQ(JobLimitSeconds(60, 6, 0, false), 60);
  EXPECT_DOUBLE_EQ(JobLimitSeconds(60, 6, 1'000'000'000, false), 120);
  EXPECT_DOUBLE_EQ(JobLimitSeconds(60, 2, 500'000'000, false), 70);
  EXPECT_DOUBLE_EQ(JobLimitSeconds(60, 2, 500'000'000, true), 220);
  EXPECT_GT(JobLimitSeconds(60, 2, 988'000'000, true), 300);
}

TEST(BenchReportTest, JsonStringEscapes) {
  EXPECT_EQ(JsonString("vllm(tp=1,dp=2)"), "\"vllm(tp=1,dp=2)\"");
  EXPECT_EQ(JsonString("a\"b\\c\nd"), "\"a\\\"b\\\\c\\u000ad\"");
}

TEST(BenchReportTest, SummaryOfAContestant) {
  const Scenario s = Example();
  const std::optional<Summary> fast = Summarize(s, "fast");
  ASSERT_TRUE(fast.has_value());
  EXPECT_EQ(fast->seconds_median, 2);
  EXPECT_EQ(fast->seconds_min, 1);
  EXPECT_EQ(fast->seconds_max, 3);
  EXPECT_DOUBLE_EQ(fast->gbps_per_rollout, 0.5);
  EXPECT_DOUBLE_EQ(fast->speedup.at("slow"), 2);
  EXPECT_DOUBLE_EQ(fast->speedup.at("fast"), 1);
  EXPECT_EQ(fast->speedup.count("perftest-tcp"), 0);  // Limits are not contestants.
  ASSERT_TRUE(fast->fraction_of_link.has_value());
  EXPECT_DOUBLE_EQ(*fast->fraction_of_link, 0.25);  // 0.5 GB/s of 2 GB/s.
  ASSERT_TRUE(fast->fraction_of_memcpy.has_value());
  EXPECT_DOUBLE_EQ(*fast->fraction_of_memcpy, 0.125);  // 0.5 GB/s of 4 GB/s.

  const std::optional<Summary> slow = Summarize(s, "slow");
  ASSERT_TRUE(slow.has_value());
  EXPECT_DOUBLE_EQ(slow->speedup.at("fast"), 0.5);
  EXPECT_FALSE(slow->fraction_of_link.has_value());  // It names no link limit.

  const std::optional<Summary> limit = Summarize(s, "perftest-tcp");
  ASSERT_TRUE(limit.has_value());
  EXPECT_TRUE(limit->speedup.empty());
  EXPECT_DOUBLE_EQ(limit->gbps_per_rollout, 2);
  const std::optional<Summary> memcpy_summary = Summarize(s, "memcpy");
  ASSERT_TRUE(memcpy_summary.has_value());
  EXPECT_FALSE(memcpy_summary->fraction_of_memcpy.has_value());
}

TEST(BenchReportTest, MissingResultsHaveNoSummary) {
  Scenario s = Example();
  EXPECT_FALSE(Summarize(s, "absent").has_value());
  s.results[1].seconds.clear();
  EXPECT_FALSE(Summarize(s, "slow").has_value());
  // A contestant without samples is left out of the others' speed-ups.
  EXPECT_EQ(Summarize(s, "fast")->speedup.count("slow"), 0);
  // A missing link limit leaves the fraction unknown instead of inventing one.
  s.results.erase(s.results.begin() + 2);
  EXPECT_FALSE(Summarize(s, "fast")->fraction_of_link.has_value());
}

// Speed-ups are reciprocal and transitive, and every fraction is a ratio of medians, for random
// samples.
TEST(BenchReportTest, SpeedupsAreRatiosOfMedians) {
  std::mt19937 random(12);
  std::uniform_real_distribution<double> seconds(0.01, 10);
  for (int trial = 0; trial < 200; ++trial) {
    Scenario s;
    s.rollout_bytes = 1 + random() % 1000000000;
    const std::vector<std::string> ids = {"a", "b", "c"};
    for (const std::string& id : ids) {
      std::vector<double> samples(1 + random() % 7);
      for (double& v : samples) v = seconds(random);
      s.results.push_back(Contestant(id, samples, "limit"));
    }
    s.results.push_back(Limit("limit", {seconds(random), seconds(random)}));
    for (const std::string& x : ids) {
      const Summary sx = *Summarize(s, x);
      EXPECT_NEAR(sx.gbps_per_rollout * sx.seconds_median * 1e9, s.rollout_bytes,
                  1e-6 * s.rollout_bytes);
      EXPECT_NEAR(*sx.fraction_of_link, Median(s.results[3].seconds) / sx.seconds_median, 1e-9);
      for (const std::string& y : ids) {
        const Summary sy = *Summarize(s, y);
        EXPECT_NEAR(sx.speedup.at(y) * sy.speedup.at(x), 1, 1e-9);
        for (const std::string& z : ids) {
          EXPECT_NEAR(sx.speedup.at(y) * sy.speedup.at(z), sx.speedup.at(z), 1e-9);
        }
      }
    }
  }
}

TEST(BenchReportTest, TableShowsEveryResult) {
  Scenario s = Example();
  s.results[1].verified = false;
  s.notes = {"a note"};
  const std::string table = FormatTable(s);
  EXPECT_THAT(table, HasSubstr("m, megatron(tp=2) -> vllm(tp=2): 2 trainer and 2 rollout"));
  EXPECT_THAT(table, HasSubstr("953.67 MiB per sync"));
  for (const char* id : {"fast", "slow", "perftest-tcp", "memcpy"}) {
    EXPECT_THAT(table, HasSubstr(std::string("\n") + id + " ")) << id;
  }
  EXPECT_THAT(table, HasSubstr("x fast"));
  EXPECT_THAT(table, HasSubstr("x slow"));
  EXPECT_THAT(table, Not(HasSubstr("x perftest-tcp")));
  // fast: median 2 s, 0.500 GB/s, 2.00 times slow, 0.25 of its link, 0.12 of memcpy, verified.
  EXPECT_THAT(table, HasSubstr("2.0000   1.0000   3.0000     0.500          -       2.00    0.25 "
                               "   0.12  yes"));
  EXPECT_THAT(table, HasSubstr("NO"));   // slow is not verified.
  EXPECT_THAT(table, HasSubstr("n/a"));  // perftest cannot be.
  EXPECT_THAT(table, HasSubstr("fast         rollout 0 5, trainer 0 3"));
  EXPECT_THAT(table, HasSubstr("a note\n"));
}

TEST(BenchReportTest, JsonHoldsSamplesAndSummaries) {
  const Scenario s = Example();
  const std::string json = ToJson({s, s}, "2026-11-29", "2 cores", "wsync-bench compare");
  EXPECT_THAT(json, HasSubstr("\"date\": \"2026-11-29\""));
  EXPECT_THAT(json, HasSubstr("\"command\": \"wsync-bench compare\""));
  EXPECT_THAT(json, HasSubstr("\"to\": \"vllm(tp=2)\""));
  EXPECT_THAT(json, HasSubstr("\"rollout_bytes\": 1000000000"));
  EXPECT_THAT(json, HasSubstr("\"seconds\": [3, 1, 2]"));
  EXPECT_THAT(json, HasSubstr("\"seconds_median\": 2, \"seconds_min\": 1, \"seconds_max\": 3, "
                              "\"gbps_per_rollout\": 0.5"));
  EXPECT_THAT(json, HasSubstr("\"speedup\": {\"fast\": 1, \"slow\": 2}"));
  EXPECT_THAT(json, HasSubstr("\"fraction_of_link\": 0.25, \"fraction_of_memcpy\": 0.125"));
  EXPECT_THAT(json, HasSubstr("\"fraction_of_link\": null"));
  EXPECT_THAT(json, HasSubstr("\"peak_rss_bytes\": {\"rollout 0\": 5242880, \"trainer 0\": "
                              "3145728}"));
  EXPECT_THAT(json, HasSubstr("\"limit\": true"));
  // Two scenarios, separated by a comma; brackets and braces balance.
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < json.size(); ++i) {
    if (json[i] == '\\') {
      ++i;
      continue;
    }
    if (json[i] == '"') in_string = !in_string;
    if (in_string) continue;
    if (json[i] == '{' || json[i] == '[') ++depth;
    if (json[i] == '}' || json[i] == ']') --depth;
    ASSERT_GE(depth, 0);
  }
  EXPECT_EQ(depth, 0);
  EXPECT_FALSE(in_string);
}

TEST(BenchReportTest, QuantComparisonRatiosAndGoal) {
  QuantComparison c;
  c.transport = "tcp";
  c.bf16_wire_bytes = 1300;
  c.fp8_wire_bytes = 810;
  c.bf16_plan_bytes = 1300;
  c.fp8_plan_bytes = 805;
  c.plain_bytes = 300;  // Sent in bf16 by both: the quantized parameters are 1000 and 510.
  c.fp8_bytes = 480;
  c.scale_bytes = 5;
  c.gathered_bytes = 20;
  c.quantized_bf16_bytes = 1000;
  c.bf16_seconds = 0.4;
  c.fp8_seconds = 0.3;
  EXPECT_DOUBLE_EQ(WireRatio(c), 810.0 / 1300);
  EXPECT_DOUBLE_EQ(QuantizedWireRatio(c), 0.51);
  EXPECT_DOUBLE_EQ(PlanRatio(c), 805.0 / 1300);
  EXPECT_DOUBLE_EQ(QuantizedPlanRatio(c), 0.505);
  EXPECT_DOUBLE_EQ(TimeRatio(c), 0.75);
  EXPECT_DOUBLE_EQ(WholeRatioFloor(c), 800.0 / 1300);  // (300 + 1000 / 2) / (300 + 1000).
  const std::string text = FormatQuantComparison(c);
  EXPECT_THAT(text, HasSubstr("over tcp"));
  EXPECT_THAT(text, HasSubstr("bf16 1300 B, fp8 810 B: ratio 0.6231 (goal <= 0.52: NOT met)"));
  EXPECT_THAT(text, HasSubstr("less the 300 B of parameters both send in bf16"));
  EXPECT_THAT(text, HasSubstr("bf16 1000 B, fp8 510 B: ratio 0.5100 (goal <= 0.52: met)"));
  EXPECT_THAT(text, HasSubstr("(300 B + 1000 B / 2) / (300 B + 1000 B) = 0.6154\n"));
  EXPECT_THAT(text, HasSubstr("bf16 1300 B, fp8 805 B: ratio 0.6192"));
  EXPECT_THAT(text, HasSubstr("e4m3 480 B + scales 5 B (sender-side) + bf16 20 B gathered"));
  EXPECT_THAT(text, HasSubstr("ratio 0.5050\n"));
  EXPECT_THAT(text, HasSubstr("bf16 0.4000 s, fp8 0.3000 s: ratio 0.750"));
  const std::string json = QuantComparisonJson(c);
  EXPECT_THAT(json, HasSubstr("\"quantized_wire_ratio\": 0.510000"));
  EXPECT_THAT(json, HasSubstr("\"quantized_plan_ratio\": 0.505000"));
  EXPECT_THAT(json, HasSubstr("\"time_ratio\": 0.750000"));
  EXPECT_THAT(json, HasSubstr("\"whole_ratio_floor\": 0.615385"));

  // Nothing measured for bf16: no ratio, and the goal is not met.
  c.bf16_wire_bytes = 0;
  c.bf16_seconds = 0;
  c.bf16_plan_bytes = 0;
  c.quantized_bf16_bytes = 0;
  EXPECT_EQ(WireRatio(c), 0);
  EXPECT_EQ(QuantizedWireRatio(c), 0);
  EXPECT_EQ(TimeRatio(c), 0);
  EXPECT_EQ(PlanRatio(c), 0);
  EXPECT_EQ(QuantizedPlanRatio(c), 0);
  c.plain_bytes = 0;
  EXPECT_EQ(WholeRatioFloor(c), 0);
  EXPECT_THAT(FormatQuantComparison(c), HasSubstr("ratio 0.0000 (goal <= 0.52: NOT met)"));
}

}  // namespace
}  // namespace wsync::bench
