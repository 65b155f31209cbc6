#include "integration/host/job_flags.h"

#include <cstdint>
#include <string>

#include "absl/flags/flag.h"

ABSL_FLAG(std::string, coordinator_host, "127.0.0.1", "Coordinator address.");
ABSL_FLAG(int32_t, coordinator_port, 0, "Coordinator port.");
ABSL_FLAG(std::string, job, "wsync-test", "Job id.");
ABSL_FLAG(std::string, secret_env, "WSYNC_SECRET", "Environment variable holding the secret.");
ABSL_FLAG(std::string, role, "trainer", "trainer or rollout.");
ABSL_FLAG(int32_t, rank, 0, "Rank within the role.");
ABSL_FLAG(std::string, node_id, "", "Node id (default: the host name).");
ABSL_FLAG(std::string, model, "qwen2.5-tiny",
          "Built-in model (wsync_host also takes a config.json path).");
ABSL_FLAG(std::string, from, "megatron(tp=2)", "Trainer layout.");
ABSL_FLAG(std::string, to, "vllm(tp=2)", "Rollout layout.");
ABSL_FLAG(std::string, policy, "local_first_least_loaded",
          "Replica policy (cost_aware needs --calibration).");
ABSL_FLAG(std::string, calibration, "",
          "A calibration file (wsync calibrate --out) whose fits --policy cost_aware uses.");
ABSL_FLAG(std::string, tls, "", "UCX transports (UCX_TLS) for every peer; empty: UCX's default.");
ABSL_FLAG(std::string, net_devices, "", "UCX network devices (UCX_NET_DEVICES) for every peer.");
ABSL_FLAG(std::string, path_transports, "",
          "Transport per path class, e.g. 'intra_node=ucx:sm,cma,self;inter_node=ucx:tcp@eth0'; "
          "empty: one UCX transport with --tls and --net_devices for every peer.");
ABSL_FLAG(int32_t, versions, 3, "Syncs to run (versions 1..N).");
ABSL_FLAG(bool, verify, true, "Write logical values (trainer) and check them (rollout).");
ABSL_FLAG(bool, fill_pattern, false,
          "Trainers write test::FillPattern of the version over all their buffer bytes before each "
          "sync (at memory speed; with --verify_hashes the chunk hashes then compare distinct "
          "bytes). Ignored with --verify, which writes the logical values.");
ABSL_FLAG(bool, verify_quant, false,
          "Rollouts check every FP8 weight and scale they hold against the reference quantizer "
          "applied to the bytes the trainers' --fill_pattern wrote (test::CheckQuantizedPattern; "
          "the trainers must use --fill_pattern and hold each element once). Prints "
          "quant_verified=<e4m3 elements checked> in STATS.");
ABSL_FLAG(bool, verify_hashes, false,
          "wsync's end-to-end integrity: xxh3 per chunk, sender against receiver, before the "
          "commit vote.");
ABSL_FLAG(std::string, verify_mode, "",
          "wsync's end-to-end integrity: off, hash (xxh3 per chunk) or keyed (a MAC per chunk "
          "keyed from the job secret). Empty: --verify_hashes decides.");
ABSL_FLAG(double, budget, 0,
          "Staging budget in bytes per peer and direction (0: the default, 64 MiB).");
ABSL_FLAG(double, deadline_s, 60, "Deadline of each step in seconds.");
