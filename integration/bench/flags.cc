#include "integration/bench/flags.h"

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "integration/host/table_setting_args.h"
#include "plugin/settings.h"

// Defaults come from the options structs, so that a flag and its field cannot disagree. A string
// flag whose default is "" means the benchmark's own default (they differ between benchmarks).

// Shared by several benchmarks.
ABSL_FLAG(std::string, model, "",
          "Model: a built-in name (`wsync plan --help` lists them) or a config.json path; default: "
          "the benchmark's.");
ABSL_FLAG(std::string, from, "", "Trainer layout; default: the benchmark's.");
ABSL_FLAG(std::string, to, "", "Rollout layout; default: the benchmark's.");
ABSL_FLAG(int32_t, layers, 0,
          "executor: keep only the first N transformer layers (0: the benchmark's 2).");
ABSL_FLAG(int32_t, repeats, 0,
          "executor: syncs per scenario (0: 5), the median reported; compare: rounds of every "
          "contestant (0: 2).");
ABSL_FLAG(bool, one_core, wsync::bench::ExecutorBenchOptions().one_core,
          "Pin every thread to one core, so that pack, unpack and memcpy are each measured "
          "without other threads competing for memory bandwidth.");
ABSL_FLAG(std::string, out, "", "compare: folder of compare.json and compare.png.");
ABSL_FLAG(std::string, sync_worker, "",
          "The host program of the jobs' processes (wsync_host: libwsync.so through its C ABI); "
          "default: next to wsync-bench, else in its build tree.");
ABSL_FLAG(std::string, wsync, "",
          "The wsync CLI (its `coordinator` and `calibrate` commands); default: next to "
          "wsync-bench, else in its build tree (integration/cli/wsync).");
ABSL_FLAG(double, sync_timeout_s, wsync::bench::JobOptions().timeout_s,
          "Limit of each ucx_perftest run, and the base of each wsync job's limit, which adds "
          "per version 10 s per GB the busiest process holds (160 s with --verify_elements).");
ABSL_FLAG(bool, verify_elements, false,
          "sync and compare: the verification jobs check every rollout element against its "
          "logical value (about a minute per GB per version here) instead of comparing the "
          "sender's and the receiver's hash of every chunk.");

// sync (and its --memory cuda).
ABSL_FLAG(int32_t, sync_syncs, wsync::bench::SyncBenchOptions().syncs,
          "Timed syncs per wsync job (after the warm-up syncs).");
ABSL_FLAG(int32_t, sync_warmup, wsync::bench::SyncBenchOptions().warmup,
          "Untimed syncs at the start of every wsync job.");
ABSL_FLAG(int32_t, sync_rounds, wsync::bench::SyncBenchOptions().rounds,
          "Times the contestants (wsync shm, perftest shm, wsync tcp, perftest tcp) run, in turn.");
ABSL_FLAG(bool, sync_verify, wsync::bench::SyncBenchOptions().verify_first,
          "First run one verification job of 2 versions per scenario and transport: every chunk's "
          "hash compared (--verify_elements: every rollout element checked).");
ABSL_FLAG(
    bool, verify_costs, false,
    "Also time wsync with verify=true (xxh3 per chunk, checked before the commit) and with keyed "
    "verify (a MAC per chunk) in the same rounds, and print their costs as ratios of seconds per "
    "sync with and without them.");
ABSL_FLAG(std::string, sync_shm_tls, wsync::bench::SyncBenchOptions().shm_tls,
          "UCX_TLS of the shared-memory contestants.");
ABSL_FLAG(std::string, sync_tcp_tls, wsync::bench::SyncBenchOptions().tcp_tls,
          "UCX_TLS of the TCP contestants.");
ABSL_FLAG(std::string, sync_tcp_devices, wsync::bench::SyncBenchOptions().tcp_devices,
          "UCX_NET_DEVICES of the TCP contestants.");
ABSL_FLAG(std::string, sync_perftest, wsync::bench::SyncBenchOptions().perftest,
          "ucx_perftest binary (searched in PATH).");
