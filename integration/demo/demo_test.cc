// `wsync demo` end to end on small jobs: it reports a corrupted version as FAILED and exits 1,
// derives process counts from the layouts, and refuses bad options. (The default job, `wsync demo
// --steps 2`, is the ctest entry demo_test.)

#include <stdio.h>
#include <sys/wait.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace {

using ::testing::HasSubstr;
using ::testing::Not;

struct Outcome {
  int exit_code = -1;
  std::string output;  // Standard output and standard error.
};

Outcome RunDemo(const std::string& flags) {
  Outcome outcome;
  FILE* pipe = popen(absl::StrCat(WSYNC_CLI, " demo ", flags, " 2>&1").c_str(), "r");
  if (pipe == nullptr) return outcome;
  char buffer[4096];
  size_t n = 0;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) outcome.output.append(buffer, n);
  const int status = pclose(pipe);
  outcome.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return outcome;
}

TEST(DemoTest, CorruptedVersionIsReportedAndFailsTheDemo) {
  const Outcome outcome = RunDemo("--model qwen2.5-tiny --steps 2 --demo_corrupt_step 1");
  EXPECT_EQ(outcome.exit_code, 1) << outcome.output;
  EXPECT_THAT(outcome.output, HasSubstr("does not hold its value of version 1"));
  EXPECT_THAT(outcome.output, HasSubstr("FAILED ("));
  // The next version is written whole again and must verify.
  EXPECT_THAT(outcome.output, HasSubstr("ok (2/2 rollouts)"));
  EXPECT_THAT(outcome.output, HasSubstr("FAILED: not every step verified"));
}

TEST(DemoTest, ProcessCountsComeFromTheLayouts) {
  const Outcome outcome =
      RunDemo("--model qwen2.5-tiny --from 'fsdp(3)' --to 'vllm(tp=2,dp=2)' --steps 2");
  EXPECT_EQ(outcome.exit_code, 0) << outcome.output;
  EXPECT_THAT(outcome.output, HasSubstr("3 trainers fsdp(3) -> 4 rollouts vllm(tp=2,dp=2)"));
  EXPECT_THAT(outcome.output, HasSubstr("every byte of all 2 steps verified on all 4 rollouts"));
  EXPECT_THAT(outcome.output, Not(HasSubstr("FAILED")));
}

TEST(DemoTest, RefusesCountsTheLayoutsDoNotHave) {
  const Outcome outcome = RunDemo("--model qwen2.5-tiny --trainers 3");
  EXPECT_EQ(outcome.exit_code, 2) << outcome.output;
  EXPECT_THAT(outcome.output, HasSubstr("--trainers and --rollouts must match them"));
}

TEST(DemoTest, ReportsAMissingLibrary) {
  const Outcome outcome = RunDemo("--model qwen2.5-tiny --library /nonexistent/libwsync.so");
  EXPECT_EQ(outcome.exit_code, 1) << outcome.output;
  EXPECT_THAT(outcome.output, HasSubstr("build target wsync_plugin"));
}

}  // namespace
