/* libwsync.so loads the CUDA libraries only where CUDA memory needs them (docs/cuda.md;
 * device/cuda_module.h).
 *
 * One trainer (this process, hosting the coordinator) and one rollout (a forked partner) load
 * libwsync.so through its C ABI and run three jobs of one 16x16 fp32 matrix, one after another:
 *   1. host memory on both sides: connect and one sync; the rollout then holds the trainer's
 *      weights, and neither process maps libcudart, libnccl or libwsync_cuda.so (/proc/self/maps).
 *   2. the trainer's weights registered as CUDA memory, with WSYNC_CUDA_MODULE naming a module that
 *      does not exist: connect fails in both processes with WSYNC_UNSUPPORTED and an error naming
 *      that path (the trainer's own verdict, spread to the rollout by the CUDA collective); still
 *      nothing of CUDA is mapped in either process.
 *   3. the same with WSYNC_CUDA_MODULE unset, so the trainer loads the module built next to
 *      libwsync.so, on a machine without a GPU only (with one, the job would be accepted): connect
 *      fails in both with WSYNC_UNSUPPORTED "no CUDA device", which only the module's libcudart can
 *      answer; the trainer now maps libwsync_cuda.so and libcudart, the rollout still neither.
 *
 * Output: failures on standard error, then "cuda_module_test: N passed, M failed". Exit status 0
 * only when nothing failed. Usage: cuda_module_test (no arguments). */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "host_test_util.h"
#include "wsync/wsync.h"

#ifndef WSYNC_PLUGIN_PATH
#define WSYNC_PLUGIN_PATH "libwsync.so"
#endif

#define DIM 16
#define MISSING_MODULE "/nonexistent/libwsync_cuda.so"

static float weights[DIM * DIM];

/* Whether a line of /proc/self/maps names `library` (a file name prefix such as "libcudart"). */
static int Maps(const char* library) {
  FILE* maps = fopen("/proc/self/maps", "r");
  if (maps == NULL) return -1;
  char line[4096];
  int found = 0;
  while (!found && fgets(line, sizeof(line), maps) != NULL) {
    const char* slash = strrchr(line, '/');
    found = slash != NULL && strncmp(slash + 1, library, strlen(library)) == 0;
  }
  fclose(maps);
  return found;
}

/* Checks that this process maps the module, libcudart and libnccl (the module's DT_NEEDED) after
 * `phase` exactly when `cuda_expected`. */
static void CheckMaps(int phase, int cuda_expected) {
  const char* libraries[] = {"libwsync_cuda.so", "libcudart", "libnccl"};
  for (int i = 0; i < 3; ++i) {
    const int expected = cuda_expected ? 1 : 0;
    const int mapped = Maps(libraries[i]);
    char text[160];
    snprintf(text, sizeof(text), "phase %d: %s is %smapped, expected %s", phase, libraries[i],
             mapped == 1 ? "" : "not ", expected ? "mapped" : "not mapped");
    Check(mapped == expected, text, __LINE__);
  }
}

/* Phase 1: a host-only sync; returns after finalize. */
static void HostOnly(const wsync_plugin_v1_t* api, int is_trainer, int port) {
  const int step = 1;
  for (int i = 0; i < DIM * DIM; ++i) weights[i] = is_trainer ? (float)(7 * i) : -1.0f;
  wsync_session_t* session =
      InitSquareJob(api, is_trainer, port, "cuda-module-host", 30, weights, DIM, step);
  if (session == NULL) return;
  if (CheckCall(api, session, api->connect(session), "connect", step, __LINE__) &&
      CheckCall(api, session, api->sync(session, 1), "sync", step, __LINE__) && !is_trainer) {
    int wrong = 0;
    for (int i = 0; i < DIM * DIM; ++i) wrong += weights[i] != (float)(7 * i);
    char text[96];
    snprintf(text, sizeof(text), "phase 1: %d wrong elements after the sync", wrong);
    Check(wrong == 0, text, __LINE__);
  }
  CheckCall(api, session, api->finalize(session), "finalize", step, __LINE__);
}

