/* listening_ports and integer byte counts through the C ABI (wsync.h), as a host sees them.
 *
 * The trainer (this process) asks for port 0 for both its metrics exporter and its hosted
 * coordinator. listening_ports must report the exporter's port right after init (an HTTP GET of
 * /metrics on it answers with wsync's metrics), and the coordinator's port while connect, on
 * another thread, waits for the job: the main thread reads it there and hands it to the rollout
 * (a partner forked before the library was loaded) through a pipe. The job then syncs once with
 * a staging budget of exactly 4096 bytes (an integer byte count: the 16 KiB matrix moves in at
 * least 4 rounds) and the rollout checks every element. Also: NULL out-pointers are fine, a NULL
 * session is refused, a negative budget is refused, a failed connect leaves no coordinator port.
 *
 * Output: failures on standard error, then "ports_test: N passed, M failed". Exit status 0 only
 * when nothing failed. */

#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "host_test_util.h"
#include "wsync/wsync.h"

#ifndef WSYNC_PLUGIN_PATH
#define WSYNC_PLUGIN_PATH "libwsync.so"
#endif

#define DIM 64
#define BUDGET_BYTES 4096
#define CALL(session, call) CheckCall(api, (session), (call), #call, 0, __LINE__)

static float weights[DIM * DIM];

/* The body of an HTTP/1.0 GET of /metrics on 127.0.0.1:`port` (at most `size` - 1 bytes, NUL
 * terminated); 0 when the connection or the exchange failed. */
static int FetchMetrics(int port, char* text, size_t size) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  const struct sockaddr_in address = LoopbackAddress(port);
  const char request[] = "GET /metrics HTTP/1.0\r\n\r\n";
  size_t got = 0;
  if (connect(fd, (struct sockaddr*)&address, sizeof(address)) == 0 &&
      write(fd, request, sizeof(request) - 1) == (ssize_t)(sizeof(request) - 1)) {
    ssize_t n;
    while (got + 1 < size && (n = read(fd, text + got, size - 1 - got)) > 0) got += (size_t)n;
  }
  close(fd);
  text[got] = '\0';
  return got > 0;
}

typedef struct {
  const wsync_plugin_v1_t* api;
  wsync_session_t* session;
  wsync_status_t status;
} ConnectCall;

static void* RunConnect(void* arg) {
  ConnectCall* call = (ConnectCall*)arg;
  call->status = call->api->connect(call->session);
  return NULL;
}

static double Seconds(void) {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return (double)now.tv_sec + (double)now.tv_nsec * 1e-9;
}

/* The rollout: waits for the coordinator's port on `port_pipe`, syncs once, checks every element.
 * Returns the exit status. */
static int Rollout(int port_pipe) {
  test_who = "rollout";
  int port = 0;
  if (!Check(read(port_pipe, &port, sizeof(port)) == (ssize_t)sizeof(port) && port > 0,
             "the coordinator's port arrives from the trainer", __LINE__)) {
    return 1;
  }
  const wsync_plugin_v1_t* api = LoadPlugin(WSYNC_PLUGIN_PATH);
  if (api == NULL) return 1;
  wsync_config_t config = SquareJobConfig(0, port, "ports-test", 30);
  config.staging_budget_bytes = BUDGET_BYTES;
  for (int i = 0; i < DIM * DIM; ++i) weights[i] = -1.0f;
  wsync_session_t* session = InitSquareJobWith(api, &config, weights, DIM, WSYNC_MEMORY_HOST, 0);
  if (session == NULL) return 1;
  if (CALL(session, api->connect(session)) && CALL(session, api->sync(session, 1))) {
    int wrong = 0;
    for (int i = 0; i < DIM * DIM; ++i) wrong += weights[i] != (float)(3 * i + 1);
    Check(wrong == 0, "every rollout element equals the trainer's", __LINE__);
    wsync_stats_t stats;
    memset(&stats, 0, sizeof(stats));
    stats.struct_size = sizeof(stats);
    CALL(session, api->stats(session, &stats));
    char text[160];
    snprintf(text, sizeof(text),
             "the 4096-byte budget splits the %d bytes into rounds (%lld rounds, %lld chunks)",
             DIM * DIM * 4, (long long)stats.rounds, (long long)stats.chunks);
    Check(stats.rounds >= DIM * DIM * 4 / BUDGET_BYTES, text, __LINE__);
  }
  int32_t metrics_port = -1;
  int32_t coordinator_port = -1;
  CALL(session, api->listening_ports(session, &metrics_port, &coordinator_port));
  Check(metrics_port == 0 && coordinator_port == 0, "a rollout without exporter listens on nothing",
        __LINE__);
  api->finalize(session);
  fprintf(stderr, "[rollout] %d passed, %d failed\n", test_passed, test_failed);
  return test_failed == 0 ? 0 : 1;
}

