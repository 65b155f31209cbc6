#include "integration/host/job_flags.h"

#include <cstdint>
#include <string>

#include "absl/flags/flag.h"

ABSL_FLAG(std::string, job, "wsync-test", "Job id.");
ABSL_FLAG(std::string, role, "trainer", "trainer or rollout.");
ABSL_FLAG(int32_t, rank, 0, "Rank within the role.");
ABSL_FLAG(std::string, model, "qwen2.5-tiny",
          "Built-in model (wsync_host also takes a config.json path).");
ABSL_FLAG(std::string, from, "megatron(tp=2)", "Trainer layout.");
ABSL_FLAG(std::string, to, "vllm(tp=2)", "Rollout layout.");
ABSL_FLAG(std::string, tls, "",
          "UCX transports (UCX_TLS) for every peer, without --path_transports; empty: UCX's "
          "default.");
ABSL_FLAG(std::string, net_devices, "",
          "UCX network devices (UCX_NET_DEVICES) for every peer, without --path_transports.");
ABSL_FLAG(int32_t, versions, 3, "Syncs to run (versions 1..N).");
ABSL_FLAG(bool, check_values, true,
          "Trainers write logical values, rollouts check every element of them (not the "
          "library's --verify, which compares chunk digests).");
ABSL_FLAG(bool, fill_pattern, false,
          "Trainers write test::FillPattern of the version over all their buffer bytes before each "
          "sync (at memory speed; with --verify=hash the chunk hashes then compare distinct "
          "bytes). Ignored with --check_values, which writes the logical values.");
ABSL_FLAG(bool, verify_quant, false,
          "Rollouts check every FP8 weight and scale they hold against the reference quantizer "
          "applied to the bytes the trainers' --fill_pattern wrote (test::CheckQuantizedPattern; "
          "the trainers must use --fill_pattern and hold each element once). Prints "
          "quant_verified=<e4m3 elements checked> in STATS.");
