#include "common/log.h"

#include <unistd.h>

#include <cstdlib>
#include <utility>

#include "absl/base/attributes.h"
#include "absl/base/const_init.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace wsync::log {
namespace internal {
std::atomic<uint32_t> g_filter{0};
}  // namespace internal

namespace {

constexpr uint32_t kRead = 1u << 31;
constexpr absl::string_view kCategoryNames[kCategoryCount] = {
    "connect", "plan", "round", "sync", "fault", "control", "transport", "config"};
constexpr absl::string_view kLevelNames[] = {"error", "warn", "info", "debug"};

uint32_t Pack(uint32_t categories, Level level) {
  return kRead | categories | (static_cast<uint32_t>(level) << 16);
}

// The state behind g_filter: guarded by Mu(); sink calls are made holding it, which serializes
// them and lets Configure wait for one in flight.
struct State {
  bool read = false;
  EnvironmentFilter environment;
  std::optional<uint32_t> host_categories;
  std::optional<Level> host_level;
  Sink sink;  // Null: standard error.
};

ABSL_CONST_INIT absl::Mutex mu(absl::kConstInit);
State& GetState() {
  static State* const state = new State();
  return *state;
}

// Set while this thread is inside a sink call (a line emitted then is dropped).
thread_local bool in_sink = false;

void WriteToStandardError(Level level, Category category, absl::string_view message) {
  const absl::Time now = absl::Now();
  std::string line = absl::StrCat(
      "[wsync ", absl::FormatTime("%H:%M:%E6S", now, absl::LocalTimeZone()), " ", getpid(), " ",
      LevelName(level), " ", CategoryName(category), "] ", message, "\n");
  // One write per line, so that the lines of several threads and processes do not interleave.
  const char* data = line.data();
  size_t left = line.size();
  while (left > 0) {
    const ssize_t n = write(STDERR_FILENO, data, left);
    if (n <= 0) return;
    data += n;
    left -= static_cast<size_t>(n);
  }
}

void CallSink(const State& state, Category category, Level level, absl::string_view message)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
  in_sink = true;
  if (state.sink) {
    try {
      state.sink(level, category, message);
    } catch (...) {  // A host's sink never takes the library's thread down.
    }
  } else {
    WriteToStandardError(level, category, message);
  }
  in_sink = false;
}

// Reads the environment once and publishes the filter; the warnings go to the sink then.
void ReadOnce(State& state) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
  if (state.read) return;
  state.read = true;
  state.environment = ReadEnvironment(std::getenv("WSYNC_LOG"), std::getenv("WSYNC_LOG_LEVEL"));
  for (const std::string& warning : state.environment.warnings) {
    CallSink(state, Category::kConfig, Level::kWarn, warning);
  }
}

uint32_t Publish(const State& state) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
  const uint32_t categories =
      state.environment.categories.value_or(state.host_categories.value_or(0));
  const Level level = state.environment.level.value_or(state.host_level.value_or(Level::kInfo));
  const uint32_t filter = Pack(categories, level);
  internal::g_filter.store(filter, std::memory_order_relaxed);
  return filter;
}

}  // namespace

absl::string_view CategoryName(Category category) {
  const int index = static_cast<int>(category);
  return index >= 0 && index < kCategoryCount ? kCategoryNames[index] : "unknown";
}

absl::string_view LevelName(Level level) {
  const int index = static_cast<int>(level) - 1;
  return index >= 0 && index < 4 ? kLevelNames[index] : "unknown";
}

std::string Count(int64_t count, absl::string_view noun) {
  if (count == 1) return absl::StrCat(count, " ", noun);
  const bool sibilant = absl::EndsWith(noun, "s") || absl::EndsWith(noun, "x") ||
                        absl::EndsWith(noun, "ch") || absl::EndsWith(noun, "sh");
  return absl::StrCat(count, " ", noun, sibilant ? "es" : "s");
}

