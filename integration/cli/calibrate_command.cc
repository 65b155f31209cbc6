#include "integration/cli/calibrate_command.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <optional>
#include <set>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/status.h"
#include "cost/link_model.h"
#include "integration/cli/calibrate_job.h"
#include "integration/harness/launcher.h"
#include "plugin/prediction.h"

ABSL_FLAG(std::string, synthetic, "",
          "Link constants, e.g. 'intra_node=5us,200GB/s;inter_node=20us,25GB/s'.");
ABSL_FLAG(std::string, out, "", "Write the calibration to this file.");
ABSL_FLAG(std::string, show, "", "Print the fits of this calibration file.");
ABSL_FLAG(bool, netns, false,
          "With --nodes naming two nodes: each node's processes in a network namespace of its "
          "own, the two joined by a veth, so inter_node pairs cross a network link (root).");
ABSL_FLAG(std::string, path_transports, "",
          "`wsync calibrate`: transport per path class of the probe workers, e.g. "
          "'intra_node=ucx:sm,cma,self;inter_node=ucx:tcp'.");
ABSL_FLAG(int32_t, probe_worker, -1,
          "Internal: run as process P of a calibration job (started by `wsync calibrate`).");
ABSL_FLAG(std::string, probe_coordinator, "", "Internal: host:port of the job's coordinator.");
ABSL_FLAG(std::string, probe_job, "wsync-calibrate", "Internal: the job id.");

// Flags shared by the launcher (`wsync calibrate --processes N --out F`) and its workers.
ABSL_FLAG(int32_t, processes, 0, "`wsync calibrate`: processes to probe on this machine.");
ABSL_FLAG(std::string, nodes, "",
          "`wsync calibrate`: node id per process, e.g. 'a,a,b,b' (default: one node).");
ABSL_FLAG(std::string, probe_sizes, "",
          "`wsync calibrate`: message sizes, e.g. '4K,64K,1M,16M' (default 4K..256M, factors of "
          "4, within --probe_memory).");
ABSL_FLAG(int32_t, probe_repeats, 5, "`wsync calibrate`: timed repeats per pattern and size.");
ABSL_FLAG(int32_t, probe_warmup, 1, "`wsync calibrate`: untimed repeats before them.");
ABSL_FLAG(std::string, fan_widths, "",
          "`wsync calibrate`: fan widths, e.g. '1,2,3' (default: powers of two up to the "
          "processes per node minus one).");
ABSL_FLAG(double, probe_memory, static_cast<double>(int64_t{1} << 30),
          "`wsync calibrate`: bytes each process may allocate for probing.");

