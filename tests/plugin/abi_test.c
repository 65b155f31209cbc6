/* The C ABI as an engine sees it, compiled as C: load libwsync.so with dlopen, find
 * wsyncPlugin_v1, check the documented status codes of invalid arguments and of calls in the wrong
 * state (each with a message in last_error), then run a real job of one trainer and one rollout
 * in two processes: versions 1..3 of one fp32 [8, 8] parameter, every element checked, with the
 * processes calling sync themselves; then a second job in the trainer-triggered mode, where the
 * rollout's callbacks see versions 1 and 2.
 *
 * The parent forks both job processes before it loads the library itself (nothing is forked with
 * the library loaded); each child loads it on its own. The parent picks a free port for the
 * coordinator, which the trainer hosts; the job secret comes from the environment.
 *
 * Output: one line per failed check, and "abi_test: N passed, M failed". Exit status 0 only when
 * nothing failed. Usage: abi_test [path to libwsync.so]. Under valgrind, set
 * WSYNC_ABI_TEST_NO_OOM=1 (see CheckOutOfMemory). The checks without a job are in
 * abi_arguments.c. */

#include "abi_test.h"

#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "wsync/wsync.h"

#ifndef WSYNC_PLUGIN_PATH
#define WSYNC_PLUGIN_PATH "libwsync.so"
#endif

#define JOB_TIMEOUT_SECONDS 120
#define NUM_VERSIONS 3

int passed = 0;
int failed = 0;
const char* who = "parent"; /* Prefix of failure lines: parent, trainer or rollout. */

/* Counts one check; prints the failure with its location. */
int Check(int ok, const char* what, int line) {
  if (ok) {
    ++passed;
  } else {
    ++failed;
    fprintf(stderr, "[%s] FAILED (line %d): %s\n", who, line, what);
  }
  return ok;
}

const char* StatusName(wsync_status_t status) {
  switch (status) {
    case WSYNC_OK:
      return "OK";
    case WSYNC_IN_PROGRESS:
      return "IN_PROGRESS";
    case WSYNC_INVALID_ARGUMENT:
      return "INVALID_ARGUMENT";
    case WSYNC_LAYOUT_REFUSED:
      return "LAYOUT_REFUSED";
    case WSYNC_RANKS_DISAGREE:
      return "RANKS_DISAGREE";
    case WSYNC_TIMED_OUT:
      return "TIMED_OUT";
    case WSYNC_PEER_LOST:
      return "PEER_LOST";
    case WSYNC_ABORTED:
      return "ABORTED";
    case WSYNC_NO_MEMORY:
      return "NO_MEMORY";
    case WSYNC_AUTHENTICATION:
      return "AUTHENTICATION";
    case WSYNC_UNSUPPORTED:
      return "UNSUPPORTED";
    case WSYNC_INTERNAL:
      return "INTERNAL";
  }
  return "(not a status)";
}

/* Checks that `got` is `want` and, for a failure, that last_error(session) has a message (and
 * contains `needle` when given). */
void ExpectStatus(const wsync_plugin_v1_t* api, wsync_session_t* session, wsync_status_t got,
                  wsync_status_t want, const char* needle, const char* what, int line) {
  char text[512];
  const char* message = api->last_error(session);
  snprintf(text, sizeof(text), "%s: got %s, want %s (last_error: \"%s\")", what, StatusName(got),
           StatusName(want), message != NULL ? message : "(NULL)");
  if (!Check(got == want, text, line) || want == WSYNC_OK) return;
  snprintf(text, sizeof(text), "%s: last_error is empty", what);
  if (!Check(message != NULL && message[0] != '\0', text, line)) return;
  if (needle != NULL) {
    snprintf(text, sizeof(text), "%s: last_error \"%s\" does not mention \"%s\"", what, message,
             needle);
    Check(strcasestr(message, needle) != NULL, text, line);
  }
}

/* Loads the library and returns its v1 table (NULL after a failed check). */
static const wsync_plugin_v1_t* Load(const char* path) {
  void* library = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!Check(library != NULL, "dlopen of the plugin", __LINE__)) {
    fprintf(stderr, "[%s] dlopen(%s): %s\n", who, path, dlerror());
    return NULL;
  }
  const wsync_plugin_v1_t* api = (const wsync_plugin_v1_t*)dlsym(library, "wsyncPlugin_v1");
  if (!Check(api != NULL, "dlsym(wsyncPlugin_v1)", __LINE__)) return NULL;
  return api;
}

/* Two distinct free TCP ports on 127.0.0.1 (bound together with port 0, then released); 0 for a
 * port that could not be found. */
