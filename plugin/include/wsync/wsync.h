/* wsync: weight sync from RL trainers to rollout engines. The plugin's C ABI.
 *
 * Loading: dlopen("libwsync.so") and dlsym("wsyncPlugin_v1"), which is a `const wsync_plugin_v1_t`.
 * A later ABI adds wsyncPlugin_v2 and keeps wsyncPlugin_v1. v1 is frozen (2026-12-02): no entry,
 * field or enum value changes in place; v1 grows only at the end (a table entry after the last, a
 * field at the end of a struct that carries struct_size), so a host built against any v1 header
 * works with every later library (tests/plugin/abi_frozen_test.c). Which entries a loaded library
 * has: the size of its wsyncPlugin_v1 symbol (the ELF st_size, e.g. glibc's dladdr1(table, &info,
 * (void**)&symbol, RTLD_DL_SYMENT)) is sizeof(wsync_plugin_v1_t) of the header it was built with
 * (more in an AddressSanitizer build, whose redzone it includes), and WSYNC_PLUGIN_V1_HAS(size,
 * entry) says whether `entry` lies inside it; a library from before
 * an entry was appended ends its table earlier (tests/plugin/table_size_test.c; the Python
 * package refuses such calls by name). The library exports no other
 * symbol and never lets a C++ exception out: every call returns a wsync_status_t, and
 * last_error(session) describes the most recent failure of that session.
 *
 * One session per process and job. Its states (wsync_state_t):
 *   REGISTERED  after init: register buffers, declare parameters and pieces (or give a manifest or
 *               a named layout), set callbacks;
 *   CONNECTED   after connect: rendezvous with every process, both layouts validated, the plan and
 *               schedule built and agreed; nothing moved yet;
 *   IDLE        between syncs; `version` is the last committed one (-1 before the first);
 *   SYNCING     while a sync runs (sync_begin .. sync_test returning WSYNC_OK or an error);
 *   DIRTY       a rollout process whose last sync failed: its weights must not be served until a
 *               later sync commits (trainers return to IDLE after a failure);
 *   FINALIZED   after finalize; the handle is freed and must not be used again.
 * A call made in a state that does not allow it returns WSYNC_INVALID_ARGUMENT with a message
 * naming the state.
 *
 * Threads: calls on one session are serialized by the caller, except abort() and last_error(),
 * which any thread may call at any time, and state(), stats(), listening_ports() and
 * progress(), which are always safe (also while another thread is blocked in connect or sync).
 * abort() may also race finalize() on another thread: an abort that starts before finalize
 * returns either acts on the session or, once finalize has begun, does nothing and returns
 * WSYNC_OK; finalize waits for an abort in flight to return before it frees the handle. An abort
 * that starts after finalize returned uses a freed handle, like any other call (and with a new
 * session at the same address, would abort that one): hosts stop calling abort once finalize
 * returned.
 *
 * No exception and no failure of the library's own threads (the sync_begin thread, the
 * trainer-triggered loop, the control connection's heartbeat thread, a hosted coordinator)
 * terminates the host: it becomes the session's error (sync_test or the next call returns it, a
 * rollout turns DIRTY, the session is aborted; finalize and start a new session).
 *
 * A failed init or finalize, and any call given a NULL session, record their detail for this
 * thread; last_error(NULL) returns it.
 */
#ifndef WSYNC_WSYNC_H_
#define WSYNC_WSYNC_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define WSYNC_ABI_VERSION 1

/* Grouped by blast radius: argument errors touch nothing; layout and agreement errors fail
 * connect on every process; timeouts, lost peers and aborts fail one sync (rollouts turn DIRTY);
 * the rest are local. */
typedef enum wsync_status {
  WSYNC_OK = 0,
  WSYNC_IN_PROGRESS = 1,      /* sync_test: the sync is still running. */
  WSYNC_INVALID_ARGUMENT = 2, /* A bad argument, or a call in the wrong state. */
  WSYNC_LAYOUT_REFUSED = 3,   /* A layout cannot be planned; the message names parameter/box. */
  WSYNC_RANKS_DISAGREE = 4,   /* Processes disagree on the plan digest, budget or a verdict. */
  WSYNC_TIMED_OUT = 5,        /* A deadline passed; the message names who was missing. */
  WSYNC_PEER_LOST = 6,        /* A peer or the coordinator went away. */
  WSYNC_ABORTED = 7,          /* abort() was called here or on another process. */
  WSYNC_NO_MEMORY = 8,
  WSYNC_AUTHENTICATION = 9, /* The job secret was refused (or missing). */
  WSYNC_UNSUPPORTED = 10,   /* E.g. CUDA memory without a CUDA-capable transport. */
  WSYNC_INTERNAL = 11
} wsync_status_t;

