#include "integration/bench/bench_broadcast.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/dtype.h"
#include "common/status.h"
#include "integration/bench/bench_report.h"
#include "integration/bench/perftest.h"
#include "integration/harness/launcher.h"
#include "planner/layout.h"

namespace wsync::bench {

std::string ProcessName(int32_t process, int32_t trainers) {
  return process < trainers ? absl::StrCat("trainer ", process)
                            : absl::StrCat("rollout ", process - trainers);
}

namespace {

std::string DimsJson(const Dims& dims) { return absl::StrCat("[", absl::StrJoin(dims, ","), "]"); }

}  // namespace

absl::StatusOr<std::string> LayoutSpecJson(const std::string& model_name, const Layout& trainers,
                                           const Layout& rollouts) {
  std::map<std::string, int32_t> index_by_name;
  int64_t element_bytes = 0;
  std::string params;
  for (int32_t i = 0; i < static_cast<int32_t>(trainers.params.size()); ++i) {
    const ParamInfo& p = trainers.params[i];
    const int64_t size = DTypeSize(p.dtype);
    if (element_bytes != 0 && size != element_bytes) {
      return absl::UnimplementedError(
          absl::StrCat("the broadcast contestants need one element size; ", p.name, " has ", size,
                       " bytes, others ", element_bytes));
    }
    element_bytes = size;
    index_by_name[p.name] = i;
    absl::StrAppend(&params, i == 0 ? "" : ",\n  ", "{\"name\": ", JsonString(p.name),
                    ", \"shape\": ", DimsJson(p.shape), "}");
  }
  // Rollout pieces name the trainer layout's parameter index (the layouts may order them apart).
  std::vector<int32_t> rollout_to_trainer(rollouts.params.size());
  for (size_t i = 0; i < rollouts.params.size(); ++i) {
    auto it = index_by_name.find(rollouts.params[i].name);
    if (it == index_by_name.end() ||
        trainers.params[it->second].shape != rollouts.params[i].shape) {
      return absl::InvalidArgumentError(absl::StrCat("rollout parameter ", rollouts.params[i].name,
                                                     " has no equal trainer parameter"));
    }
    rollout_to_trainer[i] = it->second;
  }
  auto side = [](const Layout& layout, const std::vector<int32_t>* param_map) {
    std::string out;
    for (size_t rank = 0; rank < layout.processes.size(); ++rank) {
      std::vector<std::string> buffers, pieces;
      for (const BufferInfo& b : layout.buffers) {
        if (b.process != static_cast<int32_t>(rank)) continue;
        buffers.push_back(absl::StrFormat("{\"id\": %d, \"bytes\": %d}", b.id, b.bytes));
      }
      for (const Piece& p : layout.pieces) {
        if (p.process != static_cast<int32_t>(rank)) continue;
        pieces.push_back(absl::StrFormat(
            "{\"param\": %d, \"buffer\": %d, \"origin\": %s, \"extent\": %s, \"offset\": %d, "
            "\"strides\": %s}",
            param_map == nullptr ? p.param : (*param_map)[p.param], p.buffer,
            DimsJson(p.box.origin), DimsJson(p.box.extent), p.offset, DimsJson(p.strides)));
      }
      absl::StrAppend(&out, rank == 0 ? "" : ",\n  ", "{\"buffers\": [",
                      absl::StrJoin(buffers, ", "), "],\n   \"pieces\": [",
                      absl::StrJoin(pieces, ",\n     "), "]}");
    }
    return out;
  };
  return absl::StrCat("{\"model\": ", JsonString(model_name),
                      ", \"element_bytes\": ", element_bytes, ",\n \"params\": [", params,
                      "],\n \"trainers\": [", side(trainers, nullptr), "],\n \"rollouts\": [",
                      side(rollouts, &rollout_to_trainer), "]}\n");
}

// ---------------------------------------------------------------------------------------------
// The broadcast contestants: one broadcast_sync.py process per trainer and rollout rank.

absl::StatusOr<BroadcastRun> RunBroadcast(const BroadcastOptions& options,
                                          const std::string& spec_path, int32_t trainers,
                                          int32_t rollouts, int32_t warmup, int32_t syncs) {
  const std::string& mode = options.mode;
  WSYNC_ASSIGN_OR_RETURN(const int port, harness::PickFreePort());
  harness::ProcessesSpec spec;
  spec.processes = trainers + rollouts;
  spec.command = [&](int p) {
    return std::vector<std::string>{
        options.python,   options.scripts + "/broadcast_sync.py",
        "--spec",         spec_path,
        "--rank",         absl::StrCat(p),
        "--mode",         mode,
        "--master_port",  absl::StrCat(port),
        "--bucket_bytes", absl::StrCat(options.bucket_bytes),
        "--warmup",       absl::StrCat(warmup),
        "--syncs",        absl::StrCat(syncs),
        "--timeout_s",    absl::StrCat(absl::ToDoubleSeconds(options.timeout))};
  };
  spec.env = {"GLOO_SOCKET_IFNAME=lo", "OMP_NUM_THREADS=1", "PYTHONDONTWRITEBYTECODE=1"};
  spec.timeout = options.timeout;
  WSYNC_ASSIGN_OR_RETURN(std::vector<harness::ProcessResult> results, harness::RunProcesses(spec));
  BroadcastRun run;
  std::map<int64_t, double> slowest;  // version -> seconds
  for (int32_t p = 0; p < spec.processes; ++p) {
    const harness::ProcessResult& r = results[p];
    if (r.exit_code != 0) {
      return absl::InternalError(absl::StrFormat(
          "%s broadcast: %s exited %d%s: %s", mode, ProcessName(p, trainers), r.exit_code,
          r.killed ? " (killed at the limit)" : "", TailOf(r.stderr_text)));
    }
    run.peak_rss_bytes.push_back(r.peak_rss_bytes);
    int32_t verified = 0;
    for (absl::string_view line : absl::StrSplit(r.stdout_text, '\n', absl::SkipEmpty())) {
      std::map<std::string, std::string> fields;
      for (absl::string_view word : absl::StrSplit(line, ' ')) {
        const std::pair<std::string, std::string> kv = absl::StrSplit(word, '=');
        fields[kv.first] = kv.second;
      }
      int64_t version = 0;
      double seconds = 0;
      if (absl::StartsWith(line, "SYNC ") && absl::SimpleAtoi(fields["version"], &version) &&
          absl::SimpleAtod(fields["seconds"], &seconds)) {
        slowest[version] = std::max(slowest[version], seconds);
      } else if (absl::StartsWith(line, "VERIFIED ")) {
        ++verified;
      } else if (absl::StartsWith(line, "BUCKETS ")) {
        run.buckets_line = std::string(line);
      }
    }
    if (p >= trainers && verified != warmup + syncs) {
      return absl::InternalError(absl::StrFormat("%s broadcast: %s verified %d of %d versions",
                                                 mode, ProcessName(p, trainers), verified,
                                                 warmup + syncs));
    }
  }
  for (const auto& [version, seconds] : slowest) run.seconds.push_back(seconds);
  if (static_cast<int32_t>(run.seconds.size()) != syncs) {
    return absl::InternalError(absl::StrFormat("%s broadcast: %d of %d timed syncs reported", mode,
                                               run.seconds.size(), syncs));
  }
  return run;
}

}  // namespace wsync::bench
