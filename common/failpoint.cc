#include "common/failpoint.h"

#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <map>
#include <mutex>
#include <stdexcept>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/log.h"

namespace wsync::failpoint {
namespace internal {
std::atomic<int> g_state{0};
}  // namespace internal

namespace {

struct Point {
  std::vector<Rule> rules;
  int64_t hits = 0;
};

absl::Mutex& Mu() {
  static absl::Mutex* mu = new absl::Mutex();
  return *mu;
}

std::map<std::string, Point, std::less<>>& Points() {
  static auto* points = new std::map<std::string, Point, std::less<>>();
  return *points;
}

// Installs `rules` (caller holds Mu()).
void Install(const std::vector<std::pair<std::string, Rule>>& rules) {
  Points().clear();
  for (const auto& [name, rule] : rules) Points()[name].rules.push_back(rule);
  internal::g_state.store(rules.empty() ? 1 : 2, std::memory_order_release);
}

// SIGKILLs this process: at once for a zero `d`, else from a forked child (async-signal-safe calls
// only) after `d` while this process runs on; the child does nothing if this process is gone.
void KillIn(absl::Duration d) {
  const pid_t parent = getpid();
  if (d <= absl::ZeroDuration()) {
    kill(parent, SIGKILL);
    return;
  }
  struct timespec ts = absl::ToTimespec(d);
  if (fork() == 0) {
    while (nanosleep(&ts, &ts) != 0) {
    }
    if (getppid() == parent) kill(parent, SIGKILL);
    _exit(0);
  }
}

// SIGSTOPs this process; a forked child (async-signal-safe calls only) SIGCONTs it after `d`.
void StopFor(absl::Duration d) {
  const pid_t parent = getpid();
  struct timespec ts = absl::ToTimespec(d);  // Before fork: the child calls only nanosleep, kill.
  const pid_t child = fork();
  if (child == 0) {
    while (nanosleep(&ts, &ts) != 0) {
    }
    kill(parent, SIGCONT);
    _exit(0);
  }
  kill(parent, SIGSTOP);
}

}  // namespace

absl::Status Parse(absl::string_view spec, std::vector<std::pair<std::string, Rule>>* rules) {
  rules->clear();
  for (absl::string_view entry : absl::StrSplit(spec, ',', absl::SkipWhitespace())) {
    entry = absl::StripAsciiWhitespace(entry);
    const auto bad = [&](absl::string_view why) {
      return absl::InvalidArgumentError(
          absl::StrCat("WSYNC_FAILPOINTS entry '", entry, "': ", why,
                       " (NAME:fail|delay=DUR|flip|kill|stop=DUR[@K[+]])"));
    };
    const size_t colon = entry.find(':');
    if (colon == absl::string_view::npos || colon == 0) return bad("needs NAME:ACTION");
    std::string name(entry.substr(0, colon));
    absl::string_view rest = entry.substr(colon + 1);
    Rule rule;
    if (const size_t at = rest.find('@'); at != absl::string_view::npos) {
      absl::string_view k = rest.substr(at + 1);
      rest = rest.substr(0, at);
      if (absl::ConsumeSuffix(&k, "+")) rule.and_later = true;
      if (!absl::SimpleAtoi(k, &rule.hit) || rule.hit < 1) return bad("K must be an integer >= 1");
    }
    absl::string_view arg;
    bool has_arg = false;
    if (const size_t eq = rest.find('='); eq != absl::string_view::npos) {
      arg = rest.substr(eq + 1);
      rest = rest.substr(0, eq);
      has_arg = true;
    }
    if (rest == "fail") {
      rule.action = Action::kFail;
    } else if (rest == "flip") {
      rule.action = Action::kFlip;
    } else if (rest == "kill" && !has_arg) {
      rule.action = Action::kKill;
    } else if (rest == "throw") {
      rule.action = Action::kThrow;
    } else if (rest == "delay" || rest == "stop" || rest == "kill") {
      rule.action = rest == "delay"  ? Action::kDelay
                    : rest == "stop" ? Action::kStop
                                     : Action::kKill;
      if (!has_arg || !absl::ParseDuration(arg, &rule.duration) ||
          rule.duration < absl::ZeroDuration() || rule.duration == absl::InfiniteDuration()) {
        return bad("needs a finite duration, e.g. delay=500ms");
      }
      has_arg = false;
    } else {
      return bad("unknown action");
    }
    if (has_arg) return bad("this action takes no argument");
    rules->emplace_back(std::move(name), rule);
  }
  return absl::OkStatus();
}

absl::Status SetForTesting(absl::string_view spec) {
  std::vector<std::pair<std::string, Rule>> rules;
  if (absl::Status status = Parse(spec, &rules); !status.ok()) return status;
  absl::MutexLock lock(&Mu());
  Install(rules);
  return absl::OkStatus();
}

int internal::Init() {
  absl::MutexLock lock(&Mu());
  int state = g_state.load(std::memory_order_acquire);
  if (state != 0) return state;
  std::vector<std::pair<std::string, Rule>> rules;
  if (const char* env = std::getenv("WSYNC_FAILPOINTS"); env != nullptr) {
    if (absl::Status status = Parse(env, &rules); !status.ok()) {
      log::Fatal(log::Category::kFault, status.message());
    }
  }
  Install(rules);
  return g_state.load(std::memory_order_acquire);
}

Action internal::EvaluateSlow(absl::string_view name) {
  if (g_state.load(std::memory_order_acquire) == 0 && Init() != 2) return Action::kNone;
  Rule fired;
  {
    absl::MutexLock lock(&Mu());
    auto it = Points().find(name);
    if (it == Points().end()) return Action::kNone;
    const int64_t hit = ++it->second.hits;
    for (const Rule& rule : it->second.rules) {
      if (hit == rule.hit || (rule.and_later && hit > rule.hit)) {
        fired = rule;
        break;
      }
    }
  }
  switch (fired.action) {
    case Action::kDelay:
      absl::SleepFor(fired.duration);
      break;
    case Action::kKill:
      WSYNC_LOG(kFault, kWarn, "failpoint '", name, "' kills process ", getpid(), " in ",
                absl::FormatDuration(fired.duration));
      KillIn(fired.duration);
      break;
    case Action::kThrow:
      throw std::runtime_error(absl::StrCat("failpoint '", name, "' threw (WSYNC_FAILPOINTS)"));
    case Action::kStop:
      WSYNC_LOG(kFault, kWarn, "failpoint '", name, "' stops process ", getpid(), " for ",
                absl::FormatDuration(fired.duration));
      StopFor(fired.duration);
      break;
    default:
      break;
  }
  return fired.action;
}

int64_t Hits(absl::string_view name) {
  absl::MutexLock lock(&Mu());
  auto it = Points().find(name);
  return it == Points().end() ? 0 : it->second.hits;
}

}  // namespace wsync::failpoint