namespace wsync::cli {
namespace {

void PrintFit(std::FILE* out, const std::string& what, const LinkFit& fit) {
  absl::FPrintF(out, "  %-36s alpha %9.2f us  %9.3f GB/s  max rel. error %.3f (%d sizes)\n", what,
                fit.alpha_seconds * 1e6, fit.bytes_per_second / 1e9, fit.max_relative_error,
                fit.sizes);
}

// Each process's delta encode and apply fits, and the rates delta=auto and the prediction of a
// delta sync use (the slowest process's), or that the file has none.
void PrintDeltaRates(std::FILE* out, const LinkFits& fits) {
  for (const auto& [kernel, by_process] :
       {std::pair("encode", &fits.delta_encode), std::pair("apply", &fits.delta_apply)}) {
    for (const auto& [process, fit] : *by_process) {
      PrintFit(out,
               process < 0 ? absl::StrCat("delta ", kernel, " (stated)")
                           : absl::StrCat("delta ", kernel, " on process ", process),
               fit);
    }
  }
  if (fits.delta_encode_bytes_per_second > 0 && fits.delta_apply_bytes_per_second > 0) {
    absl::FPrintF(out,
                  "  delta rates (the slowest process's): encode %.3f GB/s, apply %.3f GB/s of "
                  "the dense chunk\n",
                  fits.delta_encode_bytes_per_second / 1e9,
                  fits.delta_apply_bytes_per_second / 1e9);
  } else {
    absl::FPrintF(out,
                  "  delta rates: not measured; delta=auto stays dense and no delta sync is "
                  "predicted (wsync calibrate --processes N measures them)\n");
  }
}

absl::Status Show(const proto::Calibration& calibration, std::FILE* out) {
  WSYNC_ASSIGN_OR_RETURN(const LinkFits fits, FitLinks(calibration));
  absl::FPrintF(out, "calibration: %d processes, transport %s, %d samples\n",
                calibration.processes(), calibration.transport(), calibration.samples_size());
  for (const auto& [path, fit] : fits.by_path) PrintFit(out, absl::StrCat("path ", path), fit);
  for (const auto& [pair, fit] : fits.by_pair) {
    PrintFit(out, absl::StrCat("pair ", pair.first, " -> ", pair.second), fit);
  }
  for (const auto& [pair, fit] : fits.both_ways) {
    PrintFit(out, absl::StrCat("both ways ", pair.first, " <-> ", pair.second), fit);
  }
  for (const auto& [key, fit] : fits.fan_aggregate) {
    PrintFit(out,
             absl::StrCat(std::get<0>(key), " root ", std::get<1>(key), " peers ",
                          absl::StrJoin(std::get<2>(key), ","), " (aggregate)"),
             fit);
  }
  for (const auto& [paths, fit] : fits.relay) {
    PrintFit(out, absl::StrCat("relay ", paths.first, " -> ", paths.second), fit);
  }
  for (const auto& [path, fit] : fits.path_aggregate) {
    PrintFit(out, absl::StrCat("all ", path, " at once (relay)"), fit);
  }
  for (const auto& [nodes, fit] : fits.node_link) {
    PrintFit(out,
             nodes.first == nodes.second
                 ? absl::StrCat("inside node ", nodes.first, " (half to half)")
                 : absl::StrCat("node link ", nodes.first, " -> ", nodes.second, " (all pairs)"),
             fit);
  }
  for (const auto& [process, fit] : fits.quantize) {
    PrintFit(out,
             process < 0 ? std::string("quantize (stated)")
                         : absl::StrCat("quantize on process ", process),
             fit);
  }
  if (fits.quantize_bytes_per_second > 0) {
    absl::FPrintF(out, "  quantize rate (the slowest process's): %.3f GB/s of bf16 input\n",
                  fits.quantize_bytes_per_second / 1e9);
  } else {
    absl::FPrintF(out,
                  "  quantize rate: not measured; predictions use the stand-in %.3f GB/s of "
                  "input\n",
                  kQuantizeInputBytesPerSecond / 1e9);
  }
  PrintDeltaRates(out, fits);
  for (const std::string& skipped : fits.skipped) absl::FPrintF(out, "  left out: %s\n", skipped);
  return absl::OkStatus();
}

absl::StatusOr<CalibrationJob> JobFromFlags(const std::string& path) {
  CalibrationJob job;
  job.processes = absl::GetFlag(FLAGS_processes);
  job.nodes = absl::StrSplit(absl::GetFlag(FLAGS_nodes), ',', absl::SkipEmpty());
  if (job.nodes.empty()) job.nodes.assign(job.processes, "local");
  if (static_cast<int32_t>(job.nodes.size()) != job.processes) {
    return absl::InvalidArgumentError(
        absl::StrCat(job.nodes.size(), " --nodes for ", job.processes, " --processes"));
  }
  job.path_transports = {absl::GetFlag(FLAGS_path_transports)};
  WSYNC_ASSIGN_OR_RETURN(job.sizes, ParseSizes(absl::GetFlag(FLAGS_probe_sizes)));
  job.repeats = absl::GetFlag(FLAGS_probe_repeats);
  job.warmup = absl::GetFlag(FLAGS_probe_warmup);
  WSYNC_ASSIGN_OR_RETURN(job.fan_widths, ParseWidths(absl::GetFlag(FLAGS_fan_widths)));
  job.memory_budget_bytes = static_cast<int64_t>(absl::GetFlag(FLAGS_probe_memory));
  job.out = path;
  return job;
}

// --netns: the processes of job.nodes[0]'s node in namespace 0 of `net`, the others in namespace
// 1; shared memory inside a node and TCP over the veth between them, unless --path_transports
// says otherwise. InvalidArgument unless --nodes names exactly two nodes.
absl::Status PlaceInNamespaces(const harness::NetnsPair& net, CalibrationJob& job) {
  const std::set<std::string> distinct(job.nodes.begin(), job.nodes.end());
  if (distinct.size() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("--netns needs --nodes naming two nodes, e.g. a,a,b,b; got '",
                     absl::StrJoin(job.nodes, ","), "'"));
  }
  const std::string given = job.path_transports[0];
  job.path_transports.clear();
  for (const std::string& node : job.nodes) {
    const int side = node == job.nodes[0] ? 0 : 1;
    job.netns.push_back(net.ns(side));
    job.path_transports.push_back(
        !given.empty() ? given
                       : absl::StrCat("local=ucx:sm,cma,self;intra_node=ucx:sm,cma,self;"
                                      "inter_node=ucx:tcp@",
                                      net.device(side)));
  }
  job.coordinator_address = net.address(0);
  return absl::OkStatus();
}

absl::Status Run(std::FILE* out) {
  const std::string synthetic = absl::GetFlag(FLAGS_synthetic);
  const std::string path = absl::GetFlag(FLAGS_out);
  const std::string show = absl::GetFlag(FLAGS_show);
  if (!show.empty()) {
    std::ifstream file(show, std::ios::binary);
    if (!file) return absl::NotFoundError(absl::StrCat("cannot read ", show));
    const std::string bytes((std::istreambuf_iterator<char>(file)),
                            std::istreambuf_iterator<char>());
    WSYNC_ASSIGN_OR_RETURN(const proto::Calibration calibration, ParseCalibration(bytes));
    return Show(calibration, out);
  }
  if (absl::GetFlag(FLAGS_probe_worker) >= 0) {
    WSYNC_ASSIGN_OR_RETURN(const CalibrationJob job, JobFromFlags(path));
    return RunCalibrationWorker(job, absl::GetFlag(FLAGS_probe_worker),
                                absl::GetFlag(FLAGS_probe_coordinator),
                                absl::GetFlag(FLAGS_probe_job));
  }
  if (absl::GetFlag(FLAGS_processes) > 0 && !path.empty()) {
    WSYNC_ASSIGN_OR_RETURN(CalibrationJob job, JobFromFlags(path));
    // Removes the namespaces when the job is done.
    std::string reason;
    const std::optional<harness::NetnsPair> net =
        absl::GetFlag(FLAGS_netns) ? harness::NetnsPair::Create(&reason) : std::nullopt;
    if (absl::GetFlag(FLAGS_netns)) {
      if (!net) {
        return absl::FailedPreconditionError(
            absl::StrCat("--netns: cannot create network namespaces (run as root): ", reason));
      }
      WSYNC_RETURN_IF_ERROR(PlaceInNamespaces(*net, job));
    }
    char self[4096];
    const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n <= 0) return absl::InternalError("cannot read /proc/self/exe");
    absl::FPrintF(
        out, "calibrating %d processes (nodes %s%s, transports '%s')...\n", job.processes,
        absl::StrJoin(job.nodes, ","), net ? ", two network namespaces" : "",
        absl::StrJoin(std::set<std::string>(job.path_transports.begin(), job.path_transports.end()),
                      "' / '"));
    std::fflush(out);
    WSYNC_ASSIGN_OR_RETURN(const proto::Calibration calibration,
                           RunCalibrationJob(job, std::string(self, n)));
    absl::FPrintF(out, "wrote %s\n", path);
    return Show(calibration, out);
  }
  if (synthetic.empty() || path.empty()) {
    return absl::InvalidArgumentError(
        "give --processes N --out FILE, --synthetic SPEC --out FILE, or --show FILE");
  }
  WSYNC_ASSIGN_OR_RETURN(const proto::Calibration calibration, SyntheticCalibration(synthetic));
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  file << SerializeCalibration(calibration);
  if (!file.good()) return absl::InternalError(absl::StrCat("cannot write ", path));
  absl::FPrintF(out, "wrote %s\n", path);
  return Show(calibration, out);
}

}  // namespace

