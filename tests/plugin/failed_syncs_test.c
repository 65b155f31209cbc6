/* 100 failed syncs in a row leave descriptors, threads, memory maps and /dev/shm entries at
 * baseline, write nothing into the rollout's weights but that sync's own bytes, and the next sync
 * succeeds without restarting anything (docs/failures.md, promises 2 and 6).
 *
 * One job of one trainer (this process, hosting the coordinator) and one rollout (a forked
 * partner), both through libwsync.so's C ABI, connected once. Then syncs fail alternately in two
 * ways that both fail after connect:
 *   - receive: the rollout's executor fails its receive post (failpoint `recv`, WSYNC_FAILPOINTS,
 *     common/failpoint.h) after the agreement, while the trainer's message is on its way;
 *   - disagree: the rollout asks for another version than trainer rank 0 (ranks disagree).
 * After WARMUP_FAILURES of them (one of each: UCX creates some resources lazily on the first
 * transfer attempt) both processes measure their resources; after FAILED_SYNCS more they measure
 * again: descriptors, threads and /dev/shm entries must be equal, memory maps may exceed the
 * baseline by MAPS_TOLERANCE lines (the allocator may map a few more arenas). Every failed sync
 * must fail on both processes with an error naming its cause (the trainer's names the rollout) and
 * leave the rollout `dirty`. A disagreement fails before any byte moves: it changes no weight. A
 * failed receive may still take in what the trainer already sent (a failed run drains its peers'
 * messages for a moment, executor/execute.h), so it may change weights, but only to that sync's
 * values, never to anything else. A last sync
 * must then succeed: the rollout holds exactly the trainer's weights and is consistent.
 * Both processes share a private /dev/shm (host_test_util.h).
 *
 * Output: failures on standard error, then "failed_syncs_test: N passed, M failed". Exit status 0
 * only when nothing failed. Usage: failed_syncs_test [failed syncs (default 100)]. */

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "host_test_util.h"
#include "wsync/wsync.h"

#ifndef WSYNC_PLUGIN_PATH
#define WSYNC_PLUGIN_PATH "libwsync.so"
#endif

#define WARMUP_FAILURES 2
#define DIM 16
#define UNTOUCHED -1.0f

#define CALL(session, call) CheckCall(api, (session), (call), #call, step, __LINE__)

/* Sync `step` (0-based) fails through the rollout's receive when even, by disagreement when odd. */
static int FailsByReceive(int step) { return step % 2 == 0; }

static float weights[DIM * DIM];
static float before_sync[DIM * DIM]; /* The rollout's weights when the sync was called. */

static double Now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void Fill(int64_t version) {
  for (int i = 0; i < DIM * DIM; ++i) weights[i] = (float)(version * 1000 + i);
}

/* Elements a failed sync of `version` changed to anything but that version's value, or, with
 * `any_change`, changed at all. */
static int WronglyChanged(int64_t version, int any_change) {
  int wrong = 0;
  for (int i = 0; i < DIM * DIM; ++i) {
    if (weights[i] == before_sync[i]) continue;
    wrong += any_change || weights[i] != (float)(version * 1000 + i);
  }
  return wrong;
}

/* Elements of the rollout's weights that differ from `expected` (UNTOUCHED or version v's). */
static int Wrong(int64_t version, int untouched) {
  int wrong = 0;
  for (int i = 0; i < DIM * DIM; ++i) {
    wrong += weights[i] != (untouched ? UNTOUCHED : (float)(version * 1000 + i));
  }
  return wrong;
}

static wsync_session_t* Connect(const wsync_plugin_v1_t* api, int is_trainer, int port) {
  const int step = -1;
  for (int i = 0; i < DIM * DIM; ++i) weights[i] = UNTOUCHED;
  /* The deadline is reached only by a hang: every failure here is immediate. */
  wsync_session_t* session =
      InitSquareJob(api, is_trainer, port, "failed-syncs-test", 20, weights, DIM, step);
  if (session == NULL || CALL(session, api->connect(session))) return session;
  api->finalize(session);
  return NULL;
}

/* Checks the rollout's state: DIRTY after a failure, IDLE at `expected_version` (consistent)
 * after a success. */
static void CheckState(const wsync_plugin_v1_t* api, wsync_session_t* session, int step,
                       int64_t expected_version, wsync_state_t expected) {
  int64_t version = -2;
  wsync_state_t state = WSYNC_STATE_IDLE;
  if (!CALL(session, api->state(session, &version, &state))) return;
  char text[160];
  snprintf(text, sizeof(text), "step %d: rollout state %d version %lld, expected %d version %lld",
           step, (int)state, (long long)version, (int)expected, (long long)expected_version);
  Check(state == expected && (expected != WSYNC_STATE_IDLE || version == expected_version), text,
        __LINE__);
}

