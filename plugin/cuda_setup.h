#ifndef WSYNC_PLUGIN_CUDA_SETUP_H_
#define WSYNC_PLUGIN_CUDA_SETUP_H_

// The CUDA part of a session's connect, compiled with or without NCCL (WSYNC_HAVE_NCCL).
//
// A job with CUDA buffers (executor/memory_kinds.h) runs one extra collective at connect (a
// replacement process: at its first sync, see NcclBackendFormedAtFirstSync), right after
// planning, on every process (host-only ones too, so the numbering of collectives stays the same
// everywhere; a job without CUDA buffers runs none), made of two AllGathers. The first carries
// each process's verdict and the identity of its GPU (node and device UUID). The NCCL pairs are
// the pairs of CUDA processes that exchange CUDA memory over a path class routed to NCCL
// (PathTransportSetup::NcclPairs: by default the pairs on different nodes; pairs within a node go
// over CUDA IPC, transport/cuda_ipc); from them and the identities every process computes the same
// communicators (plugin/nccl_communicators.h: one over all their processes, or, where processes
// share a GPU as in colocated jobs, several with no two processes of one GPU in any). The second
// carries the unique ids of the communicators each process roots (the first member of each).
// A verdict is "no" when this process's transport routes were refused (selector), when it holds
// CUDA buffers and the build has no NCCL, when the CUDA module (libwsync_cuda.so, which links
// libcudart and libnccl: device/cuda_module.h) cannot be loaded, or when its device cannot
// be used ("no CUDA device"). Only processes holding CUDA buffers load the module, so a host-only
// process never maps the CUDA libraries. Any "no", a pair of processes on one GPU (Unimplemented:
// NCCL cannot connect them) or a root that cannot make a unique id fails the connect of every
// process, the refusing ones included, with the same error (WSYNC_UNSUPPORTED at the C ABI) naming
// the process and its reason, before a communicator is formed, so nobody waits in
// ncclCommInitRank for a process that gave up. Otherwise each member forms its communicators
// (NcclTransport::Create, in ascending order, bounded by the connect deadline); a member of
// several gets them as one "nccl" backend routing each peer to the communicator of its pair.

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "planner/job.h"
#include "plugin/nccl_communicators.h"
#include "transport/device_memory.h"
#include "transport/transport.h"

namespace wsync {

class NcclApi;
// Makes the NcclApi the session calls (empty: the real one of the CUDA module, loaded on first use:
// device/cuda_module.h); tests pass a fake.
using NcclApiFactory = std::function<std::unique_ptr<NcclApi>()>;

// Whether this build has the NCCL backend.
bool NcclBuilt();

struct CudaConnection {
  std::unique_ptr<DeviceMemory> device;  // When this process holds CUDA buffers.
  std::unique_ptr<Transport> nccl;       // When it is a member of the job's communicator.
};

// Runs the collective described above over `group` (skipped for a job without CUDA buffers) and
// returns what this process needs. `pairs` are the job's NCCL pairs (empty: none); `routes` is
// this process's routing verdict (contributed as "no" when it is an error); `device` the CUDA
// device of its buffers.
absl::StatusOr<CudaConnection> ConnectCuda(const Job& job, const std::vector<NcclPair>& pairs,
                                           int32_t process, int device, const absl::Status& routes,
                                           Group& group, absl::Time deadline,
                                           const NcclApiFactory& factory);

// The CUDA IPC backend of this process (transport/cuda_ipc) over `messenger`, with the factory's
// API (the CUDA module's when empty). Unimplemented in a build without NCCL.
absl::StatusOr<std::unique_ptr<Transport>> MakeCudaIpc(int32_t process, int device,
                                                       std::unique_ptr<Transport> messenger,
                                                       const NcclApiFactory& factory);

// New communicators after a failed sync (NCCL cannot cancel one operation, so a failure aborts
// the communicator): the same collective, every process taking part (the roots contribute new
// unique ids), and the new NCCL backend on each member (nullptr on the others). Every process of
// such a job calls it at the same point: at the start of the sync after one whose commit decision
// failed (the decision is the same everywhere).
absl::StatusOr<std::unique_ptr<Transport>> ReformNccl(const Job& job,
                                                      const std::vector<NcclPair>& pairs,
                                                      int32_t process, int device, Group& group,
                                                      absl::Time deadline,
                                                      const NcclApiFactory& factory);

// A replacement process (admitted for a lost one after the roster) cannot run ConnectCuda's
// collective at connect: the running processes are not in a collective then. It routes its NCCL
// peers to this stand-in instead (named "nccl"; carries no memory kind: Unimplemented; every
// send and receive fails with FailedPrecondition) and runs ConnectCuda at the start of its first
// sync, where every running process, having taken the roster that admitted it, calls ReformNccl
// (the same collective, at the same point); the communicator formed there replaces the stand-in.
std::unique_ptr<Transport> NcclBackendFormedAtFirstSync(int32_t process);

}  // namespace wsync

#endif  // WSYNC_PLUGIN_CUDA_SETUP_H_
