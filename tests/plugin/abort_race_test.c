/* abort() racing finalize() on another thread (wsync.h, "Threads"), many times: every abort that
 * starts while finalize runs either acts on the session or does nothing, and finalize frees the
 * handle only after an abort in flight returned. Before the fix abort dereferenced the handle
 * finalize was freeing (a use after free that AddressSanitizer reports and ThreadSanitizer sees as
 * a race); this test runs in the plain, ASan and TSan builds.
 *
 * Each cycle: init a session of a 1-trainer, 1-rollout job (registered, not connected), start a
 * thread that waits for a shared flag and then calls abort() once or several times, set the flag
 * and call finalize() at once. Every call must return WSYNC_OK.
 *
 * Output: failures on standard error, then "abort_race_test: N passed, M failed". Exit status 0
 * only when nothing failed. Usage: abort_race_test [cycles (default 10000)] [path to libwsync.so]. */

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#include "host_test_util.h"
#include "wsync/wsync.h"

#ifndef WSYNC_PLUGIN_PATH
#define WSYNC_PLUGIN_PATH "libwsync.so"
#endif

#define DIM 4

typedef struct {
  const wsync_plugin_v1_t* api;
  wsync_session_t* session;
  atomic_int go;
  int aborts;
  wsync_status_t worst;
} Racer;

static void* AbortLoop(void* arg) {
  Racer* racer = (Racer*)arg;
  while (!atomic_load(&racer->go)) {
  }
  for (int i = 0; i < racer->aborts; ++i) {
    const wsync_status_t status = racer->api->abort(racer->session, "racing finalize");
    if (status != WSYNC_OK) racer->worst = status;
  }
  return NULL;
}

int main(int argc, char** argv) {
  test_who = "abort_race_test";
  setenv("WSYNC_SECRET", "abort-race-test-secret-0123456789abcdef", 1);
  const int cycles = argc > 1 ? atoi(argv[1]) : 10000;
  const wsync_plugin_v1_t* api = LoadPlugin(argc > 2 ? argv[2] : WSYNC_PLUGIN_PATH);
  if (api == NULL) return 1;
  const int port = FreePort();
  static float weights[DIM * DIM];
  int bad_abort = 0, bad_finalize = 0, failed_init = 0;
  for (int cycle = 0; cycle < cycles; ++cycle) {
    wsync_session_t* session =
        InitSquareJob(api, cycle % 2 == 0, port, "abort-race", 5, weights, DIM, cycle);
    if (session == NULL) {
      ++failed_init;
      break;
    }
    Racer racer = {api, session, 0, 1 + cycle % 3, WSYNC_OK};
    pthread_t thread;
    if (pthread_create(&thread, NULL, AbortLoop, &racer) != 0) {
      Check(0, "pthread_create", __LINE__);
      api->finalize(session);
      break;
    }
    atomic_store(&racer.go, 1);
    if (api->finalize(session) != WSYNC_OK) ++bad_finalize;
    pthread_join(thread, NULL);
    if (racer.worst != WSYNC_OK) ++bad_abort;
  }
  Check(failed_init == 0, "every init succeeded", __LINE__);
  Check(bad_abort == 0, "every abort racing finalize returned WSYNC_OK", __LINE__);
  Check(bad_finalize == 0, "every finalize returned WSYNC_OK", __LINE__);
  fprintf(stderr, "abort_race_test: %d passed, %d failed (%d cycles)\n", test_passed, test_failed,
          cycles);
  return test_failed == 0 ? 0 : 1;
}
