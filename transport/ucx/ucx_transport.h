#ifndef WSYNC_TRANSPORT_UCX_UCX_TRANSPORT_H_
#define WSYNC_TRANSPORT_UCX_UCX_TRANSPORT_H_

// A Transport over UCX's UCP tag API for host memory: one UCP context and one worker per process,
// one endpoint per peer created from the peer's worker address (exchanged by the control plane),
// ucp_tag_send_nbx / ucp_tag_recv_nbx with the caller's MessageTag under a full tag mask.
//
// Tags: UCP tag receives match any endpoint of the worker, so the sender's id travels in the
// low 16 bits of the tag (MakeTag in transport.h puts it there). The wire tag is the caller's tag
// with those bits set to the sender's id; a tag whose low 16 bits are neither zero nor the
// sender's id is refused (InvalidArgument), since it would silently match another sender. A job
// therefore has at most 65536 processes.
//
// Threads: every call except Abort is made by one thread at a time (the driving thread), which
// also drives UCX progress inside Test and WaitAll. The worker runs in UCS_THREAD_MODE_SERIALIZED
// and every use of it holds one internal mutex. Abort may come from any thread: it records the
// reason, wakes a WaitAll blocked on the worker's event fd with ucp_worker_signal (documented as
// safe from any thread), then takes the mutex and performs the abort itself unless the driving
// thread already did. So Abort returns once outstanding requests are finished; it blocks for at
// most about twice `drain_timeout` (a WaitAll already cancelling, then the abort's own drain).
// Abort must not race with the destructor.
//
// Failures: endpoints use UCP_ERR_HANDLING_MODE_PEER where the selected transports support it
// (tcp, verbs). When UCX reports a peer failed, its endpoint is closed, this process's
// outstanding requests with the peer fail with Unavailable naming it, and so does every later
// post with it until ConnectPeers connects it again (no automatic reconnect: in UCX 1.13 a new tcp
// endpoint to a peer whose old connection is still failing can hit an internal assertion).
// PeerLost (any thread: the control plane saw the peer die) has the same effect over any
// transport, shared memory included. UCX 1.13's shared-memory transports (posix, sysv, cma, self)
// have no peer failure handler, so with ErrorHandling::kAuto endpoints over them use
// UCP_ERR_HANDLING_MODE_NONE, where a dead peer mostly shows as a deadline. Every endpoint, in
// either mode, carries UCX's error callback: without one UCX 1.13 aborts this process when a
// transport operation with the peer fails (a CMA copy from or to a process that has exited);
// with one such a copy fails its request with UCX's error instead. A peer whose worker is
// destroyed is detected over tcp at once; one that only aborted (its worker still alive) shows as
// a deadline. A peer whose process has exited (its pid, published after UCX's bytes in
// WorkerAddress, is gone in this pid namespace) is failed the same way before progress runs,
// checked at most every 250 ms, naming it ("has exited").
//
// Cancelling: a receive that misses its deadline is cancelled with ucp_request_cancel (a receive
// already matched is waited for, up to drain_timeout). UCX cannot cancel a single send: a send that
// misses its deadline force-closes the endpoint to its peer (other sends on it fail with
// Cancelled) and the next send creates a new endpoint. Over tcp the peer sees that close as a
// failure of this process and needs ConnectPeers to talk to it again; deadlines are expected to
// end a sync, after which the control plane reconnects.
//
// Memory: a request's memory is not touched once WaitAll, Test or Abort returned it, with two UCX
// limits, both about reads of send memory: (1) a rendezvous send whose request-to-send already
// reached the peer may still be read by the peer (CMA get) if the peer posts a matching receive
// later; (2) a send on an endpoint without error handling (shared memory) cannot be cancelled at
// all: it is released to UCX with an error saying so. Receive memory is never written after its
// request was released, unless UCX does not finish a matched receive within drain_timeout (then
// the error says so). A request released unfinished keeps its registration pinned
// (DeregisterMemory refuses it) until destruction.
//
// Sizes: a receive matched by a longer message fails with UCS_ERR_MESSAGE_TRUNCATED, a shorter
// one with the received length; both are InvalidArgument naming both sizes. UCX does not tell the
// sender, whose request succeeds: only the receiver reports the mismatch.
//
// UCX 1.13 quirks handled here: recv_info is not filled on immediate completion (openucx/ucx#9425),
// so receives use UCP_OP_ATTR_FLAG_NO_IMM_CMPL and get their length in the callback; a callback
// may run inside the post itself.

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "transport/transport.h"

namespace wsync {

struct UcxOptions {
  // How endpoints learn of peer failures.
  enum class ErrorHandling : uint8_t {
    // UCP_ERR_HANDLING_MODE_PEER, or MODE_NONE when the transport list names only shared-memory
    // and self transports or when UCX finds no transport with a peer failure handler.
    kAuto,
    kPeer,  // Always MODE_PEER: a peer reachable only over shared memory is unreachable.
    kNone,  // Always MODE_NONE. Unsafe with Abort over network transports (forced closes).
  };