static void FreePorts(int ports[2]) {
  int fds[2];
  for (int p = 0; p < 2; ++p) {
    ports[p] = 0;
    fds[p] = socket(AF_INET, SOCK_STREAM, 0);
    if (fds[p] < 0) continue;
    struct sockaddr_in address;
    memset(&address, 0, sizeof(address));
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof(address);
    if (bind(fds[p], (struct sockaddr*)&address, sizeof(address)) == 0 &&
        getsockname(fds[p], (struct sockaddr*)&address, &length) == 0) {
      ports[p] = ntohs(address.sin_port);
    }
  }
  for (int p = 0; p < 2; ++p) {
    if (fds[p] >= 0) close(fds[p]);
  }
}

wsync_config_t BaseConfig(wsync_role_t role, int port) {
  wsync_config_t config;
  memset(&config, 0, sizeof(config));
  config.struct_size = sizeof(config);
  config.role = role;
  config.rank = 0;
  config.num_trainers = 1;
  config.num_rollouts = 1;
  config.job_id = "abi-test";
  config.coordinator_port = port;
  config.deadline_seconds = 30;
  config.path_transports = "*=ucx:sm,cma,self";
  /* By value: the library removes WSYNC_SECRET from the environment once it read it. */
  config.secret = getenv("WSYNC_SECRET");
  config.secret_length = config.secret != NULL ? strlen(config.secret) : 0;
  return config;
}

static double Now(void) {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return (double)now.tv_sec + (double)now.tv_nsec * 1e-9;
}

/* ---- The job: one trainer and one rollout process. ---- */

/* The value of element `index` (row-major) of the parameter at `version`. */
static float Value(int version, int index) { return (float)(version * 1000 + index); }

static void CheckStateAndStats(const wsync_plugin_v1_t* api, wsync_session_t* session, int version,
                               int is_trainer) {
  int64_t state_version = -2;
  wsync_state_t state = WSYNC_STATE_DIRTY;
  EXPECT_STATUS(session, api->state(session, &state_version, &state), WSYNC_OK, NULL);
  CHECK(state == WSYNC_STATE_IDLE);
  CHECK(state_version == version);
  wsync_stats_t stats;
  memset(&stats, 0, sizeof(stats));
  stats.struct_size = sizeof(stats);
  EXPECT_STATUS(session, api->stats(session, &stats), WSYNC_OK, NULL);
  CHECK(stats.version == version);
  if (is_trainer) {
    CHECK(stats.sent_bytes == DIM * DIM * (int64_t)sizeof(float));
    CHECK(stats.received_bytes == 0);
  } else {
    CHECK(stats.received_bytes == DIM * DIM * (int64_t)sizeof(float));
    CHECK(stats.sent_bytes == 0);
  }
  CHECK(stats.rounds >= 1);
  CHECK(stats.seconds >= 0);
  /* An older caller's shorter struct (through version): the fields past it are left alone. */
  wsync_stats_t short_stats;
  memset(&short_stats, 0x5a, sizeof(short_stats));
  short_stats.struct_size = offsetof(wsync_stats_t, segments);
  EXPECT_STATUS(session, api->stats(session, &short_stats), WSYNC_OK, NULL);
  CHECK(short_stats.version == version);
  CHECK(short_stats.segments == 0x5a5a5a5a5a5a5a5aLL);

  /* After the committed sync: idle, committed at it, every round and byte of it done, the same
   * figures as the stats. */
  wsync_progress_t progress;
  memset(&progress, 0, sizeof(progress));
  progress.struct_size = sizeof(progress);
  EXPECT_STATUS(session, api->progress(session, &progress), WSYNC_OK, NULL);
  CHECK(progress.phase == WSYNC_PHASE_IDLE);
  CHECK(progress.version == version);
  CHECK(progress.committed_version == version);
  CHECK(progress.rounds_total == stats.rounds);
  CHECK(progress.rounds_done == progress.rounds_total);
  CHECK(progress.bytes_total == stats.sent_bytes + stats.received_bytes);
  CHECK(progress.bytes_done == progress.bytes_total);
  wsync_progress_t short_progress;
  memset(&short_progress, 0x5a, sizeof(short_progress));
  short_progress.struct_size = offsetof(wsync_progress_t, rounds_done);
  EXPECT_STATUS(session, api->progress(session, &short_progress), WSYNC_OK, NULL);
  CHECK(short_progress.version == version);
  CHECK(short_progress.rounds_done == 0x5a5a5a5a5a5a5a5aLL);
}