/* Phases 2 and 3: the trainer's weights are CUDA memory (never touched: connect must refuse the
 * job first); connect must fail with WSYNC_UNSUPPORTED and an error containing `reason`. */
static void RefusedCudaJob(const wsync_plugin_v1_t* api, int is_trainer, int port, int phase,
                           const char* job_id, const char* reason) {
  wsync_session_t* session =
      InitSquareJobIn(api, is_trainer, port, job_id, 30, weights, DIM,
                      is_trainer ? WSYNC_MEMORY_CUDA : WSYNC_MEMORY_HOST, phase);
  if (session == NULL) return;
  const wsync_status_t status = api->connect(session);
  const char* error = api->last_error(session);
  fprintf(stderr, "[%s] phase %d: connect returned %d: %s\n", test_who, phase, (int)status, error);
  char text[1024];
  snprintf(text, sizeof(text), "phase %d: connect returned %d, expected WSYNC_UNSUPPORTED (%d): %s",
           phase, (int)status, (int)WSYNC_UNSUPPORTED, error);
  Check(status == WSYNC_UNSUPPORTED, text, __LINE__);
  snprintf(text, sizeof(text), "phase %d: the error does not name \"%s\": %s", phase, reason,
           error);
  Check(strstr(error, reason) != NULL, text, __LINE__);
  CheckCall(api, session, api->finalize(session), "finalize", phase, __LINE__);
}

static int GpuPresent(void) { return access("/dev/nvidia0", F_OK) == 0; }

static int Run(int is_trainer, const int ports[3]) {
  const wsync_plugin_v1_t* api = LoadPlugin(WSYNC_PLUGIN_PATH);
  if (api == NULL) return 1;
  HostOnly(api, is_trainer, ports[0]);
  CheckMaps(1, 0);

  setenv("WSYNC_CUDA_MODULE", MISSING_MODULE, 1);
  RefusedCudaJob(api, is_trainer, ports[1], 2, "cuda-module-missing", MISSING_MODULE);
  CheckMaps(2, 0);
  unsetenv("WSYNC_CUDA_MODULE");

  if (GpuPresent()) {
    fprintf(stderr, "[%s] phase 3 skipped: a GPU is present (/dev/nvidia0)\n", test_who);
  } else {
    RefusedCudaJob(api, is_trainer, ports[2], 3, "cuda-module-no-device", "no CUDA device");
    CheckMaps(3, is_trainer);
  }
  return test_failed == 0 ? 0 : 1;
}

int main(int argc, char** argv) {
  (void)argv;
  if (argc > 1) {
    fprintf(stderr, "usage: cuda_module_test\n");
    return 2;
  }
  test_who = "trainer";
  setenv("WSYNC_SECRET", "cuda-module-test-secret-0123456789", 1);
  unsetenv("WSYNC_CUDA_MODULE");
  int ports[3];
  for (int i = 0; i < 3; ++i) {
    ports[i] = FreePort();
    for (int j = 0; j < i; ++j) {
      if (ports[j] == ports[i]) ports[i] = 0;
    }
    if (!Check(ports[i] > 0, "three distinct free ports", __LINE__)) return 1;
  }
  fflush(NULL);
  const pid_t partner = fork();
  if (partner < 0) return 1;
  if (partner == 0) {
    test_who = "rollout";
    exit(Run(0, ports)); /* exit: LeakSanitizer checks it too */
  }
  Run(1, ports);
  int status = 0;
  waitpid(partner, &status, 0);
  Check(WIFEXITED(status) && WEXITSTATUS(status) == 0,
        "the rollout partner exited with status 0 (its failures are above)", __LINE__);
  printf("cuda_module_test: %d passed, %d failed\n", test_passed, test_failed);
  return test_failed == 0 ? 0 : 1;
}