  // Global id of this process, in [0, 65536).
  int32_t process = 0;
  // UCX_TLS, e.g. "sm,cma,self" within a node or "tcp" between nodes; empty: UCX's default (the
  // UCX_TLS environment variable, or all). Applied with ucp_config_modify, never via setenv.
  std::string transports;
  // UCX_NET_DEVICES, e.g. "lo" or "eth0,mlx5_0:1"; empty: UCX's default.
  std::string net_devices;
  // Further UCP settings by name without the "UCX_" prefix, e.g. {"RNDV_THRESH", "64k"}. They
  // override UcxDefaultSettings() and the environment.
  std::vector<std::pair<std::string, std::string>> config;
  ErrorHandling error_handling = ErrorHandling::kAuto;
  // How long a cancel, abort, endpoint close or the destructor waits for UCX to finish requests
  // before releasing them to UCX unfinished. Bounds every internal wait.
  absl::Duration drain_timeout = absl::Seconds(2);
  // WaitAll busy-polls this long after the last event before sleeping on the worker's event fd.
  absl::Duration idle_spin = absl::Microseconds(50);
  // Longest single sleep of WaitAll; bounds the reaction to events UCX does not signal.
  absl::Duration max_sleep = absl::Milliseconds(1);
};

// A UCX setting wsync applies unless the environment sets it or UcxOptions::config names it.
struct UcxDefaultSetting {
  // For ucp_config_modify. UCX 1.13 matches a transport's setting without its transport's
  // prefix ("RX_SEG_SIZE" for UCX_TCP_RX_SEG_SIZE), in every transport that has one.
  std::string name;
  std::string environment;  // The variable that sets it, e.g. "UCX_TCP_RX_SEG_SIZE".
  std::string value;
  // The UCX transport it tunes ("tcp"): applied only when the transport list may select it, since
  // UCX warns of a setting that no selected transport has ("invalid configuration").
  std::string transport;
};

// Whether UCX may select `transport` ("tcp") under `tls`, a UCX_TLS list: empty or naming "all"
// selects every transport, "^a,b" every one but those listed, otherwise only those listed.
bool UcxTlsMaySelect(absl::string_view tls, absl::string_view transport);

// wsync's tuning of UCX 1.13's defaults (today a larger TCP receive segment). Benchmarks give
// ucx_perftest the same settings (through the environment), for a like-for-like limit.
std::vector<UcxDefaultSetting> UcxDefaultSettings();

class UcxTransport : public Transport {
 public:
  // Creates the UCP context (tag and wakeup features) and worker. Errors: InvalidArgument for a
  // bad option, Unavailable when UCX cannot start with the requested transports.
  static absl::StatusOr<std::unique_ptr<UcxTransport>> Create(const UcxOptions& options);

  // Cancels outstanding requests, closes endpoints, unmaps registered memory and destroys the
  // worker and context. Every wait is bounded by drain_timeout.
  ~UcxTransport() override = default;

  // The bytes of this worker's UCP address, to be exchanged with every peer.
  virtual std::string WorkerAddress() const = 0;

  // Creates an endpoint to every process with a non-empty address in `addresses_by_process`
  // (indexed by process id; this process's own entry, if empty, is replaced by its own address so
  // self-sends work). Addresses must come from WorkerAddress() of authenticated peers: UCX parses
  // them without bounds checks. May be called again: a changed address closes the old endpoint
  // (its requests fail) and connects the new one; PeerLost reports made before the call apply to
  // the endpoints it replaces, never to the new ones (a replacement of a lost process starts
  // clean). Errors: InvalidArgument for a bad table,
  // Unavailable when UCX cannot reach a peer (naming it), Aborted after Abort.
  virtual absl::Status ConnectPeers(const std::vector<std::string>& addresses_by_process) = 0;

  // Whether this context can carry CUDA memory: UCX lists CUDA among the memory types it reports
  // (ucp_context_query, UCP_ATTR_FIELD_MEMORY_TYPES), i.e. it was built with CUDA support and
  // found the CUDA libraries. Debian's UCX 1.13 is built without it. When false, RegisterMemory
  // refuses CUDA memory (Unimplemented) and every message is host memory; when true, CUDA
  // registrations are mapped as CUDA memory and messages in them are posted as such.
  virtual bool CarriesCudaMemory() const = 0;

  // The memory types this context reports, e.g. "host" or "host, cuda, cuda-managed" (for
  // refusals and logs).
  virtual std::string MemoryTypes() const = 0;

  // Human-readable description of the endpoint to `peer` (error handling mode and UCX's lanes,
  // i.e. the transports it selected), or an empty string without an endpoint.
  virtual std::string EndpointInfo(int32_t peer) = 0;
};

}  // namespace wsync

#endif  // WSYNC_TRANSPORT_UCX_UCX_TRANSPORT_H_
