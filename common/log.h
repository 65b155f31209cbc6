#ifndef WSYNC_COMMON_LOG_H_
#define WSYNC_COMMON_LOG_H_

// The trace facility: what the library tells an operator, by category and level. The library
// never prints otherwise.
//
//   WSYNC_LOG=connect,plan,round,sync,fault   (a comma list of CategoryName values, or "all")
//   WSYNC_LOG_LEVEL=error|warn|info|debug     (the most verbose level delivered; default info)
//
// Both are read once, at the first use of the facility. Names are case-insensitive; blanks around
// a name and empty entries are ignored. An unknown name, or an unknown level, is ignored (the
// rest of the list still counts) and reported by one warn line in category `config`, delivered
// whatever the filter, so a typo never goes unseen.
//
// Lines go to the sink: by default standard error, one line per write ("[wsync HH:MM:SS.uuuuuu
// PID LEVEL CATEGORY] message"), or a host's function (Configure; the C ABI's set_log). With
// WSYNC_LOG unset and no host filter nothing is delivered: the default is silence.
//
// Thread safety: every function may be called from any thread. Sink calls are serialized (one
// at a time, on the emitting thread); a line emitted from inside a sink call on the same thread
// (a sink that calls back into wsync) is dropped rather than deadlocking.
//
// Cost when a line is filtered out: one relaxed atomic load and a compare; WSYNC_LOG's
// arguments are not evaluated.

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/optimization.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace wsync::log {

// Values equal wsync_log_level_t of the C ABI (plugin/include/wsync/wsync.h).
enum class Level : int32_t { kError = 1, kWarn = 2, kInfo = 3, kDebug = 4 };

// Values are bit positions of a category mask; never renumber (the mask is shared state only,
// not a wire format, but tests name them).
enum class Category : int32_t {
  kConnect = 0,    // who joined, the roster, the transports chosen per path class
  kPlan = 1,       // the plan: digest, segments, chunks, rounds, bytes
  kRound = 2,      // each round of a sync: index, messages, bytes, time
  kSync = 3,       // a sync's start and its decision (commit or abort)
  kFault = 4,      // failures: who, what (lost peers, refused votes, failpoints, fatal errors)
  kControl = 5,    // the coordinator: admissions, rosters, decisions, lost processes
  kTransport = 6,  // transport details (endpoints, error handling)
  kConfig = 7,     // a session's settings; refused log settings
};
inline constexpr int kCategoryCount = 8;
inline constexpr uint32_t kAllCategories = (1u << kCategoryCount) - 1;

// "connect", "plan", ... (the names WSYNC_LOG takes).
absl::string_view CategoryName(Category category);
// "error", "warn", "info", "debug".
absl::string_view LevelName(Level level);

// A WSYNC_LOG value: the mask of the categories named ("all": every one). InvalidArgument naming
// every unknown entry and the known names; on error nothing is returned for the valid entries
// (the C ABI refuses the whole value; ReadEnvironment keeps what it can, see below).
absl::StatusOr<uint32_t> ParseCategories(absl::string_view spec);
// A WSYNC_LOG_LEVEL value; InvalidArgument naming it.
absl::StatusOr<Level> ParseLevel(absl::string_view text);

// What the environment asks for: nullopt where a variable is unset. An unknown entry of
// WSYNC_LOG is dropped (the known ones stay); an unknown level leaves `level` unset. Each
// refusal is one line of `warnings`. Pure: the values are passed in (null: unset).
struct EnvironmentFilter {
  std::optional<uint32_t> categories;
  std::optional<Level> level;
  std::vector<std::string> warnings;
};
EnvironmentFilter ReadEnvironment(const char* log, const char* log_level);

// A host's destination for lines: `message` without the prefix the default sink adds; valid for
// the call only.
using Sink = std::function<void(Level level, Category category, absl::string_view message)>;

// Installs the host's settings, replacing earlier ones: `sink` (null: standard error), the
// categories and the level (nullopt: none and info). WSYNC_LOG and WSYNC_LOG_LEVEL, when set,
// take precedence over `categories` and `level` (an operator's setting overrides the host's
// default). Returns after any call into the previous sink has returned; the previous sink is
// never called again. FailedPrecondition when called from inside a sink call.
absl::Status Configure(Sink sink, std::optional<uint32_t> categories, std::optional<Level> level);

// "1 round", "3 rounds", "2 processes": `count` and `noun`, plural unless `count` is 1 (an "s",
// or "es" after s, x, ch, sh; nouns are chosen to fit the rule).
std::string Count(int64_t count, absl::string_view noun);

// `bytes` for a line: "512 B", "1.5 KiB", "942.3 MiB", "1.2 GiB", "2.0 TiB".
std::string Bytes(int64_t bytes);

// Back to the state before any Configure, with the environment read again: for tests.
void ResetForTesting();

namespace internal {
// Bits 0..kCategoryCount-1: categories; bits 16..19: the level; bit 31: read. 0: not read yet.
extern std::atomic<uint32_t> g_filter;
uint32_t Initialize();
void Deliver(Category category, Level level, absl::string_view message);
}  // namespace internal

// Whether a line of `category` at `level` would be delivered now.
inline bool Enabled(Category category, Level level) {
  uint32_t filter = internal::g_filter.load(std::memory_order_relaxed);
  if (ABSL_PREDICT_FALSE(filter == 0)) filter = internal::Initialize();
  return ((filter >> static_cast<int>(category)) & 1u) != 0 &&
         static_cast<uint32_t>(level) <= ((filter >> 16) & 0xFu);
}

// Delivers `message` when Enabled(category, level).
inline void Emit(Category category, Level level, absl::string_view message) {
  if (Enabled(category, level)) internal::Deliver(category, level, message);
}

// Delivers `message` at level error whatever the filter (to the host's sink, or standard error),
// then aborts the process: for the library's own unrecoverable errors (a broken invariant, a
// malformed WSYNC_FAILPOINTS), which must not end the process without a word.
[[noreturn]] void Fatal(Category category, absl::string_view message);

}  // namespace wsync::log

// WSYNC_LOG(kRound, kInfo, "round ", r, " done"): absl::StrCat of the arguments, built only when
// the line is delivered.
#define WSYNC_LOG(category, level, ...)                                                        \
  do {                                                                                         \
    if (::wsync::log::Enabled(::wsync::log::Category::category, ::wsync::log::Level::level)) { \
      ::wsync::log::internal::Deliver(::wsync::log::Category::category,                        \
                                      ::wsync::log::Level::level, absl::StrCat(__VA_ARGS__));  \
    }                                                                                          \
  } while (false)

#endif  // WSYNC_COMMON_LOG_H_