ABSL_FLAG(int32_t, sync_perftest_iters, 0,
          "Messages per ucx_perftest run; 0: as many as carry two syncs' bytes to one rollout "
          "process.");
ABSL_FLAG(int64_t, sync_perftest_size, 0,
          "ucx_perftest message bytes; 0: the largest message the schedule sends.");
ABSL_FLAG(bool, sync_perftest_concurrent, wsync::bench::SyncBenchOptions().perftest_concurrent,
          "Also run as many concurrent ucx_perftest pairs as the schedule has busy sender -> "
          "receiver pairs (each carrying at least a quarter of the busiest pair's bytes).");
ABSL_FLAG(int32_t, sync_perftest_pairs, 0,
          "Concurrent ucx_perftest pairs; 0: the schedule's busy sender -> receiver pairs.");
ABSL_FLAG(std::string, sync_single_from, wsync::bench::SyncBenchOptions().single_from,
          "Trainer layout of the 1->1 wsync contestant (compared with one ucx_perftest pair); "
          "empty: none.");
ABSL_FLAG(std::string, sync_single_to, wsync::bench::SyncBenchOptions().single_to,
          "Rollout layout of the 1->1 contestant.");
ABSL_FLAG(bool, sync_perftest_wsync_settings,
          wsync::bench::SyncBenchOptions().perftest_wsync_settings,
          "Run ucx_perftest with the UCX settings wsync's processes apply (UcxDefaultSettings); "
          "false: with UCX's own defaults.");
ABSL_FLAG(std::string, sync_json, "", "Also write the table as JSON to this path.");
ABSL_FLAG(std::string, sync_quant, wsync::bench::SyncBenchOptions().quant,
          "The FP8 scenario: --sync_quant_from -> --sync_quant_to with quant=Q (fp8_block, "
          "fp8_channel or fp8_tensor) over UCX TCP, verified against the reference quantizer and "
          "timed next to the sync of the same layouts into bf16 (bytes on the wire and seconds, "
          "as ratios); empty: none.");
ABSL_FLAG(std::string, sync_quant_from, wsync::bench::SyncBenchOptions().quant_from,
          "Trainer layout of the FP8 scenario.");
ABSL_FLAG(std::string, sync_quant_to, wsync::bench::SyncBenchOptions().quant_to,
          "Rollout layout of the FP8 scenario, without quant= (--sync_quant adds it).");
ABSL_FLAG(std::string, memory, wsync::bench::SyncBenchOptions().memory,
          "Where the weights live: host (UCX contestants) or cuda (GPU only: CUDA IPC or NCCL, "
          "against cudaMemcpy device-to-device).");
ABSL_FLAG(std::string, cuda_from, wsync::bench::CudaSyncOptions().from,
          "Trainer layout of --memory cuda.");
ABSL_FLAG(std::string, cuda_to, wsync::bench::CudaSyncOptions().to,
          "Rollout layout of --memory cuda.");
ABSL_FLAG(std::string, cuda_path_transports, "",
          "Path transports of --memory cuda (empty: CUDA IPC within the node; "
          "\"intra_node=nccl\": NCCL).");
ABSL_FLAG(bool, cuda_forked, false,
          "--memory cuda: each process of the job a forked OS process instead of a thread.");

// compare (and its memcpy child).
ABSL_FLAG(int32_t, compare_syncs, wsync::bench::CompareBenchOptions().syncs,
          "Timed syncs per contestant run (after the warm-up syncs).");
ABSL_FLAG(int32_t, compare_warmup, wsync::bench::CompareBenchOptions().warmup,
          "Untimed syncs at the start of every contestant run.");
ABSL_FLAG(int64_t, compare_bucket_bytes, wsync::bench::CompareBenchOptions().bucket_bytes,
          "Bucket size of the bucketed broadcast, bytes.");
ABSL_FLAG(std::string, compare_python, wsync::bench::CompareBenchOptions().python,
          "Python with torch (Debian's python3-torch) for the broadcast contestants and the plot.");
