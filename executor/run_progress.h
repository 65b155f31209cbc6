#ifndef WSYNC_EXECUTOR_RUN_PROGRESS_H_
#define WSYNC_EXECUTOR_RUN_PROGRESS_H_

// Private to the executor (run.cc): publishes where one run stands into the caller's SyncProgress
// (ExecuteOptions::progress): the phase, the rounds of this process whose messages all completed
// and the bytes of its completed messages, each of its totals; and, with WSYNC_LOG's category
// round at info (common/log.h), one line per completed round of this process: its messages,
// bytes and the time since the run started. Constant amortized time per message (a count per
// round and a cursor that only moves forward) and relaxed stores only: no lock on the data path
// (a log line takes the log's lock). Not thread-safe: the run's thread only; readers read the
// SyncProgress.

#include <cstdint>
#include <vector>

#include "absl/time/time.h"
#include "common/sync_progress.h"
#include "executor/work.h"

namespace wsync::executor_internal {

// The rounds of `work`: one more than the largest round of any message, 0 without messages.
int32_t RoundsOf(const Work& work);

class RunProgress {
 public:
  // `progress` may be null: then nothing is published. `work` must outlive this. `sync_id` names
  // the sync in log lines.
  RunProgress(const Work& work, SyncProgress* progress, uint64_t sync_id = 0)
      : work_(work), progress_(progress), sync_id_(sync_id) {}

  // The run starts moving bytes: totals published, nothing done, phase transferring.
  void Start();
  // The message `message` of `work` completed (sent, or every byte of it received).
  void Completed(const Message& message);
  // Every message completed; the chunk digests are exchanged and checked now.
  void Verifying();

 private:
  const Work& work_;
  SyncProgress* const progress_;
  // Advances rounds_done_ past the rounds with no message left, logging those that had some.
  void Advance();

  const uint64_t sync_id_;
  bool active_ = false;            // Publishing or logging (set by Start).
  bool logging_ = false;           // Round lines (set by Start).
  absl::Time start_;               // Of the run (Start), for the round lines.
  absl::Time last_round_;          // When the previous round line's round completed.
  std::vector<int32_t> left_;      // Per round: this process's messages of it not completed.
  std::vector<int32_t> messages_;  // Per round: this process's messages of it (round lines).
  std::vector<int64_t> bytes_;     // Per round: their bytes (round lines).
  int32_t rounds_done_ = 0;        // The first round with a message left (rounds before are done).
  int64_t bytes_done_ = 0;
};

}  // namespace wsync::executor_internal

#endif  // WSYNC_EXECUTOR_RUN_PROGRESS_H_
