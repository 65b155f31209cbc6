/* The host log callback of the C ABI (set_log in wsync.h), as an engine routes wsync's lines into
 * its own logger. A 1-trainer, 1-rollout job (the rollout a partner forked before the library was
 * loaded; the trainer hosts the coordinator) runs four syncs, each process with its own callback:
 *   sync 1, categories "all" at info: each process receives the connect lines (the job joined,
 *     the transports per path class), its plan, a line per round of its own (at least the four
 *     rounds a 4096-byte budget cuts the 16 KiB matrix into) and "sync 1 committed"; the trainer
 *     also its coordinator's lines (both processes joined, the commit vote); no debug line.
 *   sync 2, categories "round": round lines only.
 *   sync 3, after set_log(NULL, ...): the callback is not called again.
 *   sync 4, categories "fault,sync" at warn, fails (the rollout syncs version 5): no info line;
 *     both processes receive "sync 4 aborted" and their own failure with the reason, the trainer
 *     naming the process that rejected the sync.
 * Also: an unknown category and a level outside 0..4 are refused, naming them, and change
 * nothing. WSYNC_LOG and WSYNC_LOG_LEVEL are unset first: the environment would take precedence.
 *
 * Output: failures on standard error, then "log_callback_test: N passed, M failed". Exit status 0
 * only when nothing failed in either process. */

#include <pthread.h>
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

#define DIM 64
#define BUDGET_BYTES 4096
#define MAX_LINES 2048
#define CALL(session, call) CheckCall(api, (session), (call), #call, 0, __LINE__)

typedef struct {
  pthread_mutex_t mu; /* The library serializes the calls; the main thread reads meanwhile. */
  int count;
  int calls;
  int levels[MAX_LINES];
  char categories[MAX_LINES][16];
  char lines[MAX_LINES][320];
} Collected;

static Collected collected = {PTHREAD_MUTEX_INITIALIZER, 0, 0, {0}, {{0}}, {{0}}};
static float weights[DIM * DIM];

static void Collect(void* user, int32_t level, const char* category, const char* line) {
  Collected* c = (Collected*)user;
  pthread_mutex_lock(&c->mu);
  ++c->calls;
  if (c->count < MAX_LINES) {
    c->levels[c->count] = level;
    snprintf(c->categories[c->count], sizeof(c->categories[0]), "%s", category);
    snprintf(c->lines[c->count], sizeof(c->lines[0]), "%s", line);
    ++c->count;
  }
  pthread_mutex_unlock(&c->mu);
}

static void Forget(void) {
  pthread_mutex_lock(&collected.mu);
  collected.count = 0;
  collected.calls = 0;
  pthread_mutex_unlock(&collected.mu);
}

/* Lines of `category` (NULL: any) containing `text` (NULL: any). */
static int Count(const char* category, const char* text) {
  int n = 0;
  pthread_mutex_lock(&collected.mu);
  for (int i = 0; i < collected.count; ++i) {
    if ((category == NULL || strcmp(collected.categories[i], category) == 0) &&
        (text == NULL || strstr(collected.lines[i], text) != NULL)) {
      ++n;
    }
  }
  pthread_mutex_unlock(&collected.mu);
  return n;
}

static int CountAbove(int level) {
  int n = 0;
  pthread_mutex_lock(&collected.mu);
  for (int i = 0; i < collected.count; ++i) n += collected.levels[i] > level;
  pthread_mutex_unlock(&collected.mu);
  return n;
}

static int Calls(void) {
  pthread_mutex_lock(&collected.mu);
  const int calls = collected.calls;
  pthread_mutex_unlock(&collected.mu);
  return calls;
}

static void Expect(const char* category, const char* text, int at_least, int line) {
  const int n = Count(category, text);
  char what[256];
  snprintf(what, sizeof(what), "at least %d %s line(s) containing '%s' (got %d)", at_least,
           category, text, n);
  if (Check(n >= at_least, what, line)) return;
  pthread_mutex_lock(&collected.mu); /* What arrived instead. */
  for (int i = 0; i < collected.count; ++i) {
    fprintf(stderr, "  [%s] %d %s: %s\n", test_who, collected.levels[i], collected.categories[i],
            collected.lines[i]);
  }
  pthread_mutex_unlock(&collected.mu);
}

static void CheckRefusals(const wsync_plugin_v1_t* api) {
  Check(
      api->set_log(Collect, &collected, "connect,bogus", WSYNC_LOG_INFO) == WSYNC_INVALID_ARGUMENT,
      "an unknown category is refused", __LINE__);
  Check(strstr(api->last_error(NULL), "'bogus'") != NULL, "the refusal names the category",
        __LINE__);
  Check(api->set_log(Collect, &collected, "all", 5) == WSYNC_INVALID_ARGUMENT, "level 5 is refused",
        __LINE__);
  Check(api->set_log(Collect, &collected, "all", -1) == WSYNC_INVALID_ARGUMENT,
        "level -1 is refused", __LINE__);
}