ABSL_FLAG(std::string, compare_scripts, wsync::bench::CompareBenchOptions().scripts,
          "Folder of broadcast_sync.py and plot_compare.py.");
ABSL_FLAG(double, compare_timeout_s, wsync::bench::CompareBenchOptions().timeout_s,
          "Limit of each broadcast, ucx_perftest and memcpy run, seconds (wsync jobs: "
          "--sync_timeout_s plus their bytes' allowance).");
ABSL_FLAG(bool, compare_long, false,
          "Without --model and --to: qwen2.5-0.5b and llama-3.2-1b (2.3 GiB), each to vllm(tp=2) "
          "and vllm(tp=1,dp=2) (the four scenarios took 1150 s at 3 rounds on the 2-core machine "
          "of docs/benchmarks.md).");
ABSL_FLAG(bool, compare_plot, wsync::bench::CompareBenchOptions().plot,
          "Write compare.png next to compare.json.");
ABSL_FLAG(int64_t, compare_memcpy_bytes, 0, "wsync-bench memcpy: bytes to copy.");
ABSL_FLAG(int32_t, compare_memcpy_pattern, wsync::bench::MemcpyOptions().pattern,
          "wsync-bench memcpy: the source's byte value.");

// predict.
ABSL_FLAG(std::string, predict_model, wsync::bench::PredictBenchOptions().model,
          "predict: the model synced.");
ABSL_FLAG(std::string, predict_scenarios, "",
          "predict: the scenarios to run, by name, comma-separated, or `all`; default: the six of "
          "the default run (all but 'netns tc tp2->tp2' and 'replicated dp2 shm').");
ABSL_FLAG(int32_t, predict_rounds, wsync::bench::PredictBenchOptions().rounds,
          "predict: rounds; each round calibrates and measures every scenario once, scenarios "
          "interleaved.");
ABSL_FLAG(int32_t, predict_syncs, wsync::bench::PredictBenchOptions().syncs,
          "predict: timed syncs per measured job.");
ABSL_FLAG(int32_t, predict_warmup, wsync::bench::PredictBenchOptions().warmup,
          "predict: untimed syncs before them.");
ABSL_FLAG(std::string, predict_rate, wsync::bench::PredictBenchOptions().rate,
          "predict: tc tbf rate of the veth link between the two namespaces.");
ABSL_FLAG(std::string, predict_probe_sizes, wsync::bench::PredictBenchOptions().probe_sizes,
          "predict: calibration message sizes.");
ABSL_FLAG(int32_t, predict_probe_repeats, wsync::bench::PredictBenchOptions().probe_repeats,
          "predict: calibration repeats.");
ABSL_FLAG(double, predict_timeout_s, wsync::bench::PredictBenchOptions().timeout_s,
          "predict: limit of each child job.");

// relay.
ABSL_FLAG(std::string, relay_model, wsync::bench::RelayBenchOptions().model, "Model of relay.");
ABSL_FLAG(std::string, relay_from, wsync::bench::RelayBenchOptions().from,
          "Trainer layout of relay.");
ABSL_FLAG(std::string, relay_to, wsync::bench::RelayBenchOptions().to, "Rollout layout of relay.");
ABSL_FLAG(int32_t, relay_rate_mbit, wsync::bench::RelayBenchOptions().rate_mbit,
          "Rate tc gives the veth between the namespaces, Mbit/s.");
ABSL_FLAG(std::string, relay_intra_link, wsync::bench::RelayBenchOptions().intra_link,
          "The shared-memory link the cost model assumes (SyntheticCalibration syntax).");
ABSL_FLAG(int32_t, relay_syncs, wsync::bench::RelayBenchOptions().syncs,
          "Timed syncs per job (after one warm-up sync).");
ABSL_FLAG(int32_t, relay_rounds, wsync::bench::RelayBenchOptions().rounds,
          "Jobs per mode, the modes alternating.");
