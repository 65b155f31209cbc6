#include "host_test_util.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

int test_passed = 0;
int test_failed = 0;
const char* test_who = "main";

int Check(int ok, const char* what, int line) {
  if (ok) {
    ++test_passed;
  } else {
    ++test_failed;
    fprintf(stderr, "[%s] FAILED (line %d): %s\n", test_who, line, what);
  }
  return ok;
}

int CheckCall(const wsync_plugin_v1_t* api, wsync_session_t* session, wsync_status_t status,
              const char* what, int step, int line) {
  if (status == WSYNC_OK) return 1;
  char text[512];
  snprintf(text, sizeof(text), "step %d: %s returned %d: %s", step, what, (int)status,
           api->last_error(session));
  return Check(0, text, line);
}

const wsync_plugin_v1_t* LoadPlugin(const char* path) {
  void* library = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (library == NULL) {
    fprintf(stderr, "[%s] dlopen(%s): %s\n", test_who, path, dlerror());
    Check(0, "dlopen of the plugin", __LINE__);
    return NULL;
  }
  const wsync_plugin_v1_t* api = (const wsync_plugin_v1_t*)dlsym(library, "wsyncPlugin_v1");
  Check(api != NULL, "dlsym(wsyncPlugin_v1)", __LINE__);
  return api;
}

wsync_session_t* InitSquareJob(const wsync_plugin_v1_t* api, int is_trainer, int port,
                               const char* job_id, double deadline_seconds, float* weights, int dim,
                               int step) {
  return InitSquareJobIn(api, is_trainer, port, job_id, deadline_seconds, weights, dim,
                         WSYNC_MEMORY_HOST, step);
}

wsync_config_t SquareJobConfig(int is_trainer, int port, const char* job_id,
                               double deadline_seconds) {
  wsync_config_t config;
  memset(&config, 0, sizeof(config));
  config.struct_size = sizeof(config);
  config.role = is_trainer ? WSYNC_ROLE_TRAINER : WSYNC_ROLE_ROLLOUT;
  config.num_trainers = 1;
  config.num_rollouts = 1;
  config.job_id = job_id;
  config.coordinator_port = port;
  config.host_coordinator = is_trainer;
  config.deadline_seconds = deadline_seconds;
  config.path_transports = "*=ucx:sm,cma,self";
  /* The secret the test put in WSYNC_SECRET, given by value: the library removes a variable it
   * reads from the environment, and a test process inits more than one session. */
  config.secret = getenv("WSYNC_SECRET");
  config.secret_length = config.secret != NULL ? strlen(config.secret) : 0;
  return config;
}

wsync_session_t* InitSquareJobIn(const wsync_plugin_v1_t* api, int is_trainer, int port,
                                 const char* job_id, double deadline_seconds, float* weights,
                                 int dim, wsync_memory_kind_t kind, int step) {
  const wsync_config_t config = SquareJobConfig(is_trainer, port, job_id, deadline_seconds);
  return InitSquareJobWith(api, &config, weights, dim, kind, step);
}

wsync_session_t* InitSquareJobWith(const wsync_plugin_v1_t* api, const wsync_config_t* config,
                                   float* weights, int dim, wsync_memory_kind_t kind, int step) {
  wsync_session_t* session = NULL;
  const wsync_status_t status = api->init(config, &session);
  if (!CheckCall(api, NULL, status, "init", step, __LINE__)) return NULL;
  const int64_t shape[2] = {dim, dim};
  const int64_t origin[2] = {0, 0};
  const int64_t strides[2] = {dim, 1};
  const uint64_t bytes = (uint64_t)dim * (uint64_t)dim * sizeof(float);
  if (CheckCall(api, session, api->register_buffer(session, 1, weights, bytes, kind, 0),
                "register_buffer", step, __LINE__) &&
      CheckCall(api, session, api->declare_parameter(session, "w", "fp32", 2, shape),
                "declare_parameter", step, __LINE__) &&
      CheckCall(api, session, api->declare_piece(session, "w", 1, 2, origin, shape, 0, strides),
                "declare_piece", step, __LINE__)) {
    return session;
  }
  api->finalize(session);
  return NULL;
}

