// The trace facility (common/log.h): parsing of WSYNC_LOG and WSYNC_LOG_LEVEL, the filter by
// category and level over every combination, the environment's precedence over a host's
// settings, silence by default, the default sink's line, serialized sink calls under many
// threads, re-entrant calls, and Fatal delivering whatever the filter.

#include "common/log.h"

#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace wsync::log {
namespace {

using ::testing::HasSubstr;
using ::testing::MatchesRegex;

// Every test starts from the state before any use, with neither variable set.
class LogTest : public ::testing::Test {
 protected:
  struct Line {  // What a sink received.
    Level level;
    Category category;
    std::string message;
  };

  void SetUp() override { SetEnvironment(nullptr, nullptr); }
  void TearDown() override {
    SetEnvironment(nullptr, nullptr);
    ASSERT_TRUE(Configure(nullptr, std::nullopt, std::nullopt).ok());
  }

  static void SetEnvironment(const char* log, const char* level) {
    log != nullptr ? setenv("WSYNC_LOG", log, 1) : unsetenv("WSYNC_LOG");
    level != nullptr ? setenv("WSYNC_LOG_LEVEL", level, 1) : unsetenv("WSYNC_LOG_LEVEL");
    ResetForTesting();
  }

  // Installs a sink that keeps the lines in lines_.
  void Collect(std::optional<uint32_t> categories, std::optional<Level> level) {
    ASSERT_TRUE(Configure(
                    [this](Level l, Category c, absl::string_view m) {
                      lines_.push_back({l, c, std::string(m)});
                    },
                    categories, level)
                    .ok());
  }

  // Emits one line of every (category, level); returns which were delivered, as a mask of
  // category * 4 + level - 1.
  uint64_t EmitAll() {
    lines_.clear();
    for (int c = 0; c < kCategoryCount; ++c) {
      for (int l = 1; l <= 4; ++l) {
        Emit(static_cast<Category>(c), static_cast<Level>(l), absl::StrCat(c, "/", l));
      }
    }
    uint64_t delivered = 0;
    for (const Line& line : lines_) {
      EXPECT_EQ(line.message,
                absl::StrCat(static_cast<int>(line.category), "/", static_cast<int>(line.level)));
      delivered |=
          uint64_t{1} << (static_cast<int>(line.category) * 4 + static_cast<int>(line.level) - 1);
    }
    return delivered;
  }

  static uint64_t Expected(uint32_t categories, Level level) {
    uint64_t expected = 0;
    for (int c = 0; c < kCategoryCount; ++c) {
      if ((categories >> c & 1) == 0) continue;
      for (int l = 1; l <= static_cast<int>(level); ++l) expected |= uint64_t{1} << (c * 4 + l - 1);
    }
    return expected;
  }

  std::vector<Line> lines_;
};

TEST_F(LogTest, EverySubsetOfNamesParsesToItsMask) {
  std::mt19937 random(43);
  for (uint32_t mask = 0; mask <= kAllCategories; ++mask) {
    std::vector<std::string> names;
    for (int c = 0; c < kCategoryCount; ++c) {
      if (mask >> c & 1) names.emplace_back(CategoryName(static_cast<Category>(c)));
    }
    std::shuffle(names.begin(), names.end(), random);
    // Case, blanks and empty entries do not matter.
    if (!names.empty() && mask % 3 == 0) names[0] = absl::AsciiStrToUpper(names[0]);
    if (mask % 5 == 0) names.push_back("");
    const std::string spec = absl::StrJoin(names, mask % 2 == 0 ? "," : " , ");
    absl::StatusOr<uint32_t> parsed = ParseCategories(spec);
    ASSERT_TRUE(parsed.ok()) << spec << ": " << parsed.status();
    EXPECT_EQ(*parsed, mask) << spec;
  }
  EXPECT_EQ(*ParseCategories("all"), kAllCategories);
  EXPECT_EQ(*ParseCategories("round,ALL"), kAllCategories);
}

TEST_F(LogTest, UnknownCategoriesAndLevelsAreRefusedByName) {
  absl::StatusOr<uint32_t> bad = ParseCategories("round,plann,conect");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("'plann', 'conect'"));
  EXPECT_THAT(bad.status().message(), HasSubstr("known: connect,plan,round"));
  for (const char* level : {"error", "WARN", " info ", "Debug"}) {
    EXPECT_TRUE(ParseLevel(level).ok()) << level;
  }
  EXPECT_EQ(*ParseLevel("warn"), Level::kWarn);
  for (const char* level : {"", "verbose", "3", "info,debug"}) {
    EXPECT_FALSE(ParseLevel(level).ok()) << level;
  }
}

