#ifndef WSYNC_TESTS_TESTING_FAN_OUT_JOB_H_
#define WSYNC_TESTS_TESTING_FAN_OUT_JOB_H_

// A job whose one trainer sends to many rollouts: the trainer (process 0) holds a float32 tensor
// "w" of `shape` whole in one buffer; each of `rollouts` rollouts holds its part of it, split
// evenly along `axis` (SplitBox), packed in its own buffer. Split along axis 0 every message is
// contiguous on both sides; along axis 1 (column blocks of one row shard) the sender stages.
// Header-only; for tests and benchmarks of the executor's many-lane runs.

#include <cstdint>
#include <utility>

#include "absl/status/statusor.h"
#include "planner/builders.h"
#include "planner/geometry.h"
#include "planner/job.h"

namespace wsync::test {

inline absl::StatusOr<Job> FanOutJob(const Dims& shape, int axis, int32_t rollouts) {
  LayoutBuilder source(Role::kTrainer);
  const int32_t w = source.AddParam("w", DType::kFloat32, shape);
  source.AddProcess("n0");
  source.AddPackedPiece(w, 0, source.AddBuffer(0, Volume(WholeBox(shape)) * 4), WholeBox(shape), 0);
  LayoutBuilder target(Role::kRollout);
  const int32_t part_of = target.AddParam("w", DType::kFloat32, shape);
  for (int32_t r = 0; r < rollouts; ++r) {
    target.AddProcess("n1");
    const Box part = SplitBox(shape, axis, rollouts, r);
    target.AddPackedPiece(part_of, r, target.AddBuffer(r, Volume(part) * 4), part, 0);
  }
  return Job::Create(std::move(source).Build(), std::move(target).Build());
}

}  // namespace wsync::test

#endif  // WSYNC_TESTS_TESTING_FAN_OUT_JOB_H_