typedef enum wsync_role { WSYNC_ROLE_TRAINER = 1, WSYNC_ROLE_ROLLOUT = 2 } wsync_role_t;

typedef enum wsync_memory_kind { WSYNC_MEMORY_HOST = 1, WSYNC_MEMORY_CUDA = 2 } wsync_memory_kind_t;

typedef enum wsync_state {
  WSYNC_STATE_REGISTERED = 1,
  WSYNC_STATE_CONNECTED = 2,
  WSYNC_STATE_IDLE = 3,
  WSYNC_STATE_SYNCING = 4,
  WSYNC_STATE_DIRTY = 5
} wsync_state_t;

/* Configuration. `struct_size` must be sizeof(wsync_config_t) as the caller compiled it: fields
 * past it take their defaults, so a caller built against an older header keeps working (it must
 * reach at least through job_id); fields of a newer header that this library does not know are
 * not read. Zero or NULL fields are unset: a setting's field that is unset takes its environment
 * variable WSYNC_<FIELD> (e.g. WSYNC_DEADLINE_SECONDS, WSYNC_DELTA=auto) when that is set, else its
 * default (given here); a variable whose value is refused fails init with WSYNC_INVALID_ARGUMENT
 * naming it. Which fields are settings, with their defaults, variables and help: the settings
 * table (plugin/settings.h); `wsync settings` prints it with the values in effect. Not settings
 * (never read from the environment): role, rank, num_trainers, num_rollouts, job_id,
 * host_coordinator, has_device_index, device_index; secret_file, secret_env and secret have no
 * variable. Strings are copied by init. */