TEST_F(LogTest, TheEnvironmentKeepsKnownEntriesAndWarnsOfTheRest) {
  EnvironmentFilter unset = ReadEnvironment(nullptr, nullptr);
  EXPECT_FALSE(unset.categories.has_value());
  EXPECT_FALSE(unset.level.has_value());
  EXPECT_TRUE(unset.warnings.empty());
  EnvironmentFilter mixed = ReadEnvironment("round,bogus,fault", "loud");
  EXPECT_EQ(mixed.categories, (1u << 2) | (1u << 4));
  EXPECT_FALSE(mixed.level.has_value());
  ASSERT_EQ(mixed.warnings.size(), 2u);
  EXPECT_THAT(mixed.warnings[0], HasSubstr("WSYNC_LOG: unknown log category 'bogus'"));
  EXPECT_THAT(mixed.warnings[1], HasSubstr("WSYNC_LOG_LEVEL: unknown log level 'loud'"));
  EnvironmentFilter empty = ReadEnvironment("", "debug");
  EXPECT_EQ(empty.categories, 0u);  // Set but empty: nothing, which overrides a host's list.
  EXPECT_EQ(empty.level, Level::kDebug);
}

TEST_F(LogTest, TheFilterDeliversExactlyItsCategoriesAtOrAboveItsLevel) {
  for (uint32_t categories = 0; categories <= kAllCategories; categories += 7) {
    for (int l = 1; l <= 4; ++l) {
      const Level level = static_cast<Level>(l);
      Collect(categories, level);
      EXPECT_EQ(EmitAll(), Expected(categories, level)) << categories << " " << l;
    }
  }
  Collect(kAllCategories, std::nullopt);  // The default level: info.
  EXPECT_EQ(EmitAll(), Expected(kAllCategories, Level::kInfo));
}

TEST_F(LogTest, SilentUnlessAskedAndArgumentsAreNotEvaluated) {
  Collect(std::nullopt, std::nullopt);
  EXPECT_EQ(EmitAll(), 0u);
  int evaluated = 0;
  auto argument = [&evaluated] { return ++evaluated; };
  WSYNC_LOG(kRound, kInfo, "round ", argument());
  EXPECT_EQ(evaluated, 0);
  Collect(1u << static_cast<int>(Category::kRound), Level::kInfo);
  WSYNC_LOG(kRound, kInfo, "round ", argument());
  WSYNC_LOG(kRound, kDebug, "round ", argument());
  WSYNC_LOG(kPlan, kError, "plan ", argument());
  EXPECT_EQ(evaluated, 1);
  ASSERT_EQ(lines_.size(), 1u);
  EXPECT_EQ(lines_[0].message, "round 1");
}

TEST_F(LogTest, TheEnvironmentWinsOverTheHost) {
  SetEnvironment("round", "error");
  Collect(kAllCategories, Level::kDebug);
  EXPECT_EQ(EmitAll(), Expected(1u << static_cast<int>(Category::kRound), Level::kError));
  SetEnvironment(nullptr, "debug");  // Only the level: the host's categories stand.
  Collect(1u << static_cast<int>(Category::kPlan), Level::kError);
  EXPECT_EQ(EmitAll(), Expected(1u << static_cast<int>(Category::kPlan), Level::kDebug));
}

