/* The C ABI's checks without a job, run by abi_test's parent process (abi_test.c): the table,
 * init's argument checks, calls given a NULL session, a registered session's argument and state
 * errors (each with a message in last_error), named placement, and out of memory. */

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "abi_test.h"
#include "wsync/wsync.h"

void CheckTable(const wsync_plugin_v1_t* api) {
  CHECK(api->name != NULL && strcmp(api->name, "wsync") == 0);
  CHECK(api->abi_version == WSYNC_ABI_VERSION);
  CHECK(api->init != NULL && api->register_buffer != NULL && api->declare_parameter != NULL &&
        api->declare_piece != NULL && api->set_manifest != NULL && api->set_named_layout != NULL &&
        api->connect != NULL && api->schedule_report != NULL && api->sync != NULL &&
        api->sync_begin != NULL && api->sync_test != NULL && api->set_update_callbacks != NULL &&
        api->abort != NULL && api->state != NULL && api->stats != NULL &&
        api->metrics_text != NULL && api->listening_ports != NULL && api->last_error != NULL &&
        api->finalize != NULL && api->progress != NULL && api->rebind_buffer != NULL);
}

void CheckInitArguments(const wsync_plugin_v1_t* api) {
  wsync_session_t* session = (wsync_session_t*)&session; /* Not NULL: init must reset it. */
  EXPECT_STATUS(NULL, api->init(NULL, &session), WSYNC_INVALID_ARGUMENT, "config");
  CHECK(session == NULL);

  wsync_config_t config = BaseConfig(WSYNC_ROLE_ROLLOUT, 1);
  EXPECT_STATUS(NULL, api->init(&config, NULL), WSYNC_INVALID_ARGUMENT, "session");

  config.struct_size = 4;
  EXPECT_STATUS(NULL, api->init(&config, &session), WSYNC_INVALID_ARGUMENT, "struct_size");
  config.struct_size = 0;
  EXPECT_STATUS(NULL, api->init(&config, &session), WSYNC_INVALID_ARGUMENT, "struct_size");

  config = BaseConfig(WSYNC_ROLE_ROLLOUT, 1);
  config.role = (wsync_role_t)7;
  EXPECT_STATUS(NULL, api->init(&config, &session), WSYNC_INVALID_ARGUMENT, "role");

  config = BaseConfig(WSYNC_ROLE_ROLLOUT, 1);
  config.rank = 1; /* The job has one rollout. */
  EXPECT_STATUS(NULL, api->init(&config, &session), WSYNC_INVALID_ARGUMENT, "rank");

  config = BaseConfig(WSYNC_ROLE_ROLLOUT, 1);
  config.job_id = NULL;
  EXPECT_STATUS(NULL, api->init(&config, &session), WSYNC_INVALID_ARGUMENT, "job");

  config = BaseConfig(WSYNC_ROLE_ROLLOUT, 0); /* No port, and not hosting the coordinator. */
  EXPECT_STATUS(NULL, api->init(&config, &session), WSYNC_INVALID_ARGUMENT, "port");

  config = BaseConfig(WSYNC_ROLE_ROLLOUT, 1);
  config.host_coordinator = 1; /* Trainer rank 0 only. */
  EXPECT_STATUS(NULL, api->init(&config, &session), WSYNC_INVALID_ARGUMENT, "coordinator");

  config = BaseConfig(WSYNC_ROLE_ROLLOUT, 1);
  config.deadline_seconds = -1;
  EXPECT_STATUS(NULL, api->init(&config, &session), WSYNC_INVALID_ARGUMENT, "deadline");

  /* The hosted coordinator's heartbeats: 0 is the default; anything else must be a finite
   * positive number of seconds, the interval at least 1 ms, the limit at least twice it. */
  config = BaseConfig(WSYNC_ROLE_ROLLOUT, 1);
  config.heartbeat_interval_seconds = -0.25;
  EXPECT_STATUS(NULL, api->init(&config, &session), WSYNC_INVALID_ARGUMENT,
                "heartbeat_interval_seconds");
  config = BaseConfig(WSYNC_ROLE_ROLLOUT, 1);
  config.silence_limit_seconds = NAN;
  EXPECT_STATUS(NULL, api->init(&config, &session), WSYNC_INVALID_ARGUMENT,
                "silence_limit_seconds");
  config = BaseConfig(WSYNC_ROLE_ROLLOUT, 1);
  config.silence_limit_seconds = INFINITY;
  EXPECT_STATUS(NULL, api->init(&config, &session), WSYNC_INVALID_ARGUMENT,
                "silence_limit_seconds");
  config = BaseConfig(WSYNC_ROLE_ROLLOUT, 1);
  config.silence_limit_seconds = 0.4; /* Below twice the default interval (0.25 s). */
  EXPECT_STATUS(NULL, api->init(&config, &session), WSYNC_INVALID_ARGUMENT, "twice");
  config = BaseConfig(WSYNC_ROLE_ROLLOUT, 1);
  config.heartbeat_interval_seconds = 0.0001;
  EXPECT_STATUS(NULL, api->init(&config, &session), WSYNC_INVALID_ARGUMENT, "at least 1 ms");
  CHECK(session == NULL);
  config = BaseConfig(WSYNC_ROLE_ROLLOUT, 1);
  config.heartbeat_interval_seconds = 0.05;
  config.silence_limit_seconds = 0.5;
  EXPECT_STATUS(NULL, api->init(&config, &session), WSYNC_OK, NULL);
  if (session != NULL) EXPECT_STATUS(NULL, api->finalize(session), WSYNC_OK, NULL);
  session = NULL;

  /* device_index: read only with has_device_index; then 0..65536. */
  config = BaseConfig(WSYNC_ROLE_ROLLOUT, 1);
  config.has_device_index = 1;
  config.device_index = -1;
  EXPECT_STATUS(NULL, api->init(&config, &session), WSYNC_INVALID_ARGUMENT, "device_index");
  config.device_index = 65537;
  EXPECT_STATUS(NULL, api->init(&config, &session), WSYNC_INVALID_ARGUMENT, "device_index");
  config.has_device_index = 0; /* The bad index is not read. */
  EXPECT_STATUS(NULL, api->init(&config, &session), WSYNC_OK, NULL);
  if (session != NULL) EXPECT_STATUS(NULL, api->finalize(session), WSYNC_OK, NULL);
  session = NULL;

  /* delta: off (0), auto (1, for now off) and on (2) are taken; other values are refused. */
  config = BaseConfig(WSYNC_ROLE_ROLLOUT, 1);
  config.delta = 3;
  EXPECT_STATUS(NULL, api->init(&config, &session), WSYNC_INVALID_ARGUMENT, "delta");
  config.delta = -1;
  EXPECT_STATUS(NULL, api->init(&config, &session), WSYNC_INVALID_ARGUMENT, "delta");
  config.delta = WSYNC_DELTA_ON;
  EXPECT_STATUS(NULL, api->init(&config, &session), WSYNC_OK, NULL);
  if (session != NULL) EXPECT_STATUS(NULL, api->finalize(session), WSYNC_OK, NULL);
  session = NULL;
  config.delta = WSYNC_DELTA_AUTO;
  EXPECT_STATUS(NULL, api->init(&config, &session), WSYNC_OK, NULL);
  if (session != NULL) EXPECT_STATUS(NULL, api->finalize(session), WSYNC_OK, NULL);
  session = NULL;
  /* delta_budget_bytes: 0 (the default) or more; a negative budget is refused by name. */
  config.delta = WSYNC_DELTA_ON;
  config.delta_budget_bytes = -1;
  EXPECT_STATUS(NULL, api->init(&config, &session), WSYNC_INVALID_ARGUMENT, "delta_budget_bytes");
  config.delta_budget_bytes = 1 << 20;
  EXPECT_STATUS(NULL, api->init(&config, &session), WSYNC_OK, NULL);
  if (session != NULL) EXPECT_STATUS(NULL, api->finalize(session), WSYNC_OK, NULL);
  session = NULL;

  /* Settings from the environment (plugin/settings.h): a field left unset takes its WSYNC_<NAME>
   * variable; a value the setting cannot take fails init naming the variable; a field the host set
   * wins, and its variable is then not read. */
  config = BaseConfig(WSYNC_ROLE_ROLLOUT, 1);
  config.deadline_seconds = 0;
  setenv("WSYNC_DEADLINE_SECONDS", "soon", 1);
  EXPECT_STATUS(NULL, api->init(&config, &session), WSYNC_INVALID_ARGUMENT,
                "WSYNC_DEADLINE_SECONDS='soon'");
  CHECK(session == NULL);
  config.deadline_seconds = 30;
  EXPECT_STATUS(NULL, api->init(&config, &session), WSYNC_OK, NULL);
  if (session != NULL) EXPECT_STATUS(NULL, api->finalize(session), WSYNC_OK, NULL);
  session = NULL;
  unsetenv("WSYNC_DEADLINE_SECONDS");
  config = BaseConfig(WSYNC_ROLE_ROLLOUT, 1);
  setenv("WSYNC_DELTA", "3", 1);
  EXPECT_STATUS(NULL, api->init(&config, &session), WSYNC_INVALID_ARGUMENT, "WSYNC_DELTA='3'");
  setenv("WSYNC_DELTA", "on", 1);
  EXPECT_STATUS(NULL, api->init(&config, &session), WSYNC_OK, NULL);
  if (session != NULL) EXPECT_STATUS(NULL, api->finalize(session), WSYNC_OK, NULL);
  session = NULL;
  unsetenv("WSYNC_DELTA");

  config = BaseConfig(WSYNC_ROLE_ROLLOUT, 1);
  config.secret_file = "/nonexistent";
  config.secret_env = "WSYNC_SECRET";
  EXPECT_STATUS(NULL, api->init(&config, &session), WSYNC_INVALID_ARGUMENT, "secret");

  config = BaseConfig(WSYNC_ROLE_ROLLOUT, 1);
  config.metrics_address = "127.0.0.1:not-a-port";
  EXPECT_STATUS(NULL, api->init(&config, &session), WSYNC_INVALID_ARGUMENT, "metrics");

  config = BaseConfig(WSYNC_ROLE_ROLLOUT, 1);
  config.secret = NULL;
  config.secret_env = "WSYNC_ABI_TEST_UNSET_VARIABLE";
  EXPECT_STATUS(NULL, api->init(&config, &session), WSYNC_AUTHENTICATION, "secret");
  CHECK(session == NULL);

  /* The secret by value: too short, too long, or with secret_env too, is refused. */
  config = BaseConfig(WSYNC_ROLE_ROLLOUT, 1);
  config.secret_length = 8;
  EXPECT_STATUS(NULL, api->init(&config, &session), WSYNC_AUTHENTICATION, "secret");
  config.secret_length = 4097;
  EXPECT_STATUS(NULL, api->init(&config, &session), WSYNC_INVALID_ARGUMENT, "secret_length");
  config = BaseConfig(WSYNC_ROLE_ROLLOUT, 1);
  config.secret_env = "WSYNC_SECRET";
  EXPECT_STATUS(NULL, api->init(&config, &session), WSYNC_INVALID_ARGUMENT, "secret");
  CHECK(session == NULL);

  /* The metrics exporter refuses the wildcard address without metrics_allow_any_address. */
  config = BaseConfig(WSYNC_ROLE_ROLLOUT, 1);
  config.metrics_address = "0.0.0.0:0";
  EXPECT_STATUS(NULL, api->init(&config, &session), WSYNC_INVALID_ARGUMENT, "wildcard");
  CHECK(session == NULL);
  config.metrics_allow_any_address = 1;
  EXPECT_STATUS(NULL, api->init(&config, &session), WSYNC_OK, NULL);
  if (session != NULL) EXPECT_STATUS(NULL, api->finalize(session), WSYNC_OK, NULL);
  session = NULL;

  /* A caller built against an older, shorter header: fields past its struct_size are not read,
   * however invalid their bytes. */
  config = BaseConfig(WSYNC_ROLE_ROLLOUT, 1);
  config.struct_size = offsetof(wsync_config_t, staging_budget_bytes);
  config.staging_budget_bytes = -5;
  config.deadline_seconds = -5;
  config.metrics_address = "set past struct_size";
  /* Past struct_size too: the secret by value. init reads WSYNC_SECRET, the default, and removes
   * it from the environment (processes the host starts later do not inherit it). */
  char* secret = strdup(getenv("WSYNC_SECRET"));
  EXPECT_STATUS(NULL, api->init(&config, &session), WSYNC_OK, NULL);
  CHECK(session != NULL);
  if (session != NULL) EXPECT_STATUS(NULL, api->finalize(session), WSYNC_OK, NULL);
  CHECK(getenv("WSYNC_SECRET") == NULL);
  session = NULL;
  EXPECT_STATUS(NULL, api->init(&config, &session), WSYNC_AUTHENTICATION, "WSYNC_SECRET");
  CHECK(session == NULL);
  setenv("WSYNC_SECRET", secret, 1);
  free(secret);
}