typedef struct wsync_config {
  size_t struct_size;
  wsync_role_t role;
  int32_t rank;         /* Within the role. */
  int32_t num_trainers; /* Processes of each role in the job. */
  int32_t num_rollouts;
  const char* job_id;           /* Required. */
  const char* coordinator_host; /* Default "127.0.0.1". */
  int32_t coordinator_port;     /* Required; host_coordinator listens on it (0 there picks a
                                   free port: listening_ports reports it). */
  int32_t host_coordinator;     /* Nonzero on trainer rank 0: run the coordinator in-process. */
  const char* secret_file;      /* The job secret: a file of mode 0600 ... */
  const char* secret_env;       /* ... or an environment variable (default "WSYNC_SECRET");
                                   not both. */
  const char* node_id;          /* Default: the host name. */
  int64_t staging_budget_bytes; /* Bytes per peer and direction; default 64 MiB (67108864).
                                   Negative: WSYNC_INVALID_ARGUMENT. */
  double deadline_seconds;      /* Of every blocking step; default 60. */
  const char* replica_policy;   /* Default "local_first_least_loaded". */
  const char* path_transports;  /* e.g. "intra_node=ucx:sm,cma,self;inter_node=ucx:tcp". */
  const char* metrics_address;  /* "HOST:PORT" to serve /metrics (port 0 picks one, which
                                   listening_ports reports); NULL: no exporter (metrics_text
                                   still works). */
  const char* calibration_file; /* A calibration (wsync calibrate --out), read by trainer
                                   rank 0 and shared at connect; NULL: none. Required by
                                   replica_policy "cost_aware". */
  int32_t verify;               /* End-to-end integrity, default 0 (off). 1: every chunk is
                                   hashed (xxh3) by its sender and by its receiver over what
                                   landed; a mismatch fails the sync on every process (the
                                   receiver votes no naming the peer and chunk). Finds
                                   accidents, not attackers. 2 (keyed): the same with a MAC
                                   keyed from the job secret and bound to the sync, sender,
                                   receiver and chunk (DATA_LOSS "the MAC of chunk ..."):
                                   forged or replayed chunks and MACs fail too. Other values
                                   are refused. */
  double heartbeat_interval_seconds; /* host_coordinator only (ignored elsewhere): the hosted
                                        coordinator's heartbeat interval, default 0.25 (at least
                                        0.001), and ... */
  double silence_limit_seconds;      /* ... the silence after which it takes a process as lost
                                        (SIGSTOP, a hung host), default 3; at least twice the
                                        interval. Negative, NaN or infinite values, or a limit below
                                        twice the interval: WSYNC_INVALID_ARGUMENT. */
  int32_t has_device_index;          /* Nonzero: device_index says which GPU this process uses. */
  int32_t device_index;              /* This process's GPU as its node numbers it (nvidia-smi's
                                        index, 0..65536; not an ordinal relative to
                                        CUDA_VISIBLE_DEVICES). Processes of one node with equal
                                        device indexes share a GPU: path class "same_device".
                                        Without has_device_index (the default) the GPU is unknown
                                        and never shared, unless the layout says (set_named_layout
                                        with colocated=1, a manifest's Process.device); a layout
                                        that names another GPU than this is refused. */
  int32_t delta;                     /* Delta sync (issue 44): WSYNC_DELTA_OFF (0, the default):
                                        every sync moves every byte of the plan;
                                        WSYNC_DELTA_AUTO (1): delta per path class where the
                                        calibration's cost model says it pays (never over shared
                                        memory; off without a calibration that measured delta's
                                        encode and apply rates); WSYNC_DELTA_ON (2): senders
                                        move only the elements changed since the version a
                                        rollout committed last and holds (dense to a rollout that
                                        is new, dirty, rebound or was in an aborted sync since);
                                        every process of a job must set the same (else its syncs
                                        fail before any byte moves). Other values:
                                        WSYNC_INVALID_ARGUMENT. */
  /* Appended to v1 (a caller's struct_size without them: the defaults). */
  const char* secret;   /* The job secret itself, secret_length bytes (need not end in NUL),
                           instead of secret_file or secret_env (give at most one of the three).
                           init copies them; the caller may wipe its copy once init returned.
                           For hosts that hold the secret in memory: no file or variable
                           outlives them. secret_env (and the default WSYNC_SECRET) is removed
                           from the environment once init read it, so that processes the host
                           starts later do not inherit it. */
  size_t secret_length; /* At most 4096, or WSYNC_INVALID_ARGUMENT. */
  int32_t metrics_allow_any_address; /* Nonzero: metrics_address may be a wildcard ("0.0.0.0",
                                        every interface); without it such an address is refused
                                        (WSYNC_INVALID_ARGUMENT), as the coordinator refuses one
                                        without its explicit flag. */
  int64_t delta_budget_bytes; /* With delta: the most bytes a sender keeps as its bases (what it
                                 last sent per chunk, in host memory); 0: the default, 16 GiB
                                 (17179869184). A chunk that does not fit travels dense until
                                 bytes are freed. Negative: WSYNC_INVALID_ARGUMENT. */
} wsync_config_t;

/* Values of wsync_config_t.delta. */
typedef enum wsync_delta_mode {
  WSYNC_DELTA_OFF = 0,
  WSYNC_DELTA_AUTO = 1,
  WSYNC_DELTA_ON = 2
} wsync_delta_mode_t;

/* What the last sync of this process did. */
typedef struct wsync_stats {
  size_t struct_size; /* Set by the caller to sizeof(wsync_stats_t) (at least through version);
                         fields past it are left. */
  int64_t version;
  int64_t segments;
  int64_t chunks;
  int64_t rounds;
  int64_t sent_bytes;
  int64_t received_bytes;
  int64_t local_copy_bytes;
  int64_t direct_bytes;
  int64_t staged_bytes;
  int64_t peak_arena_bytes;
  double seconds;
  int64_t verified_chunks; /* With verify: received chunks whose hash matched the sender's. */
  /* Appended (issue 44): delta sync; zero without it. */
  int64_t delta_messages;    /* Messages sent or received as encodings. */
  int64_t delta_saved_bytes; /* Their dense bytes minus their encodings' (sent_bytes and
                                received_bytes count what travelled). */
  int64_t delta_compared_elements; /* As a sender: elements compared with a base of their
                                      receiver's version, ... */
  int64_t delta_changed_elements;  /* ... and of those the changed ones (a chunk sent dense
                                      because most of it changed counts whole). */
  double delta_encode_seconds;     /* Thread CPU time: a sender's encoding, ... */
  double delta_apply_seconds;      /* ... a receiver's patching of its targets. */
} wsync_stats_t;

