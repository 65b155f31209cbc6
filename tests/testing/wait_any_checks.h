#ifndef WSYNC_TESTS_TESTING_WAIT_ANY_CHECKS_H_
#define WSYNC_TESTS_TESTING_WAIT_ANY_CHECKS_H_

// Transport::WaitAny's contract, checked over any connected pair of endpoints: it returns on the
// first request that finished, with its position, and leaves the others posted; at the deadline
// with none finished it releases nothing; a failed request is reported with its position and
// error. `sender` is process 0 and `receiver` process 1 of one job.

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "transport/transport.h"

namespace wsync::test {

inline void ExpectWaitAnyContract(Transport& sender, Transport& receiver) {
  const auto in = [](absl::Duration d) { return absl::Now() + d; };
  // Sends not yet seen complete; testing them drives a sender that needs progress to move.
  std::vector<RequestId> sends;
  // WaitAny on `requests` in 50 ms slices, driving the sender between them, for up to 10 s.
  const auto wait_any = [&](std::vector<RequestId> requests, std::vector<size_t>* finished) {
    const absl::Time give_up = in(absl::Seconds(10));
    for (;;) {
      finished->clear();
      const absl::Status status = receiver.WaitAny(requests, in(absl::Milliseconds(50)), finished);
      if (!absl::IsDeadlineExceeded(status) || absl::Now() > give_up) return status;
      std::erase_if(sends, [&](RequestId send) {
        absl::StatusOr<bool> done = sender.Test(send);
        return !done.ok() || *done;
      });
    }
  };
  std::vector<uint8_t> a(4096, 0), b(4096, 0), c(16, 0);
  const std::vector<uint8_t> data(4096, 7);
  absl::StatusOr<RequestId> receive_a = receiver.PostReceive(0, MakeTag(3, 1, 0), a.data(), 4096);
  absl::StatusOr<RequestId> receive_b = receiver.PostReceive(0, MakeTag(3, 2, 0), b.data(), 4096);
  ASSERT_TRUE(receive_a.ok() && receive_b.ok());

  // Only b's message comes: b is reported, a stays posted.
  absl::StatusOr<RequestId> send_b = sender.PostSend(1, MakeTag(3, 2, 0), data.data(), 4096);
  ASSERT_TRUE(send_b.ok()) << send_b.status();
  sends.push_back(*send_b);
  std::vector<size_t> finished;
  absl::Status status = wait_any({*receive_a, *receive_b}, &finished);
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(finished, std::vector<size_t>{1});
  EXPECT_EQ(b, data);
  EXPECT_EQ(receiver.Test(*receive_b).status().code(), absl::StatusCode::kNotFound);  // Released.

  // Nothing finishes by the deadline: DeadlineExceeded, a still posted.
  finished.clear();
  const absl::Time start = absl::Now();
  status = receiver.WaitAny({*receive_a}, in(absl::Milliseconds(100)), &finished);
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(95));
  EXPECT_TRUE(finished.empty());
  absl::StatusOr<bool> still = receiver.Test(*receive_a);
  ASSERT_TRUE(still.ok()) << still.status();
  EXPECT_FALSE(*still);

  // A message of another size fails its receive, which is reported with its position.
  absl::StatusOr<RequestId> receive_c = receiver.PostReceive(0, MakeTag(3, 3, 0), c.data(), 16);
  ASSERT_TRUE(receive_c.ok());
  absl::StatusOr<RequestId> send_c = sender.PostSend(1, MakeTag(3, 3, 0), data.data(), 32);
  ASSERT_TRUE(send_c.ok()) << send_c.status();
  sends.push_back(*send_c);
  status = wait_any({*receive_a, *receive_c}, &finished);
  EXPECT_FALSE(status.ok());
  EXPECT_FALSE(absl::IsDeadlineExceeded(status)) << status;
  EXPECT_EQ(finished, std::vector<size_t>{1});

  // a's message comes after all.
  absl::StatusOr<RequestId> send_a = sender.PostSend(1, MakeTag(3, 1, 0), data.data(), 4096);
  ASSERT_TRUE(send_a.ok()) << send_a.status();
  sends.push_back(*send_a);
  status = wait_any({*receive_a}, &finished);
  EXPECT_TRUE(status.ok()) << status;
  EXPECT_EQ(finished, std::vector<size_t>{0});
  EXPECT_EQ(a, data);
  sender.WaitAll(sends, in(absl::Seconds(1))).IgnoreError();
}

}  // namespace wsync::test

#endif  // WSYNC_TESTS_TESTING_WAIT_ANY_CHECKS_H_
