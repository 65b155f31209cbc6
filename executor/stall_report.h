#ifndef WSYNC_EXECUTOR_STALL_REPORT_H_
#define WSYNC_EXECUTOR_STALL_REPORT_H_

// What a run still waited for when it stopped: per lane (one peer and direction) the messages not
// completed, their bytes and rounds, for the error of a transfer that missed its deadline.

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "executor/work.h"

namespace wsync::executor_internal {

// Lanes named in one report; the rest are counted.
inline constexpr int kMaxReportedLanes = 16;

// "outstanding with 2 peers: receive from process 3: 6 of 10 messages (3145728 bytes, rounds
// 4-9); send to process 3: 1 of 10 messages (524288 bytes, round 9)", or "nothing outstanding".
// `completed[lane]` is the number of that lane's messages completed (the next one to complete).
// Pure; any thread.
std::string DescribeOutstanding(const Work& work, absl::Span<const int32_t> completed);

// `status` with "; " and DescribeOutstanding appended when it is DeadlineExceeded; any other
// status unchanged.
absl::Status WithOutstanding(const absl::Status& status, const Work& work,
                             absl::Span<const int32_t> completed);

}  // namespace wsync::executor_internal

#endif  // WSYNC_EXECUTOR_STALL_REPORT_H_