/* Where a sync stands (wsync_progress_t.phase). */
typedef enum wsync_phase {
  WSYNC_PHASE_IDLE = 0,         /* No sync running: before the first, or after a decision. */
  WSYNC_PHASE_AGREEING = 1,     /* The trigger and the agreement before any byte moves. */
  WSYNC_PHASE_TRANSFERRING = 2, /* Messages with the peers (and local copies). */
  WSYNC_PHASE_VERIFYING = 3,    /* Exchanging and checking chunk digests (verify). */
  WSYNC_PHASE_VOTING = 4        /* The commit decision. */
} wsync_phase_t;

/* Where this process stands in its current sync, or its last one (then IDLE). */
typedef struct wsync_progress {
  size_t struct_size;   /* Set by the caller to sizeof(wsync_progress_t) (at least through
                           version); fields past it are left. */
  int64_t version;      /* Of the current or last sync; -1 before the first. */
  int64_t rounds_done;  /* This process's rounds whose messages all completed, of rounds_total. */
  int64_t rounds_total; /* 0 until the transfer started. */
  int64_t bytes_done;   /* Bytes of its completed messages, sent and received, of bytes_total. */
  int64_t bytes_total;
  int64_t committed_version; /* The last version whose decision committed; -1: none yet. */
  int32_t phase;             /* A wsync_phase_t. */
} wsync_progress_t;

/* FP8 quantization schemes of a rollout parameter (wsync_fp8_parameter_t.scheme). */
typedef enum wsync_quant_scheme {
  WSYNC_QUANT_FP8_BLOCK = 1,   /* Blocks of block_rows x block_cols (default 128 x 128) with one
                                  scale each: DeepSeek-V3 / Kimi-K2 block FP8, vLLM's
                                  "<module>.weight_scale_inv" [ceil(rows/128), ceil(cols/128)]. */
  WSYNC_QUANT_FP8_CHANNEL = 2, /* One scale per output row: vLLM's "<module>.weight_scale"
                                  [rows, 1]. */
  WSYNC_QUANT_FP8_TENSOR = 3   /* One scale per matrix: vLLM's "<module>.weight_scale" [1, 1]. */
} wsync_quant_scheme_t;

/* An FP8 e4m3 target parameter and its fp32 scale tensor (declare_fp8_parameter). A parameter of
 * 2 axes [rows, cols] or 3 [experts, rows, cols] (each expert scaled on its own: the scale tensor
 * has the experts axis first). The sync quantizes the trainers' bf16 or fp32 values into it:
 * fp8 = e4m3(clamp(x / scale, -448, 448)) rounded to nearest even, scale = fp32(max(amax of the
 * block, 1e-10) / 448), which the engine reads as dequantized = fp8 * scale. `struct_size` must
 * be sizeof(wsync_fp8_parameter_t) as the caller compiled it (at least through scale_shape). */
typedef struct wsync_fp8_parameter {
  size_t struct_size;
  const char* parameter;      /* Declared before with dtype "fp8_e4m3" (rollout processes only). */
  int32_t scheme;             /* A wsync_quant_scheme_t. */
  int32_t scale_num_axes;     /* The parameter's axis count. */
  int64_t block_rows;         /* WSYNC_QUANT_FP8_BLOCK: rows and columns of a block, 0 for 128 */
  int64_t block_cols;         /* (vLLM's weight_block_size); 0 for the other schemes. */
  const char* scale_name;     /* The scale tensor as the engine names it ("...weight_scale_inv",
                                 "...weight_scale"); declared by this call, its pieces by
                                 declare_piece (origin, extent and strides in scale elements). */
  const char* scale_dtype;    /* "fp32" ("float32"): the only one accepted. */
  const int64_t* scale_shape; /* scale_num_axes values: per axis ceil(extent / block) (1 for a
                                 whole axis, experts 1 by 1); any other shape is refused. */
} wsync_fp8_parameter_t;

typedef struct wsync_session wsync_session_t;

/* Rollout hosts in the trainer-triggered mode: called on the library's background thread around
 * each sync the trainer starts, never on the host's threads and never both at once. before_update
 * may pause serving; after_update gets the outcome (WSYNC_OK or the error) and must not resume
 * serving on an error. `user` is passed through untouched: the library neither reads nor frees it,
 * and it must stay valid until finalize returns. A callback may call state, stats, progress,
 * last_error and abort on the session, no other function (they are the host's thread's, which may
 * be blocked in one of them). */
typedef void (*wsync_before_update_fn)(void* user, int64_t version);
typedef void (*wsync_after_update_fn)(void* user, int64_t version, wsync_status_t status);

