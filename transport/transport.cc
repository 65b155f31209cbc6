#include "transport/transport.h"

#include <algorithm>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace wsync {

MessageTag MakeTag(uint64_t sync_id, int64_t round, int32_t sender) {
  const uint64_t sync_bits = sync_id & 0xffffffu;
  const uint64_t round_bits = static_cast<uint64_t>(round) & 0xffffffu;
  const uint64_t sender_bits = static_cast<uint32_t>(sender) & 0xffffu;
  return MessageTag{(sync_bits << 40) | (round_bits << 16) | sender_bits};
}

namespace {
constexpr absl::string_view kCoordinatorLossPayload = "wsync.dev/coordinator_loss";
}  // namespace

absl::Status CoordinatorLoss(absl::string_view detail) {
  absl::Status status = absl::UnavailableError(
      absl::StrCat("this process lost its connection to the coordinator: ", detail));
  status.SetPayload(kCoordinatorLossPayload, absl::Cord("1"));
  return status;
}

bool IsCoordinatorLoss(const absl::Status& reason) {
  return reason.GetPayload(kCoordinatorLossPayload).has_value();
}

bool IsStaleTag(MessageTag tag, uint64_t sync_id) {
  const uint64_t behind = ((sync_id & 0xffffffu) - (tag.value >> 40)) & 0xffffffu;
  return behind >= 1 && behind <= kStaleSyncWindow;
}

absl::Status Transport::WaitAny(absl::Span<const RequestId> requests, absl::Time deadline,
                                std::vector<size_t>* finished) {
  constexpr absl::Duration kSpin = absl::Microseconds(50);
  constexpr absl::Duration kMaxPause = absl::Microseconds(50);
  const absl::Time start = absl::Now();
  for (;;) {
    absl::Status failure;
    bool any = false;
    for (size_t i = 0; i < requests.size() && failure.ok(); ++i) {
      absl::StatusOr<bool> done = Test(requests[i]);
      if (!done.ok() || *done) {
        finished->push_back(i);
        any = true;
      }
      if (!done.ok()) failure = done.status();
    }
    if (any || requests.empty()) return failure;
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat("process ", process(), ": none of ",
                                                      requests.size(),
                                                      " requests finished by the deadline"));
    }
    if (now - start >= kSpin) absl::SleepFor(std::min(kMaxPause, deadline - now));
  }
}

}  // namespace wsync