ABSL_FLAG(double, relay_timeout_s, wsync::bench::RelayBenchOptions().timeout_s,
          "Limit of each job, seconds.");

// delta.
ABSL_FLAG(int32_t, delta_steps, wsync::bench::DeltaBenchOptions().steps,
          "delta: versions per job (one AdamW step each); the first is dense for every mode (it "
          "primes the senders' bases), the others are timed.");
ABSL_FLAG(int32_t, delta_rounds, wsync::bench::DeltaBenchOptions().rounds,
          "delta: jobs per row, the rows taking turns.");
ABSL_FLAG(std::string, delta_lrs, wsync::bench::DeltaBenchOptions().lrs,
          "delta: AdamW learning rates of the timed rows, comma-separated; every link's rows run "
          "at each.");
ABSL_FLAG(std::string, delta_verify_lrs, wsync::bench::DeltaBenchOptions().verify_lrs,
          "delta: learning rates of the verified delta=on jobs before the rounds (verify=hash; "
          "their bytes sent per version printed), comma-separated; empty: none.");
ABSL_FLAG(double, delta_weight_decay, wsync::bench::DeltaBenchOptions().weight_decay,
          "delta: AdamW's decoupled weight decay of the linear and embedding weights.");
ABSL_FLAG(std::string, delta_links, wsync::bench::DeltaBenchOptions().links,
          "delta: the links whose rows run, comma-separated: tcp (off, on), shm (off, on, auto), "
          "netns (off, on; root, else skipped).");
ABSL_FLAG(int32_t, delta_rate_mbit, wsync::bench::DeltaBenchOptions().rate_mbit,
          "delta: rate tc gives the veth between the namespaces, Mbit/s.");
ABSL_FLAG(bool, delta_verify_timed, wsync::bench::DeltaBenchOptions().verify_timed,
          "delta: verify=hash in the timed jobs too (every sync's chunk digests checked; the "
          "hashing is then in every figure).");

