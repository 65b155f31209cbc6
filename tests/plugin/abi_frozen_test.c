/* The frozen v1 ABI (issue 23): the offset of every field of wsync.h's structs and of every entry
 * of the v1 table, the smallest size of each caller-sized struct, and every enum value, as v1 was
 * frozen on 2026-12-02 (x86-64 / aarch64 LP64). A host compiled against the frozen header must work
 * with every later libwsync.so, so v1 may only grow at the end: a new table entry after the last,
 * a new field at the end of a struct that carries struct_size. A change in place fails here,
 * naming the field; a change that is meant must be a v2 (wsync.h, "Loading").
 *
 * Exit status 0 when every check holds; 1 with a line per difference otherwise. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "wsync/wsync.h"

static int failures = 0;

static void check(const char* what, const char* name, long long now, long long frozen,
                  int at_least) {
  if (at_least ? now >= frozen : now == frozen) return;
  fprintf(stderr, "abi_frozen_test: %s %s is %lld, frozen at %s%lld\n", what, name, now,
          at_least ? "at least " : "", frozen);
  ++failures;
}

#define CHECK_OFFSET(type, field, frozen) \
  check("offset of", #type "." #field, (long long)offsetof(type, field), frozen, 0)
#define CHECK_SIZE(type, frozen) check("sizeof", #type, (long long)sizeof(type), frozen, 1)
#define CHECK_VALUE(name, frozen) check("value of", #name, (long long)(name), frozen, 0)

int main(void) {
  if (sizeof(void*) != 8 || sizeof(size_t) != 8 || sizeof(double) != 8) {
    printf("abi_frozen_test: the frozen offsets are those of an LP64 ABI; this is not one\n");
    return 1;
  }
  CHECK_VALUE(WSYNC_ABI_VERSION, 1);
  CHECK_OFFSET(wsync_config_t, struct_size, 0);
  CHECK_OFFSET(wsync_config_t, role, 8);
  CHECK_OFFSET(wsync_config_t, rank, 12);
  CHECK_OFFSET(wsync_config_t, num_trainers, 16);
  CHECK_OFFSET(wsync_config_t, num_rollouts, 20);
  CHECK_OFFSET(wsync_config_t, job_id, 24);
  CHECK_OFFSET(wsync_config_t, coordinator_host, 32);
  CHECK_OFFSET(wsync_config_t, coordinator_port, 40);
  CHECK_OFFSET(wsync_config_t, host_coordinator, 44);
  CHECK_OFFSET(wsync_config_t, secret_file, 48);
  CHECK_OFFSET(wsync_config_t, secret_env, 56);
  CHECK_OFFSET(wsync_config_t, node_id, 64);
  CHECK_OFFSET(wsync_config_t, staging_budget_bytes, 72);
  CHECK_OFFSET(wsync_config_t, deadline_seconds, 80);
  CHECK_OFFSET(wsync_config_t, replica_policy, 88);
  CHECK_OFFSET(wsync_config_t, path_transports, 96);
  CHECK_OFFSET(wsync_config_t, metrics_address, 104);
  CHECK_OFFSET(wsync_config_t, calibration_file, 112);
  CHECK_OFFSET(wsync_config_t, verify, 120);
  CHECK_OFFSET(wsync_config_t, heartbeat_interval_seconds, 128);
  CHECK_OFFSET(wsync_config_t, silence_limit_seconds, 136);
  CHECK_OFFSET(wsync_config_t, has_device_index, 144);
  CHECK_OFFSET(wsync_config_t, device_index, 148);
  CHECK_OFFSET(wsync_config_t, delta, 152);    /* Appended on 2026-12-05 (issue 44). */
  CHECK_OFFSET(wsync_config_t, secret, 160);   /* Appended on 2026-12-05 (issue 42). */
  CHECK_OFFSET(wsync_config_t, secret_length, 168);
  CHECK_OFFSET(wsync_config_t, metrics_allow_any_address, 176);
  CHECK_OFFSET(wsync_config_t, delta_budget_bytes, 184); /* Appended on 2026-12-05 (issue 44). */
  CHECK_SIZE(wsync_config_t, 192);
  CHECK_OFFSET(wsync_stats_t, struct_size, 0);
  CHECK_OFFSET(wsync_stats_t, version, 8);
  CHECK_OFFSET(wsync_stats_t, segments, 16);
  CHECK_OFFSET(wsync_stats_t, chunks, 24);
  CHECK_OFFSET(wsync_stats_t, rounds, 32);
  CHECK_OFFSET(wsync_stats_t, sent_bytes, 40);
  CHECK_OFFSET(wsync_stats_t, received_bytes, 48);
  CHECK_OFFSET(wsync_stats_t, local_copy_bytes, 56);
  CHECK_OFFSET(wsync_stats_t, direct_bytes, 64);
  CHECK_OFFSET(wsync_stats_t, staged_bytes, 72);
  CHECK_OFFSET(wsync_stats_t, peak_arena_bytes, 80);
  CHECK_OFFSET(wsync_stats_t, seconds, 88);
  CHECK_OFFSET(wsync_stats_t, verified_chunks, 96);
  CHECK_OFFSET(wsync_stats_t, delta_messages, 104); /* Appended on 2026-12-05 (issue 44). */
  CHECK_OFFSET(wsync_stats_t, delta_saved_bytes, 112);
  CHECK_OFFSET(wsync_stats_t, delta_compared_elements, 120);
  CHECK_OFFSET(wsync_stats_t, delta_changed_elements, 128);
  CHECK_OFFSET(wsync_stats_t, delta_encode_seconds, 136);
  CHECK_OFFSET(wsync_stats_t, delta_apply_seconds, 144);
  CHECK_SIZE(wsync_stats_t, 152);
  CHECK_OFFSET(wsync_progress_t, struct_size, 0);
  CHECK_OFFSET(wsync_progress_t, version, 8);
  CHECK_OFFSET(wsync_progress_t, rounds_done, 16);
  CHECK_OFFSET(wsync_progress_t, rounds_total, 24);
  CHECK_OFFSET(wsync_progress_t, bytes_done, 32);
  CHECK_OFFSET(wsync_progress_t, bytes_total, 40);
  CHECK_OFFSET(wsync_progress_t, committed_version, 48);
  CHECK_OFFSET(wsync_progress_t, phase, 56);
  CHECK_SIZE(wsync_progress_t, 64);
  CHECK_OFFSET(wsync_plugin_v1_t, name, 0);
  CHECK_OFFSET(wsync_plugin_v1_t, abi_version, 8);
  CHECK_OFFSET(wsync_plugin_v1_t, init, 16);
  CHECK_OFFSET(wsync_plugin_v1_t, register_buffer, 24);
  CHECK_OFFSET(wsync_plugin_v1_t, declare_parameter, 32);
  CHECK_OFFSET(wsync_plugin_v1_t, declare_piece, 40);
  CHECK_OFFSET(wsync_plugin_v1_t, set_manifest, 48);
  CHECK_OFFSET(wsync_plugin_v1_t, set_named_layout, 56);
  CHECK_OFFSET(wsync_plugin_v1_t, connect, 64);
  CHECK_OFFSET(wsync_plugin_v1_t, schedule_report, 72);
  CHECK_OFFSET(wsync_plugin_v1_t, sync, 80);
  CHECK_OFFSET(wsync_plugin_v1_t, sync_begin, 88);
  CHECK_OFFSET(wsync_plugin_v1_t, sync_test, 96);
  CHECK_OFFSET(wsync_plugin_v1_t, set_update_callbacks, 104);
  CHECK_OFFSET(wsync_plugin_v1_t, abort, 112);
  CHECK_OFFSET(wsync_plugin_v1_t, state, 120);
  CHECK_OFFSET(wsync_plugin_v1_t, stats, 128);
  CHECK_OFFSET(wsync_plugin_v1_t, metrics_text, 136);
  CHECK_OFFSET(wsync_plugin_v1_t, listening_ports, 144);
  CHECK_OFFSET(wsync_plugin_v1_t, last_error, 152);
  CHECK_OFFSET(wsync_plugin_v1_t, finalize, 160);
  CHECK_OFFSET(wsync_plugin_v1_t, progress, 168);
  CHECK_OFFSET(wsync_plugin_v1_t, rebind_buffer, 176);
  CHECK_OFFSET(wsync_plugin_v1_t, declare_fp8_parameter, 184);
  CHECK_OFFSET(wsync_plugin_v1_t, set_parameter_wave, 192);
  CHECK_OFFSET(wsync_plugin_v1_t, set_wave_callback, 200);
  CHECK_OFFSET(wsync_plugin_v1_t, set_log, 208);
  CHECK_OFFSET(wsync_plugin_v1_t, setting_count, 216); /* Appended on 2026-12-05 (issue 43). */
  CHECK_OFFSET(wsync_plugin_v1_t, setting_info, 224);
  CHECK_OFFSET(wsync_plugin_v1_t, config_set, 232);
  CHECK_OFFSET(wsync_setting_info_t, struct_size, 0); /* Added on 2026-12-05 (issue 43). */
  CHECK_OFFSET(wsync_setting_info_t, name, 8);
  CHECK_OFFSET(wsync_setting_info_t, type, 16);
  CHECK_OFFSET(wsync_setting_info_t, offset, 24);
  CHECK_OFFSET(wsync_setting_info_t, default_value, 32);
  CHECK_OFFSET(wsync_setting_info_t, default_note, 40);
  CHECK_OFFSET(wsync_setting_info_t, variable, 48);
  CHECK_OFFSET(wsync_setting_info_t, help, 56);
  CHECK_OFFSET(wsync_setting_info_t, choices, 64);
  CHECK_SIZE(wsync_setting_info_t, 72);
  CHECK_VALUE(WSYNC_OK, 0);
  CHECK_VALUE(WSYNC_IN_PROGRESS, 1);
  CHECK_VALUE(WSYNC_INVALID_ARGUMENT, 2);
  CHECK_VALUE(WSYNC_LAYOUT_REFUSED, 3);
  CHECK_VALUE(WSYNC_RANKS_DISAGREE, 4);
  CHECK_VALUE(WSYNC_TIMED_OUT, 5);
  CHECK_VALUE(WSYNC_PEER_LOST, 6);
  CHECK_VALUE(WSYNC_ABORTED, 7);
  CHECK_VALUE(WSYNC_NO_MEMORY, 8);
  CHECK_VALUE(WSYNC_AUTHENTICATION, 9);
  CHECK_VALUE(WSYNC_UNSUPPORTED, 10);
  CHECK_VALUE(WSYNC_INTERNAL, 11);
  CHECK_VALUE(WSYNC_ROLE_TRAINER, 1);
  CHECK_VALUE(WSYNC_ROLE_ROLLOUT, 2);
  CHECK_VALUE(WSYNC_MEMORY_HOST, 1);
  CHECK_VALUE(WSYNC_MEMORY_CUDA, 2);
  CHECK_VALUE(WSYNC_STATE_REGISTERED, 1);
  CHECK_VALUE(WSYNC_STATE_CONNECTED, 2);
  CHECK_VALUE(WSYNC_STATE_IDLE, 3);
  CHECK_VALUE(WSYNC_STATE_SYNCING, 4);
  CHECK_VALUE(WSYNC_STATE_DIRTY, 5);
  CHECK_VALUE(WSYNC_PHASE_IDLE, 0);
  CHECK_VALUE(WSYNC_PHASE_AGREEING, 1);
  CHECK_VALUE(WSYNC_PHASE_TRANSFERRING, 2);
  CHECK_VALUE(WSYNC_PHASE_VERIFYING, 3);
  CHECK_VALUE(WSYNC_PHASE_VOTING, 4);
  CHECK_VALUE(WSYNC_LOG_ERROR, 1);
  CHECK_VALUE(WSYNC_LOG_WARN, 2);
  CHECK_VALUE(WSYNC_LOG_INFO, 3);
  CHECK_VALUE(WSYNC_LOG_DEBUG, 4);
  if (failures == 0) printf("abi_frozen_test: every v1 offset, size and value as frozen\n");
  return failures == 0 ? 0 : 1;
}
