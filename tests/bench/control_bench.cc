// The cost of the sealed control channel (control/framing.h, frame_seal.h), side by side
// with unsealed frames: a roster of `roster_kib` KiB broadcast to `connections` connections (one
// encoded body, hashed once when sealed, plus a tag per connection), and one small frame (a
// contribution of 100 bytes) each way per call. Every frame is written to a socket pair and read
// and decoded on the other end, as on a real connection. Also the whole rendezvous of a
// coordinator and 16 clients with 256 KiB manifests (sealed, as shipped) for scale.
//
//   build/tests/bench/control_bench --benchmark_repetitions=3

#include <sys/socket.h>

#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "benchmark/benchmark.h"
#include "control/client.h"
#include "control/coordinator.h"
#include "control/frame_seal.h"
#include "control/framing.h"
#include "control/socket.h"

namespace wsync {
namespace {

constexpr char kSecret[] = "correct-horse-battery-staple-42-0123";

std::string RandomText(size_t size) {
  std::mt19937_64 rng(3);
  std::string out(size, '\0');
  for (char& c : out) c = static_cast<char>('a' + rng() % 26);
  return out;
}

struct Connection {
  Connection(bool sealed) : reader(kDefaultMaxFrameBytes) {
    int fds[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, fds) != 0) std::abort();
    a = UniqueFd(fds[0]);
    b = UniqueFd(fds[1]);
    if (sealed) {
      writer.Seal(std::make_unique<FrameSealer>(std::string(32, 'k')));
      reader.Open(std::make_unique<FrameOpener>(std::string(32, 'k'), "the peer"));
    }
  }
  // Writes what is queued and reads one whole frame, alternating (one thread).
  void Deliver() {
    for (;;) {
      if (!writer.Flush(a.get()).ok()) std::abort();
      absl::StatusOr<bool> complete = reader.ReadSome(b.get());
      if (!complete.ok()) std::abort();
      if (*complete) break;
    }
    absl::StatusOr<control::Frame> frame = reader.TakeFrame();
    if (!frame.ok()) std::abort();
    benchmark::DoNotOptimize(frame->kind_case());
  }
  UniqueFd a, b;
  FrameWriter writer;
  FrameReader reader;
};

// Args: roster KiB, connections, sealed (0/1).
void BM_BroadcastRoster(benchmark::State& state) {
  const bool sealed = state.range(2) != 0;
  std::vector<std::unique_ptr<Connection>> connections;
  for (int64_t i = 0; i < state.range(1); ++i) {
    connections.push_back(std::make_unique<Connection>(sealed));
  }
  control::Frame frame;
  frame.mutable_roster()->add_blobs(RandomText(static_cast<size_t>(state.range(0)) << 10));
  for (auto _ : state) {
    absl::StatusOr<std::shared_ptr<const OutgoingFrame>> prepared =
        PrepareFrame(frame, kDefaultMaxFrameBytes);
    for (auto& c : connections) c->writer.Enqueue(*prepared);
    for (auto& c : connections) c->Deliver();
  }
  state.SetBytesProcessed(state.iterations() * state.range(0) * 1024 * state.range(1));
}
BENCHMARK(BM_BroadcastRoster)
    ->ArgNames({"roster_kib", "connections", "sealed"})
    ->ArgsProduct({{64, 4096}, {16}, {0, 1}})
    ->Unit(benchmark::kMillisecond);

// Args: sealed (0/1). One 100-byte contribution one way and its result back.
void BM_SmallFrameRoundTrip(benchmark::State& state) {
  Connection up(state.range(0) != 0), down(state.range(0) != 0);
  control::Frame contribute;
  contribute.mutable_contribute()->set_payload(RandomText(100));
  control::Frame result;
  result.mutable_result()->add_payloads(RandomText(100));
  for (auto _ : state) {
    up.writer.Enqueue(*PrepareFrame(contribute, kDefaultMaxFrameBytes));
    up.Deliver();
    down.writer.Enqueue(*PrepareFrame(result, kDefaultMaxFrameBytes));
    down.Deliver();
  }
}
BENCHMARK(BM_SmallFrameRoundTrip)->ArgName("sealed")->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);

// A coordinator and 16 clients over loopback: connect, handshake, join with 256 KiB manifests,
// and the roster (4 MiB) back to each.
void BM_Rendezvous16(benchmark::State& state) {
  constexpr int kProcesses = 16;
  const std::string manifest = RandomText(256 << 10);
  for (auto _ : state) {
    CoordinatorOptions options;
    options.job_id = "bench";
    options.secret = kSecret;
    options.num_trainers = kProcesses / 2;
    options.num_rollouts = kProcesses / 2;
    std::unique_ptr<Coordinator> coordinator = *Coordinator::Start(options);
    std::vector<std::thread> threads;
    for (int id = 0; id < kProcesses; ++id) {
      threads.emplace_back([&, id] {
        ControlClientOptions o;
        o.coordinator_port = coordinator->port();
        o.job_id = "bench";
        o.secret = kSecret;
        o.role = id < kProcesses / 2 ? ControlRole::kTrainer : ControlRole::kRollout;
        o.rank = id % (kProcesses / 2);
        o.node_id = "bench-node";
        std::unique_ptr<ControlClient> client = *ControlClient::Connect(o);
        // Distinct manifests (as processes of different ranks have): the roster holds all 16.
        absl::StatusOr<Roster> roster =
            client->Join(JoinRequest{absl::StrCat(id, manifest), absl::StrCat("address-", id), ""},
                         absl::Now() + absl::Seconds(60));
        if (!roster.ok()) std::abort();
      });
    }
    for (std::thread& t : threads) t.join();
  }
}
BENCHMARK(BM_Rendezvous16)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace wsync

BENCHMARK_MAIN();
