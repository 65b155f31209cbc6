#ifndef WSYNC_INTEGRATION_BENCH_BENCH_JOBS_H_
#define WSYNC_INTEGRATION_BENCH_BENCH_JOBS_H_

// The wsync jobs the benchmarks launch (`wsync-bench sync`, `wsync-bench compare`): what a
// layout pair's schedule sends, one job of wsync_host processes (integration/host: libwsync.so
// loaded with dlopen and driven through its C ABI, as an engine does) over UCX with its checks
// and its time limit, and where the binaries they need are. Nothing here reads a flag: every
// setting comes in a JobOptions (filled once per benchmark from its flags, flags.cc).

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "executor/schedule.h"
#include "integration/harness/launcher.h"
#include "planner/models.h"
#include "planner/quant_plan.h"
#include "plugin/settings.h"

namespace wsync::bench {

// What every wsync job of a benchmark is launched with.
struct JobOptions {
  // wsync_host (the job's processes; --sync_worker) and the `wsync` CLI (its `wsync
  // coordinator`): paths, or empty until ResolveBinaries finds them.
  std::string host;
  std::string wsync;
  std::string policy = std::string(kDefaultReplicaPolicy);          // Of the plan and processes.
  double budget = static_cast<double>(kDefaultStagingBudgetBytes);  // Per peer direction.
  // Base of each job's limit (WsyncJobLimit) and the limit of each ucx_perftest run.
  double timeout_s = 60;
  // Verification jobs check every rollout element instead of every chunk's hash.
  bool verify_elements = false;
  // The session settings given to wsync-bench ("--<setting>=<value>", plugin/settings.h), handed
  // to every wsync_host of every job before the job's own arguments (which win where a job sets
  // the same setting: a contestant's verify, a row's delta, a policy compared).
  std::vector<std::string> settings;
};

// What the schedule sends to the rollout processes (every process on one node, as the benchmark
// jobs run them).
struct ScheduleFacts {
  int32_t trainers = 0;
  int32_t rollouts = 0;
  int64_t bytes_per_rollout = 0;  // The busiest rollout process's received bytes.
  int64_t bytes_total = 0;        // All rollout processes (quantization steps' bytes included).
  // The e4m3 elements all rollout processes hold (FP8 targets, planner/quant_plan.h): what their
  // verification checks against the reference quantizer; 0 without quantized parameters.
  int64_t fp8_elements = 0;
  // The quantization steps' bytes (CountQuantWireBytes: e4m3, scales, gathered bf16, and the
  // quantized parameters' bf16 bytes) and the bytes of the plan's other segments (parameters sent
  // as they are) to the rollouts.
  QuantWireBytes quant;
  int64_t plain_bytes = 0;
  // The most buffer bytes one process (trainer or rollout) holds: what it fills or checks.
  int64_t largest_process_bytes = 0;
  int64_t largest_message = 0;
  bool largest_direct = false;
  int64_t messages = 0;  // Received by the busiest rollout process.
  int64_t direct_messages = 0;
  int64_t received_chunks = 0;  // Chunks all rollout processes receive from their peers.
  int32_t rounds = 0;           // The most rounds of any rollout process.
  int64_t median_message = 0;   // Bytes-weighted median message size of that process.
  // Bytes per sync of every sender -> receiver pair that carries any, largest first.
  std::vector<int64_t> pair_bytes;
  // Pairs carrying at least a quarter of the busiest pair's bytes: the sender/receiver pairs
  // that stream at the same time, as many as concurrent ucx_perftest pairs are fair to compare.
  int32_t busy_pairs = 0;
};

// Plans `model` from `from` to `to` with the replica policy `policy` and schedules it with a
// staging budget of `budget` bytes per peer direction, quantization steps included (what a
// process's sync runs for FP8 targets). Fails when a layout, the policy, the plan
// or the schedule fails, or nothing is sent.
absl::StatusOr<ScheduleFacts> ScheduleFactsFor(const ModelSpec& model, const std::string& from,
                                               const std::string& to, double budget,
                                               const std::string& policy);

// The named layout `to` with quant=`quant` added: "vllm(tp=2)" and "fp8_block" give
// "vllm(tp=2,quant=fp8_block)", "vllm()" gives "vllm(quant=fp8_block)". InvalidArgument when `to`
// does not end with ')' after its '(' or already names a quant.
absl::StatusOr<std::string> QuantizedSpec(const std::string& to, const std::string& quant);

// ucx_perftest messages of `message_bytes` that carry two syncs' bytes to the busiest rollout
// process, at least 10.
int32_t PerftestIterations(const ScheduleFacts& facts, int64_t message_bytes);

// The UCX transports of a wsync job.
struct Transports {
  std::string name;     // "shm" or "tcp".
  std::string tls;      // UCX_TLS.
  std::string devices;  // UCX_NET_DEVICES; empty: UCX's default.
};

// What a job checks, besides the bytes and rounds every rollout received (always).
enum class JobCheck {
  kNone,  // Trainers' buffers hold a constant: for timed jobs.
  // Trainers write test::FillPattern before every sync and wsync's verify=true compares the
  // sender's and the receiver's xxh3 of every chunk (DataLoss on a mismatch); every chunk the
  // schedule sends must be checked. At memory speed. With FP8 targets the rollouts also check
  // every e4m3 element and scale against the reference quantizer (--verify_quant), and all of
  // them (ScheduleFacts::fp8_elements) must have been checked.
  kChunkHashes,
  // Trainers write the logical value of every element and rollouts check every element they
  // hold (test::CheckLogical): also what no chunk covers, but about a minute per GB per version
  // here, one thread per process.
  kElements,
  kTimedHashes,  // verify=true on constant buffers: what verify=true costs a timed sync.
  kTimedKeyed,   // Keyed verify (a MAC per chunk) on constant buffers: what it costs.
};

// The time limit of a job of `versions` syncs: `timeout_s`, plus per version JobLimitSeconds's
// allowance for the bytes the busiest process holds (with the element check's allowance for
// kElements, and for kChunkHashes with FP8 targets, whose reference check walks every element).
absl::Duration WsyncJobLimit(const ScheduleFacts& facts, int32_t versions, JobCheck check,
                             double timeout_s);

// The job check of a benchmark's verification job: kElements with `verify_elements`, else
// kChunkHashes; and its description for the progress lines and tables.
JobCheck VerificationCheck(bool verify_elements);
std::string VerificationText(JobCheck check);

// One timed sync: the slowest process's figures.
struct SyncSample {
  // Transfer (agreement and decision excluded), slowest process: the library's wsync_stats_t
  // seconds.
  double seconds = 0;
  // The sync call (wsync.h's sync) as its host sees it, slowest process: the trigger, the
  // agreement, the transfer and the commit decision.
  double sync_seconds = 0;
  // sync_seconds less seconds: what the slowest sync call took beyond the slowest transfer, which
  // the C ABI's figures cannot split further (the trigger and the agreement before the transfer
  // and the commit decision after it).
  double outside_seconds = 0;
  int64_t rollout_bytes = 0;  // Received by the busiest rollout process.
  int64_t total_bytes = 0;    // Received by all rollout processes.
  // CPU time (user and system, every thread: the library's too) of all processes during the
  // sync call: the work the sync costs, which other load on the cores inflates far less than
  // seconds.
  double cpu_seconds = 0;
  double cpu_user_seconds = 0;  // The user-space part of cpu_seconds (the rest is the kernel's).
  // Bytes all processes sent to their peers during the sync, as the library counts them in its
  // metrics (wsync_bytes_sent_total, read through metrics_text: the schedule's message bytes of
  // each sync whose transfer ran to the end), quantization steps and relay forwards included.
  int64_t wire_bytes = 0;
  // libwsync.so as every process had it mapped (/proc/self/maps), the same path in all.
  std::string library;
};

// Runs one wsync job (trainers and rollouts of options.host, `options.wsync coordinator`) of
// warmup + syncs versions over `t`, with `check`, options.budget and options.policy. Returns the
// timed syncs; fails when a process fails (a wrong byte or chunk hash included), the received bytes
// or rounds differ from `facts`, or (kChunkHashes) the rollouts checked fewer chunks than the
// schedule sends. Sets *peak_rss_bytes (when not null) to every process's peak resident set, by
// global process id. Every process and every step of a process is bounded by WsyncJobLimit; a
// process that reports no libwsync.so mapped (a host that is not wsync_host) fails the job.
// options.host and options.wsync must be resolved (ResolveBinaries).
absl::StatusOr<std::vector<SyncSample>> RunWsync(const ScheduleFacts& facts,
                                                 const std::string& model, const std::string& from,
                                                 const std::string& to, const Transports& t,
                                                 int32_t warmup, int32_t syncs, JobCheck check,
                                                 const JobOptions& options,
                                                 std::vector<int64_t>* peak_rss_bytes = nullptr);

// The figure `key` of a STATS line (harness::WorkerResult::stats), 0 when absent or malformed.
double StatsFigure(const std::map<std::string, std::string>& stats, const std::string& key);

// The sum of a STATS line's figures whose keys start with `prefix` (wire_sent_<path> over the
// path classes).
int64_t SumStatsFigures(const std::map<std::string, std::string>& stats, const std::string& prefix);

// Two network namespaces joined by a veth shaped by tc tbf to `rate` (tc's syntax: "1000mbit") on
// both ends (burst 1 MB). nullopt with *reason where namespaces cannot be made (not root, no
// iproute2); Internal when tc fails.
absl::StatusOr<std::optional<harness::NetnsPair>> ShapedNetnsPair(const std::string& rate,
                                                                  std::string* reason);

// This program's path (/proc/self/exe).
absl::StatusOr<std::string> SelfPath();

// A sibling binary of `self` (this wsync-bench): `given` when not empty (NotFound unless it is
// an executable file), else the first executable of `self`'s folder + "/" + each of
// `relative_paths`; NotFound naming them all (and `flag`, to pass instead) when none is.
absl::StatusOr<std::string> FindSibling(const std::string& self, const std::string& given,
                                        const std::vector<std::string>& relative_paths,
                                        const std::string& flag);

// Fills options->host (wsync_host: next to `self`, as in a bundle's bin/, or in the build tree,
// integration/host/) and options->wsync (the `wsync` CLI: next to `self`, or in the build tree,
// integration/cli/) where they are empty; a path already there must be executable.
absl::Status ResolveBinaries(const std::string& self, JobOptions* options);

// `name` looked up in PATH (or taken as is when it holds a '/'); NotFound naming `flag`.
absl::StatusOr<std::string> FindInPath(const std::string& name, const std::string& flag);

}  // namespace wsync::bench

#endif  // WSYNC_INTEGRATION_BENCH_BENCH_JOBS_H_