/* set_named_layout with placement keys: a colocated layout puts rollout rank 0 on GPU 0, which a
 * device_index of 3 contradicts; the same layout with device_index 0, or without one, is taken,
 * and a malformed key is refused. */
void CheckNamedPlacement(const wsync_plugin_v1_t* api) {
  static const struct {
    int has_device_index;
    int32_t device_index;
    const char* layout;
    wsync_status_t expected;
    const char* message;
  } kCases[] = {
      {1, 3, "vllm(tp=1,ppn=1,colocated=1)", WSYNC_INVALID_ARGUMENT, "device_index is 3"},
      {1, 0, "vllm(tp=1,ppn=1,colocated=1)", WSYNC_OK, NULL},
      {0, 0, "vllm(tp=1,ppn=2,colocated=1)", WSYNC_OK, NULL},
      {1, 3, "vllm(tp=1,ppn=2)", WSYNC_OK, NULL}, /* Separate nodes say nothing of GPUs. */
      {0, 0, "vllm(tp=1,colocated=2)", WSYNC_INVALID_ARGUMENT, "colocated must be 0 or 1"},
  };
  for (size_t i = 0; i < sizeof(kCases) / sizeof(kCases[0]); ++i) {
    wsync_config_t config = BaseConfig(WSYNC_ROLE_ROLLOUT, 1);
    config.has_device_index = kCases[i].has_device_index;
    config.device_index = kCases[i].device_index;
    wsync_session_t* session = NULL;
    EXPECT_STATUS(NULL, api->init(&config, &session), WSYNC_OK, NULL);
    if (session == NULL) continue;
    EXPECT_STATUS(session, api->set_named_layout(session, "qwen2.5-tiny", kCases[i].layout),
                  kCases[i].expected, kCases[i].message);
    EXPECT_STATUS(NULL, api->finalize(session), WSYNC_OK, NULL);
  }
}

