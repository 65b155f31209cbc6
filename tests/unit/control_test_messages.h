#ifndef WSYNC_TESTS_UNIT_CONTROL_TEST_MESSAGES_H_
#define WSYNC_TESTS_UNIT_CONTROL_TEST_MESSAGES_H_

// What the control tests share (control_test.cc, control_coordinator_test.cc): the error messages
// they saw, one list for the whole binary (its last test checks that no secret leaked into any of
// them), and raw writes to a socket.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "control/framing.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/control_job.h"

namespace wsync::control_testing {

inline constexpr char kWrongSecret[] = "incorrect-donkey-battery-staple-7";
// How long a reply may take beyond its due time on a loaded machine (a hang bound).
inline constexpr absl::Duration kReplyWait = absl::Seconds(5);

// Every error message a test saw; the last test checks that no secret leaked into any of them.
inline absl::Mutex& MessagesMutex() {
  static absl::Mutex mu(absl::kConstInit);
  return mu;
}
inline std::vector<std::string>& Messages() {
  static auto* messages = new std::vector<std::string>();
  return *messages;
}
inline absl::Status Seen(absl::Status status) {
  absl::MutexLock lock(&MessagesMutex());
  Messages().push_back(std::string(status.message()));
  return status;
}
inline void ExpectNoSecret(const absl::Status& status) {
  (void)Seen(status);
  EXPECT_THAT(status.message(),
              ::testing::AllOf(::testing::Not(::testing::HasSubstr(kSecret)),
                               ::testing::Not(::testing::HasSubstr(kWrongSecret))));
}

// Writes `bytes` to `fd` as they are (no framing of their own), within 5 s.
inline void SendRaw(int fd, const std::string& bytes) {
  FrameWriter writer;
  writer.EnqueueUnsealed(std::make_shared<const std::string>(bytes));
  ASSERT_TRUE(FlushFrames(fd, writer, absl::Now() + absl::Seconds(5)).ok());
}
inline std::string Header(uint32_t length) {
  return std::string{static_cast<char>(length >> 24), static_cast<char>(length >> 16),
                     static_cast<char>(length >> 8), static_cast<char>(length)};
}

}  // namespace wsync::control_testing

#endif  // WSYNC_TESTS_UNIT_CONTROL_TEST_MESSAGES_H_