struct sockaddr_in LoopbackAddress(int port) {
  struct sockaddr_in address;
  memset(&address, 0, sizeof(address));
  address.sin_family = AF_INET;
  address.sin_port = htons((uint16_t)port);
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return address;
}

/* Binds a TCP socket to 127.0.0.1:`port` (0: the kernel picks) and releases it; returns the
 * port bound, or 0. */
static int BindLoopbackAndRelease(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  struct sockaddr_in address = LoopbackAddress(port);
  socklen_t length = sizeof(address);
  int bound = 0;
  if (bind(fd, (struct sockaddr*)&address, sizeof(address)) == 0 &&
      getsockname(fd, (struct sockaddr*)&address, &length) == 0) {
    bound = ntohs(address.sin_port);
  }
  close(fd);
  return bound;
}

/* Drawn below the ephemeral range (net.ipv4.ip_local_port_range), as harness::PickFreePort
 * does: no bind to port 0 and no outgoing connection can take the port before it is listened
 * on. */
int FreePort(void) {
  enum { kLowestPort = 10000, kAttempts = 64 };
  int ephemeral_start = 0;
  int ephemeral_end = 0;
  FILE* range = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
  if (range != NULL) {
    if (fscanf(range, "%d %d", &ephemeral_start, &ephemeral_end) != 2) ephemeral_start = 0;
    fclose(range);
  }
  if (ephemeral_start > kLowestPort + kAttempts) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    unsigned int seed = (unsigned int)getpid() * 2654435761u ^ (unsigned int)now.tv_nsec;
    for (int attempt = 0; attempt < kAttempts; ++attempt) {
      const int candidate = kLowestPort + rand_r(&seed) % (ephemeral_start - kLowestPort);
      if (BindLoopbackAndRelease(candidate) == candidate) return candidate;
    }
  }
  return BindLoopbackAndRelease(0);
}

int UsePrivateDevShm(void) {
  return unshare(CLONE_NEWNS) == 0 && mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) == 0 &&
         mount("wsync-test-shm", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "size=256m") == 0;
}

static int CountEntries(const char* directory) {
  DIR* dir = opendir(directory);
  if (dir == NULL) return -1;
  int count = 0;
  for (struct dirent* entry = readdir(dir); entry != NULL; entry = readdir(dir)) {
    if (strcmp(entry->d_name, ".") != 0 && strcmp(entry->d_name, "..") != 0) ++count;
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

Resources MeasureResources(void) {
  Resources r;
  r.fds = CountEntries("/proc/self/fd");
  r.threads = CountEntries("/proc/self/task");
  r.maps = CountLines("/proc/self/maps");
  r.shm = CountEntries("/dev/shm");
  return r;
}

void CheckResources(Resources baseline, Resources now, int maps_tolerance, const char* what) {
  char text[256];
  snprintf(text, sizeof(text), "open descriptors %s: %d, baseline %d", what, now.fds, baseline.fds);
  Check(now.fds >= 0 && now.fds == baseline.fds, text, __LINE__);
  snprintf(text, sizeof(text), "threads %s: %d, baseline %d", what, now.threads, baseline.threads);
  Check(now.threads >= 0 && now.threads == baseline.threads, text, __LINE__);
  snprintf(text, sizeof(text), "memory maps %s: %d, baseline %d (tolerance %d)", what, now.maps,
           baseline.maps, maps_tolerance);
  Check(now.maps >= 0 && now.maps <= baseline.maps + maps_tolerance, text, __LINE__);
  snprintf(text, sizeof(text), "/dev/shm entries %s: %d, baseline %d", what, now.shm, baseline.shm);
  Check(now.shm >= 0 && now.shm == baseline.shm, text, __LINE__);
  fprintf(stderr, "[%s] %s: fds %d -> %d, threads %d -> %d, maps %d -> %d, /dev/shm %d -> %d\n",
          test_who, what, baseline.fds, now.fds, baseline.threads, now.threads, baseline.maps,
          now.maps, baseline.shm, now.shm);
}