void CheckNullSession(const wsync_plugin_v1_t* api) {
  float buffer[4];
  int64_t version = 0;
  wsync_state_t state = WSYNC_STATE_REGISTERED;
  wsync_stats_t stats;
  memset(&stats, 0, sizeof(stats));
  stats.struct_size = sizeof(stats);
  size_t size = 0;
  const int64_t shape[1] = {4};
  EXPECT_STATUS(NULL, api->register_buffer(NULL, 1, buffer, sizeof(buffer), WSYNC_MEMORY_HOST, 0),
                WSYNC_INVALID_ARGUMENT, "session");
  EXPECT_STATUS(NULL, api->declare_parameter(NULL, "w", "fp32", 1, shape), WSYNC_INVALID_ARGUMENT,
                "session");
  EXPECT_STATUS(NULL, api->connect(NULL), WSYNC_INVALID_ARGUMENT, "session");
  EXPECT_STATUS(NULL, api->sync(NULL, 1), WSYNC_INVALID_ARGUMENT, "session");
  EXPECT_STATUS(NULL, api->sync_test(NULL), WSYNC_INVALID_ARGUMENT, "session");
  EXPECT_STATUS(NULL, api->state(NULL, &version, &state), WSYNC_INVALID_ARGUMENT, "session");
  EXPECT_STATUS(NULL, api->stats(NULL, &stats), WSYNC_INVALID_ARGUMENT, "session");
  wsync_progress_t progress;
  memset(&progress, 0, sizeof(progress));
  progress.struct_size = sizeof(progress);
  EXPECT_STATUS(NULL, api->progress(NULL, &progress), WSYNC_INVALID_ARGUMENT, "session");
  EXPECT_STATUS(NULL, api->schedule_report(NULL, NULL, &size), WSYNC_INVALID_ARGUMENT, "session");
  EXPECT_STATUS(NULL, api->abort(NULL, "test"), WSYNC_INVALID_ARGUMENT, "session");
  EXPECT_STATUS(NULL, api->finalize(NULL), WSYNC_INVALID_ARGUMENT, "session");
}

