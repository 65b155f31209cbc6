#ifndef WSYNC_EXECUTOR_RUN_PROGRESS_H_
#define WSYNC_EXECUTOR_RUN_PROGRESS_H_

// Private to the executor (run.cc): publishes where one run stands into the caller's SyncProgress
// (ExecuteOptions::progress): the phase, the rounds of this process whose messages all completed
// and the bytes of its completed messages, each of its totals. Constant amortized time per
// message (a count per round and a cursor that only moves forward) and relaxed stores only: no
// lock on the data path. Not thread-safe: the run's thread only; readers read the SyncProgress.

#include <cstdint>
#include <vector>

#include "common/sync_progress.h"
#include "executor/work.h"

namespace wsync::executor_internal {

// The rounds of `work`: one more than the largest round of any message, 0 without messages.
int32_t RoundsOf(const Work& work);

class RunProgress {
 public:
  // `progress` may be null: then nothing is published. `work` must outlive this.
  RunProgress(const Work& work, SyncProgress* progress) : work_(work), progress_(progress) {}

  // The run starts moving bytes: totals published, nothing done, phase transferring.
  void Start();
  // The message `message` of `work` completed (sent, or every byte of it received).
  void Completed(const Message& message);
  // Every message completed; the chunk digests are exchanged and checked now.
  void Verifying();

 private:
  const Work& work_;
  SyncProgress* const progress_;
  std::vector<int32_t> left_;  // Per round: this process's messages of it not completed.
  int32_t rounds_done_ = 0;    // The first round with a message left (rounds before are done).
  int64_t bytes_done_ = 0;
};

}  // namespace wsync::executor_internal

#endif  // WSYNC_EXECUTOR_RUN_PROGRESS_H_
