#ifndef WSYNC_INTEGRATION_CLI_DEMO_COMMAND_H_
#define WSYNC_INTEGRATION_CLI_DEMO_COMMAND_H_

// `wsync demo`: the main job on this machine. Launches trainer and rollout processes
// (wsync_demo_process, integration/demo/), each of which loads libwsync.so with dlopen and drives
// it through the C ABI as an engine would; trainer rank 0 hosts the coordinator. Runs K RL steps
// (the trainers write version v, sync it; every rollout verifies every byte of version v), shows
// progress while they run and prints a table per step at the end.

#include <string>

namespace wsync::cli {

// Text describing `wsync demo`'s flags, for `wsync help`.
std::string DemoUsage();

// argv[0] is "demo". Returns 0 when every step committed and verified on every rollout, 1 when
// the job fails or a byte differs, 2 for a usage error.
int DemoMain(int argc, char** argv);

}  // namespace wsync::cli

#endif  // WSYNC_INTEGRATION_CLI_DEMO_COMMAND_H_