namespace wsync::bench {
namespace {

// The settings TakeSettingFlags took.
host::SettingArgs& GivenSettings() {
  static host::SettingArgs* const given = new host::SettingArgs(host::CompiledSettingArgs());
  return *given;
}

// The replica policy and staging budget of the plans: the settings given, else the defaults.
std::string Policy() {
  return GivenSettings().Value("replica_policy").value_or(JobOptions().policy);
}
double Budget() {
  int64_t bytes = 0;  // Checked by TakeCompiledSettings.
  const std::optional<std::string> given = GivenSettings().Value("staging_budget_bytes");
  return given.has_value() && absl::SimpleAtoi(*given, &bytes) ? static_cast<double>(bytes)
                                                               : JobOptions().budget;
}

// `flag` unless it is empty, else `fallback`.
std::string Or(const std::string& flag, const std::string& fallback) {
  return flag.empty() ? fallback : flag;
}

JobOptions JobOptionsFromFlags() {
  JobOptions job;
  job.host = absl::GetFlag(FLAGS_sync_worker);
  job.wsync = absl::GetFlag(FLAGS_wsync);
  job.policy = Policy();
  job.budget = Budget();
  job.settings = GivenSettings().Arguments();
  job.timeout_s = absl::GetFlag(FLAGS_sync_timeout_s);
  job.verify_elements = absl::GetFlag(FLAGS_verify_elements);
  return job;
}

}  // namespace

absl::Status TakeSettingFlags(int* argc, char** argv) {
  absl::StatusOr<host::SettingArgs> taken = host::TakeCompiledSettings(argc, argv);
  if (!taken.ok()) return taken.status();
  GivenSettings() = *std::move(taken);
  return absl::OkStatus();
}

ExecutorBenchOptions ExecutorOptionsFromFlags() {
  ExecutorBenchOptions o;
  o.model = Or(absl::GetFlag(FLAGS_model), o.model);
  if (absl::GetFlag(FLAGS_layers) > 0) o.layers = absl::GetFlag(FLAGS_layers);
  o.from = absl::GetFlag(FLAGS_from);
  o.to = absl::GetFlag(FLAGS_to);
  o.policy = Policy();
  o.budget = Budget();
  if (absl::GetFlag(FLAGS_repeats) > 0) o.repeats = absl::GetFlag(FLAGS_repeats);
  o.one_core = absl::GetFlag(FLAGS_one_core);
  return o;
}

SyncBenchOptions SyncOptionsFromFlags() {
  SyncBenchOptions o;
  o.model = Or(absl::GetFlag(FLAGS_model), o.model);
  o.from = Or(absl::GetFlag(FLAGS_from), o.from);
  o.to = Or(absl::GetFlag(FLAGS_to), o.to);
  o.memory = absl::GetFlag(FLAGS_memory);
  o.syncs = absl::GetFlag(FLAGS_sync_syncs);
  o.warmup = absl::GetFlag(FLAGS_sync_warmup);
  o.rounds = absl::GetFlag(FLAGS_sync_rounds);
  o.verify_first = absl::GetFlag(FLAGS_sync_verify);
  o.verify = absl::GetFlag(FLAGS_verify_costs);
  o.shm_tls = absl::GetFlag(FLAGS_sync_shm_tls);
  o.tcp_tls = absl::GetFlag(FLAGS_sync_tcp_tls);
  o.tcp_devices = absl::GetFlag(FLAGS_sync_tcp_devices);
  o.perftest = absl::GetFlag(FLAGS_sync_perftest);
  o.perftest_iters = absl::GetFlag(FLAGS_sync_perftest_iters);
  o.perftest_size = absl::GetFlag(FLAGS_sync_perftest_size);
  o.perftest_concurrent = absl::GetFlag(FLAGS_sync_perftest_concurrent);
  o.perftest_pairs = absl::GetFlag(FLAGS_sync_perftest_pairs);
  o.single_from = absl::GetFlag(FLAGS_sync_single_from);
  o.single_to = absl::GetFlag(FLAGS_sync_single_to);
  o.perftest_wsync_settings = absl::GetFlag(FLAGS_sync_perftest_wsync_settings);
  o.json = absl::GetFlag(FLAGS_sync_json);
  o.quant = absl::GetFlag(FLAGS_sync_quant);
  o.quant_from = absl::GetFlag(FLAGS_sync_quant_from);
  o.quant_to = absl::GetFlag(FLAGS_sync_quant_to);
  o.job = JobOptionsFromFlags();
  o.cuda.from = absl::GetFlag(FLAGS_cuda_from);
  o.cuda.to = absl::GetFlag(FLAGS_cuda_to);
  o.cuda.path_transports = absl::GetFlag(FLAGS_cuda_path_transports);
  o.cuda.forked = absl::GetFlag(FLAGS_cuda_forked);
  return o;
}

CompareBenchOptions CompareOptionsFromFlags(const std::string& command) {
  // The default run is the scenario the goals are stated on (its wall time on the 2-core
  // machine is in docs/benchmarks.md, "Default runs"); --compare_long: both models, both rollout
  // layouts.
  const bool long_run = absl::GetFlag(FLAGS_compare_long);
  CompareBenchOptions o;
  o.models = Or(absl::GetFlag(FLAGS_model), long_run ? "qwen2.5-0.5b,llama-3.2-1b" : o.models);
  o.froms = Or(absl::GetFlag(FLAGS_from), o.froms);
  o.tos = Or(absl::GetFlag(FLAGS_to), long_run ? "vllm(tp=2);vllm(tp=1,dp=2)" : o.tos);
  if (absl::GetFlag(FLAGS_repeats) > 0) o.repeats = absl::GetFlag(FLAGS_repeats);
  o.syncs = absl::GetFlag(FLAGS_compare_syncs);
  o.warmup = absl::GetFlag(FLAGS_compare_warmup);
  o.bucket_bytes = absl::GetFlag(FLAGS_compare_bucket_bytes);
  o.python = absl::GetFlag(FLAGS_compare_python);
  o.scripts = absl::GetFlag(FLAGS_compare_scripts);
  o.timeout_s = absl::GetFlag(FLAGS_compare_timeout_s);
  o.plot = absl::GetFlag(FLAGS_compare_plot);
  o.out_dir = Or(absl::GetFlag(FLAGS_out), o.out_dir);
  o.shm_tls = absl::GetFlag(FLAGS_sync_shm_tls);
  o.tcp_tls = absl::GetFlag(FLAGS_sync_tcp_tls);
  o.tcp_devices = absl::GetFlag(FLAGS_sync_tcp_devices);
  o.perftest = absl::GetFlag(FLAGS_sync_perftest);
  o.command = command;
  o.job = JobOptionsFromFlags();
  return o;
}

PredictBenchOptions PredictOptionsFromFlags() {
  PredictBenchOptions o;
  o.model = absl::GetFlag(FLAGS_predict_model);
  o.scenarios = absl::GetFlag(FLAGS_predict_scenarios);
  o.rounds = absl::GetFlag(FLAGS_predict_rounds);
  o.syncs = absl::GetFlag(FLAGS_predict_syncs);
  o.warmup = absl::GetFlag(FLAGS_predict_warmup);
  o.rate = absl::GetFlag(FLAGS_predict_rate);
  o.probe_sizes = absl::GetFlag(FLAGS_predict_probe_sizes);
  o.probe_repeats = absl::GetFlag(FLAGS_predict_probe_repeats);
  o.timeout_s = absl::GetFlag(FLAGS_predict_timeout_s);
  o.job = JobOptionsFromFlags();
  return o;
}

RelayBenchOptions RelayOptionsFromFlags() {
  RelayBenchOptions o;
  o.model = absl::GetFlag(FLAGS_relay_model);
  o.from = absl::GetFlag(FLAGS_relay_from);
  o.to = absl::GetFlag(FLAGS_relay_to);
  o.rate_mbit = absl::GetFlag(FLAGS_relay_rate_mbit);
  o.intra_link = absl::GetFlag(FLAGS_relay_intra_link);
  o.syncs = absl::GetFlag(FLAGS_relay_syncs);
  o.rounds = absl::GetFlag(FLAGS_relay_rounds);
  o.timeout_s = absl::GetFlag(FLAGS_relay_timeout_s);
  o.job = JobOptionsFromFlags();
  return o;
}

DeltaBenchOptions DeltaOptionsFromFlags() {
  DeltaBenchOptions o;
  o.model = Or(absl::GetFlag(FLAGS_model), o.model);
  o.from = Or(absl::GetFlag(FLAGS_from), o.from);
  o.to = Or(absl::GetFlag(FLAGS_to), o.to);
  o.steps = absl::GetFlag(FLAGS_delta_steps);
  o.rounds = absl::GetFlag(FLAGS_delta_rounds);
  o.lrs = absl::GetFlag(FLAGS_delta_lrs);
  o.weight_decay = absl::GetFlag(FLAGS_delta_weight_decay);
  o.links = absl::GetFlag(FLAGS_delta_links);
  o.rate_mbit = absl::GetFlag(FLAGS_delta_rate_mbit);
  o.verify_lrs = absl::GetFlag(FLAGS_delta_verify_lrs);
  o.verify_timed = absl::GetFlag(FLAGS_delta_verify_timed);
  o.shm_tls = absl::GetFlag(FLAGS_sync_shm_tls);
  o.tcp_tls = absl::GetFlag(FLAGS_sync_tcp_tls);
  o.tcp_devices = absl::GetFlag(FLAGS_sync_tcp_devices);
  o.job = JobOptionsFromFlags();
  return o;
}

MemcpyOptions MemcpyOptionsFromFlags() {
  return MemcpyOptions{absl::GetFlag(FLAGS_compare_memcpy_bytes),
                       absl::GetFlag(FLAGS_compare_memcpy_pattern)};
}

}  // namespace wsync::bench
