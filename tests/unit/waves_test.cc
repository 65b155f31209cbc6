// Streamed syncs (planner/waves.h, executor/waves.h): random jobs whose rollouts land wave 1 and
// wave 2 in one shared staging buffer, each process a thread over one loopback fabric. After each
// wave, on every rollout, the staging holds exactly that wave's logical values (so the wave landed
// whole and no byte of the next one had moved); the in-place parameter of wave 0 ends exact; the
// stats equal ScheduleWaves; a callback that fails, or a transfer that fails, ends every process
// in the wave after it without running the later waves. Validation and merging of waves too.

#include "executor/waves.h"

#include <atomic>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "integration/fill/fill.h"
#include "planner/layout_parts.h"
#include "planner/manifest_codec.h"
#include "planner/policy.h"
#include "planner/validate.h"
#include "tests/testing/executor_checks.h"
#include "transport/loopback/loopback.h"

namespace wsync::test {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kF32 = 4;

// Three fp32 parameters of one shape: "a" in wave 0 (in place), "b" in wave 1 and "c" in wave 2,
// whose pieces share one staging buffer on each rollout. Trainers split rows, rollouts columns.
struct WaveCase {
  Layout source;
  Layout target;
};

std::vector<int64_t> Cuts(int64_t extent, int parts, std::mt19937& rng) {
  std::vector<int64_t> cuts = {0};
  for (int i = 1; i < parts; ++i) {
    cuts.push_back(std::uniform_int_distribution<int64_t>(cuts.back(), extent)(rng));
  }
  cuts.push_back(extent);
  return cuts;
}

WaveCase MakeCase(std::mt19937& rng, int trainers, int rollouts) {
  const int64_t rows = std::uniform_int_distribution<int64_t>(1, 9)(rng);
  const int64_t cols = std::uniform_int_distribution<int64_t>(1, 9)(rng);
  const std::vector<std::string> names = {"a", "b", "c"};
  WaveCase c;
  c.source.role = Role::kTrainer;
  c.target.role = Role::kRollout;
  for (int w = 0; w < 3; ++w) {
    c.source.params.push_back(ParamInfo{names[w], DType::kFloat32, {rows, cols}, ParamQuant{}, 0});
    c.target.params.push_back(ParamInfo{names[w], DType::kFloat32, {rows, cols}, ParamQuant{}, w});
  }
  const std::vector<int64_t> row_cuts = Cuts(rows, trainers, rng);
  for (int t = 0; t < trainers; ++t) {
    c.source.processes.push_back(ProcessInfo{t, "node", kUnknownDevice});
    const int64_t height = row_cuts[t + 1] - row_cuts[t];
    c.source.buffers.push_back(BufferInfo{t, 0, 3 * height * cols * kF32, MemoryKind::kHost});
    for (int w = 0; w < 3; ++w) {
      c.source.pieces.push_back(
          Piece{w, t, 0, Box{{row_cuts[t], 0}, {height, cols}}, w * height * cols, {cols, 1}});
    }
  }
  const std::vector<int64_t> col_cuts = Cuts(cols, rollouts, rng);
  for (int r = 0; r < rollouts; ++r) {
    c.target.processes.push_back(ProcessInfo{r, "node", kUnknownDevice});
    const int64_t width = col_cuts[r + 1] - col_cuts[r];
    const Box box{{0, col_cuts[r]}, {rows, width}};
    // Buffer 0: "a" in place; buffer 1: the staging of "b" and "c", both at offset 0.
    c.target.buffers.push_back(BufferInfo{r, 0, rows * width * kF32, MemoryKind::kHost});
    c.target.buffers.push_back(BufferInfo{r, 1, rows * width * kF32, MemoryKind::kHost});
    c.target.pieces.push_back(Piece{0, r, 0, box, 0, {width, 1}});
    c.target.pieces.push_back(Piece{1, r, 1, box, 0, {width, 1}});
    c.target.pieces.push_back(Piece{2, r, 1, box, 0, {width, 1}});
  }
  return c;
}

// `layout` with only the pieces of parameter `param` held by rank `rank`.
Layout PiecesOf(const Layout& layout, int32_t param, int32_t rank) {
  Layout only = layout;
  only.pieces.clear();
  for (const Piece& piece : layout.pieces) {
    if (piece.param == param && piece.process == rank) only.pieces.push_back(piece);
  }
  return only;
}

struct WaveRun {
  std::vector<absl::StatusOr<TransferStats>> results;
  // Per process: the waves its callback saw, and what the staging held then.
  std::vector<std::vector<int32_t>> waves_seen;
  std::vector<std::vector<absl::Status>> staging_checks;
  std::vector<ProcessSchedule> schedules;
};

// Runs every process of `job` over one loopback fabric. `fail_after(p, wave)` is the callback's
// answer on process p (OK by default); `kill_after_wave`: the fabric kills that process right
// after its callback of wave 1.
WaveRun RunWaves(const Job& job, const Plan& plan, HostBuffers& source, HostBuffers& target,
                 const std::function<absl::Status(int32_t, int32_t)>& fail_after = {},
                 int32_t kill_after_wave = -1) {
  const std::vector<Wave> waves = SplitIntoWaves(job, plan.segments);
  const StagingBudget budget{256};
  LoopbackFabric fabric(job.num_processes());
  WaveRun run;
  run.results.resize(job.num_processes(), absl::UnknownError("not run"));
  run.waves_seen.resize(job.num_processes());
  run.staging_checks.resize(job.num_processes());
  const Endpoints endpoints = AllProcesses(job);
  for (int32_t p = 0; p < job.num_processes(); ++p) {
    absl::StatusOr<ProcessSchedule> schedule =
        ScheduleWaves(job, waves, plan.quant, endpoints, budget, p);
    EXPECT_TRUE(schedule.ok()) << schedule.status();
    run.schedules.push_back(schedule.ok() ? *schedule : ProcessSchedule{});
  }
  std::vector<std::thread> threads;
  for (int32_t p = 0; p < job.num_processes(); ++p) {
    threads.emplace_back([&, p] {
      auto transport = fabric.Connect(p);
      auto group = fabric.MakeGroup(p);
      ASSERT_TRUE(transport.ok() && group.ok());
      const LocalBuffers buffers = BuffersOf(job, p, source, target);
      const ExecuteOptions options = SyncOptionsOf(plan, 5, VerifyMode::kHash, absl::Seconds(20));
      const auto after_wave = [&, p](int32_t wave) -> absl::Status {
        run.waves_seen[p].push_back(wave);
        if (!job.IsSource(p) && wave > 0) {
          const int32_t rank = job.processes()[p].rank;
          run.staging_checks[p].push_back(
              CheckLogical(PiecesOf(job.target(), wave, rank), target, /*version=*/3));
        }
        if (p == kill_after_wave && wave == 1) fabric.Kill(p);
        return fail_after ? fail_after(p, wave) : absl::OkStatus();
      };
      run.results[p] = ExecuteWaves(job, waves, plan.quant, endpoints, budget, p, buffers,
                                    **transport, **group, options, after_wave);
    });
  }
  for (std::thread& thread : threads) thread.join();
  return run;
}

struct Prepared {
  Job job;
  Plan plan;
};

Prepared Prepare(const WaveCase& c) {
  absl::StatusOr<Job> job = Job::Create(c.source, c.target);
  EXPECT_TRUE(job.ok()) << job.status();
  auto policy = MakeFirstHolderPolicy();
  absl::StatusOr<Plan> plan = MakePlan(*job, *policy, PlanOptions{});
  EXPECT_TRUE(plan.ok()) << plan.status();
  return Prepared{*std::move(job), *std::move(plan)};
}

TEST(WavesTest, EveryWaveLandsWholeBeforeTheNextMovesAndTheStatsAreTheSchedule) {
  std::mt19937 rng(20261203);
  for (int trial = 0; trial < 12; ++trial) {
    const int trainers = 1 + trial % 3;
    const int rollouts = 1 + (trial / 3) % 3;
    const WaveCase c = MakeCase(rng, trainers, rollouts);
    Prepared prepared = Prepare(c);
    HostBuffers source(c.source, kSourceFill);
    HostBuffers target(c.target, kPoison);
    ASSERT_TRUE(FillLogical(c.source, 3, &source).ok());
    const WaveRun run = RunWaves(prepared.job, prepared.plan, source, target);
    for (int32_t p = 0; p < prepared.job.num_processes(); ++p) {
      SCOPED_TRACE(absl::StrCat("trial ", trial, ", process ", p));
      ASSERT_TRUE(run.results[p].ok()) << run.results[p].status();
      EXPECT_THAT(run.waves_seen[p], ::testing::ElementsAre(0, 1, 2));
      ExpectStatsMatchSchedule(run.schedules[p], *run.results[p]);
      for (const absl::Status& check : run.staging_checks[p]) EXPECT_TRUE(check.ok()) << check;
      if (!prepared.job.IsSource(p)) {
        EXPECT_EQ(run.staging_checks[p].size(), 2u);
      }
    }
    // Wave 0 in place, and the staging holds wave 2 (the last to land there).
    for (int32_t r = 0; r < rollouts; ++r) {
      EXPECT_TRUE(CheckLogical(PiecesOf(c.target, 0, r), target, 3).ok());
      EXPECT_TRUE(CheckLogical(PiecesOf(c.target, 2, r), target, 3).ok());
    }
  }
}

// A job of 2 trainers and 2 rollouts (random case `seed`) with its source filled at version 3,
// run with `fail_after` and `kill_after_wave` as RunWaves takes them; `seconds`: how long it took.
struct FaultyRun {
  Prepared prepared;
  WaveRun run;
  double seconds = 0;
};

FaultyRun RunFaulty(uint32_t seed, const std::function<absl::Status(int32_t, int32_t)>& fail_after,
                    const std::function<int32_t(const Job&)>& kill_after_wave) {
  std::mt19937 rng(seed);
  const WaveCase c = MakeCase(rng, 2, 2);
  FaultyRun out{Prepare(c), WaveRun{}};
  HostBuffers source(c.source, kSourceFill);
  HostBuffers target(c.target, kPoison);
  EXPECT_TRUE(FillLogical(c.source, 3, &source).ok());
  const int32_t killed = kill_after_wave ? kill_after_wave(out.prepared.job) : -1;
  const absl::Time start = absl::Now();
  out.run = RunWaves(out.prepared.job, out.prepared.plan, source, target, fail_after, killed);
  out.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  return out;
}

TEST(WavesTest, AFailingCallbackEndsEveryProcessInTheNextWave) {
  int32_t failing = -1;
  const FaultyRun faulty = RunFaulty(
      7,
      [&](int32_t p, int32_t wave) {
        return p == failing && wave == 1 ? absl::InternalError("load_weights raised")
                                         : absl::OkStatus();
      },
      [&](const Job& job) {
        failing = job.TargetId(1);
        return -1;
      });
  const Prepared& prepared = faulty.prepared;
  const WaveRun& run = faulty.run;
  EXPECT_LT(faulty.seconds, 10);  // Well before the 20 s deadline.
  for (int32_t p = 0; p < prepared.job.num_processes(); ++p) {
    SCOPED_TRACE(absl::StrCat("process ", p));
    ASSERT_FALSE(run.results[p].ok());
    EXPECT_THAT(run.waves_seen[p], ::testing::ElementsAre(0, 1));  // Wave 2 never ran.
    EXPECT_THAT(run.results[p].status().message(),
                HasSubstr("the host's callback after wave 1 failed: load_weights raised"));
  }
  EXPECT_TRUE(absl::IsInvalidArgument(run.results[failing].status()));
}

TEST(WavesTest, ALostProcessFailsEveryProcessWithoutTheLaterWaves) {
  const FaultyRun faulty = RunFaulty(11, {}, [](const Job& job) { return job.SourceId(0); });
  const Prepared& prepared = faulty.prepared;
  const WaveRun& run = faulty.run;
  EXPECT_LT(faulty.seconds, 10);
  for (int32_t p = 0; p < prepared.job.num_processes(); ++p) {
    SCOPED_TRACE(absl::StrCat("process ", p));
    EXPECT_FALSE(run.results[p].ok());
    EXPECT_THAT(run.waves_seen[p], ::testing::Not(::testing::Contains(2)));
  }
}

TEST(WavesTest, AJobWithoutWavesIsOneWaveOfEverySegment) {
  std::mt19937 rng(3);
  WaveCase c = MakeCase(rng, 2, 2);
  for (ParamInfo& param : c.target.params) param.wave = 0;
  for (BufferInfo& buffer : c.target.buffers) buffer.bytes *= 2;  // b and c apart.
  for (Piece& piece : c.target.pieces) {
    if (piece.param == 2) piece.offset = Volume(piece.box);
  }
  Prepared prepared = Prepare(c);
  const std::vector<Wave> waves = SplitIntoWaves(prepared.job, prepared.plan.segments);
  ASSERT_EQ(waves.size(), 1u);
  EXPECT_EQ(waves[0].wave, 0);
  EXPECT_EQ(waves[0].segments, prepared.plan.segments);
}

TEST(WavesValidationTest, PiecesShareMemoryOnlyAcrossWaves) {
  std::mt19937 rng(5);
  const WaveCase c = MakeCase(rng, 1, 2);
  EXPECT_TRUE(ValidateLayout(c.target).ok());
  Layout same_wave = c.target;
  same_wave.params[2].wave = 1;  // b and c in one wave, in one staging.
  absl::Status status = ValidateLayout(same_wave);
  EXPECT_TRUE(absl::IsInvalidArgument(status));
  EXPECT_THAT(status.message(), HasSubstr("overlaps"));
}

TEST(WavesValidationTest, WavesOutOfRangeOnTrainersOrOnQuantizedParametersAreRefused) {
  std::mt19937 rng(9);
  const WaveCase c = MakeCase(rng, 1, 1);
  Layout out_of_range = c.target;
  out_of_range.params[1].wave = kMaxWaves;
  EXPECT_THAT(ValidateLayout(out_of_range).message(), HasSubstr("outside [0, 4096)"));
  Layout negative = c.target;
  negative.params[1].wave = -1;
  EXPECT_THAT(ValidateLayout(negative).message(), HasSubstr("is in wave -1"));
  Layout trainer = c.source;
  trainer.params[0].wave = 2;
  EXPECT_THAT(ValidateLayout(trainer).message(), HasSubstr("waves are the rollouts' alone"));
  Layout quantized = c.target;
  quantized.params[1].quant = ParamQuant{128, 128, "b_scale"};
  EXPECT_THAT(ValidateLayout(quantized).message(),
              HasSubstr("quantized parameters stay in wave 0"));
}

TEST(WavesValidationTest, RollingOutWavesSurviveTheManifestAndDisagreementIsRefused) {
  std::mt19937 rng(13);
  const WaveCase c = MakeCase(rng, 1, 2);
  absl::StatusOr<Layout> decoded = FromManifest(ToManifest(c.target), ManifestLimits{});
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  for (size_t i = 0; i < c.target.params.size(); ++i) {
    EXPECT_EQ(decoded->params[i].wave, c.target.params[i].wave);
  }
  // Two rollout parts that put "c" in different waves cannot be merged.
  std::vector<Layout> parts;
  for (int32_t r = 0; r < 2; ++r) {
    Layout part = c.target;
    part.processes = {c.target.processes[r]};
    part.buffers.clear();
    part.pieces.clear();
    for (const BufferInfo& buffer : c.target.buffers) {
      if (buffer.process == r) part.buffers.push_back(buffer);
    }
    for (const Piece& piece : c.target.pieces) {
      if (piece.process == r) part.pieces.push_back(piece);
    }
    parts.push_back(part);
  }
  EXPECT_TRUE(MergeLayoutParts(parts).ok());
  parts[1].params[2].wave = 7;
  absl::StatusOr<Layout> merged = MergeLayoutParts(parts);
  ASSERT_FALSE(merged.ok());
  EXPECT_THAT(merged.status().message(),
              HasSubstr("parameter 'c' is in wave 2 in the part of rollout rank 0 but in wave 7 in "
                        "the part of rank 1"));
}

TEST(WavesValidationTest, TheLayoutsDigestCoversTheWaves) {
  std::mt19937 rng(17);
  const WaveCase c = MakeCase(rng, 1, 1);
  Prepared with_waves = Prepare(c);
  WaveCase moved = c;
  moved.target.params[2].wave = 5;
  Prepared other = Prepare(moved);
  EXPECT_NE(with_waves.plan.digest, other.plan.digest);
}

}  // namespace
}  // namespace wsync::test