/* A registered (never connected) rollout session: bad arguments, and calls that need a
 * connected session. */
void CheckRegisteredSession(const wsync_plugin_v1_t* api) {
  wsync_config_t config = BaseConfig(WSYNC_ROLE_ROLLOUT, 1);
  wsync_session_t* session = NULL;
  EXPECT_STATUS(NULL, api->init(&config, &session), WSYNC_OK, NULL);
  if (session == NULL) return;
  CHECK(strcmp(api->last_error(session), "") == 0);

  static float weights[DIM * DIM];
  const int64_t shape[2] = {DIM, DIM};
  const int64_t origin[2] = {0, 0};
  const int64_t strides[2] = {DIM, 1};
  EXPECT_STATUS(
      session,
      api->register_buffer(session, 1, weights, sizeof(weights), (wsync_memory_kind_t)9, 0),
      WSYNC_INVALID_ARGUMENT, "kind");
  EXPECT_STATUS(session, api->register_buffer(session, 1, NULL, 64, WSYNC_MEMORY_HOST, 0),
                WSYNC_INVALID_ARGUMENT, "address");
  EXPECT_STATUS(session, api->declare_parameter(session, "w", "fp33", 2, shape),
                WSYNC_INVALID_ARGUMENT, "fp33");
  EXPECT_STATUS(session, api->declare_parameter(session, "w", NULL, 2, shape),
                WSYNC_INVALID_ARGUMENT, "dtype");
  EXPECT_STATUS(session, api->declare_parameter(session, NULL, "fp32", 2, shape),
                WSYNC_INVALID_ARGUMENT, "name");
  EXPECT_STATUS(session, api->declare_parameter(session, "w", "fp32", 9, shape),
                WSYNC_INVALID_ARGUMENT, "num_axes");
  EXPECT_STATUS(session, api->declare_parameter(session, "w", "fp32", -1, shape),
                WSYNC_INVALID_ARGUMENT, "num_axes");
  EXPECT_STATUS(session, api->declare_parameter(session, "w", "fp32", 2, NULL),
                WSYNC_INVALID_ARGUMENT, "shape");
  EXPECT_STATUS(session, api->declare_piece(session, "w", 1, 2, origin, NULL, 0, strides),
                WSYNC_INVALID_ARGUMENT, "extent");
  EXPECT_STATUS(session, api->set_manifest(session, NULL, 10), WSYNC_INVALID_ARGUMENT, "bytes");
  EXPECT_STATUS(session, api->set_named_layout(session, NULL, "vllm(tp=1)"), WSYNC_INVALID_ARGUMENT,
                "model");

  int64_t version = 0;
  wsync_state_t state = WSYNC_STATE_DIRTY;
  EXPECT_STATUS(session, api->state(session, NULL, &state), WSYNC_INVALID_ARGUMENT, "NULL");
  EXPECT_STATUS(session, api->state(session, &version, &state), WSYNC_OK, NULL);
  CHECK(state == WSYNC_STATE_REGISTERED);
  CHECK(version == -1);

  wsync_stats_t stats;
  memset(&stats, 0, sizeof(stats));
  EXPECT_STATUS(session, api->stats(session, &stats), WSYNC_INVALID_ARGUMENT, "struct_size");
  EXPECT_STATUS(session, api->stats(session, NULL), WSYNC_INVALID_ARGUMENT, "stats");
  stats.struct_size = sizeof(stats);
  EXPECT_STATUS(session, api->stats(session, &stats), WSYNC_OK, NULL);
  CHECK(stats.version == -1);

  /* Before any sync: idle, nothing committed. */
  wsync_progress_t progress;
  memset(&progress, 0, sizeof(progress));
  EXPECT_STATUS(session, api->progress(session, &progress), WSYNC_INVALID_ARGUMENT, "struct_size");
  EXPECT_STATUS(session, api->progress(session, NULL), WSYNC_INVALID_ARGUMENT, "progress");
  progress.struct_size = sizeof(progress);
  progress.phase = 77;
  EXPECT_STATUS(session, api->progress(session, &progress), WSYNC_OK, NULL);
  CHECK(progress.version == -1);
  CHECK(progress.committed_version == -1);
  CHECK(progress.phase == WSYNC_PHASE_IDLE);
  CHECK(progress.rounds_total == 0 && progress.bytes_total == 0);

  size_t size = 16;
  EXPECT_STATUS(session, api->schedule_report(session, NULL, NULL), WSYNC_INVALID_ARGUMENT, "size");
  EXPECT_STATUS(session, api->schedule_report(session, NULL, &size), WSYNC_INVALID_ARGUMENT,
                "buffer");

  /* Calls that need a connected session. */
  size = 0;
  EXPECT_STATUS(session, api->schedule_report(session, NULL, &size), WSYNC_INVALID_ARGUMENT,
                "state");
  EXPECT_STATUS(session, api->sync(session, 1), WSYNC_INVALID_ARGUMENT, "registered");
  EXPECT_STATUS(session, api->sync_begin(session, 1), WSYNC_INVALID_ARGUMENT, "registered");
  EXPECT_STATUS(session, api->sync_test(session), WSYNC_INVALID_ARGUMENT, "sync");
  EXPECT_STATUS(session, api->sync(session, -3), WSYNC_INVALID_ARGUMENT, "version");
  /* The metrics text exists from init on (its families, before any sync). */
  size = 0;
  EXPECT_STATUS(session, api->metrics_text(session, NULL, &size), WSYNC_OK, NULL);
  CHECK(size > 1);
  /* The state is unchanged by the refused calls. */
  EXPECT_STATUS(session, api->state(session, &version, &state), WSYNC_OK, NULL);
  CHECK(state == WSYNC_STATE_REGISTERED);

  /* abort() on an idle, unconnected session does nothing and succeeds. */
  EXPECT_STATUS(session, api->abort(session, "nothing runs"), WSYNC_OK, NULL);
  EXPECT_STATUS(NULL, api->finalize(session), WSYNC_OK, NULL);
}