TEST_F(LogTest, RefusedEnvironmentValuesAreReportedWhateverTheFilter) {
  SetEnvironment("plan,nonsense", nullptr);
  Collect(std::nullopt, std::nullopt);
  ASSERT_EQ(lines_.size(), 1u);
  EXPECT_EQ(lines_[0].level, Level::kWarn);
  EXPECT_EQ(lines_[0].category, Category::kConfig);
  EXPECT_THAT(lines_[0].message, HasSubstr("'nonsense'"));
  EXPECT_EQ(EmitAll(), Expected(1u << static_cast<int>(Category::kPlan), Level::kInfo));
}

TEST_F(LogTest, TheDefaultSinkWritesOneLineToStandardErrorOnlyWhenEnabled) {
  ASSERT_TRUE(Configure(nullptr, std::nullopt, std::nullopt).ok());
  ::testing::internal::CaptureStderr();
  WSYNC_LOG(kFault, kError, "not asked for");
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
  SetEnvironment("sync", nullptr);
  ::testing::internal::CaptureStderr();
  WSYNC_LOG(kSync, kInfo, "version ", 7, " committed");
  WSYNC_LOG(kSync, kDebug, "too verbose");
  EXPECT_THAT(::testing::internal::GetCapturedStderr(),
              MatchesRegex("\\[wsync [0-9]{2}:[0-9]{2}:[0-9]{2}\\.[0-9]{6} [0-9]+ info sync\\] "
                           "version 7 committed\n"));
}

TEST_F(LogTest, SinkCallsAreSerializedAcrossThreads) {
  std::atomic<int> inside{0};
  std::atomic<bool> overlapped{false};
  std::vector<int> per_thread(8, 0);  // Written only inside the sink: safe only if serialized.
  ASSERT_TRUE(Configure(
                  [&](Level, Category, absl::string_view message) {
                    if (inside.fetch_add(1) != 0) overlapped = true;
                    ++per_thread[message[0] - '0'];
                    inside.fetch_sub(1);
                  },
                  kAllCategories, Level::kDebug)
                  .ok());
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([t] {
      for (int i = 0; i < 2000; ++i) WSYNC_LOG(kRound, kDebug, t, " line ", i);
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_FALSE(overlapped);
  EXPECT_THAT(per_thread, ::testing::Each(2000));
}

TEST_F(LogTest, ASinkThatCallsBackIsNotDeadlocked) {
  absl::Status reconfigured;
  ASSERT_TRUE(Configure(
                  [&](Level, Category, absl::string_view message) {
                    lines_.push_back({Level::kInfo, Category::kFault, std::string(message)});
                    WSYNC_LOG(kFault, kError, "from inside");  // Dropped.
                    reconfigured = Configure(nullptr, std::nullopt, std::nullopt);
                  },
                  kAllCategories, Level::kInfo)
                  .ok());
  WSYNC_LOG(kControl, kInfo, "outside");
  ASSERT_EQ(lines_.size(), 1u);
  EXPECT_EQ(lines_[0].message, "outside");
  EXPECT_TRUE(absl::IsFailedPrecondition(reconfigured)) << reconfigured;
}

TEST_F(LogTest, CountsAndBytesReadAsWords) {
  EXPECT_EQ(Count(1, "round"), "1 round");
  EXPECT_EQ(Count(0, "round"), "0 rounds");
  EXPECT_EQ(Count(12, "process"), "12 processes");
  EXPECT_EQ(Count(2, "batch"), "2 batches");
  EXPECT_EQ(Count(1, "process"), "1 process");
  EXPECT_EQ(Bytes(0), "0 B");
  EXPECT_EQ(Bytes(1023), "1023 B");
  EXPECT_EQ(Bytes(1024), "1.0 KiB");
  EXPECT_EQ(Bytes(1536), "1.5 KiB");
  EXPECT_EQ(Bytes(int64_t{942} * 1024 * 1024 + 300 * 1024), "942.3 MiB");
  EXPECT_EQ(Bytes(int64_t{5} << 40), "5.0 TiB");
  EXPECT_EQ(Bytes(int64_t{3} << 50), "3072.0 TiB");
}

TEST_F(LogTest, FatalIsDeliveredWhateverTheFilterAndAborts) {
  EXPECT_DEATH(Fatal(Category::kFault, "the invariant broke: 42"),
               "error fault\\] the invariant broke: 42");
}

}  // namespace
}  // namespace wsync::log