/* Streamed syncs (set_parameter_wave, set_wave_callback): called on the thread running the sync
 * (the host's in sync, the library's in sync_begin and the trainer-triggered mode) after wave
 * `wave` of sync `version` landed on this process, before any byte of the next wave moves. It
 * returns WSYNC_OK, or an error that fails the sync on every process (this process votes no; its
 * last_error names the wave). It may read and change the memory of that wave's parameters and
 * call state, stats, progress, last_error and abort on the session, no other function. */
typedef wsync_status_t (*wsync_wave_fn)(void* user, int64_t version, int32_t wave);

/* Log lines (set_log): their levels, most severe first. A filter at level L delivers the lines of
 * L and of every more severe level. */
typedef enum wsync_log_level {
  WSYNC_LOG_ERROR = 1,
  WSYNC_LOG_WARN = 2,
  WSYNC_LOG_INFO = 3,
  WSYNC_LOG_DEBUG = 4
} wsync_log_level_t;

/* A host's log function (set_log): one line of wsync's trace, without a trailing newline.
 * `level` is a wsync_log_level_t; `category` one of "connect" (who joined, the transports chosen
 * per path class), "plan" (digest, segments, chunks, rounds, bytes), "round" (each round of a
 * sync: messages, bytes, time), "sync" (a sync's start, its commit or abort), "fault" (failures:
 * who and what), "control" (the coordinator: joins, rosters, decisions), "transport", "config";
 * both strings are valid for the call only. Called on whichever thread emits the line (a library
 * thread or the host's own, inside any call), one call at a time in the whole process. It must
 * return promptly and must not call into the library (a line it causes is dropped; set_log from
 * inside it is refused). */
typedef void (*wsync_log_fn)(void* user, int32_t level, const char* category, const char* line);

/* One row of the settings table (setting_info): a setting of wsync_config_t. Every string is the
 * library's, NUL-terminated and valid while the library is loaded. */
typedef struct wsync_setting_info {
  size_t struct_size;        /* Set by the caller to sizeof(wsync_setting_info_t) (at least
                                through choices); fields past it are left. */
  const char* name;          /* The wsync_config_t field, e.g. "deadline_seconds". */
  const char* type;          /* "bool" (int32_t 0 or 1), "port" (int32_t), "bytes" (int64_t),
                                "seconds" (double), "choice" (int32_t: an index of choices),
                                "text" (const char*), "secret" (the secret's bytes: never text). */
  size_t offset;             /* offsetof(wsync_config_t, <name>). */
  const char* default_value; /* The default as its variable would be written ("60", "off",
                                "67108864"); "" when there is none. */
  const char* default_note;  /* How the default reads where the value says nothing ("the host
                                name", "none"); "" otherwise. */
  const char* variable;      /* "WSYNC_<NAME>"; "" for a setting without one. */
  const char* help;          /* One line. */
  const char* choices;       /* "choice": the names of 0, 1, ... comma-separated
                                ("off,hash,keyed"); "" for other types. */
} wsync_setting_info_t;

