#ifndef WSYNC_TESTS_TESTING_SINK_TRANSPORT_H_
#define WSYNC_TESTS_TESTING_SINK_TRANSPORT_H_

// A transport and group for one process run alone, for executor tests and benchmarks that need
// neither peers nor threads, and full control over the order in which requests complete.
//
// SinkTransport: every posted request finishes without a peer (a send's bytes go nowhere, a
// receive's memory is left as it was). WaitAny reports exactly one finished request per call, at
// the position `order` picks in the wait list, in constant time (so that a benchmark measures its
// caller, not the transport). Test finishes the request it is asked about; WaitAll finishes all.
// A released or unknown id is NotFound. Single-threaded; Abort makes later posts fail.
//
// SoloGroup: a group of one, whose AllGather returns the caller's payload.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/status.h"
#include "transport/transport.h"

namespace wsync::test {

class SinkTransport : public Transport {
 public:
  // Which request of a wait list WaitAny finishes.
  enum class Order {
    kFirst,   // Position 0.
    kLast,    // The last position.
    kRandom,  // A position drawn from a generator seeded with `seed`.
  };

  SinkTransport(int32_t process, Order order, uint64_t seed = 1)
      : process_(process), order_(order), random_state_(seed | 1) {}

  int32_t process() const override { return process_; }
  std::string name() const override { return "sink"; }
  absl::StatusOr<RegistrationId> RegisterMemory(void*, int64_t, MemoryKind) override {
    return ++registrations_;
  }
  absl::Status DeregisterMemory(RegistrationId) override { return absl::OkStatus(); }
  absl::StatusOr<RequestId> PostSend(int32_t, MessageTag, const void*, int64_t) override {
    return NewRequest();
  }
  absl::StatusOr<RequestId> PostReceive(int32_t, MessageTag, void*, int64_t) override {
    return NewRequest();
  }
  absl::StatusOr<bool> Test(RequestId request) override {
    WSYNC_RETURN_IF_ERROR(Release(request));
    return true;
  }
  absl::Status WaitAll(absl::Span<const RequestId> requests, absl::Time) override {
    absl::Status first;
    for (RequestId request : requests) first.Update(Release(request));
    return first;
  }
  absl::Status WaitAny(absl::Span<const RequestId> requests, absl::Time,
                       std::vector<size_t>* finished) override {
    if (requests.empty()) return absl::DeadlineExceededError("sink: no requests to wait for");
    size_t position = 0;
    if (order_ == Order::kLast) position = requests.size() - 1;
    if (order_ == Order::kRandom) position = NextRandom() % requests.size();
    finished->push_back(position);
    return Release(requests[position]);
  }
  void Abort(const absl::Status& reason) override { aborted_ = reason; }

 private:
  absl::StatusOr<RequestId> NewRequest() {
    if (!aborted_.ok()) return aborted_;
    live_.push_back(true);
    return live_.size();  // Ids start at 1.
  }
  absl::Status Release(RequestId request) {
    if (request == 0 || request > live_.size() || !live_[request - 1]) {
      return absl::NotFoundError(absl::StrCat("sink: no request ", request));
    }
    live_[request - 1] = false;
    return absl::OkStatus();
  }
  uint64_t NextRandom() {  // xorshift64
    random_state_ ^= random_state_ << 13;
    random_state_ ^= random_state_ >> 7;
    random_state_ ^= random_state_ << 17;
    return random_state_;
  }

  const int32_t process_;
  const Order order_;
  uint64_t random_state_;
  RegistrationId registrations_ = 0;
  std::vector<bool> live_;  // By request id - 1.
  absl::Status aborted_;
};

class SoloGroup final : public Group {
 public:
  explicit SoloGroup(int32_t process) : process_(process) {}
  int32_t process() const override { return process_; }
  int32_t size() const override { return 1; }
  absl::StatusOr<std::vector<std::string>> AllGather(absl::string_view payload,
                                                     absl::Time) override {
    return std::vector<std::string>{std::string(payload)};
  }

 private:
  const int32_t process_;
};

}  // namespace wsync::test

#endif  // WSYNC_TESTS_TESTING_SINK_TRANSPORT_H_