/* The three syncs of either process; returns the exit status. */
static int RunJob(const wsync_plugin_v1_t* api, int is_trainer, int port) {
  CheckRefusals(api);
  wsync_config_t config = SquareJobConfig(is_trainer, port, "log-callback-test", 30);
  config.staging_budget_bytes = BUDGET_BYTES;
  for (int i = 0; i < DIM * DIM; ++i) weights[i] = is_trainer ? (float)(i + 1) : -1.0f;
  Forget();
  CALL(NULL, api->set_log(Collect, &collected, "all", WSYNC_LOG_INFO));
  wsync_session_t* session = InitSquareJobWith(api, &config, weights, DIM, WSYNC_MEMORY_HOST, 0);
  if (session == NULL) return 1;
  if (!CALL(session, api->connect(session)) || !CALL(session, api->sync(session, 1))) return 1;
  Check(Calls() == Count(NULL, NULL), "the collector kept every line", __LINE__);
  Expect("connect", "joined job log-callback-test: 2 processes (1 trainer, 1 rollout)", 1,
         __LINE__);
  Expect("connect", ": transports ", 1, __LINE__);
  Expect("plan", ": plan ", 1, __LINE__);
  Expect("round", "sync 1 round ", DIM * DIM * 4 / BUDGET_BYTES, __LINE__);
  Expect("sync", "sync 1 starts", 1, __LINE__);
  Expect("sync", "sync 1 committed", 1, __LINE__);
  Check(CountAbove(WSYNC_LOG_INFO) == 0, "no debug line at level info", __LINE__);
  Check(Count("fault", NULL) == 0, "no fault line in a good sync", __LINE__);
  if (is_trainer) {
    Expect("control", " joined (1 of 2)", 1, __LINE__);
    Expect("control", " joined (2 of 2)", 1, __LINE__);
    Expect("control", "every process voted yes: commit", 1, __LINE__);
  }

  CALL(NULL, api->set_log(Collect, &collected, "round", WSYNC_LOG_INFO));
  Forget();
  if (!CALL(session, api->sync(session, 2))) return 1;
  Expect("round", "sync 2 round ", DIM * DIM * 4 / BUDGET_BYTES, __LINE__);
  Check(Count(NULL, NULL) == Count("round", NULL), "only round lines with categories \"round\"",
        __LINE__);

  CALL(NULL, api->set_log(NULL, NULL, NULL, 0));
  Forget();
  if (!CALL(session, api->sync(session, 3))) return 1;
  Check(Calls() == 0, "after set_log(NULL) the callback is not called", __LINE__);
  if (!is_trainer) {
    int wrong = 0;
    for (int i = 0; i < DIM * DIM; ++i) wrong += weights[i] != (float)(i + 1);
    Check(wrong == 0, "every rollout element equals the trainer's", __LINE__);
  }

  /* A failed sync at level warn: the rollout syncs another version than the trainer's. */
  CALL(NULL, api->set_log(Collect, &collected, "fault,sync", WSYNC_LOG_WARN));
  Forget();
  Check(api->sync(session, is_trainer ? 4 : 5) != WSYNC_OK, "sync 4 fails: versions differ",
        __LINE__);
  Check(CountAbove(WSYNC_LOG_WARN) == 0, "no info line at level warn", __LINE__);
  Check(Count(NULL, NULL) == Count("fault", NULL) + Count("sync", NULL),
        "only fault and sync lines", __LINE__);
  Expect("sync", "sync 4 aborted: ", 1, __LINE__);
  Expect("sync", "ranks disagree on the version: this process syncs 5", 1, __LINE__);
  Expect("fault", "sync 4 failed here: ", 1, __LINE__);
  Expect("fault", "ranks disagree on the version: this process syncs 5", 1, __LINE__);
  if (is_trainer) Expect("fault", "rejected before any byte moved by process 1", 1, __LINE__);
  CALL(NULL, api->set_log(NULL, NULL, NULL, 0));
  CALL(NULL, api->finalize(session));
  return test_failed == 0 ? 0 : 1;
}

int main(void) {
  test_who = "log_callback_test";
  unsetenv("WSYNC_LOG");
  unsetenv("WSYNC_LOG_LEVEL");
  setenv("WSYNC_SECRET", "log-callback-test-secret-0123456789", 1);
  const int port = FreePort();
  if (!Check(port > 0, "a free port", __LINE__)) return 1;
  fflush(NULL);
  const pid_t partner = fork();
  if (partner == 0) {
    test_who = "rollout";
    const wsync_plugin_v1_t* api = LoadPlugin(WSYNC_PLUGIN_PATH);
    const int status = api == NULL ? 1 : RunJob(api, 0, port);
    fprintf(stderr, "[rollout] %d passed, %d failed\n", test_passed, test_failed);
    _exit(status);
  }
  test_who = "trainer";
  const wsync_plugin_v1_t* api = LoadPlugin(WSYNC_PLUGIN_PATH);
  int status = api == NULL ? 1 : RunJob(api, 1, port);
  int partner_status = 0;
  Check(waitpid(partner, &partner_status, 0) == partner && WIFEXITED(partner_status) &&
            WEXITSTATUS(partner_status) == 0,
        "the rollout's checks passed", __LINE__);
  printf("log_callback_test: %d passed, %d failed\n", test_passed, test_failed);
  return status == 0 && test_failed == 0 ? 0 : 1;
}