typedef struct wsync_plugin_v1 {
  const char* name;    /* "wsync" */
  int32_t abi_version; /* WSYNC_ABI_VERSION */

  wsync_status_t (*init)(const wsync_config_t* config, wsync_session_t** session);

  /* Layout of this process (REGISTERED only). Buffer ids are the caller's, unique per process (a
   * second registration of an id: WSYNC_INVALID_ARGUMENT). The caller owns the memory: it must
   * stay allocated at this address until finalize returns, and the library never frees it. The
   * library reads it (trainers) or writes it (rollouts) only while a sync runs: from sync or
   * sync_begin until the outcome is returned, or between before_update and after_update; connect
   * may register it with the transports (UCX memory handles, CUDA IPC handles) without touching
   * its bytes.
   * WSYNC_MEMORY_CUDA: a device pointer on CUDA device `device` (one device per process), moved
   * over NCCL; connect returns WSYNC_UNSUPPORTED with the reason when this build or machine
   * cannot (no NCCL, no CUDA device, a path configuration whose backend cannot reach it). The
   * caller's writes to CUDA buffers must be complete (its streams synchronised) before sync, and
   * sync returns only after every byte it moved into them has landed. */
  wsync_status_t (*register_buffer)(wsync_session_t* session, uint64_t buffer_id, void* address,
                                    uint64_t bytes, wsync_memory_kind_t kind, int32_t device);
  /* dtype: "bf16", "fp16", "fp32", "fp8_e4m3", "fp8_e5m2", "int8", "int32", "int64" (or torch's
   * spellings). Every string and array argument of these calls is copied before they return. */
  wsync_status_t (*declare_parameter)(wsync_session_t* session, const char* name, const char* dtype,
                                      int32_t num_axes, const int64_t* shape);
  /* This buffer holds box [origin, origin + extent) of the parameter: element i at
   * offset + sum (i[a] - origin[a]) * strides[a] (elements). */
  wsync_status_t (*declare_piece)(wsync_session_t* session, const char* parameter,
                                  uint64_t buffer_id, int32_t num_axes, const int64_t* origin,
                                  const int64_t* extent, int64_t offset, const int64_t* strides);
  /* The whole layout part at once: a serialized wsync.proto.Manifest of this process only; the
   * bytes are parsed and copied before the call returns. Buffers are still registered with
   * register_buffer (the manifest's buffer ids). */
  wsync_status_t (*set_manifest)(wsync_session_t* session, const void* bytes, size_t size);
  /* Or a named layout of an embedded model (e.g. "qwen2.5-0.5b", "vllm(tp=2)"); the process then
   * registers the buffers the layout names (ids 0, 1, ... in the layout's order). A layout with
   * placement keys ("vllm(tp=2,ppn=4,colocated=1)") places this process as `wsync plan` places
   * its rank: on node "node<rank / ppn>" (colocated) or "<role>-node<rank / ppn>", replacing
   * node_id, and with colocated=1 on GPU rank % ppn of it, so that rollout rank r and trainer
   * rank r share a GPU (path class "same_device"). Colocation is a property of the pair: give
   * the same keys on both sides (`wsync plan` applies one side's to both; processes cannot).
   * Without placement keys: node node_id, GPU device_index (or unknown). */
  wsync_status_t (*set_named_layout)(wsync_session_t* session, const char* model,
                                     const char* layout);

  /* REGISTERED -> CONNECTED (then IDLE): rendezvous, validate, plan, schedule, agree. */
  wsync_status_t (*connect)(wsync_session_t* session);

  /* A text report of what this process will send, receive, stage and copy. Writes at most *size
   * bytes including the terminating NUL; *size is set to the bytes needed. Like snprintf, a
   * smaller buffer gets a NUL-terminated prefix (nothing when *size is 0; buffer may then be
   * NULL) and the call still returns WSYNC_OK: compare *size with what you passed. */
  wsync_status_t (*schedule_report)(wsync_session_t* session, char* buffer, size_t* size);

  /* One sync of `version` (>= 0), blocking until committed or failed (at most the deadline per
   * step). */
  wsync_status_t (*sync)(wsync_session_t* session, int64_t version);
  /* The same, for hosts that poll: begin returns at once; test returns WSYNC_IN_PROGRESS until the
   * sync ends, then its outcome. */
  wsync_status_t (*sync_begin)(wsync_session_t* session, int64_t version);
  wsync_status_t (*sync_test)(wsync_session_t* session);

  /* Rollout, trainer-triggered mode: a background thread joins every sync the trainer starts and
   * calls the callbacks around it. Set before connect; started by connect. Either function may
   * be NULL. */
  wsync_status_t (*set_update_callbacks)(wsync_session_t* session, wsync_before_update_fn before,
                                         wsync_after_update_fn after, void* user);

  /* Fails the running sync (if any) on every process; callable from any thread; idempotent; may
   * race finalize (see "Threads" above). */
  wsync_status_t (*abort)(wsync_session_t* session, const char* reason);

  wsync_status_t (*state)(wsync_session_t* session, int64_t* version, wsync_state_t* state);
  wsync_status_t (*stats)(wsync_session_t* session, wsync_stats_t* stats);
  /* Prometheus text exposition of this session's metrics (same size protocol as
   * schedule_report), for engines that serve their own /metrics. */
  wsync_status_t (*metrics_text)(wsync_session_t* session, char* buffer, size_t* size);
  /* The TCP ports this session listens on, 0 for none: the metrics exporter's (from init, when
   * metrics_address is set) and the hosted coordinator's (host_coordinator only: from the moment
   * connect has started it, before connect waits for the other processes, so that a host that
   * asked for port 0 can read it on another thread and hand it to them; 0 again once a failed
   * connect stopped it). Either pointer may be NULL. Any thread, any time before finalize. */
  wsync_status_t (*listening_ports)(wsync_session_t* session, int32_t* metrics_port,
                                    int32_t* coordinator_port);
  /* The detail of the most recent failure of this session ("" if none); with NULL, of this
   * thread's most recent failure that had no session (see above). Valid until this thread's next
   * call into the library. */
  const char* (*last_error)(wsync_session_t* session);

  /* Releases everything (threads, sockets, transport, registrations, arenas) and frees the
   * session, after any abort() in flight on it returned. */
  wsync_status_t (*finalize)(wsync_session_t* session);

  /* Appended to v1 (a library from before it ends the table at finalize): where this process
   * stands in its current sync, for a progress display (its coordinator sees the same with every
   * heartbeat: `wsync status`). Any thread, at any time between init and finalize, also while
   * sync or sync_begin runs on another thread; never blocks (relaxed reads: the fields of one
   * call may come from neighbouring moments, e.g. bytes of a message before its round; never torn
   * values). WSYNC_INVALID_ARGUMENT for a NULL session or progress, or struct_size too small. */
  wsync_status_t (*progress)(wsync_session_t* session, wsync_progress_t* progress);

  /* Points registered buffer `buffer_id` at `address` for the syncs that follow: memory of the
   * same size, kind and device that now holds what the old address held (an engine that released
   * and reallocated its weights, as vLLM's sleep and wake_up do). IDLE or DIRTY, in a host-driven
   * session only (not after set_update_callbacks: its syncs start on their own). The plan, the
   * schedule and its digest stay as they are, no other process is told, and the job does not
   * reconnect. Once it returns WSYNC_OK the library no longer reads or writes the old memory; on
   * any failure the buffer stays where it was. WSYNC_INVALID_ARGUMENT for a NULL session or
   * address, an id this process did not register, or a call in another state or session mode. */
  wsync_status_t (*rebind_buffer)(wsync_session_t* session, uint64_t buffer_id, void* address);

  /* Appended to v1 (a library from before it ends the table at rebind_buffer): declares
   * `fp8->parameter`, a parameter this rollout process declared with dtype "fp8_e4m3", as
   * quantized by `fp8->scheme`, and declares its scale tensor `fp8->scale_name` (fp32, shape
   * `fp8->scale_shape`) as a parameter whose pieces (buffer, offset, strides) the process gives
   * with declare_piece. REGISTERED only. Every rollout process declares the parameter, quantized
   * the same way (a difference fails connect on every process with WSYNC_LAYOUT_REFUSED naming
   * it); the trainers declare it under the same name in bf16 or fp32, unquantized, and declare no
   * scale tensor. A process's pieces of the parameter must be whole blocks (the last block of an
   * axis ragged) sharing no block, and its scale pieces must hold exactly their blocks' scales
   * (refused at connect otherwise). WSYNC_INVALID_ARGUMENT, with a message naming the parameter,
   * for a NULL session or fp8, a struct_size too small, a NULL or unknown parameter, one not
   * fp8_e4m3, not of 2 or 3 axes or already quantized, a trainer process, an unknown scheme, block
   * sizes negative or given for a scheme without blocks, a scale name that is NULL, empty or
   * already declared, a scale dtype other than fp32, or a scale shape other than the scheme's. */
  wsync_status_t (*declare_fp8_parameter)(wsync_session_t* session,
                                          const wsync_fp8_parameter_t* fp8);

  /* Appended to v1 (a library from before them ends the table at declare_fp8_parameter):
   * streamed syncs, for a rollout that must hand what it receives to the engine's own loader in
   * bounded memory. A sync moves its parameters in waves 0, 1, ...: every byte of wave w lands on
   * every process, and each process runs its wave callback for w (when set), before any byte of
   * wave w + 1 moves (each wave begins with an agreement of every process, as a sync does). The
   * commit vote follows the last wave: a failure in any wave or callback fails the sync on every
   * process, the later waves do not run, and a rollout is DIRTY (the waves before it may have
   * been handed on: it holds neither version). Waves with no parameter in the job are skipped.
   *
   * set_parameter_wave puts declared parameter `parameter` of this rollout process in wave `wave`
   * (0 .. 4095; every parameter is in wave 0 until set). Pieces of parameters in different waves
   * may share memory (one staging area reused wave after wave); within a wave they may not. Every
   * rollout process declaring the parameter gives it the same wave (a difference fails connect on
   * every process with WSYNC_LAYOUT_REFUSED naming it); trainers set no waves. FP8-quantized
   * parameters and their scales stay in wave 0. REGISTERED only. WSYNC_INVALID_ARGUMENT, naming
   * the parameter, for a NULL session or parameter, an undeclared or quantized parameter, a wave
   * out of range, or a trainer process.
   *
   * set_wave_callback sets the function called after each wave (NULL: none); `user` is passed
   * through untouched and must stay valid until finalize returns. REGISTERED only. */
  wsync_status_t (*set_parameter_wave)(wsync_session_t* session, const char* parameter,
                                       int32_t wave);
  wsync_status_t (*set_wave_callback)(wsync_session_t* session, wsync_wave_fn callback, void* user);

  /* Appended to v1 (a library from before it ends the table at set_wave_callback): where this
   * process's log lines go and which are delivered. Process-wide (every session, a hosted
   * coordinator, the library's threads); any thread, any time, also before init; needs no
   * session. Without a call the library reads WSYNC_LOG (a comma list of the categories of
   * wsync_log_fn, or "all") and WSYNC_LOG_LEVEL ("error", "warn", "info" (the default),
   * "debug"), and writes the lines it selects to standard error; with neither set it writes
   * nothing.
   *
   * `callback` receives the lines from now on (NULL: standard error again), with `user` passed
   * through untouched. `categories` is a list as WSYNC_LOG takes (NULL: none, "" too); `level` a
   * wsync_log_level_t (0: info). WSYNC_LOG and WSYNC_LOG_LEVEL, when set in the environment,
   * take precedence over `categories` and `level`: the operator's choice wins over the host's
   * default. An unknown name in them is ignored and reported as a warn line of category
   * "config", delivered whatever the filter. Returns after any call of the previous callback
   * has returned: from then on the previous `user` is no longer used. Before unloading the
   * library or freeing `user`, a host sets NULL. WSYNC_INVALID_ARGUMENT, with last_error(NULL)
   * naming it, for an unknown category or a level outside 0..4; nothing changes then. */
  wsync_status_t (*set_log)(wsync_log_fn callback, void* user, const char* categories,
                            int32_t level);

  /* Appended to v1 (a library from before them ends the table at set_log): the settings table,
   * from which a host derives its command-line flags, keyword arguments and help (plugin/settings.h
   * is the same table inside the library; `wsync settings` prints it). Session-free: any thread,
   * any time, also before init. Every string they return is the library's, valid while it is
   * loaded.
   *
   * setting_count returns the number of rows (one per setting of wsync_config_t, in its order).
   *
   * setting_info fills `info` (up to info->struct_size) with row `index`. WSYNC_INVALID_ARGUMENT,
   * with last_error(NULL) naming the index and the count, for an index outside
   * [0, setting_count()), and for a NULL info or an info->struct_size too small; `info` is left
   * untouched then.
   *
   * config_set parses `text` with exactly the syntax the setting's variable WSYNC_<NAME> takes
   * and writes the field `name` of `config`: "bool" 1, 0, true, false, yes, no, on, off; "port"
   * 1..65535; "bytes" at least 1; "seconds" finite and positive; "choice" a name or its index;
   * "text" non-empty. A text field gets the pointer `text` itself: the caller keeps it alive
   * until init has returned (init copies it). A value that writes 0 ("off", "false") leaves the
   * field unset, as 0 always is: the setting's variable, when set, still wins at init.
   * WSYNC_INVALID_ARGUMENT, with last_error(NULL) naming the setting, the text and what the
   * setting takes, and `config` unchanged, for a NULL config, name or text, an unknown name, the
   * secret (never text: set secret and secret_length), a field that lies past
   * config->struct_size, or text that does not parse. */
  int32_t (*setting_count)(void);
  wsync_status_t (*setting_info)(int32_t index, wsync_setting_info_t* info);
  wsync_status_t (*config_set)(wsync_config_t* config, const char* name, const char* text);
} wsync_plugin_v1_t;

/* Whether a v1 table of `table_size` bytes (the library's wsyncPlugin_v1 symbol size, above) has
 * entry `entry`, a member name of wsync_plugin_v1_t. */
#define WSYNC_PLUGIN_V1_HAS(table_size, entry) \
  ((size_t)(table_size) >=                     \
   offsetof(wsync_plugin_v1_t, entry) + sizeof(((const wsync_plugin_v1_t*)0)->entry))

#ifdef __cplusplus
}
#endif

#endif /* WSYNC_WSYNC_H_ */
