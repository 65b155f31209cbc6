#include "control/rendezvous_progress.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "control/protocol.h"

namespace wsync {
namespace {

// The first kMaxListedProgress texts of `items`, cut, with "and N more" for the rest of `total`.
std::string Listed(const google::protobuf::RepeatedPtrField<std::string>& items, int64_t total) {
  std::vector<std::string> named;
  for (int i = 0; i < std::min(items.size(), kMaxListedProgress); ++i) {
    named.push_back(TruncateText(items[i], kMaxProgressTextBytes));
  }
  std::string text = named.empty() ? "none named" : absl::StrJoin(named, ", ");
  if (total > static_cast<int64_t>(named.size())) {
    absl::StrAppend(&text, " and ", total - static_cast<int64_t>(named.size()), " more");
  }
  return text;
}

}  // namespace

std::string DescribeRendezvousProgress(const control::RendezvousProgress& progress,
                                       absl::Duration received_ago) {
  const int64_t joined = progress.joined();
  const int64_t expected = progress.expected();
  std::string text =
      absl::StrCat(joined, " of ", expected, " processes joined (",
                   joined > 0 ? Listed(progress.joined_processes(), joined) : "none", ")");
  if (expected > joined) {
    absl::StrAppend(&text, "; missing: ", Listed(progress.missing_processes(), expected - joined));
  }
  std::vector<std::string> refused;
  for (int i = 0; i < std::min(progress.refused_size(), kMaxListedProgress); ++i) {
    const control::RefusalNote& note = progress.refused(i);
    const absl::Duration age =
        absl::Milliseconds(std::clamp<int64_t>(note.age_ms(), 0, int64_t{1} << 40)) + received_ago;
    refused.push_back(absl::StrFormat("%s, %.1f s ago",
                                      TruncateText(note.text(), kMaxProgressTextBytes),
                                      absl::ToDoubleSeconds(age)));
  }
  if (!refused.empty()) absl::StrAppend(&text, "; refused: ", absl::StrJoin(refused, "; "));
  return text;
}

}  // namespace wsync
