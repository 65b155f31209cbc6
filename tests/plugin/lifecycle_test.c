/* init/finalize many times in one process leaks no file descriptor, thread, memory map or /dev/shm
 * entry.
 *
 * Each cycle is a whole job of one trainer (this process, hosting the coordinator) and one
 * rollout (a partner process that cycles in lockstep): init, declare the layout, connect, sync
 * version 1, check it, finalize. Both processes count their open descriptors (/proc/self/fd),
 * threads (/proc/self/task), memory maps (/proc/self/maps) and /dev/shm entries after the first
 * cycles (one-time initialization of UCX and the allocator) and after the last: descriptors,
 * threads and /dev/shm entries must be equal, maps may differ by at most MAPS_TOLERANCE lines (the
 * allocator may keep a few). Both processes share a private /dev/shm (host_test_util.h), so the
 * count is this job's alone.
 *
 * The partner is forked before either process loads the library. Per cycle the trainer picks a
 * free port and sends it to the partner through a pipe; the partner answers one byte when its
 * cycle ended ('+' good, '-' failed), so cycles never overlap.
 *
 * Output: failures on standard error, then "lifecycle_test: N passed, M failed". Exit status 0
 * only when nothing failed. Usage: lifecycle_test [cycles (default 200)] [path to libwsync.so]. */

#include <fcntl.h>
#include <signal.h>
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

#define WARMUP_CYCLES 3
#define DIM 16

#define CALL(session, call) CheckCall(api, (session), (call), #call, cycle, __LINE__)

static void CompareResources(Resources baseline, Resources now, int cycles) {
  char what[64];
  snprintf(what, sizeof(what), "after %d cycles", cycles - WARMUP_CYCLES);
  CheckResources(baseline, now, MAPS_TOLERANCE, what);
}

/* One job cycle of this process; returns 1 when every step succeeded. */
static int Cycle(const wsync_plugin_v1_t* api, int is_trainer, int port, int cycle) {
  static float weights[DIM * DIM];
  wsync_session_t* session =
      InitSquareJob(api, is_trainer, port, "lifecycle-test", 30, weights, DIM, cycle);
  if (session == NULL) return 0;
  for (int i = 0; i < DIM * DIM; ++i) weights[i] = is_trainer ? (float)(cycle + i) : -1.0f;
  int ok = CALL(session, api->connect(session)) && CALL(session, api->sync(session, 1));
  if (ok && !is_trainer) {
    int wrong = 0;
    for (int i = 0; i < DIM * DIM; ++i) wrong += weights[i] != (float)(cycle + i);
    char text[128];
    snprintf(text, sizeof(text), "cycle %d: %d wrong elements", cycle, wrong);
    ok = Check(wrong == 0, text, __LINE__);
  }
  ok = CALL(NULL, api->finalize(session)) && ok;
  return ok;
}

/* The rollout partner: a cycle per port read from `in` until 0 or end of file. */
static int Partner(const char* path, int in, int out) {
  test_who = "rollout";
  const wsync_plugin_v1_t* api = LoadPlugin(path);
  Resources baseline = MeasureResources();
  int cycle = 0;
  int port = 0;
  while (api != NULL && read(in, &port, sizeof(port)) == (ssize_t)sizeof(port) && port != 0) {
    const char result = Cycle(api, 0, port, cycle) ? '+' : '-';
    if (write(out, &result, 1) != 1) break;
    ++cycle;
    if (cycle == WARMUP_CYCLES) baseline = MeasureResources();
  }
  if (cycle > WARMUP_CYCLES) CompareResources(baseline, MeasureResources(), cycle);
  return test_failed == 0 ? 0 : 1;
}

int main(int argc, char** argv) {
  const int cycles = argc > 1 ? atoi(argv[1]) : 200;
  const char* path = argc > 2 ? argv[2] : WSYNC_PLUGIN_PATH;
  if (cycles <= WARMUP_CYCLES) {
    fprintf(stderr, "cycles must exceed %d\n", WARMUP_CYCLES);
    return 2;
  }
  test_who = "trainer";
  if (!UsePrivateDevShm())
    fprintf(stderr, "[trainer] no private /dev/shm: counting the shared one\n");
  setenv("WSYNC_SECRET", "lifecycle-test-secret-0123456789", 1);
  int to_partner[2];
  int from_partner[2];
  if (pipe2(to_partner, O_CLOEXEC) != 0 || pipe2(from_partner, O_CLOEXEC) != 0) return 1;
  fflush(NULL);
  const pid_t partner = fork();
  if (partner < 0) return 1;
  if (partner == 0) {
    close(to_partner[1]);
    close(from_partner[0]);
    exit(Partner(path, to_partner[0], from_partner[1])); /* exit: LeakSanitizer checks it too */
  }
  close(to_partner[0]);
  close(from_partner[1]);

  const wsync_plugin_v1_t* api = LoadPlugin(path);
  Resources baseline = MeasureResources();
  int cycle = 0;
  for (; api != NULL && cycle < cycles; ++cycle) {
    if (cycle == WARMUP_CYCLES) baseline = MeasureResources();
    int port = FreePort();
    if (!Check(port > 0, "a free port", __LINE__)) break;
    if (write(to_partner[1], &port, sizeof(port)) != (ssize_t)sizeof(port)) {
      Check(0, "the partner takes the next port", __LINE__);
      break;
    }
    const int ok = Cycle(api, 1, port, cycle);
    char result = 0;
    if (read(from_partner[0], &result, 1) != 1) {
      Check(0, "the partner reports its cycle", __LINE__);
      break;
    }
    /* The partner counts its own failures; a failed cycle on either side ends the test. */
    if (!ok || result != '+') {
      fprintf(stderr, "[trainer] stopping after the failed cycle %d\n", cycle);
      ++cycle;
      break;
    }
  }
  if (cycle > WARMUP_CYCLES) CompareResources(baseline, MeasureResources(), cycle);
  Check(cycle == cycles, "every cycle ran", __LINE__);

  const int stop = 0;
  if (write(to_partner[1], &stop, sizeof(stop)) != (ssize_t)sizeof(stop)) {
    Check(0, "the partner takes the stop", __LINE__);
  }
  close(to_partner[1]);
  int status = 0;
  waitpid(partner, &status, 0);
  Check(WIFEXITED(status) && WEXITSTATUS(status) == 0,
        "the rollout partner exited with status 0 (its failures are above)", __LINE__);
  printf("lifecycle_test: %d passed, %d failed (%d cycles)\n", test_passed, test_failed, cycle);
  return test_failed == 0 ? 0 : 1;
}