/* The exception firewall: an allocation that fails inside the library (std::bad_alloc) comes back
 * as WSYNC_NO_MEMORY with a message, and the session stays usable. A limit on the address space
 * makes the library's copy of a 256 MiB parameter name fail. Skipped when the environment sets
 * WSYNC_ABI_TEST_NO_OOM (under valgrind, whose operator new aborts instead of throwing). */
void CheckOutOfMemory(const wsync_plugin_v1_t* api) {
  if (getenv("WSYNC_ABI_TEST_NO_OOM") != NULL) return;
  wsync_config_t config = BaseConfig(WSYNC_ROLE_ROLLOUT, 1);
  wsync_session_t* session = NULL;
  EXPECT_STATUS(NULL, api->init(&config, &session), WSYNC_OK, NULL);
  if (session == NULL) return;
  const size_t length = (size_t)256 << 20;
  char* name = (char*)malloc(length + 1);
  long pages = 0;
  FILE* statm = fopen("/proc/self/statm", "r");
  if (statm != NULL) {
    if (fscanf(statm, "%ld", &pages) != 1) pages = 0;
    fclose(statm);
  }
  struct rlimit old_limit;
  if (CHECK(name != NULL && pages > 0 && getrlimit(RLIMIT_AS, &old_limit) == 0)) {
    memset(name, 'n', length);
    name[length] = '\0';
    struct rlimit limit = old_limit;
    limit.rlim_cur = (rlim_t)pages * (rlim_t)sysconf(_SC_PAGESIZE) + ((rlim_t)64 << 20);
    if (CHECK(setrlimit(RLIMIT_AS, &limit) == 0)) {
      const int64_t shape[1] = {4};
      const wsync_status_t status = api->declare_parameter(session, name, "fp32", 1, shape);
      CHECK(setrlimit(RLIMIT_AS, &old_limit) == 0);
      EXPECT_STATUS(session, status, WSYNC_NO_MEMORY, "memory");
    }
  }
  free(name);
  const int64_t shape[1] = {4};
  EXPECT_STATUS(session, api->declare_parameter(session, "w", "fp32", 1, shape), WSYNC_OK, NULL);
  EXPECT_STATUS(NULL, api->finalize(session), WSYNC_OK, NULL);
}
