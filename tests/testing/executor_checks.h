#ifndef WSYNC_TESTS_TESTING_EXECUTOR_CHECKS_H_
#define WSYNC_TESTS_TESTING_EXECUTOR_CHECKS_H_

// Checks shared by the executor's test suites (host and CUDA memory): every process as an
// endpoint, a process's buffer addresses in the test's host buffers, the run's stats against its
// schedule, and the targets against the reference copier. Header-only; include from gtest suites
// that link wsync::executor and wsync::testing.

#include <cstring>
#include <vector>

#include "executor/execute.h"
#include "executor/schedule.h"
#include "gtest/gtest.h"
#include "tests/testing/reference.h"

namespace wsync::test {

inline Endpoints AllProcesses(const Job& job) {
  Endpoints endpoints;
  for (int32_t p = 0; p < job.num_processes(); ++p) endpoints.processes.push_back(p);
  return endpoints;
}

// The addresses of process `p`'s buffers in `source` (trainers) or `target` (rollouts).
inline LocalBuffers BuffersOf(const Job& job, int32_t p, HostBuffers& source, HostBuffers& target) {
  const bool is_source = job.IsSource(p);
  const Layout& layout = is_source ? job.source() : job.target();
  HostBuffers& memory = is_source ? source : target;
  const int32_t rank = job.processes()[p].rank;
  LocalBuffers buffers;
  for (const BufferInfo& info : layout.buffers) {
    if (info.process == rank) buffers[info.id] = memory.data(BufferKey{rank, info.id});
  }
  return buffers;
}

inline void ExpectStatsMatchSchedule(const ProcessSchedule& schedule, const TransferStats& stats) {
  EXPECT_EQ(stats.segments, schedule.segments);
  EXPECT_EQ(stats.chunks, schedule.chunks);
  EXPECT_EQ(stats.rounds, schedule.rounds);
  EXPECT_EQ(stats.sent_bytes, schedule.sent_bytes);
  EXPECT_EQ(stats.received_bytes, schedule.received_bytes);
  EXPECT_EQ(stats.local_copy_bytes, schedule.local_copy_bytes);
  EXPECT_EQ(stats.direct_bytes, schedule.direct_bytes);
  EXPECT_EQ(stats.staged_bytes, schedule.staged_bytes);
  EXPECT_EQ(stats.forwarded_bytes, schedule.forwarded_bytes);
  EXPECT_EQ(stats.peak_arena_bytes, schedule.arena_bytes);
}

// The run wrote exactly what the reference copier writes for the same plan (version 3), and no
// guard byte changed.
inline void ExpectTargetsAsTheReferenceWrites(const Job& job, const std::vector<Segment>& segments,
                                              const HostBuffers& source,
                                              const HostBuffers& target) {
  HostBuffers expected(job.target(), kPoison);
  WriteCounts counts(job.target());
  ASSERT_TRUE(ExecutePlanReference(job, segments, source, &expected, &counts).ok());
  ASSERT_TRUE(CheckTargets(job.target(), expected, counts, 3).ok());
  ASSERT_TRUE(target.CheckGuards().ok());
  for (const BufferKey& key : expected.keys()) {
    ASSERT_EQ(0, std::memcmp(expected.data(key), target.data(key), expected.bytes(key)))
        << "rollout process " << key.process << " buffer " << key.buffer;
  }
}

}  // namespace wsync::test

#endif  // WSYNC_TESTS_TESTING_EXECUTOR_CHECKS_H_
