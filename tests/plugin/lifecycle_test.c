/* init/finalize many times in one process leaks no file descriptor, thread or memory map.
 *
 * Each cycle is a whole job of one trainer (this process, hosting the coordinator) and one
 * rollout (a partner process that cycles in lockstep): init, declare the layout, connect, sync
 * version 1, check it, finalize. Both processes count their open descriptors (/proc/self/fd),
 * threads (/proc/self/task) and memory maps (/proc/self/maps) after the first cycles (one-time
 * initialization of UCX and the allocator) and after the last: descriptors and threads must be
 * equal, maps may differ by at most MAPS_TOLERANCE lines (the allocator may keep a few).
 *
 * The partner is forked before either process loads the library. Per cycle the trainer picks a
 * free port and sends it to the partner through a pipe; the partner answers one byte when its
 * cycle ended ('+' good, '-' failed), so cycles never overlap.
 *
 * Output: failures on standard error, then "lifecycle_test: N passed, M failed". Exit status 0
 * only when nothing failed. Usage: lifecycle_test [cycles (default 200)] [path to libwsync.so]. */

#include <arpa/inet.h>
#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "wsync/wsync.h"

#ifndef WSYNC_PLUGIN_PATH
#define WSYNC_PLUGIN_PATH "libwsync.so"
#endif

#define WARMUP_CYCLES 3
#define MAPS_TOLERANCE 16
#define DIM 16

static int passed = 0;
static int failed = 0;
static const char* who = "trainer";

static int Check(int ok, const char* what, int line) {
  if (ok) {
    ++passed;
  } else {
    ++failed;
    fprintf(stderr, "[%s] FAILED (line %d): %s\n", who, line, what);
  }
  return ok;
}

/* Runs `call`; a status other than OK fails the check with last_error and the cycle number. */
static int Call(const wsync_plugin_v1_t* api, wsync_session_t* session, wsync_status_t status,
                const char* what, int cycle, int line) {
  if (status == WSYNC_OK) return 1;
  char text[512];
  snprintf(text, sizeof(text), "cycle %d: %s returned %d: %s", cycle, what, (int)status,
           api->last_error(session));
  return Check(0, text, line);
}
#define CALL(session, call) Call(api, (session), (call), #call, cycle, __LINE__)

typedef struct {
  int fds;
  int threads;
  int maps;
} Resources;

static int CountEntries(const char* directory) {
  DIR* dir = opendir(directory);
  if (dir == NULL) return -1;
  int count = 0;
  for (struct dirent* entry = readdir(dir); entry != NULL; entry = readdir(dir)) {
    if (entry->d_name[0] != '.') ++count;
  }
  closedir(dir);
  return count;
}

static int CountLines(const char* path) {
  FILE* file = fopen(path, "r");
  if (file == NULL) return -1;
  int count = 0;
  for (int c = fgetc(file); c != EOF; c = fgetc(file)) count += c == '\n';
  fclose(file);
  return count;
}

/* The descriptor count includes the one opendir holds while counting: the same every time. */
static Resources Measure(void) {
  Resources r;
  r.fds = CountEntries("/proc/self/fd");
  r.threads = CountEntries("/proc/self/task");
  r.maps = CountLines("/proc/self/maps");
  return r;
}

static void CompareResources(Resources baseline, Resources now, int cycles) {
  char text[256];
  snprintf(text, sizeof(text), "open descriptors after %d cycles: %d, baseline %d", cycles, now.fds,
           baseline.fds);
  Check(now.fds == baseline.fds, text, __LINE__);
  snprintf(text, sizeof(text), "threads after %d cycles: %d, baseline %d", cycles, now.threads,
           baseline.threads);
  Check(now.threads == baseline.threads, text, __LINE__);
  snprintf(text, sizeof(text), "memory maps after %d cycles: %d, baseline %d (tolerance %d)",
           cycles, now.maps, baseline.maps, MAPS_TOLERANCE);
  Check(now.maps <= baseline.maps + MAPS_TOLERANCE, text, __LINE__);
  fprintf(stderr, "[%s] fds %d -> %d, threads %d -> %d, maps %d -> %d over %d cycles\n", who,
          baseline.fds, now.fds, baseline.threads, now.threads, baseline.maps, now.maps,
          cycles - WARMUP_CYCLES);
}