/* The whole job as seen by one process; returns 0 when nothing failed. */
static int Run(const char* path, int is_trainer, int port, int failed_syncs) {
  const wsync_plugin_v1_t* api = LoadPlugin(path);
  if (api == NULL) return 1;
  wsync_session_t* session = Connect(api, is_trainer, port);
  if (session == NULL) return 1;
  Resources baseline = MeasureResources();
  const int total = WARMUP_FAILURES + failed_syncs;
  const double start = Now();
  int step = 0;
  for (; step < total; ++step) {
    if (step == WARMUP_FAILURES) baseline = MeasureResources();
    const int64_t version = step + 1;
    if (is_trainer) Fill(version);
    const int64_t asked = !is_trainer && !FailsByReceive(step) ? version + 1000 : version;
    memcpy(before_sync, weights, sizeof(weights));
    const wsync_status_t status = api->sync(session, asked);
    char text[640];
    snprintf(text, sizeof(text), "step %d (%s): the sync of version %lld succeeded", step,
             FailsByReceive(step) ? "receive fails" : "ranks disagree", (long long)asked);
    if (!Check(status != WSYNC_OK, text, __LINE__)) break;
    /* The error says why: the rollout its own cause, the trainer names the rollout (process 1). */
    const char* error = api->last_error(session);
    const char* cause = FailsByReceive(step) ? "failpoint 'recv'" : "ranks disagree";
    snprintf(text, sizeof(text), "step %d: the error does not name %s: %s", step,
             is_trainer ? "process 1" : cause, error);
    Check(strstr(error, is_trainer ? "process 1" : cause) != NULL, text, __LINE__);
    if (!is_trainer) {
      const int wrong = WronglyChanged(version, !FailsByReceive(step));
      snprintf(text, sizeof(text), "step %d: a failed sync changed %d elements %s (%s)", step,
               wrong,
               FailsByReceive(step) ? "to something but its own values" : "before any byte moved",
               api->last_error(session));
      Check(wrong == 0, text, __LINE__);
      CheckState(api, session, step, 0, WSYNC_STATE_DIRTY);
    }
  }
  const double failing_s = Now() - start;
  if (step == total) {
    char what[96];
    snprintf(what, sizeof(what), "after %d failed syncs (%.2f s in all)", failed_syncs, failing_s);
    CheckResources(baseline, MeasureResources(), MAPS_TOLERANCE, what);
    /* Recovery: the next sync works without restarting anything. */
    const int64_t version = total + 1;
    if (is_trainer) Fill(version);
    if (CALL(session, api->sync(session, version)) && !is_trainer) {
      char text[96];
      snprintf(text, sizeof(text), "step %d: %d wrong elements after the good sync", step,
               Wrong(version, 0));
      Check(Wrong(version, 0) == 0, text, __LINE__);
      CheckState(api, session, step, version, WSYNC_STATE_IDLE);
    }
  }
  CALL(session, api->finalize(session));
  return test_failed == 0 ? 0 : 1;
}

/* WSYNC_FAILPOINTS for the rollout: its receive fails on the first post of each receive-failing
 * sync. A failing sync posts one receive (the first post fails and the executor stops), so the
 * k-th evaluation is the k-th such sync. */
static void SetRolloutFailpoints(int total) {
  static char spec[16384];
  size_t used = 0;
  int failures = 0;
  for (int step = 0; step < total; ++step) {
    if (!FailsByReceive(step)) continue;
    ++failures;
    used += (size_t)snprintf(spec + used, sizeof(spec) - used, "%srecv:fail@%d",
                             used == 0 ? "" : ",", failures);
  }
  if (used >= sizeof(spec)) {
    Check(0, "WSYNC_FAILPOINTS fits", __LINE__);
    return;
  }
  setenv("WSYNC_FAILPOINTS", spec, 1);
}

int main(int argc, char** argv) {
  const int failed_syncs = argc > 1 ? atoi(argv[1]) : 100;
  if (failed_syncs < 1) {
    fprintf(stderr, "the number of failed syncs must be positive\n");
    return 2;
  }
  test_who = "trainer";
  if (!UsePrivateDevShm())
    fprintf(stderr, "[trainer] no private /dev/shm: counting the shared one\n");
  setenv("WSYNC_SECRET", "failed-syncs-test-secret-0123456789", 1);
  const int port = FreePort();
  if (!Check(port > 0, "a free port", __LINE__)) return 1;
  fflush(NULL);
  const pid_t partner = fork();
  if (partner < 0) return 1;
  if (partner == 0) {
    test_who = "rollout";
    SetRolloutFailpoints(WARMUP_FAILURES + failed_syncs);
    exit(Run(WSYNC_PLUGIN_PATH, 0, port, failed_syncs)); /* exit: LeakSanitizer checks it too */
  }
  Run(WSYNC_PLUGIN_PATH, 1, port, failed_syncs);
  int status = 0;
  waitpid(partner, &status, 0);
  Check(WIFEXITED(status) && WEXITSTATUS(status) == 0,
        "the rollout partner exited with status 0 (its failures are above)", __LINE__);
  printf("failed_syncs_test: %d passed, %d failed (%d failed syncs)\n", test_passed, test_failed,
         failed_syncs);
  return test_failed == 0 ? 0 : 1;
}