std::string Bytes(int64_t bytes) {
  if (bytes < 1024 && bytes > -1024) return absl::StrCat(bytes, " B");
  constexpr absl::string_view kUnits[] = {"KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = -1;
  while (unit < 3 && (value >= 1024 || value <= -1024)) {
    value /= 1024;
    ++unit;
  }
  return absl::StrFormat("%.1f %s", value, kUnits[unit]);
}

absl::StatusOr<uint32_t> ParseCategories(absl::string_view spec) {
  uint32_t mask = 0;
  std::vector<std::string> unknown;
  for (absl::string_view entry : absl::StrSplit(spec, ',')) {
    const std::string name = absl::AsciiStrToLower(absl::StripAsciiWhitespace(entry));
    if (name.empty()) continue;
    if (name == "all") {
      mask = kAllCategories;
      continue;
    }
    bool known = false;
    for (int c = 0; c < kCategoryCount; ++c) {
      if (kCategoryNames[c] == name) {
        mask |= 1u << c;
        known = true;
      }
    }
    if (!known) unknown.push_back(absl::StrCat("'", name, "'"));
  }
  if (!unknown.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown log categor", unknown.size() == 1 ? "y " : "ies ", absl::StrJoin(unknown, ", "),
        " (known: ", absl::StrJoin(kCategoryNames, ","), ", or all)"));
  }
  return mask;
}

absl::StatusOr<Level> ParseLevel(absl::string_view text) {
  const std::string name = absl::AsciiStrToLower(absl::StripAsciiWhitespace(text));
  for (int l = 0; l < 4; ++l) {
    if (kLevelNames[l] == name) return static_cast<Level>(l + 1);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown log level '", text, "' (known: error, warn, info, debug)"));
}

EnvironmentFilter ReadEnvironment(const char* log, const char* log_level) {
  EnvironmentFilter filter;
  if (log != nullptr) {
    absl::StatusOr<uint32_t> parsed = ParseCategories(log);
    if (parsed.ok()) {
      filter.categories = *parsed;
    } else {
      // Keep the known entries: parse them one by one.
      uint32_t mask = 0;
      for (absl::string_view entry : absl::StrSplit(log, ',')) {
        if (absl::StatusOr<uint32_t> one = ParseCategories(entry); one.ok()) mask |= *one;
      }
      filter.categories = mask;
      filter.warnings.push_back(
          absl::StrCat("WSYNC_LOG: ", parsed.status().message(), "; ignored"));
    }
  }
  if (log_level != nullptr) {
    absl::StatusOr<Level> parsed = ParseLevel(log_level);
    if (parsed.ok()) {
      filter.level = *parsed;
    } else {
      filter.warnings.push_back(
          absl::StrCat("WSYNC_LOG_LEVEL: ", parsed.status().message(), "; info is used"));
    }
  }
  return filter;
}

absl::Status Configure(Sink sink, std::optional<uint32_t> categories, std::optional<Level> level) {
  if (in_sink) {
    return absl::FailedPreconditionError("the log cannot be configured from inside a log call");
  }
  absl::MutexLock lock(&mu);
  State& state = GetState();
  state.sink = std::move(sink);
  state.host_categories = categories;
  state.host_level = level;
  ReadOnce(state);
  Publish(state);
  return absl::OkStatus();
}

void ResetForTesting() {
  absl::MutexLock lock(&mu);
  GetState() = State();
  internal::g_filter.store(0, std::memory_order_relaxed);
}

uint32_t internal::Initialize() {
  absl::MutexLock lock(&mu);
  State& state = GetState();
  ReadOnce(state);
  return Publish(state);
}

void internal::Deliver(Category category, Level level, absl::string_view message) {
  if (in_sink) return;
  absl::MutexLock lock(&mu);
  CallSink(GetState(), category, level, message);
}

void Fatal(Category category, absl::string_view message) {
  if (!in_sink) {
    absl::MutexLock lock(&mu);
    CallSink(GetState(), category, Level::kError, message);
  }
  std::abort();
}

}  // namespace wsync::log
