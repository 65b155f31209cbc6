#include "executor/stall_report.h"

#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace wsync::executor_internal {

std::string DescribeOutstanding(const Work& work, absl::Span<const int32_t> completed) {
  std::vector<std::string> lanes;
  std::set<int32_t> peers;
  int32_t unnamed = 0;
  for (size_t lane = 0; lane < work.lanes.size() && lane < completed.size(); ++lane) {
    const Lane& l = work.lanes[lane];
    const int32_t total = static_cast<int32_t>(l.messages.size());
    const int32_t done = completed[lane];
    if (done < 0 || done >= total) continue;
    peers.insert(l.peer);
    if (static_cast<int>(lanes.size()) >= kMaxReportedLanes) {
      ++unnamed;
      continue;
    }
    int64_t bytes = 0;
    for (int32_t m = done; m < total; ++m) bytes += l.messages[m].bytes;
    const int32_t first = l.messages[done].round;
    const int32_t last = l.messages[total - 1].round;
    lanes.push_back(absl::StrCat(
        l.direction == Direction::kSend ? "send to" : "receive from", " process ", l.peer, ": ",
        total - done, " of ", total, " messages (", bytes, " bytes, ",
        first == last ? absl::StrCat("round ", first) : absl::StrCat("rounds ", first, "-", last),
        ")"));
  }
  if (lanes.empty()) return "nothing outstanding";
  std::string text =
      absl::StrCat("outstanding with ", peers.size(),
                   peers.size() == 1 ? " peer: " : " peers: ", absl::StrJoin(lanes, "; "));
  if (unnamed > 0) absl::StrAppend(&text, "; and ", unnamed, " more lanes");
  return text;
}

absl::Status WithOutstanding(const absl::Status& status, const Work& work,
                             absl::Span<const int32_t> completed) {
  if (!absl::IsDeadlineExceeded(status)) return status;
  return absl::Status(status.code(),
                      absl::StrCat(status.message(), "; ", DescribeOutstanding(work, completed)));
}

}  // namespace wsync::executor_internal