std::string CalibrateUsage() {
  return "usage: wsync calibrate --processes N [--nodes a,a,b,b [--netns]] [--path_transports "
         "SPEC]\n"
         "                [--probe_sizes 4K,1M,...] [--probe_repeats R] [--fan_widths 1,2] --out "
         "FILE\n"
         "  Measures the links of N local processes over UCX (calibration/), writes the raw\n"
         "  samples and prints the fits. Path classes follow --nodes: processes of one node are\n"
         "  intra_node, of different nodes inter_node (default: all on one node). --netns (root)\n"
         "  puts the two nodes in two network namespaces joined by a veth: inter_node pairs then\n"
         "  cross a network link (TCP), intra_node pairs use shared memory. One machine measures\n"
         "  every class a plan uses: wsync calibrate --processes 4 --nodes a,a,b,b --netns --out "
         "F\n"
         "usage: wsync calibrate --synthetic 'PATH=ALPHA,BANDWIDTH;...' --out FILE | --show FILE\n"
         "  Writes a calibration of stated link constants, or prints a saved one's fits, its\n"
         "  quantize rate and its delta encode and apply rates. Kernel rates are stated\n"
         "  as links: 'quantize=0us,3GB/s;delta_encode=0us,4GB/s;delta_apply=0us,4GB/s'.\n";
}

int CalibrateMain(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const absl::Status status = Run(stdout);
  if (!status.ok()) {
    absl::FPrintF(stderr, "wsync calibrate: %s\n", status.ToString());
    return status.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  return 0;
}

}  // namespace wsync::cli