/* Argument checks that need no job. */
static void CheckArguments(const wsync_plugin_v1_t* api) {
  int32_t port = -1;
  Check(api->listening_ports(NULL, &port, &port) == WSYNC_INVALID_ARGUMENT,
        "listening_ports(NULL session) is INVALID_ARGUMENT", __LINE__);
  wsync_config_t config = SquareJobConfig(1, 1, "ports-test-arguments", 5);
  config.staging_budget_bytes = -1;
  wsync_session_t* session = NULL;
  Check(api->init(&config, &session) == WSYNC_INVALID_ARGUMENT && session == NULL,
        "a negative staging_budget_bytes is refused", __LINE__);
  Check(strstr(api->last_error(NULL), "staging_budget_bytes") != NULL,
        "the refusal names staging_budget_bytes", __LINE__);
}

/* A connect that fails (no rollout ever joins) stops its hosted coordinator: listening_ports then
 * reports no coordinator port rather than the stopped one's. */
static void CheckFailedConnect(const wsync_plugin_v1_t* api) {
  wsync_config_t config = SquareJobConfig(1, 0, "ports-test-alone", 1);
  wsync_session_t* session = InitSquareJobWith(api, &config, weights, DIM, WSYNC_MEMORY_HOST, 0);
  if (session == NULL) return;
  Check(api->connect(session) != WSYNC_OK, "a connect nobody joins fails by its deadline",
        __LINE__);
  int32_t coordinator_port = -1;
  CALL(session, api->listening_ports(session, NULL, &coordinator_port));
  Check(coordinator_port == 0, "no coordinator port once the failed connect stopped it", __LINE__);
  api->finalize(session);
}

static int Trainer(const wsync_plugin_v1_t* api, int port_pipe) {
  CheckArguments(api);
  CheckFailedConnect(api);
  wsync_config_t config = SquareJobConfig(1, 0, "ports-test", 30);
  config.staging_budget_bytes = BUDGET_BYTES;
  config.metrics_address = "127.0.0.1:0";
  wsync_session_t* session = InitSquareJobWith(api, &config, weights, DIM, WSYNC_MEMORY_HOST, 0);
  if (session == NULL) return 0;
  for (int i = 0; i < DIM * DIM; ++i) weights[i] = (float)(3 * i + 1);

  int32_t metrics_port = -1;
  int32_t coordinator_port = -1;
  CALL(session, api->listening_ports(session, &metrics_port, &coordinator_port));
  Check(metrics_port > 0, "the exporter's port is known after init", __LINE__);
  Check(coordinator_port == 0, "no coordinator port before connect", __LINE__);
  CALL(session, api->listening_ports(session, NULL, NULL));
  static char page[1 << 16];
  Check(FetchMetrics(metrics_port, page, sizeof(page)) && strstr(page, "200 OK") != NULL &&
            strstr(page, "wsync_") != NULL,
        "GET /metrics on the reported port answers with wsync's metrics", __LINE__);

  ConnectCall call = {api, session, WSYNC_INTERNAL};
  pthread_t thread;
  if (!Check(pthread_create(&thread, NULL, RunConnect, &call) == 0, "connect thread", __LINE__)) {
    api->finalize(session);
    return 0;
  }
  const double give_up = Seconds() + 20;
  while (coordinator_port == 0 && Seconds() < give_up) {
    CALL(session, api->listening_ports(session, NULL, &coordinator_port));
    if (coordinator_port == 0) usleep(1000);
  }
  Check(coordinator_port > 0, "the coordinator's port is known while connect waits", __LINE__);
  if (write(port_pipe, &coordinator_port, sizeof(coordinator_port)) != sizeof(coordinator_port)) {
    Check(0, "the port reaches the rollout", __LINE__);
  }
  pthread_join(thread, NULL);
  if (CALL(session, call.status)) CALL(session, api->sync(session, 1));
  int32_t later = -1;
  CALL(session, api->listening_ports(session, NULL, &later));
  Check(later == coordinator_port, "the coordinator's port stays the same after connect", __LINE__);
  api->finalize(session);
  return 1;
}

int main(void) {
  setenv("WSYNC_SECRET", "ports-test-secret-0123456789abcdefgh", 1);
  int pipe_fds[2];
  if (pipe(pipe_fds) != 0) return 1;
  const pid_t partner = fork();
  if (partner < 0) return 1;
  if (partner == 0) {
    close(pipe_fds[1]);
    _exit(Rollout(pipe_fds[0]));
  }
  close(pipe_fds[0]);
  test_who = "trainer";
  const wsync_plugin_v1_t* api = LoadPlugin(WSYNC_PLUGIN_PATH);
  if (api != NULL) Trainer(api, pipe_fds[1]);
  close(pipe_fds[1]);  // A rollout still waiting for the port gets end-of-file.
  int status = 0;
  waitpid(partner, &status, 0);
  Check(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the rollout succeeded", __LINE__);
  printf("ports_test: %d passed, %d failed\n", test_passed, test_failed);
  return test_failed == 0 ? 0 : 1;
}
