// `wsync-bench sync --memory cuda`: a job whose weights live in CUDA memory (integration/cuda),
// GB/s per rollout against cudaMemcpy device-to-device of the same bytes on the same GPU.

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status.h"
#include "integration/bench/bench_sync.h"
#include "plugin/cuda_setup.h"

#if WSYNC_HAVE_NCCL
#include "integration/cuda/cuda_job.h"
#endif

namespace wsync::bench {

std::string CudaSyncBenchUsage() {
  return "wsync-bench sync --memory cuda [--model M] [--cuda_from L] [--cuda_to L]\n"
         "                 [--sync_syncs K] [--cuda_path_transports SPEC] [--cuda_forked]\n"
         "  GPU only (fails at once with \"no CUDA device\" elsewhere). Runs M (default\n"
         "  qwen2.5-0.5b) from L (megatron(tp=1)) to L (vllm(tp=1)) with every buffer in CUDA\n"
         "  memory (process p on GPU p % GPUs), over CUDA IPC by default (SPEC\n"
         "  \"intra_node=nccl\": NCCL; with fewer GPUs than processes the trainers then keep\n"
         "  host memory, as NCCL refuses two ranks on one GPU), processes as threads (or forked\n"
         "  OS processes) driving the plugin session: one sync with every rollout element\n"
         "  checked, then K timed syncs.\n"
         "  Prints GB/s per rollout against cudaMemcpy device-to-device of the same bytes on the\n"
         "  rollout's GPU, as a ratio.\n";
}

absl::Status RunCudaSyncBench(const SyncBenchOptions& bench, std::FILE* out) {
#if WSYNC_HAVE_NCCL
  CudaJobOptions options;
  options.model = bench.model;
  options.from = bench.cuda.from;
  options.to = bench.cuda.to;
  options.syncs = std::max(1, bench.syncs);
  options.verify = true;
  options.path_transports = bench.cuda.path_transports;
  options.forked_processes = bench.cuda.forked;
  absl::FPrintF(out, "wsync-bench sync --memory cuda: %s %s -> %s, %d timed syncs\n", options.model,
                options.from, options.to, options.syncs);
  WSYNC_ASSIGN_OR_RETURN(CudaJobResult job, RunCudaJob(options));
  absl::FPrintF(out, "placement %s on %d GPU(s); verified %d bytes of rollout buffers\n",
                job.placement, job.devices, job.verified_elements_bytes);
  std::vector<double> seconds = job.transfer_seconds;
  std::sort(seconds.begin(), seconds.end());
  const double median = seconds[seconds.size() / 2];
  // The rollout of the busiest rollout process is global process `trainers`; its GPU is the
  // job's placement p % GPUs, and a GPU-to-GPU copy on GPU 0 is the single-GPU reference.
  WSYNC_ASSIGN_OR_RETURN(const double copy, DeviceToDeviceCopySeconds(0, job.rollout_bytes, 5));
  const double wsync_gbps = job.rollout_bytes / median / 1e9;
  const double copy_gbps = job.rollout_bytes / copy / 1e9;
  absl::FPrintF(out, "%-28s %12s %12s %10s\n", "contestant", "s/sync", "GB/s", "ratio");
  absl::FPrintF(out, "%-28s %12.4f %12.2f %10.3f\n", "wsync (transfer, median)", median, wsync_gbps,
                wsync_gbps / copy_gbps);
  absl::FPrintF(out, "%-28s %12.4f %12.2f %10.3f\n", "cudaMemcpy D2D (GPU 0)", copy, copy_gbps,
                1.0);
  absl::FPrintF(out, "bytes per rollout per sync: %d\n", job.rollout_bytes);
  return absl::OkStatus();
#else
  return absl::UnimplementedError(
      "--memory cuda needs the NCCL backend, which this build does not have (WSYNC_WITH_NCCL)");
#endif
}

}  // namespace wsync::bench
