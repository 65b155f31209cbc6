// A sender killed (SIGKILL) at random points of a transfer over UCX shared memory with CMA
// ("sm,cma,self"): two sender processes each send rendezvous-sized messages to two receiver
// processes, whose UCX copies them out of the senders' memory (process_vm_readv). One sender is
// killed at a seeded random delay after the transfer starts, so that many trials land inside a
// receiver's copy from it. Before endpoints carried an error callback, UCX 1.13 took such a copy
// from an exited process as fatal and aborted the receiver (SIGABRT in uct_cma_ep_tx). Every
// trial asserts that no receiver dies: each exits normally, has every message of the surviving
// sender intact (or, where the kill wedged its shared-memory FIFO, failed at the deadline), and
// has the killed sender's messages either complete and intact (the kill came after them) or
// failed within a bound with an error naming the killed process.
//
// The trials run in blocks (one test case each, spread over ctest shards); WSYNC_CMA_KILL_SEED
// replaces the seed (printed by every trial) to replay one. The AddressSanitizer build runs 40% of
// each block's trials (WSYNC_PROPERTY_PERCENT, tests/fault/CMakeLists.txt), the plain build all.

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "tests/testing/property_scale.h"
#include "transport/ucx/ucx_transport.h"

namespace wsync {
namespace {

constexpr int kSenders = 2;
constexpr int kReceivers = 2;
constexpr int kProcesses = kSenders + kReceivers;  // Senders are processes 0 and 1.
constexpr int kMessages = 2;                       // Per sender and receiver.
constexpr int64_t kBytes = 4 << 20;                // Rendezvous: copied by the receiver.
constexpr int kTrialsPerBlock = 10;  // Scaled by WSYNC_PROPERTY_PERCENT.
constexpr int kBlocks = 5;           // 50 kill points in all.
// The kill lands within this long after the start (a transfer here takes tens of ms).
constexpr absl::Duration kKillWindow = absl::Milliseconds(120);
// A receiver's wait for the killed sender ends within this long after the kill: the transport's
// exited-peer check (every 250 ms) or UCX's failed copy, plus slack for a loaded machine.
constexpr absl::Duration kFailBound = absl::Seconds(5);
constexpr absl::Duration kDeadline = absl::Seconds(10);  // Of every wait: a hang fails a test.

uint8_t Byte(int sender, int receiver, int message, int64_t i) {
  return static_cast<uint8_t>(i * 131 + sender * 17 + receiver * 29 + message * 7 + 1);
}

bool WriteAll(int fd, const std::string& data) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = write(fd, data.data() + done, data.size() - done);
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

// Reads until `fd` holds a line ending in '\n' or closes; empty on EOF before a full line.
std::string ReadLine(int fd) {
  std::string line;
  char c;
  while (read(fd, &c, 1) == 1) {
    if (c == '\n') return line;
    line.push_back(c);
  }
  return "";
}

std::string HexOf(const std::string& bytes) {
  std::string out;
  for (unsigned char c : bytes) absl::StrAppend(&out, absl::Hex(c, absl::kZeroPad2));
  return out;
}

std::string Unhex(absl::string_view hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    out.push_back(static_cast<char>(std::stoi(std::string(hex.substr(i, 2)), nullptr, 16)));
  }
  return out;
}

// One process of a trial. Protocol over its pipes: it writes "ADDR <hex>", reads the table (one
// hex address per line), connects, writes "READY", waits for "GO", posts and waits; a receiver
// then writes one "RESULT sender=S ok=O intact=I after_ms=T error=E" line per sender.
int RunChild(int process, int up, int down) {
  UcxOptions options;
  options.process = process;
  options.transports = "sm,cma,self";
  options.drain_timeout = absl::Seconds(1);
  absl::StatusOr<std::unique_ptr<UcxTransport>> made = UcxTransport::Create(options);
  if (!made.ok()) return 2;
  UcxTransport& t = **made;
  if (!WriteAll(up, absl::StrCat("ADDR ", HexOf(t.WorkerAddress()), "\n"))) return 3;
  std::vector<std::string> addresses;
  for (int p = 0; p < kProcesses; ++p) addresses.push_back(Unhex(ReadLine(down)));
  if (!t.ConnectPeers(addresses).ok()) return 4;
  const bool sender = process < kSenders;
  // Sender: one buffer per receiver and message; receiver: one per sender and message.
  const int others = sender ? kReceivers : kSenders;
  std::vector<std::vector<uint8_t>> buffers(others * kMessages, std::vector<uint8_t>(kBytes));
  for (int o = 0; o < others; ++o) {
    for (int m = 0; m < kMessages; ++m) {
      std::vector<uint8_t>& b = buffers[o * kMessages + m];
      if (sender) {
        for (int64_t i = 0; i < kBytes; ++i) b[i] = Byte(process, o, m, i);
      }
      if (!t.RegisterMemory(b.data(), kBytes, MemoryKind::kHost).ok()) return 5;
    }
  }
  if (!WriteAll(up, "READY\n") || ReadLine(down) != "GO") return 6;
  const absl::Time start = absl::Now();
  std::vector<std::vector<RequestId>> requests(others);
  std::vector<absl::Status> status(others);  // A receiver's outcome per sender.
  for (int o = 0; o < others; ++o) {
    const int peer = sender ? kSenders + o : o;
    for (int m = 0; m < kMessages; ++m) {
      const MessageTag tag = MakeTag(1, m, sender ? process : peer);
      absl::StatusOr<RequestId> r =
          sender ? t.PostSend(peer, tag, buffers[o * kMessages + m].data(), kBytes)
                 : t.PostReceive(peer, tag, buffers[o * kMessages + m].data(), kBytes);
      if (r.ok()) {
        requests[o].push_back(*r);
      } else if (status[o].ok()) {
        status[o] = r.status();  // A post to a peer already found dead fails, naming it.
      }
    }
  }
  if (sender) {  // Lives on (as a trainer would) until killed or told to end.
    for (int o = 0; o < others; ++o) (void)t.WaitAll(requests[o], start + kDeadline);
    return ReadLine(down) == "END" ? 0 : 7;
  }
  // Every request is tested in turn, so that each sender's outcome and time are its own.
  std::vector<double> after_ms(kSenders, 0);
  for (bool pending = true; pending;) {
    pending = false;
    for (int s = 0; s < kSenders; ++s) {
      std::vector<RequestId>& left = requests[s];
      for (size_t i = 0; i < left.size();) {
        absl::StatusOr<bool> done = t.Test(left[i]);
        if (done.ok() && !*done) {
          ++i;
          continue;
        }
        if (!done.ok() && status[s].ok()) status[s] = done.status();
        left.erase(left.begin() + static_cast<ptrdiff_t>(i));
      }
      if (!left.empty() && absl::Now() > start + kDeadline) {
        status[s] = t.WaitAll(left, absl::InfinitePast());  // Cancels them, naming their peer.
        left.clear();
      }
      if (left.empty() && after_ms[s] == 0) {
        after_ms[s] = absl::ToDoubleMilliseconds(absl::Now() - start);
      }
      pending = pending || !left.empty();
    }
    absl::SleepFor(absl::Microseconds(100));
  }
  for (int s = 0; s < kSenders; ++s) {
    bool intact = status[s].ok();
    for (int m = 0; intact && m < kMessages; ++m) {
      const std::vector<uint8_t>& b = buffers[s * kMessages + m];
      for (int64_t i = 0; i < kBytes; ++i) {
        if (b[i] != Byte(s, process - kSenders, m, i)) {
          intact = false;
          break;
        }
      }
    }
    std::string error(status[s].message());
    for (char& c : error) {
      if (c == '\n') c = ' ';
    }
    WriteAll(up, absl::StrCat("RESULT sender=", s, " ok=", status[s].ok(), " intact=", intact,
                              " after_ms=", after_ms[s], " error=", error, "\n"));
  }
  return 0;
}

struct Child {
  pid_t pid = -1;
  int up = -1;    // Read end: what the child writes.
  int down = -1;  // Write end: what the child reads.
  std::string out;
};

// Reads what the children write for up to `wait_ms`; false once every child closed its pipe.
bool ReadSome(std::vector<Child>& children, int wait_ms) {
  std::vector<pollfd> fds;
  for (Child& c : children) {
    if (c.up >= 0) fds.push_back({c.up, POLLIN, 0});
  }
  if (fds.empty()) return false;
  if (poll(fds.data(), fds.size(), wait_ms) < 0) return true;
  for (const pollfd& f : fds) {
    if (!(f.revents & (POLLIN | POLLHUP))) continue;
    for (Child& c : children) {
      if (c.up != f.fd) continue;
      char buf[4096];
      const ssize_t n = read(c.up, buf, sizeof(buf));
      if (n > 0) {
        c.out.append(buf, static_cast<size_t>(n));
      } else {
        close(c.up);
        c.up = -1;
      }
    }
  }
  return true;
}

// Reads what the children write until each closed its pipe or `until` passes.
void Collect(std::vector<Child>& children, absl::Time until) {
  while (absl::Now() < until && ReadSome(children, 10)) {
  }
}

// Waits until every child wrote `lines` lines starting with `prefix`, or `until`.
bool AwaitLines(std::vector<Child>& children, const std::string& prefix, int lines,
                absl::Time until) {
  for (;;) {
    bool all = true;
    for (Child& c : children) {
      int seen = 0;
      for (absl::string_view l : absl::StrSplit(c.out, '\n')) seen += absl::StartsWith(l, prefix);
      all = all && seen >= lines;
    }
    if (all) return true;
    if (absl::Now() >= until || !ReadSome(children, 10)) return false;
  }
}

uint64_t BaseSeed() {
  uint64_t seed = 42;
  if (const char* s = std::getenv("WSYNC_CMA_KILL_SEED"); s != nullptr) {
    (void)absl::SimpleAtoi(s, &seed);
  }
  return seed;
}

struct TrialOutcome {
  int failed_waits = 0;   // Receivers whose messages from the victim failed.
  int failed_copies = 0;  // Of those, failed by UCX's copy from the exited process.
  int wedged = 0;         // Receivers whose messages from the live sender stalled.
};

// One trial: the victim sender is SIGKILLed `kill_after` after GO.
TrialOutcome RunTrial(int victim, absl::Duration kill_after) {
  TrialOutcome outcome;
  std::vector<Child> children(kProcesses);
  for (int p = 0; p < kProcesses; ++p) {
    int up[2], down[2];
    if (pipe(up) != 0 || pipe(down) != 0) {
      ADD_FAILURE() << "pipe: " << std::strerror(errno);
      return outcome;
    }
    const pid_t pid = fork();
    if (pid == 0) {
      close(up[0]);
      close(down[1]);
      for (int q = 0; q < p; ++q) {
        if (children[q].up >= 0) close(children[q].up);
        close(children[q].down);
      }
      _exit(RunChild(p, up[1], down[0]));
    }
    close(up[1]);
    close(down[0]);
    children[p] = Child{pid, up[0], down[1], ""};
  }
  const absl::Time setup_until = absl::Now() + absl::Seconds(30);
  bool ok = AwaitLines(children, "ADDR ", 1, setup_until);
  std::string table;
  for (Child& c : children) {
    const size_t at = c.out.find("ADDR ");
    const size_t end = c.out.find('\n', at);
    if (at == std::string::npos || end == std::string::npos) ok = false;
    if (ok) absl::StrAppend(&table, c.out.substr(at + 5, end - at - 5), "\n");
  }
  if (ok) {
    for (Child& c : children) ok = ok && WriteAll(c.down, table);
  }
  ok = ok && AwaitLines(children, "READY", 1, setup_until);
  EXPECT_TRUE(ok) << "the trial's processes did not start";
  if (ok) {
    for (Child& c : children) WriteAll(c.down, "GO\n");
    absl::SleepFor(kill_after);
    kill(children[victim].pid, SIGKILL);
    for (int p = 0; p < kSenders; ++p) {
      if (p != victim) WriteAll(children[p].down, "END\n");
    }
  } else {
    for (Child& c : children) kill(c.pid, SIGKILL);
  }
  const absl::Time killed = absl::Now();
  Collect(children, killed + kDeadline + absl::Seconds(10));
  for (int p = 0; p < kProcesses; ++p) {
    int wstatus = 0;
    // A child closes its pipe as it exits, a moment before it can be reaped.
    const absl::Time reap_until = absl::Now() + absl::Seconds(5);
    pid_t reaped = 0;
    while ((reaped = waitpid(children[p].pid, &wstatus, WNOHANG)) == 0 &&
           absl::Now() < reap_until) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    if (reaped == 0) {
      ADD_FAILURE() << "process " << p << " hung";
      kill(children[p].pid, SIGKILL);
      waitpid(children[p].pid, &wstatus, 0);
    }
    close(children[p].down);
    if (children[p].up >= 0) close(children[p].up);
    if (!ok) continue;
    if (p == victim) {
      EXPECT_TRUE(WIFSIGNALED(wstatus) && WTERMSIG(wstatus) == SIGKILL);
      continue;
    }
    SCOPED_TRACE(absl::StrCat("process ", p, " output:\n", children[p].out));
    EXPECT_TRUE(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0)
        << "process " << p
        << " died: " << (WIFSIGNALED(wstatus) ? strsignal(WTERMSIG(wstatus)) : "exit")
        << " (status " << wstatus << ")";
    if (p < kSenders) continue;
    int results = 0;
    for (absl::string_view line : absl::StrSplit(children[p].out, '\n')) {
      if (!absl::ConsumePrefix(&line, "RESULT ")) continue;
      ++results;
      const size_t error_at = line.find(" error=");
      const std::string error(line.substr(error_at + 7));
      int sender = -1;
      bool status_ok = false, intact = false;
      double after_ms = 0;
      for (absl::string_view field : absl::StrSplit(line.substr(0, error_at), ' ')) {
        std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(field, '=');
        if (kv.first == "sender") (void)absl::SimpleAtoi(kv.second, &sender);
        if (kv.first == "ok") status_ok = kv.second == "1";
        if (kv.first == "intact") intact = kv.second == "1";
        if (kv.first == "after_ms") (void)absl::SimpleAtod(kv.second, &after_ms);
      }
      if (sender != victim || status_ok) {
        // UCX 1.13's shared-memory FIFO of a receiver is shared by its senders: one killed
        // between reserving an element and marking it written stalls every later message to that
        // receiver (transport/ucx/README.md). The receiver lives and its waits end at their
        // deadline; any other outcome than intact data or that deadline fails.
        const bool wedged = !status_ok && absl::StrContains(error, "missed the deadline");
        outcome.wedged += wedged;
        EXPECT_TRUE((status_ok && intact) || wedged)
            << "messages from live sender " << sender << ": " << error;
        continue;
      }
      ++outcome.failed_waits;
      outcome.failed_copies += absl::StrContains(error, "Input/output error");
      EXPECT_TRUE(absl::StrContains(error, absl::StrCat("process ", victim)))
          << "the error does not name the killed process: " << error;
      EXPECT_LE(absl::Milliseconds(after_ms), kill_after + kFailBound) << error;
    }
    EXPECT_EQ(results, kSenders);
  }
  return outcome;
}

class CmaKillTest : public ::testing::TestWithParam<int> {};

TEST_P(CmaKillTest, AKilledSenderNeverKillsAReceiver) {
  signal(SIGPIPE, SIG_IGN);  // A write to a child that died fails instead.
  const uint64_t seed = BaseSeed() * 1000 + static_cast<uint64_t>(GetParam());
  std::mt19937_64 rng(seed);
  int hits = 0, copy_failures = 0, wedged = 0;
  const int trials = static_cast<int>(test::ScaledCases(kTrialsPerBlock, 2));
  for (int trial = 0; trial < trials; ++trial) {
    const int victim = static_cast<int>(rng() % kSenders);
    const absl::Duration kill_after =
        absl::Microseconds(static_cast<int64_t>(rng() % absl::ToInt64Microseconds(kKillWindow)));
    std::printf("seed %llu trial %d: kill sender %d after %.3f ms\n",
                static_cast<unsigned long long>(seed), trial, victim,
                absl::ToDoubleMilliseconds(kill_after));
    std::fflush(stdout);
    SCOPED_TRACE(absl::StrCat("seed ", seed, " trial ", trial));
    const TrialOutcome outcome = RunTrial(victim, kill_after);
    hits += outcome.failed_waits;
    copy_failures += outcome.failed_copies;
    wedged += outcome.wedged;
    if (HasFailure()) break;
  }
  // A failed copy shows as UCX's "Input/output error": the copy ran from the exited sender.
  std::printf(
      "block %d: %d of %d receivers' waits for the killed sender failed, %d by UCX's "
      "failed copy; %d stalled on a wedged FIFO\n",
      GetParam(), hits, trials * kReceivers, copy_failures, wedged);
}

INSTANTIATE_TEST_SUITE_P(Blocks, CmaKillTest, ::testing::Range(0, kBlocks));

}  // namespace
}  // namespace wsync
