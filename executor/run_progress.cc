#include "executor/run_progress.h"

#include <algorithm>

namespace wsync::executor_internal {

int32_t RoundsOf(const Work& work) {
  int32_t rounds = 0;
  for (const Lane& lane : work.lanes) {
    if (!lane.messages.empty()) rounds = std::max(rounds, lane.messages.back().round + 1);
  }
  return rounds;
}

void RunProgress::Start() {
  if (progress_ == nullptr) return;
  left_.assign(RoundsOf(work_), 0);
  int64_t bytes_total = 0;
  for (const Lane& lane : work_.lanes) {
    for (const Message& message : lane.messages) {
      ++left_[message.round];
      bytes_total += message.bytes;
    }
  }
  rounds_done_ = 0;
  bytes_done_ = 0;
  while (rounds_done_ < std::ssize(left_) && left_[rounds_done_] == 0) ++rounds_done_;
  progress_->SetTotals(std::ssize(left_), bytes_total);
  progress_->SetDone(rounds_done_, 0);
  progress_->SetPhase(SyncPhase::kTransferring);
}

void RunProgress::Completed(const Message& message) {
  if (progress_ == nullptr || message.round < 0 || message.round >= std::ssize(left_)) return;
  --left_[message.round];
  bytes_done_ += message.bytes;
  while (rounds_done_ < std::ssize(left_) && left_[rounds_done_] == 0) ++rounds_done_;
  progress_->SetDone(rounds_done_, bytes_done_);
}

void RunProgress::Verifying() {
  if (progress_ != nullptr) progress_->SetPhase(SyncPhase::kVerifying);
}

}  // namespace wsync::executor_internal