/* The weights of the job processes: the trainer holds the rows of the parameter in two buffers
 * of DIM / 2 rows each; the rollout holds it whole. Both row-major. */
static float rows[2][DIM / 2 * DIM];
static float whole[DIM * DIM];

/* Writes version `version` into the trainer's buffers. */
static void FillRows(int version) {
  const int per_buffer = DIM / 2 * DIM;
  for (int i = 0; i < DIM * DIM; ++i) rows[i / per_buffer][i % per_buffer] = Value(version, i);
}

/* The number of elements of the rollout's buffer that are not version `version`. */
static int WrongElements(int version) {
  int wrong = 0;
  for (int i = 0; i < DIM * DIM; ++i) wrong += whole[i] != Value(version, i);
  return wrong;
}

/* init, then this process's layout; NULL after a failed init. */
static wsync_session_t* InitWithLayout(const wsync_plugin_v1_t* api, int is_trainer, int port) {
  wsync_config_t config = BaseConfig(is_trainer ? WSYNC_ROLE_TRAINER : WSYNC_ROLE_ROLLOUT, port);
  config.host_coordinator = is_trainer;
  wsync_session_t* session = NULL;
  EXPECT_STATUS(NULL, api->init(&config, &session), WSYNC_OK, NULL);
  if (session == NULL) return NULL;
  const int64_t shape[2] = {DIM, DIM};
  const int64_t strides[2] = {DIM, 1};
  EXPECT_STATUS(session, api->declare_parameter(session, "w", "float32", 2, shape), WSYNC_OK, NULL);
  if (is_trainer) {
    for (int half = 0; half < 2; ++half) {
      const int64_t origin[2] = {half * DIM / 2, 0};
      const int64_t extent[2] = {DIM / 2, DIM};
      EXPECT_STATUS(session,
                    api->register_buffer(session, 10 + half, rows[half], sizeof(rows[half]),
                                         WSYNC_MEMORY_HOST, 0),
                    WSYNC_OK, NULL);
      EXPECT_STATUS(session,
                    api->declare_piece(session, "w", 10 + half, 2, origin, extent, 0, strides),
                    WSYNC_OK, NULL);
    }
  } else {
    const int64_t origin[2] = {0, 0};
    EXPECT_STATUS(session,
                  api->register_buffer(session, 1, whole, sizeof(whole), WSYNC_MEMORY_HOST, 0),
                  WSYNC_OK, NULL);
    EXPECT_STATUS(session, api->declare_piece(session, "w", 1, 2, origin, shape, 0, strides),
                  WSYNC_OK, NULL);
  }
  return session;
}

/* The engine-RPC mode: both processes call sync (versions 1 and 2) and sync_begin/sync_test
 * (version 3) themselves; wrong-state calls and the schedule report on the way. */