static int FreePort(void) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  struct sockaddr_in address;
  memset(&address, 0, sizeof(address));
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  int port = 0;
  if (bind(fd, (struct sockaddr*)&address, sizeof(address)) == 0 &&
      getsockname(fd, (struct sockaddr*)&address, &length) == 0) {
    port = ntohs(address.sin_port);
  }
  close(fd);
  return port;
}

static const wsync_plugin_v1_t* Load(const char* path) {
  void* library = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (library == NULL) {
    fprintf(stderr, "[%s] dlopen(%s): %s\n", who, path, dlerror());
    Check(0, "dlopen of the plugin", __LINE__);
    return NULL;
  }
  const wsync_plugin_v1_t* api = (const wsync_plugin_v1_t*)dlsym(library, "wsyncPlugin_v1");
  Check(api != NULL, "dlsym(wsyncPlugin_v1)", __LINE__);
  return api;
}

/* One job cycle of this process; returns 1 when every step succeeded. */
static int Cycle(const wsync_plugin_v1_t* api, int is_trainer, int port, int cycle) {
  static float weights[DIM * DIM];
  wsync_config_t config;
  memset(&config, 0, sizeof(config));
  config.struct_size = sizeof(config);
  config.role = is_trainer ? WSYNC_ROLE_TRAINER : WSYNC_ROLE_ROLLOUT;
  config.num_trainers = 1;
  config.num_rollouts = 1;
  config.job_id = "lifecycle-test";
  config.coordinator_port = port;
  config.host_coordinator = is_trainer;
  config.deadline_seconds = 30;
  config.path_transports = "*=ucx:sm,cma,self";
  wsync_session_t* session = NULL;
  if (!CALL(NULL, api->init(&config, &session))) return 0;

  const int64_t shape[2] = {DIM, DIM};
  const int64_t origin[2] = {0, 0};
  const int64_t strides[2] = {DIM, 1};
  int ok = CALL(session,
                api->register_buffer(session, 1, weights, sizeof(weights), WSYNC_MEMORY_HOST, 0)) &&
           CALL(session, api->declare_parameter(session, "w", "fp32", 2, shape)) &&
           CALL(session, api->declare_piece(session, "w", 1, 2, origin, shape, 0, strides));
  for (int i = 0; i < DIM * DIM; ++i) weights[i] = is_trainer ? (float)(cycle + i) : -1.0f;
  ok = ok && CALL(session, api->connect(session)) && CALL(session, api->sync(session, 1));
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
  who = "rollout";
  const wsync_plugin_v1_t* api = Load(path);
  Resources baseline = Measure();
  int cycle = 0;
  int port = 0;
  while (api != NULL && read(in, &port, sizeof(port)) == (ssize_t)sizeof(port) && port != 0) {
    const char result = Cycle(api, 0, port, cycle) ? '+' : '-';
    if (write(out, &result, 1) != 1) break;
    ++cycle;
    if (cycle == WARMUP_CYCLES) baseline = Measure();
  }
  if (cycle > WARMUP_CYCLES) CompareResources(baseline, Measure(), cycle);
  return failed == 0 ? 0 : 1;
}

int main(int argc, char** argv) {
  const int cycles = argc > 1 ? atoi(argv[1]) : 200;
  const char* path = argc > 2 ? argv[2] : WSYNC_PLUGIN_PATH;
  if (cycles <= WARMUP_CYCLES) {
    fprintf(stderr, "cycles must exceed %d\n", WARMUP_CYCLES);
    return 2;
  }
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
    _exit(Partner(path, to_partner[0], from_partner[1]));
  }
  close(to_partner[0]);
  close(from_partner[1]);

  const wsync_plugin_v1_t* api = Load(path);
  Resources baseline = Measure();
  int cycle = 0;
  for (; api != NULL && cycle < cycles; ++cycle) {
    if (cycle == WARMUP_CYCLES) baseline = Measure();
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
  if (cycle > WARMUP_CYCLES) CompareResources(baseline, Measure(), cycle);
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
  printf("lifecycle_test: %d passed, %d failed (%d cycles)\n", passed, failed, cycle);
  return failed == 0 ? 0 : 1;
}
