// `wsync calibrate --processes 4` over UCX between real processes of this machine (two "nodes":
// shared memory within a node, TCP over loopback between them): the written calibration has every
// pattern with the expected sample counts, labels and repeats (each process's quantize rate
// included), and `--show` reads it back.

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "cost/link_model.h"
#include "gtest/gtest.h"
#include "tests/testing/probe_samples.h"

namespace wsync {
namespace {

std::string NodeOf(int32_t p) { return p < 2 ? "a" : "b"; }
std::string PathOf(int32_t from, int32_t to) {
  if (from == to) return "local";
  return NodeOf(from) == NodeOf(to) ? "intra_node" : "inter_node";
}

TEST(CalibrationMultiprocTest, EveryPatternOverUcx) {
  const std::string path = absl::StrCat(::testing::TempDir(), "/calibration-", getpid(), ".pb");
  const std::string command = absl::StrCat(
      WSYNC_CLI, " calibrate --processes 4 --nodes a,a,b,b",
      " --path_transports 'local=ucx:sm,cma,self;intra_node=ucx:sm,cma,self;",
      "inter_node=ucx:tcp@lo' --probe_sizes 4K,4M --probe_repeats 3 --probe_memory 33554432",
      " --fan_widths 1,2 --out ", path, " > ", path, ".txt 2>&1");
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
  std::ifstream file(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  const absl::StatusOr<proto::Calibration> calibration = ParseCalibration(bytes);
  ASSERT_TRUE(calibration.ok()) << calibration.status();
  EXPECT_EQ(calibration->processes(), 4);
  EXPECT_TRUE(absl::StartsWith(calibration->transport(), "routed(ucx,ucx"))
      << calibration->transport();
  EXPECT_EQ(calibration->settings().at("nodes"), "a,a,b,b");

  const int64_t n = 4, sizes = 2, widths = 2;
  std::map<std::string, int64_t> count;
  for (const proto::CalibrationSample& s : calibration->samples()) {
    ++count[s.pattern()];
    EXPECT_EQ(s.seconds_size(), 3);
    for (const double seconds : s.seconds()) EXPECT_GT(seconds, 0);
    if (s.pattern() == "quantize") {
      // Every process alone quantizes the CLI's bf16 matrix: 128 x 4096 under a 32 MiB budget.
      EXPECT_EQ(s.from(), s.to());
      EXPECT_EQ(s.path(), "local");
      EXPECT_EQ(s.from_node(), NodeOf(s.from()));
      EXPECT_EQ(s.bytes(), int64_t{1} << 20);
    } else if (s.pattern() == "local" || s.pattern() == "peer" || s.pattern() == "both_ways") {
      EXPECT_EQ(s.path(), PathOf(s.from(), s.to())) << s.pattern();
    } else if (s.pattern() == "fan_out" || s.pattern() == "fan_in") {
      // Width 1: the other process of the node; width 2: it, then the nearest other process.
      EXPECT_EQ(s.path(), s.peers_size() == 1 ? "intra_node" : "inter_node+intra_node");
    } else if (s.pattern() == "relay") {
      EXPECT_EQ(s.path(), PathOf((s.from() + 3) % 4, s.from()));
      EXPECT_EQ(s.send_path(), PathOf(s.from(), (s.from() + 1) % 4));
    } else if (s.pattern() == "node_link" && s.from_node() == s.to_node()) {
      // Inside a node, its first half sends to its second half: 0 -> 1 on a, 2 -> 3 on b.
      EXPECT_EQ(std::vector<int32_t>(s.peers().begin(), s.peers().end()),
                std::vector<int32_t>({s.from_node() == "a" ? 0 : 2}));
      EXPECT_EQ(s.path(), "intra_node");
    } else if (s.pattern() == "node_link") {
      // Both processes of one node send to the other node's at once: 0 -> 2 and 1 -> 3, or back.
      const bool forward = s.from_node() == "a";
      EXPECT_EQ(s.to_node(), forward ? "b" : "a");
      EXPECT_EQ(std::vector<int32_t>(s.peers().begin(), s.peers().end()),
                forward ? std::vector<int32_t>({0, 1}) : std::vector<int32_t>({2, 3}));
      EXPECT_EQ(s.path(), "inter_node");
    }
  }
  EXPECT_EQ(count,
            test::ExpectedProbeSamples(n, sizes, widths, /*node_pairs=*/2, /*nodes_inside=*/2,
                                       /*quantize=*/true, /*delta=*/true));
  EXPECT_EQ(std::vector<std::string>(calibration->nodes().begin(), calibration->nodes().end()),
            std::vector<std::string>({"a", "a", "b", "b"}));

  // --show reads it back: the inter-node path's fit, the quantize rate, and the node link's fit
  // or, where the machine's load made its two sizes' medians disagree, why it was left out.
  const std::string shown_path = path + ".show";
  const std::string show =
      absl::StrCat(WSYNC_CLI, " calibrate --show ", path, " > ", shown_path, " 2>&1");
  EXPECT_EQ(std::system(show.c_str()), 0) << show;
  std::ifstream shown_file(shown_path);
  const std::string shown((std::istreambuf_iterator<char>(shown_file)),
                          std::istreambuf_iterator<char>());
  EXPECT_TRUE(absl::StrContains(shown, "path inter_node")) << shown;
  EXPECT_TRUE(absl::StrContains(shown, "quantize rate (the slowest")) << shown;
  EXPECT_TRUE(absl::StrContains(shown, "node link a -> b") ||
              absl::StrContains(shown, "left out: node link fit"))
      << shown;
  for (const std::string& file : {path, path + ".txt", shown_path}) std::remove(file.c_str());
}

}  // namespace
}  // namespace wsync