static void PolledJob(const wsync_plugin_v1_t* api, int is_trainer, int port) {
  wsync_session_t* session = InitWithLayout(api, is_trainer, port);
  if (session == NULL) return;
  EXPECT_STATUS(session, api->sync(session, 1), WSYNC_INVALID_ARGUMENT, "registered");

  const wsync_status_t connected = api->connect(session);
  EXPECT_STATUS(session, connected, WSYNC_OK, NULL);
  if (connected != WSYNC_OK) {
    api->finalize(session);
    return;
  }
  int64_t version = -2;
  wsync_state_t state = WSYNC_STATE_DIRTY;
  EXPECT_STATUS(session, api->state(session, &version, &state), WSYNC_OK, NULL);
  CHECK(state == WSYNC_STATE_CONNECTED || state == WSYNC_STATE_IDLE);
  CHECK(version == -1);

  /* Layout calls after connect are in the wrong state. */
  static float late[4];
  const int64_t late_shape[1] = {4};
  EXPECT_STATUS(session,
                api->register_buffer(session, 99, late, sizeof(late), WSYNC_MEMORY_HOST, 0),
                WSYNC_INVALID_ARGUMENT, "state");
  EXPECT_STATUS(session, api->declare_parameter(session, "late", "fp32", 1, late_shape),
                WSYNC_INVALID_ARGUMENT, "state");
  EXPECT_STATUS(session, api->connect(session), WSYNC_INVALID_ARGUMENT, "state");
  EXPECT_STATUS(session, api->sync_test(session), WSYNC_INVALID_ARGUMENT, "sync");

  /* The schedule report, by the size protocol: ask, then fetch; a short buffer gets a prefix. */
  size_t size = 0;
  EXPECT_STATUS(session, api->schedule_report(session, NULL, &size), WSYNC_OK, NULL);
  CHECK(size > 1);
  char* report = (char*)malloc(size);
  size_t fetched = size;
  if (report != NULL) {
    EXPECT_STATUS(session, api->schedule_report(session, report, &fetched), WSYNC_OK, NULL);
    CHECK(fetched == size && strlen(report) + 1 == size);
    char prefix[4];
    size_t small = sizeof(prefix);
    EXPECT_STATUS(session, api->schedule_report(session, prefix, &small), WSYNC_OK, NULL);
    CHECK(small == size && strlen(prefix) == 3 && strncmp(prefix, report, 3) == 0);
    free(report);
  }

  for (int v = 1; v <= NUM_VERSIONS; ++v) {
    if (is_trainer) FillRows(v);
    if (v < NUM_VERSIONS) {
      EXPECT_STATUS(session, api->sync(session, v), WSYNC_OK, NULL);
    } else {
      /* The last version by polling. */
      EXPECT_STATUS(session, api->sync_begin(session, v), WSYNC_OK, NULL);
      const double give_up = Now() + 60;
      wsync_status_t status = WSYNC_IN_PROGRESS;
      while (status == WSYNC_IN_PROGRESS && Now() < give_up) {
        status = api->sync_test(session);
        if (status == WSYNC_IN_PROGRESS) usleep(1000);
      }
      EXPECT_STATUS(session, status, WSYNC_OK, NULL);
    }
    if (!is_trainer) {
      const int wrong = WrongElements(v);
      if (!CHECK(wrong == 0))
        fprintf(stderr, "[rollout] version %d: %d wrong elements\n", v, wrong);
    }
    CheckStateAndStats(api, session, v, is_trainer);
  }
  EXPECT_STATUS(NULL, api->finalize(session), WSYNC_OK, NULL);
}

/* What the rollout's callbacks saw, written on the session's background thread. The counters are
 * atomic, so a reader that sees count n also sees the first n entries. */
typedef struct {
  atomic_int before_count;
  atomic_int after_count;
  int64_t before_versions[4];
  int64_t after_versions[4];
  wsync_status_t after_status[4];
  int wrong_elements; /* Of the versions after_update reported committed. */
} Updates;

static void OnBeforeUpdate(void* user, int64_t version) {
  Updates* updates = (Updates*)user;
  const int n = atomic_load(&updates->before_count);
  if (n < 4) updates->before_versions[n] = version;
  atomic_store(&updates->before_count, n + 1);
}

static void OnAfterUpdate(void* user, int64_t version, wsync_status_t status) {
  Updates* updates = (Updates*)user;
  const int n = atomic_load(&updates->after_count);
  if (n < 4) {
    updates->after_versions[n] = version;
    updates->after_status[n] = status;
  }
  if (status == WSYNC_OK) updates->wrong_elements += WrongElements((int)version);
  atomic_store(&updates->after_count, n + 1);
}

/* The trainer-triggered mode: the trainer syncs versions 1 and 2; the rollout's background thread
 * joins both and calls the callbacks around them. */
static void TriggeredJob(const wsync_plugin_v1_t* api, int is_trainer, int port) {
  static Updates updates;
  wsync_session_t* session = InitWithLayout(api, is_trainer, port);
  if (session == NULL) return;
  if (is_trainer) {
    EXPECT_STATUS(session, api->set_update_callbacks(session, OnBeforeUpdate, OnAfterUpdate, NULL),
                  WSYNC_INVALID_ARGUMENT, "rollout");
  } else {
    EXPECT_STATUS(session,
                  api->set_update_callbacks(session, OnBeforeUpdate, OnAfterUpdate, &updates),
                  WSYNC_OK, NULL);
  }
  const wsync_status_t connected = api->connect(session);
  EXPECT_STATUS(session, connected, WSYNC_OK, NULL);
  if (connected == WSYNC_OK && is_trainer) {
    for (int v = 1; v <= 2; ++v) {
      FillRows(v);
      EXPECT_STATUS(session, api->sync(session, v), WSYNC_OK, NULL);
    }
  } else if (connected == WSYNC_OK) {
    const double give_up = Now() + 60;
    while (atomic_load(&updates.after_count) < 2 && Now() < give_up) usleep(1000);
    CHECK(atomic_load(&updates.before_count) == 2);
    CHECK(atomic_load(&updates.after_count) == 2);
    CHECK(updates.before_versions[0] == 1 && updates.before_versions[1] == 2);
    CHECK(updates.after_versions[0] == 1 && updates.after_versions[1] == 2);
    CHECK(updates.after_status[0] == WSYNC_OK && updates.after_status[1] == WSYNC_OK);
    CHECK(updates.wrong_elements == 0);
    int64_t version = -2;
    wsync_state_t state = WSYNC_STATE_DIRTY;
    EXPECT_STATUS(session, api->state(session, &version, &state), WSYNC_OK, NULL);
    CHECK(state == WSYNC_STATE_IDLE && version == 2);
    /* The background thread joins the syncs: the host may not start one. */
    EXPECT_STATUS(session, api->sync(session, 3), WSYNC_INVALID_ARGUMENT, "trainer-triggered");
  }
  EXPECT_STATUS(NULL, api->finalize(session), WSYNC_OK, NULL);
}

