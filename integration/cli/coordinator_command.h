#ifndef WSYNC_INTEGRATION_CLI_COORDINATOR_COMMAND_H_
#define WSYNC_INTEGRATION_CLI_COORDINATOR_COMMAND_H_

// `wsync coordinator`: the job's standalone coordinator (control/coordinator.h). It
// listens, authenticates every process, serves the rendezvous and the collectives, and runs until
// SIGINT or SIGTERM.

#include <string>

namespace wsync::cli {

std::string CoordinatorUsage();

// argv[0] is "coordinator". Returns 0 after a signal, 1 when the coordinator cannot start, 2 for a
// usage error.
int CoordinatorMain(int argc, char** argv);

}  // namespace wsync::cli

#endif  // WSYNC_INTEGRATION_CLI_COORDINATOR_COMMAND_H_
