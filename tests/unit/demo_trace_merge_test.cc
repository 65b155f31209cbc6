// MergeTraceLines (integration/cli/demo_report.h), which `WSYNC_LOG=... wsync demo` shows the
// processes' trace with: over random texts of several processes, each a time-ordered trace with
// other lines mixed in, the merged lines are every line once, the trace lines in time order,
// each process's lines in their own order, and every other line right after its own process's
// line before it (unless another process's line with the same stamp comes between: equal
// stamps keep the processes' order).

#include <algorithm>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "integration/cli/demo_report.h"

namespace wsync::cli {
namespace {

std::string Stamp(int64_t micros) {
  return absl::StrFormat("%02d:%02d:%02d.%06d", micros / 3600000000 % 24, micros / 60000000 % 60,
                         micros / 1000000 % 60, micros % 1000000);
}

TEST(MergeTraceLinesTest, TimeOrderAcrossProcessesOrderWithinEach) {
  std::mt19937 random(43);
  for (int trial = 0; trial < 300; ++trial) {
    const int processes = std::uniform_int_distribution<int>(1, 5)(random);
    std::vector<std::string> texts(processes);
    std::map<std::string, std::pair<int, int>> origin;  // line -> (process, index in it)
    for (int p = 0; p < processes; ++p) {
      int64_t micros = std::uniform_int_distribution<int64_t>(0, 5000)(random);
      const int lines = std::uniform_int_distribution<int>(0, 12)(random);
      for (int i = 0; i < lines; ++i) {
        std::string line;
        if (std::uniform_int_distribution<int>(0, 3)(random) == 0) {
          line = absl::StrCat("other line ", p, "/", i);
        } else {
          micros += std::uniform_int_distribution<int64_t>(0, 3000)(random);
          line = absl::StrCat("[wsync ", Stamp(micros), " 42 info round] process ", p, " line ", i);
        }
        origin[line] = {p, i};
        absl::StrAppend(&texts[p], line, "\n");
      }
    }
    const std::vector<std::string> merged = MergeTraceLines(texts);
    ASSERT_EQ(merged.size(), origin.size());
    std::vector<int> next(processes, 0);
    std::string last_stamp;
    for (const std::string& line : merged) {
      ASSERT_TRUE(origin.count(line)) << line;
      const auto [p, i] = origin[line];
      EXPECT_EQ(i, next[p]++) << "process " << p << " out of order: " << line;
      if (line.rfind("[wsync ", 0) == 0) {
        const std::string stamp = line.substr(7, 15);
        EXPECT_LE(last_stamp, stamp) << line;
        last_stamp = stamp;
      }
    }
  }
}

}  // namespace
}  // namespace wsync::cli