/* One job process: the polled job on ports[0], then the triggered job on ports[1]. */
static void JobProcess(const char* path, int is_trainer, const int ports[2]) {
  who = is_trainer ? "trainer" : "rollout";
  const wsync_plugin_v1_t* api = Load(path);
  if (api == NULL) return;
  PolledJob(api, is_trainer, ports[0]);
  TriggeredJob(api, is_trainer, ports[1]);
}

/* Forks a job process; it reports "passed failed" through fds[1] and exits. */
static pid_t RunChild(const char* path, int is_trainer, const int ports[2], int fds[2]) {
  if (pipe(fds) != 0) return -1;
  const pid_t pid = fork();
  if (pid != 0) {
    close(fds[1]);
    return pid;
  }
  close(fds[0]);
  JobProcess(path, is_trainer, ports);
  char line[64];
  const int length = snprintf(line, sizeof(line), "%d %d\n", passed, failed);
  if (write(fds[1], line, (size_t)length) != length) failed = 1;
  _exit(failed == 0 ? 0 : 1);
}

/* Waits for both children (killing them at the timeout) and adds their counts. */
static void WaitForChildren(pid_t pids[2], int fds[2][2], const char* names[2]) {
  const double give_up = Now() + JOB_TIMEOUT_SECONDS;
  int status[2] = {0, 0};
  int done[2] = {0, 0};
  while ((!done[0] || !done[1]) && Now() < give_up) {
    for (int c = 0; c < 2; ++c) {
      if (!done[c] && waitpid(pids[c], &status[c], WNOHANG) == pids[c]) done[c] = 1;
    }
    usleep(10000);
  }
  for (int c = 0; c < 2; ++c) {
    if (!done[c]) {
      fprintf(stderr, "[parent] the %s process did not finish within %d s; killing it\n", names[c],
              JOB_TIMEOUT_SECONDS);
      kill(pids[c], SIGKILL);
      waitpid(pids[c], &status[c], 0);
    }
    char line[64] = {0};
    const ssize_t got = read(fds[c][0], line, sizeof(line) - 1);
    close(fds[c][0]);
    int child_passed = 0;
    int child_failed = 0;
    if (got > 0 && sscanf(line, "%d %d", &child_passed, &child_failed) == 2) {
      passed += child_passed;
      failed += child_failed;
    }
    char what[128];
    snprintf(what, sizeof(what), "the %s process exited with status 0 (wait status %d)", names[c],
             status[c]);
    Check(done[c] && WIFEXITED(status[c]) && WEXITSTATUS(status[c]) == 0, what, __LINE__);
  }
}

int main(int argc, char** argv) {
  const char* path = argc > 1 ? argv[1] : WSYNC_PLUGIN_PATH;
  setenv("WSYNC_SECRET", "abi-test-secret-0123456789abcdef", 1);
  unsetenv("WSYNC_ABI_TEST_UNSET_VARIABLE");

  /* The jobs first: fork before this process loads anything. */
  int ports[2];
  FreePorts(ports);
  if (!CHECK(ports[0] > 0 && ports[1] > 0)) return 1;
  fflush(NULL);
  int fds[2][2];
  pid_t pids[2];
  pids[0] = RunChild(path, 1, ports, fds[0]);
  pids[1] = RunChild(path, 0, ports, fds[1]);
  if (!CHECK(pids[0] > 0 && pids[1] > 0)) return 1;

  const wsync_plugin_v1_t* api = Load(path);
  if (api != NULL) {
    CheckTable(api);
    CheckInitArguments(api);
    CheckNullSession(api);
    CheckRegisteredSession(api);
    CheckNamedPlacement(api);
    CheckOutOfMemory(api);
  }
  const char* names[2] = {"trainer", "rollout"};
  WaitForChildren(pids, fds, names);
  printf("abi_test: %d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
