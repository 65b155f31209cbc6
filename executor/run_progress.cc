#include "executor/run_progress.h"

#include <algorithm>

#include "absl/time/clock.h"
#include "common/log.h"

namespace wsync::executor_internal {

int32_t RoundsOf(const Work& work) {
  int32_t rounds = 0;
  for (const Lane& lane : work.lanes) {
    if (!lane.messages.empty()) rounds = std::max(rounds, lane.messages.back().round + 1);
  }
  return rounds;
}

void RunProgress::Start() {
  logging_ = log::Enabled(log::Category::kRound, log::Level::kInfo);
  active_ = progress_ != nullptr || logging_;
  if (!active_) return;
  const int32_t rounds = RoundsOf(work_);
  left_.assign(rounds, 0);
  messages_.assign(logging_ ? rounds : 0, 0);
  bytes_.assign(logging_ ? rounds : 0, 0);
  int64_t bytes_total = 0;
  for (const Lane& lane : work_.lanes) {
    for (const Message& message : lane.messages) {
      ++left_[message.round];
      bytes_total += message.bytes;
      if (logging_) {
        ++messages_[message.round];
        bytes_[message.round] += message.bytes;
      }
    }
  }
  start_ = last_round_ = absl::Now();
  rounds_done_ = 0;
  bytes_done_ = 0;
  Advance();
  if (progress_ == nullptr) return;
  progress_->SetTotals(std::ssize(left_), bytes_total);
  progress_->SetDone(rounds_done_, 0);
  progress_->SetPhase(SyncPhase::kTransferring);
}

void RunProgress::Completed(const Message& message) {
  if (!active_ || message.round < 0 || message.round >= std::ssize(left_)) return;
  --left_[message.round];
  bytes_done_ += message.bytes;
  Advance();
  if (progress_ != nullptr) progress_->SetDone(rounds_done_, bytes_done_);
}

void RunProgress::Advance() {
  while (rounds_done_ < std::ssize(left_) && left_[rounds_done_] == 0) {
    if (logging_ && messages_[rounds_done_] > 0) {
      const absl::Time now = absl::Now();
      WSYNC_LOG(kRound, kInfo, "process ", work_.process, ": sync ", sync_id_, " round ",
                rounds_done_ + 1, "/", left_.size(),
                " done: ", log::Count(messages_[rounds_done_], "message"), ", ",
                log::Bytes(bytes_[rounds_done_]), ", at ",
                absl::FormatDuration(absl::Trunc(now - start_, absl::Microseconds(10))), " (+",
                absl::FormatDuration(absl::Trunc(now - last_round_, absl::Microseconds(10))), ")");
      last_round_ = now;
    }
    ++rounds_done_;
  }
}

void RunProgress::Verifying() {
  if (progress_ != nullptr) progress_->SetPhase(SyncPhase::kVerifying);
}

}  // namespace wsync::executor_internal
