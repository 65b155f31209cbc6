/* Shared by the two files of abi_test (abi_test.c: main and the job; abi_arguments.c: the checks
 * without a job): pass/fail counting, status checks and the base config. Single-threaded use
 * only, as in abi_test's parent process. */
#ifndef WSYNC_TESTS_PLUGIN_ABI_TEST_H_
#define WSYNC_TESTS_PLUGIN_ABI_TEST_H_

#include "wsync/wsync.h"

#define DIM 8 /* The job's parameter is fp32 [DIM, DIM]. */

extern int passed;
extern int failed;
extern const char* who; /* Prefix of failure lines: parent, trainer or rollout. */

/* Counts one check; prints the failure with its location. Returns ok. */
int Check(int ok, const char* what, int line);
#define CHECK(cond) Check((cond) != 0, #cond, __LINE__)

const char* StatusName(wsync_status_t status);

/* Checks that `got` is `want` and, for a failure, that last_error(session) has a message (and
 * contains `needle` when given). */
void ExpectStatus(const wsync_plugin_v1_t* api, wsync_session_t* session, wsync_status_t got,
                  wsync_status_t want, const char* needle, const char* what, int line);
#define EXPECT_STATUS(session, call, want, needle) \
  ExpectStatus(api, (session), (call), (want), (needle), #call, __LINE__)

/* A 1-trainer, 1-rollout config of job "abi-test" over UCX shared memory, coordinator on `port`. */
wsync_config_t BaseConfig(wsync_role_t role, int port);

/* abi_arguments.c: the checks without a job, each on sessions of its own. */
void CheckTable(const wsync_plugin_v1_t* api);
void CheckInitArguments(const wsync_plugin_v1_t* api);
void CheckNullSession(const wsync_plugin_v1_t* api);
void CheckRegisteredSession(const wsync_plugin_v1_t* api);
void CheckNamedPlacement(const wsync_plugin_v1_t* api);
void CheckOutOfMemory(const wsync_plugin_v1_t* api);

#endif /* WSYNC_TESTS_PLUGIN_ABI_TEST_H_ */
