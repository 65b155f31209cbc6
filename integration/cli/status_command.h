#ifndef WSYNC_INTEGRATION_CLI_STATUS_COMMAND_H_
#define WSYNC_INTEGRATION_CLI_STATUS_COMMAND_H_

// `wsync status --coordinator HOST:PORT --job J (--secret_file F | --secret_env V) [--json]
// [--watch S]`: asks a running job's coordinator (standalone or hosted by trainer rank 0) what it
// knows, authenticated with the job secret and read-only (control/status_client.h): each
// process's role, rank, node, state (missing, connected, joined, lost and why), how long ago it
// was last heard, the collectives it contributed to, the missing processes and the latest
// refusals. --json prints one JSON object per query; --watch repeats every S seconds until
// interrupted.

#include <string>

#include "control/control.pb.h"

namespace wsync::cli {

std::string StatusUsage();

// argv[0] is "status". Returns 0 once the query (every query with --watch) succeeded, 1 when one
// failed, 2 for a usage error.
int StatusMain(int argc, char** argv);

// The report of `body`: a table for people, or one line of JSON. Pure.
std::string StatusText(const control::JobStatusBody& body);
std::string StatusJson(const control::JobStatusBody& body);

}  // namespace wsync::cli

#endif  // WSYNC_INTEGRATION_CLI_STATUS_COMMAND_H_
