#ifndef WSYNC_INTEGRATION_HOST_JOB_FLAGS_H_
#define WSYNC_INTEGRATION_HOST_JOB_FLAGS_H_

// The command line of one process of a job that harness::RunJob launches (integration/harness):
// the flags it passes to every process, defined once for the programs that take them (wsync_host,
// and wsync_test_worker of the multi-process tests, which links this library). Each program reads
// them with absl::GetFlag and adds its own.

#include <cstdint>
#include <string>

#include "absl/flags/declare.h"

ABSL_DECLARE_FLAG(std::string, coordinator_host);
ABSL_DECLARE_FLAG(int32_t, coordinator_port);
ABSL_DECLARE_FLAG(std::string, job);
ABSL_DECLARE_FLAG(std::string, secret_env);
ABSL_DECLARE_FLAG(std::string, role);
ABSL_DECLARE_FLAG(int32_t, rank);
ABSL_DECLARE_FLAG(std::string, node_id);
ABSL_DECLARE_FLAG(std::string, model);
ABSL_DECLARE_FLAG(std::string, from);
ABSL_DECLARE_FLAG(std::string, to);
ABSL_DECLARE_FLAG(std::string, policy);
ABSL_DECLARE_FLAG(std::string, calibration);
ABSL_DECLARE_FLAG(std::string, tls);
ABSL_DECLARE_FLAG(std::string, net_devices);
ABSL_DECLARE_FLAG(std::string, path_transports);
ABSL_DECLARE_FLAG(int32_t, versions);
ABSL_DECLARE_FLAG(bool, verify);
ABSL_DECLARE_FLAG(bool, fill_pattern);
ABSL_DECLARE_FLAG(bool, verify_quant);
ABSL_DECLARE_FLAG(bool, verify_hashes);
ABSL_DECLARE_FLAG(std::string, verify_mode);
ABSL_DECLARE_FLAG(double, budget);
ABSL_DECLARE_FLAG(double, deadline_s);

#endif  // WSYNC_INTEGRATION_HOST_JOB_FLAGS_H_
