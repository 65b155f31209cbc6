#ifndef WSYNC_INTEGRATION_CLI_CALIBRATE_JOB_H_
#define WSYNC_INTEGRATION_CLI_CALIBRATE_JOB_H_

// A calibration over real processes of this machine: `processes` copies of `wsync calibrate
// --probe_worker P` (optionally inside network namespaces), process 0 hosting the coordinator,
// each with its UCX transports per path class (as the session builds them), all running
// CalibrateLinks (calibration/) together. Process 0 writes the calibration file.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "calibration/probe.h"
#include "cost/calibration.pb.h"

namespace wsync::cli {

struct CalibrationJob {
  int32_t processes = 2;
  // Node id per process (path classes follow them); empty: all on node "local".
  std::vector<std::string> nodes;
  // Network namespace per process (empty entries or an empty list: this one).
  std::vector<std::string> netns;
  // Address process 0's coordinator listens on (reachable from every process's namespace).
  std::string coordinator_address = "127.0.0.1";
  // Transport per path class, e.g. "intra_node=ucx:sm,cma,self;inter_node=ucx:tcp@lo": one entry
  // for every process, or one per process; empty: UCX's defaults.
  std::vector<std::string> path_transports;
  std::vector<int64_t> sizes;  // Empty: the probe's defaults.
  int32_t repeats = 5;
  int32_t warmup = 1;
  std::vector<int32_t> fan_widths;  // Empty: the probe's defaults.
  int64_t memory_budget_bytes = int64_t{1} << 30;
  absl::Duration timeout = absl::Minutes(10);
  std::string out;  // The calibration file process 0 writes; required.
};

// Runs the job's processes as `wsync calibrate --probe_worker P`, `wsync` being the path of the
// wsync CLI (the CLI itself, or the sibling binary wsync-bench finds), and returns the calibration
// written to job.out. Fails naming the processes that failed, with their standard error.
absl::StatusOr<proto::Calibration> RunCalibrationJob(const CalibrationJob& job,
                                                     const std::string& wsync);

// The quantize pattern every calibration worker runs (calibration/ QuantizeProbe): one
// quant::QuantizeFp8 with 128 x 128 block scales of a bf16 matrix of 4096 columns and 4096 rows
// (32 MiB), fewer rows (a multiple of 128, at least 128) where that exceeds 1/32 of
// `memory_budget_bytes`; its values drawn once from a normal distribution of standard deviation
// 0.02 (fixed seed), rounded to bf16 to nearest even, as trained weights are. The callable owns
// its buffers (input, e4m3 output, scales).
QuantizeProbe HostQuantizeProbe(int64_t memory_budget_bytes);

// The delta sync patterns every calibration worker runs (ProbeOptions::delta_encode and
// delta_apply, executor/delta_codec.h): a bf16 chunk of 32 MiB (less where that exceeds 1/32 of
// `memory_budget_bytes`, at least 1 MiB) of normal(0, 0.02) values (fixed seed) and the same
// after an update like issue 44's (each value as fp32 moved by +-1e-6, an AdamW step at lr 1e-6,
// and rounded to bf16 again: about 4 % of the elements change, by an ulp). encode:
// AppendDeltaAdvancingBase, the chunk going back and forth between the two versions so that every
// call finds the same changes; apply: ApplyDelta of the two encodings in turn.
std::pair<QuantizeProbe, QuantizeProbe> HostDeltaProbes(int64_t memory_budget_bytes);

// "4K,64K,1M" (suffixes K, M, G: powers of 1024) into bytes; InvalidArgument on a bad entry.
absl::StatusOr<std::vector<int64_t>> ParseSizes(const std::string& text);

// "1,2,3" into fan widths; InvalidArgument on an entry that is not a number.
absl::StatusOr<std::vector<int32_t>> ParseWidths(const std::string& text);

// The body of `wsync calibrate --probe_worker P` (calibrate_command.cc fills the arguments from
// its flags): process `me` of `job` (job.path_transports: at most one entry, this process's;
// job.netns, job.coordinator_address and job.timeout are the launcher's and not used here),
// connecting to the coordinator at `coordinator` ("host:port", hosted by process 0) as job
// `job_id`, the secret from $WSYNC_SECRET. Process 0 writes job.out. InvalidArgument on a bad
// address, process number or node count.
absl::Status RunCalibrationWorker(const CalibrationJob& job, int32_t me,
                                  const std::string& coordinator, const std::string& job_id);

}  // namespace wsync::cli

#endif  // WSYNC_INTEGRATION_CLI_CALIBRATE_JOB_H_
