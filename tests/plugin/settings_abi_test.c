/* The settings table through the C ABI (setting_count, setting_info, config_set; issue 43), as a
 * host that derives its flags from it sees it:
 *   - every row against this test's own list (name, type, offsetof, variable, the default as the
 *     variable is written, choices), in wsync_config_t's order; each default that has a value
 *     is taken back by config_set;
 *   - config_set round trips for each type (bool, port, bytes, seconds, choice by name and by
 *     index, text: the caller's pointer itself);
 *   - refusals, each with WSYNC_INVALID_ARGUMENT, last_error(NULL) naming what was refused, and
 *     the config unchanged: an unknown name, the secret, a field past struct_size, text each type
 *     does not take, NULL arguments; setting_info with an index outside the table, a NULL info, a
 *     struct_size too small.
 * Output: failures on standard error, then "settings_abi_test: N passed, M failed". */

#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "host_test_util.h"
#include "wsync/wsync.h"

#ifndef WSYNC_PLUGIN_PATH
#define WSYNC_PLUGIN_PATH "libwsync.so"
#endif

typedef struct {
  const char* name;
  const char* type;
  size_t offset;
  const char* variable;
  const char* default_value;
  const char* choices;
} Expected;

#define ROW(field, type, variable, default_value, choices) \
  { #field, type, offsetof(wsync_config_t, field), variable, default_value, choices }

static const Expected kExpected[] = {
    ROW(coordinator_host, "text", "WSYNC_COORDINATOR_HOST", "127.0.0.1", ""),
    ROW(coordinator_port, "port", "WSYNC_COORDINATOR_PORT", "", ""),
    ROW(secret_file, "text", "", "", ""),
    ROW(secret_env, "text", "", "WSYNC_SECRET", ""),
    ROW(node_id, "text", "WSYNC_NODE_ID", "", ""),
    ROW(staging_budget_bytes, "bytes", "WSYNC_STAGING_BUDGET_BYTES", "67108864", ""),
    ROW(deadline_seconds, "seconds", "WSYNC_DEADLINE_SECONDS", "60", ""),
    ROW(replica_policy, "text", "WSYNC_REPLICA_POLICY", "local_first_least_loaded", ""),
    ROW(path_transports, "text", "WSYNC_PATH_TRANSPORTS", "", ""),
    ROW(metrics_address, "text", "WSYNC_METRICS_ADDRESS", "", ""),
    ROW(calibration_file, "text", "WSYNC_CALIBRATION_FILE", "", ""),
    ROW(verify, "choice", "WSYNC_VERIFY", "off", "off,hash,keyed"),
    ROW(heartbeat_interval_seconds, "seconds", "WSYNC_HEARTBEAT_INTERVAL_SECONDS", "0.25", ""),
    ROW(silence_limit_seconds, "seconds", "WSYNC_SILENCE_LIMIT_SECONDS", "3", ""),
    ROW(delta, "choice", "WSYNC_DELTA", "off", "off,auto,on"),
    ROW(secret, "secret", "", "", ""),
    ROW(metrics_allow_any_address, "bool", "WSYNC_METRICS_ALLOW_ANY_ADDRESS", "0", ""),
    ROW(delta_budget_bytes, "bytes", "WSYNC_DELTA_BUDGET_BYTES", "17179869184", ""),
};
#define NUM_EXPECTED ((int)(sizeof(kExpected) / sizeof(kExpected[0])))

static const wsync_plugin_v1_t* api;

static int Same(const char* a, const char* b) { return a != NULL && b != NULL && !strcmp(a, b); }

static void CheckRows(void) {
  const int count = api->setting_count();
  Check(count == NUM_EXPECTED, "setting_count is the number of settings", __LINE__);
  for (int i = 0; i < count && i < NUM_EXPECTED; ++i) {
    const Expected* e = &kExpected[i];
    wsync_setting_info_t info;
    memset(&info, 0, sizeof(info));
    info.struct_size = sizeof(info);
    if (!Check(api->setting_info(i, &info) == WSYNC_OK, "setting_info of a row", __LINE__)) {
      continue;
    }
    if (!Check(Same(info.name, e->name), e->name, __LINE__)) continue;
    Check(Same(info.type, e->type), "the type", __LINE__);
    Check(info.offset == e->offset, "the offset", __LINE__);
    Check(Same(info.variable, e->variable), "the variable", __LINE__);
    Check(Same(info.default_value, e->default_value), "the default", __LINE__);
    Check(Same(info.choices, e->choices), "the choices", __LINE__);
    Check(info.help != NULL && strlen(info.help) > 10, "a line of help", __LINE__);
    Check(info.default_note != NULL, "a default note (maybe empty)", __LINE__);
    if (info.default_value[0] == '\0') {
      Check(info.default_note[0] != '\0', "a default without a value says how it reads", __LINE__);
      continue;
    }
    wsync_config_t config;
    memset(&config, 0, sizeof(config));
    config.struct_size = sizeof(config);
    Check(api->config_set(&config, info.name, info.default_value) == WSYNC_OK,
          "config_set takes the default as written", __LINE__);
  }
}

static void CheckRoundTrips(void) {
  wsync_config_t config;
  memset(&config, 0, sizeof(config));
  config.struct_size = sizeof(config);
  const char* policy = "cost_aware";
  Check(api->config_set(&config, "metrics_allow_any_address", "yes") == WSYNC_OK &&
            config.metrics_allow_any_address == 1,
        "bool yes -> 1", __LINE__);
  Check(api->config_set(&config, "metrics_allow_any_address", "off") == WSYNC_OK &&
            config.metrics_allow_any_address == 0,
        "bool off -> 0", __LINE__);
  Check(api->config_set(&config, "coordinator_port", "29500") == WSYNC_OK &&
            config.coordinator_port == 29500,
        "port", __LINE__);
  Check(api->config_set(&config, "staging_budget_bytes", " 4096 ") == WSYNC_OK &&
            config.staging_budget_bytes == 4096,
        "bytes (blanks around it, as a variable)", __LINE__);
  Check(api->config_set(&config, "delta_budget_bytes", "17179869185") == WSYNC_OK &&
            config.delta_budget_bytes == 17179869185LL,
        "bytes past 32 bits", __LINE__);
  Check(api->config_set(&config, "deadline_seconds", "2.5") == WSYNC_OK &&
            config.deadline_seconds == 2.5,
        "seconds", __LINE__);
  Check(api->config_set(&config, "verify", "keyed") == WSYNC_OK && config.verify == 2,
        "choice by name", __LINE__);
  Check(api->config_set(&config, "delta", "1") == WSYNC_OK && config.delta == WSYNC_DELTA_AUTO,
        "choice by index", __LINE__);
  Check(api->config_set(&config, "replica_policy", policy) == WSYNC_OK &&
            config.replica_policy == policy,
        "text: the caller's pointer", __LINE__);
}

/* config_set(name, text) on a config of `struct_size` is refused, names `needle` and writes
 * nothing. */
static void Refused(const char* name, const char* text, size_t struct_size, const char* needle,
                    int line) {
  wsync_config_t config, before;
  memset(&config, 0, sizeof(config));
  config.struct_size = struct_size;
  config.deadline_seconds = 7;
  before = config;
  const wsync_status_t status = api->config_set(&config, name, text);
  const char* error = api->last_error(NULL);
  if (!Check(status == WSYNC_INVALID_ARGUMENT, "refused with WSYNC_INVALID_ARGUMENT", line)) return;
  if (!Check(strstr(error, needle) != NULL, "last_error(NULL) names what was refused", line)) {
    fprintf(stderr, "  wanted '%s' in: %s\n", needle, error);
  }
  Check(memcmp(&config, &before, sizeof(config)) == 0, "the config is unchanged", line);
}

static void CheckRefusals(void) {
  const size_t full = sizeof(wsync_config_t);
  Refused("deadline", "5", full, "'deadline' is not a setting", __LINE__);
  Refused("secret", "hunter2", full, "secret is never given as text", __LINE__);
  Refused("delta_budget_bytes", "4096", offsetof(wsync_config_t, delta_budget_bytes),
          "delta_budget_bytes lies past config->struct_size", __LINE__);
  Refused("coordinator_port", "0", full, "coordinator_port='0'", __LINE__);
  Refused("coordinator_port", "70000", full, "1..65535", __LINE__);
  Refused("staging_budget_bytes", "0", full, "staging_budget_bytes='0'", __LINE__);
  Refused("staging_budget_bytes", "64MiB", full, "number of bytes", __LINE__);
  Refused("deadline_seconds", "-1", full, "deadline_seconds='-1'", __LINE__);
  Refused("deadline_seconds", "nan", full, "finite, positive", __LINE__);
  Refused("verify", "maybe", full, "off (0), hash (1), keyed (2)", __LINE__);
  Refused("delta", "3", full, "delta='3'", __LINE__);
  Refused("metrics_allow_any_address", "maybe", full, "takes 1 or 0", __LINE__);
  Refused("replica_policy", "", full, "non-empty", __LINE__);
  Refused(NULL, "5", full, "name is NULL", __LINE__);
  Refused("verify", NULL, full, "text is NULL", __LINE__);
  Check(api->config_set(NULL, "verify", "hash") == WSYNC_INVALID_ARGUMENT &&
            strstr(api->last_error(NULL), "config is NULL") != NULL,
        "a NULL config is refused", __LINE__);

  char count_text[32];
  snprintf(count_text, sizeof(count_text), "there are %d", api->setting_count());
  wsync_setting_info_t info;
  memset(&info, 0, sizeof(info));
  info.struct_size = sizeof(info);
  Check(api->setting_info(-1, &info) == WSYNC_INVALID_ARGUMENT &&
            strstr(api->last_error(NULL), "index -1") != NULL &&
            strstr(api->last_error(NULL), count_text) != NULL && info.name == NULL,
        "index -1 is refused, naming the count", __LINE__);
  Check(api->setting_info(api->setting_count(), &info) == WSYNC_INVALID_ARGUMENT &&
            strstr(api->last_error(NULL), count_text) != NULL && info.name == NULL,
        "index count is refused", __LINE__);
  Check(api->setting_info(0, NULL) == WSYNC_INVALID_ARGUMENT &&
            strstr(api->last_error(NULL), "info is NULL") != NULL,
        "a NULL info is refused", __LINE__);
  info.struct_size = offsetof(wsync_setting_info_t, choices);
  Check(api->setting_info(0, &info) == WSYNC_INVALID_ARGUMENT &&
            strstr(api->last_error(NULL), "info->struct_size") != NULL && info.name == NULL,
        "a short info is refused", __LINE__);
}

int main(void) {
  test_who = "settings_abi_test";
  api = LoadPlugin(WSYNC_PLUGIN_PATH);
  if (api == NULL) return 1;
  CheckRows();
  CheckRoundTrips();
  CheckRefusals();
  printf("settings_abi_test: %d passed, %d failed\n", test_passed, test_failed);
  return test_failed == 0 ? 0 : 1;
}
