/* Helpers for the C host tests of libwsync.so (lifecycle_test.c, failed_syncs_test.c, ...): checks
 * with pass/fail counts, loading the plugin, a free loopback port, and the process resources a
 * leak would grow (descriptors, threads, memory maps, /dev/shm entries). Not thread-safe: call
 * from the test's main thread. */
#ifndef WSYNC_TESTS_PLUGIN_HOST_TEST_UTIL_H_
#define WSYNC_TESTS_PLUGIN_HOST_TEST_UTIL_H_

#include <netinet/in.h>

#include "wsync/wsync.h"

/* Checks passed and failed so far in this process, and who this process is in messages. */
extern int test_passed;
extern int test_failed;
extern const char* test_who;

/* Counts `ok`; when false prints "[who] FAILED (line L): what" to standard error. Returns ok. */
int Check(int ok, const char* what, int line);

/* Check(status == WSYNC_OK) with the call's text, the step number and last_error(session). */
int CheckCall(const wsync_plugin_v1_t* api, wsync_session_t* session, wsync_status_t status,
              const char* what, int step, int line);

/* dlopen + dlsym(wsyncPlugin_v1); NULL (and a failed check) when either fails. */
const wsync_plugin_v1_t* LoadPlugin(const char* path);

/* init, then the layout of a 1-trainer, 1-rollout job over UCX shared memory whose one parameter
 * "w" is the dim x dim fp32 matrix `weights` in both processes; the trainer hosts the coordinator
 * on `port`. Returns the session (REGISTERED), or NULL after failed checks (`step` in their text)
 * with the session finalized. */
wsync_session_t* InitSquareJob(const wsync_plugin_v1_t* api, int is_trainer, int port,
                               const char* job_id, double deadline_seconds, float* weights, int dim,
                               int step);

/* InitSquareJob with `weights` registered as memory of `kind` (device 0 for WSYNC_MEMORY_CUDA). */
wsync_session_t* InitSquareJobIn(const wsync_plugin_v1_t* api, int is_trainer, int port,
                                 const char* job_id, double deadline_seconds, float* weights,
                                 int dim, wsync_memory_kind_t kind, int step);

/* The config of InitSquareJob (UCX shared memory; the trainer hosts the coordinator on `port`),
 * for a test to change before InitSquareJobWith. */
wsync_config_t SquareJobConfig(int is_trainer, int port, const char* job_id,
                               double deadline_seconds);

/* init with `config`, then InitSquareJob's layout in memory of `kind`. */
wsync_session_t* InitSquareJobWith(const wsync_plugin_v1_t* api, const wsync_config_t* config,
                                   float* weights, int dim, wsync_memory_kind_t kind, int step);

/* The socket address 127.0.0.1:`port`. */
struct sockaddr_in LoopbackAddress(int port);

/* A TCP port on 127.0.0.1 that was free a moment ago, below the ephemeral range where there is
 * room; 0 when none could be found. */
int FreePort(void);

/* Gives this process (and the children it forks later) its own empty /dev/shm: a private mount
 * namespace with a tmpfs there, so that /dev/shm counts only this test's entries, whatever else
 * runs on the machine. Needs CAP_SYS_ADMIN (the tests run as root); returns 0 when that is
 * refused, leaving the shared /dev/shm (whose count other processes may then disturb). */
int UsePrivateDevShm(void);

/* Memory-map lines a test allows above its baseline: the allocator may map a few more arenas.
 * ThreadSanitizer's runtime maps state for each new thread and keeps it for reuse: measured +36
 * to +44 lines over the first 30 init/finalize cycles and no more after 200, so TSan builds allow
 * more. So does AddressSanitizer's, since every sync starts a thread (the loss watch): +7 to +21
 * lines after 200 cycles, +28 to +35 after 1000, where the uninstrumented build stays exactly
 * at its baseline over 1000 cycles. */
#if defined(WSYNC_SANITIZED) /* cmake/WsyncSanitizers.cmake */
#define MAPS_TOLERANCE 64
#else
#define MAPS_TOLERANCE 16
#endif

typedef struct {
  int fds;     /* entries of /proc/self/fd (incl. the one that counts them: constant) */
  int threads; /* entries of /proc/self/task */
  int maps;    /* lines of /proc/self/maps */
  int shm;     /* entries of /dev/shm */
} Resources;

Resources MeasureResources(void);

/* Checks that descriptors, threads and /dev/shm entries equal the baseline and that memory maps
 * exceed it by at most `maps_tolerance`; prints both on standard error with `what`. */
void CheckResources(Resources baseline, Resources now, int maps_tolerance, const char* what);

#endif /* WSYNC_TESTS_PLUGIN_HOST_TEST_UTIL_H_ */
