#ifndef WSYNC_INTEGRATION_HOST_JOB_FLAGS_H_
#define WSYNC_INTEGRATION_HOST_JOB_FLAGS_H_

// The command line of one process of a job that harness::RunJob launches (integration/harness):
// the flags it passes to every process that are not settings of the library, defined once for the
// programs that take them (wsync_host, and wsync_test_worker of the multi-process tests, which
// links this library). Each program reads them with absl::GetFlag and adds its own. The library's
// settings (--coordinator_host, --deadline_seconds, --staging_budget_bytes, --verify, ...) are not
// here: wsync_host takes them from the library's settings table (setting_args.h), and the test
// worker defines them under the same names.

#include <cstdint>
#include <string>

#include "absl/flags/declare.h"

ABSL_DECLARE_FLAG(std::string, job);
ABSL_DECLARE_FLAG(std::string, role);
ABSL_DECLARE_FLAG(int32_t, rank);
ABSL_DECLARE_FLAG(std::string, model);
ABSL_DECLARE_FLAG(std::string, from);
ABSL_DECLARE_FLAG(std::string, to);
ABSL_DECLARE_FLAG(std::string, tls);
ABSL_DECLARE_FLAG(std::string, net_devices);
ABSL_DECLARE_FLAG(int32_t, versions);
ABSL_DECLARE_FLAG(bool, check_values);
ABSL_DECLARE_FLAG(bool, fill_pattern);
ABSL_DECLARE_FLAG(bool, verify_quant);

#endif  // WSYNC_INTEGRATION_HOST_JOB_FLAGS_H_
