#include "integration/cli/calibrate_job.h"

#include <openssl/rand.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <random>
#include <tuple>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "calibration/probe.h"
#include "common/dtype.h"
#include "common/status.h"
#include "control/auth.h"
#include "cost/link_model.h"
#include "executor/delta_codec.h"
#include "integration/harness/launcher.h"
#include "plugin/runtime.h"
#include "plugin/settings.h"
#include "quant/fp8.h"
#include "transport/selector/selector.h"

namespace wsync::cli {
namespace {

// The job's secret travels to its processes in the variable a session reads by default.
constexpr absl::string_view kSecretEnv = kDefaultSecretEnv;

absl::StatusOr<std::string> NewHexSecret() {
  unsigned char bytes[32];
  if (RAND_bytes(bytes, sizeof(bytes)) != 1) {
    return absl::InternalError("cannot draw random bytes for the job secret");
  }
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(bytes), sizeof(bytes)));
}

absl::StatusOr<std::string> ReadAll(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  return std::string((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
}

std::vector<std::string> Split(const std::string& text) {
  return absl::StrSplit(text, ',', absl::SkipEmpty());
}

// `value` rounded to the nearest bf16, ties to even (finite values only).
uint16_t ToBf16(float value) {
  uint32_t bits = 0;
  std::memcpy(&bits, &value, sizeof(bits));
  return static_cast<uint16_t>((bits + 0x7fff + ((bits >> 16) & 1)) >> 16);
}

}  // namespace

QuantizeProbe HostQuantizeProbe(int64_t memory_budget_bytes) {
  constexpr int64_t kCols = 4096, kBlock = 128;
  constexpr int64_t kRowBytes = kCols * 2;
  const int64_t rows =
      std::clamp<int64_t>(memory_budget_bytes / 32 / kRowBytes / kBlock * kBlock, kBlock, 4096);
  struct Buffers {
    std::vector<uint16_t> input;
    std::vector<uint8_t> fp8;
    std::vector<float> scales;
  };
  auto buffers = std::make_shared<Buffers>();
  buffers->input.resize(rows * kCols);
  std::mt19937_64 random(46);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  for (uint16_t& value : buffers->input) value = ToBf16(normal(random));
  buffers->fp8.resize(rows * kCols);
  buffers->scales.resize(rows / kBlock * (kCols / kBlock));
  QuantizeProbe probe;
  probe.input_bytes = rows * kRowBytes;
  probe.description = absl::StrCat("quant::QuantizeFp8 of bf16 ", rows, " x ", kCols,
                                   ", normal(0, 0.02), to e4m3 with 128 x 128 block scales");
  probe.run = [buffers, rows] {
    quant::ConstRegion input{buffers->input.data(), 1, rows, kCols, 0, kCols, 1};
    quant::MutableRegion fp8{buffers->fp8.data(), 1, rows, kCols, 0, kCols, 1};
    quant::MutableRegion scales{buffers->scales.data(), 1, rows / kBlock, kCols / kBlock, 0,
                                kCols / kBlock,         1};
    return quant::QuantizeFp8(quant::Fp8Blocking::Block(), DType::kBFloat16, input, fp8, scales,
                              "calibration.quantize");
  };
  return probe;
}

std::pair<QuantizeProbe, QuantizeProbe> HostDeltaProbes(int64_t memory_budget_bytes) {
  const int64_t elements =
      std::clamp<int64_t>(memory_budget_bytes / 32 / 2, int64_t{1} << 19, int64_t{1} << 24);
  struct Buffers {
    std::vector<uint8_t> versions[2];   // Before and after the update.
    std::vector<uint8_t> base;          // What the encoder compares against and advances.
    std::vector<uint8_t> encodings[2];  // Of version 1 against 0 and of 0 against 1.
    std::vector<uint8_t> target;
    std::vector<uint8_t> scratch;
    int encode_calls = 0;
    int apply_calls = 0;
  };
  auto buffers = std::make_shared<Buffers>();
  std::mt19937_64 random(44);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  for (std::vector<uint8_t>& version : buffers->versions) version.resize(elements * 2);
  for (int64_t i = 0; i < elements; ++i) {
    const float weight = normal(random);
    const uint16_t before = ToBf16(weight);
    const uint16_t after = ToBf16(weight + ((random() & 1) != 0 ? 1e-6f : -1e-6f));
    std::memcpy(buffers->versions[0].data() + 2 * i, &before, 2);
    std::memcpy(buffers->versions[1].data() + 2 * i, &after, 2);
  }
  for (int v = 0; v < 2; ++v) {
    EncodeDelta(buffers->versions[v], buffers->versions[1 - v], 2, &buffers->encodings[v])
        .IgnoreError();  // Sizes are right by construction.
  }
  buffers->base = buffers->versions[0];
  buffers->target = buffers->versions[0];
  const std::string what = absl::StrCat("of a bf16 chunk of ", elements,
                                        " normal(0, 0.02) values, +-1e-6 as fp32 (about 4 %",
                                        " of the elements change)");
  QuantizeProbe encode, apply;
  encode.input_bytes = apply.input_bytes = elements * 2;
  encode.description = absl::StrCat("AppendDeltaAdvancingBase ", what);
  apply.description = absl::StrCat("ApplyDelta ", what);
  encode.run = [buffers] {
    const int v = buffers->encode_calls++ % 2;  // The base holds version v.
    buffers->scratch.clear();
    return AppendDeltaAdvancingBase(absl::MakeSpan(buffers->base), buffers->versions[1 - v], 2,
                                    &buffers->scratch)
        .status();
  };
  apply.run = [buffers] {
    const int v = buffers->apply_calls++ % 2;  // The target holds version v.
    return ApplyDelta(buffers->encodings[v], 2, absl::MakeSpan(buffers->target));
  };
  return {std::move(encode), std::move(apply)};
}

absl::StatusOr<std::vector<int64_t>> ParseSizes(const std::string& text) {
  std::vector<int64_t> sizes;
  for (absl::string_view entry : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    int64_t unit = 1;
    if (!entry.empty()) {
      const char suffix = entry.back();
      if (suffix == 'K' || suffix == 'k') unit = int64_t{1} << 10;
      if (suffix == 'M' || suffix == 'm') unit = int64_t{1} << 20;
      if (suffix == 'G' || suffix == 'g') unit = int64_t{1} << 30;
      if (unit != 1) entry.remove_suffix(1);
    }
    int64_t value = 0;
    if (!absl::SimpleAtoi(entry, &value) || value <= 0) {
      return absl::InvalidArgumentError(absl::StrCat("bad size '", entry, "' in '", text, "'"));
    }
    sizes.push_back(value * unit);
  }
  return sizes;
}

absl::StatusOr<std::vector<int32_t>> ParseWidths(const std::string& text) {
  std::vector<int32_t> widths;
  for (const std::string& entry : Split(text)) {
    int32_t value = 0;
    if (!absl::SimpleAtoi(entry, &value)) {
      return absl::InvalidArgumentError(absl::StrCat("bad fan width '", entry, "'"));
    }
    widths.push_back(value);
  }
  return widths;
}

absl::Status RunCalibrationWorker(const CalibrationJob& job, int32_t me,
                                  const std::string& coordinator, const std::string& job_id) {
  const int32_t n = job.processes;
  const std::vector<std::string> host_port = absl::StrSplit(coordinator, ':');
  int port = 0;
  if (host_port.size() != 2 || !absl::SimpleAtoi(host_port[1], &port) || n < 1 || me < 0 ||
      me >= n) {
    return absl::InvalidArgumentError("bad --probe_coordinator, --processes or --probe_worker");
  }
  if (job.path_transports.size() > 1) {
    return absl::InvalidArgumentError("a calibration worker takes one path transport spec");
  }
  const std::string path_transports = job.path_transports.empty() ? "" : job.path_transports[0];
  WSYNC_ASSIGN_OR_RETURN(std::string secret,
                         LoadSecret(SecretSource::Environment(std::string(kSecretEnv))));
  std::vector<std::string> nodes = job.nodes;
  if (nodes.empty()) nodes.assign(n, "local");
  if (static_cast<int32_t>(nodes.size()) != n) {
    return absl::InvalidArgumentError(absl::StrCat(nodes.size(), " --nodes for ", n, " processes"));
  }
  // Every process a trainer of one job; process 0 hosts its coordinator (plugin/runtime.h).
  RuntimeConfig config;
  config.role = Role::kTrainer;
  config.rank = me;
  config.num_trainers = n;
  config.job_id = job_id;
  config.coordinator_host = host_port[0];
  config.coordinator_port = port;
  config.host_coordinator = me == 0;
  config.node_id = nodes[me];
  WSYNC_ASSIGN_OR_RETURN(config.path_transports, ParsePathTransports(path_transports));
  const PathOf path_of = PathOfNodes(nodes);
  absl::StatusOr<ConnectedMesh> mesh = ConnectMesh(config, secret, path_of);
  WipeSecret(secret);
  WSYNC_RETURN_IF_ERROR(mesh.status());

  ProbeOptions options;
  options.sizes = job.sizes;
  options.repeats = job.repeats;
  options.warmup = job.warmup;
  options.path_of = path_of;
  options.fan_widths = job.fan_widths;
  options.nodes = nodes;
  options.memory_budget_bytes = job.memory_budget_bytes;
  options.settings["path_transports"] = path_transports;
  options.settings["nodes"] = absl::StrJoin(nodes, ",");
  options.quantize = HostQuantizeProbe(job.memory_budget_bytes);
  std::tie(options.delta_encode, options.delta_apply) = HostDeltaProbes(job.memory_budget_bytes);
  WSYNC_ASSIGN_OR_RETURN(const proto::Calibration calibration,
                         CalibrateLinks(options, *mesh->transport, *mesh->client));
  if (me == 0) {
    const std::string& path = job.out;
    std::ofstream file(path, std::ios::binary | std::ios::trunc);
    file << SerializeCalibration(calibration);
    if (!file.good()) return absl::InternalError(absl::StrCat("cannot write ", path));
  }
  WSYNC_RETURN_IF_ERROR(mesh->client->Barrier(absl::Now() + absl::Seconds(60)));
  // The coordinator goes with process 0: give the others a moment to read the barrier's result.
  if (mesh->coordinator != nullptr) absl::SleepFor(absl::Milliseconds(300));
  return absl::OkStatus();
}

absl::StatusOr<proto::Calibration> RunCalibrationJob(const CalibrationJob& job,
                                                     const std::string& wsync) {
  if (job.out.empty() || job.processes < 1 ||
      (job.path_transports.size() > 1 &&
       static_cast<int32_t>(job.path_transports.size()) != job.processes)) {
    return absl::InvalidArgumentError(
        "a calibration job needs processes, an output file and one path transport spec for all "
        "or one per process");
  }
  WSYNC_ASSIGN_OR_RETURN(const int port, harness::PickFreePort("127.0.0.1"));
  WSYNC_ASSIGN_OR_RETURN(const std::string secret, NewHexSecret());
  std::remove(job.out.c_str());
  harness::ProcessesSpec spec;
  spec.processes = job.processes;
  spec.env = {absl::StrCat(kSecretEnv, "=", secret)};
  spec.timeout = job.timeout;
  spec.command = [&](int p) {
    std::vector<std::string> argv;
    if (p < static_cast<int>(job.netns.size()) && !job.netns[p].empty()) {
      argv = {"ip", "netns", "exec", job.netns[p]};
    }
    const std::vector<std::string> flags = {
        wsync,
        "calibrate",
        absl::StrCat("--probe_worker=", p),
        absl::StrCat("--probe_coordinator=", job.coordinator_address, ":", port),
        absl::StrCat("--probe_job=wsync-calibrate-", getpid()),
        absl::StrCat("--processes=", job.processes),
        absl::StrCat("--nodes=", absl::StrJoin(job.nodes, ",")),
        absl::StrCat("--path_transports=", job.path_transports.empty() ? std::string()
                                           : job.path_transports.size() == 1
                                               ? job.path_transports[0]
                                               : job.path_transports[p]),
        absl::StrCat("--probe_sizes=", absl::StrJoin(job.sizes, ",")),
        absl::StrCat("--probe_repeats=", job.repeats),
        absl::StrCat("--probe_warmup=", job.warmup),
        absl::StrCat("--fan_widths=", absl::StrJoin(job.fan_widths, ",")),
        absl::StrCat("--probe_memory=", job.memory_budget_bytes),
        absl::StrCat("--out=", job.out),
    };
    argv.insert(argv.end(), flags.begin(), flags.end());
    return argv;
  };
  WSYNC_ASSIGN_OR_RETURN(const std::vector<harness::ProcessResult> results,
                         harness::RunProcesses(spec));
  std::string failures;
  for (size_t p = 0; p < results.size(); ++p) {
    if (results[p].exit_code == 0) continue;
    absl::StrAppend(&failures, "\n  process ", p, results[p].killed ? " (killed)" : "", ": ",
                    results[p].stderr_text);
  }
  if (!failures.empty()) {
    return absl::InternalError(absl::StrCat("calibration processes failed:", failures));
  }
  WSYNC_ASSIGN_OR_RETURN(const std::string bytes, ReadAll(job.out));
  return ParseCalibration(bytes);
}

}  // namespace wsync::cli
