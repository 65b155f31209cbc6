#include "plugin/cuda_setup.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "executor/memory_kinds.h"
#include "plugin/nccl_communicators.h"
#include "transport/selector/selector.h"

#if WSYNC_HAVE_NCCL
#include "device/cuda_device_memory.h"
#include "device/cuda_module.h"
#include "transport/cuda_ipc/cuda_ipc_transport.h"
#include "transport/nccl/nccl_transport.h"
#endif

namespace wsync {
namespace {

constexpr absl::string_view kYes = "ok:";
constexpr absl::string_view kNo = "no:";

#if WSYNC_HAVE_NCCL
// The factory's API, or the real one from the CUDA module (loaded on first use: Unimplemented
// naming the module when it cannot be).
absl::StatusOr<std::unique_ptr<NcclApi>> MakeApi(const NcclApiFactory& factory) {
  if (factory) return factory();
  return LoadRealNcclApi();
}
#endif

}  // namespace

bool NcclBuilt() {
#if WSYNC_HAVE_NCCL
  return true;
#else
  return false;
#endif
}

namespace {

// Fails with the first "no" of a gathered collective (every process, the refusing ones included,
// returns the same error); `what` says what the refusing process could not do.
absl::Status FirstRefusal(const std::vector<std::string>& all, absl::string_view what) {
  for (int32_t p = 0; p < static_cast<int32_t>(all.size()); ++p) {
    if (absl::StartsWith(all[p], kNo)) {
      return absl::UnimplementedError(
          absl::StrCat("process ", p, " ", what, ": ", all[p].substr(kNo.size())));
    }
  }
  return absl::OkStatus();
}

// The identity of this process's GPU for PlanNcclCommunicators: its node and the device's UUID;
// "" for a process in no NCCL pair (PlanNcclCommunicators reads no other identity), which then
// queries no device.
absl::StatusOr<std::string> GpuIdentity(const Job& job, const std::vector<NcclPair>& pairs,
                                        int32_t process, int device,
                                        const NcclApiFactory& factory) {
  if (std::none_of(pairs.begin(), pairs.end(), [process](const NcclPair& pair) {
        return pair.first == process || pair.second == process;
      })) {
    return std::string();
  }
#if WSYNC_HAVE_NCCL
  WSYNC_ASSIGN_OR_RETURN(std::unique_ptr<NcclApi> api, MakeApi(factory));
  WSYNC_ASSIGN_OR_RETURN(std::string uuid, api->DeviceUuid(device));
  return absl::StrCat("node ", job.processes()[process].node_id, ", GPU ",
                      absl::BytesToHexString(uuid));
#else
  return absl::UnimplementedError("this build has no NCCL");
#endif
}

// The collective of the header comment, in two AllGathers: each process's verdict with its GPU
// identity (any "no" fails everyone), then, once every process planned the same communicators,
// the unique ids of the communicators each process roots (a root that cannot make one fails
// everyone). Then every member forms its communicators in ascending order (so two processes
// sharing two communicators wait for each other in the same one), nullptr for a process in none.
absl::StatusOr<std::unique_ptr<Transport>> ExchangeAndForm(
    const Job& job, const std::vector<NcclPair>& pairs, int32_t process, int device,
    const absl::Status& verdict, const std::string& gpu_identity, Group& group, absl::Time deadline,
    const NcclApiFactory& factory) {
  const std::string mine =
      verdict.ok() ? absl::StrCat(kYes, gpu_identity) : absl::StrCat(kNo, verdict.message());
  WSYNC_ASSIGN_OR_RETURN(std::vector<std::string> all, group.AllGather(mine, deadline));
  WSYNC_RETURN_IF_ERROR(FirstRefusal(all, "cannot move the job's CUDA memory"));
  WSYNC_RETURN_IF_ERROR(verdict);  // Not reached: `all` holds this process's "no".
  std::vector<std::string> gpu_of(all.size());
  for (size_t p = 0; p < all.size(); ++p) gpu_of[p] = all[p].substr(kYes.size());
  WSYNC_ASSIGN_OR_RETURN(const NcclCommunicators communicators,
                         PlanNcclCommunicators(pairs, gpu_of));
  if (communicators.members.empty()) return std::unique_ptr<Transport>();
  std::string rooted_ids;
  absl::Status made;
#if WSYNC_HAVE_NCCL
  for (const std::vector<int32_t>& members : communicators.members) {
    if (members.front() != process || !made.ok()) continue;
    absl::StatusOr<std::unique_ptr<NcclApi>> api = MakeApi(factory);
    absl::StatusOr<NcclUniqueId> id =
        api.ok() ? NcclTransport::NewUniqueId(**api) : absl::StatusOr<NcclUniqueId>(api.status());
    if (id.ok()) {
      absl::StrAppend(&rooted_ids, id->ToBytes());
    } else {
      made = id.status();
    }
  }
#else
  made = absl::UnimplementedError("this build has no NCCL");
#endif
  WSYNC_ASSIGN_OR_RETURN(std::vector<std::string> ids,
                         group.AllGather(made.ok() ? absl::StrCat(kYes, rooted_ids)
                                                   : absl::StrCat(kNo, made.message()),
                                         deadline));
  WSYNC_RETURN_IF_ERROR(FirstRefusal(ids, "cannot make an NCCL unique id"));
#if WSYNC_HAVE_NCCL
  std::vector<std::unique_ptr<Transport>> formed;
  std::vector<int32_t> route(job.num_processes(), 0);
  std::vector<int32_t> local_index(communicators.members.size(), -1);
  for (size_t c = 0; c < communicators.members.size(); ++c) {
    const std::vector<int32_t>& members = communicators.members[c];
    if (std::find(members.begin(), members.end(), process) == members.end()) continue;
    const int32_t root = members.front();
    size_t rank_among_rooted = 0;
    for (size_t earlier = 0; earlier < c; ++earlier) {
      rank_among_rooted += communicators.members[earlier].front() == root ? 1 : 0;
    }
    const std::string& root_ids = ids[root];
    const size_t at = kYes.size() + rank_among_rooted * sizeof(NcclUniqueId::bytes);
    if (root_ids.size() < at + sizeof(NcclUniqueId::bytes)) {
      return absl::InternalError(absl::StrCat("process ", root, " sent ", root_ids.size(),
                                              " bytes of NCCL unique ids, too few"));
    }
    WSYNC_ASSIGN_OR_RETURN(
        NcclUniqueId id, NcclUniqueId::FromBytes(root_ids.substr(at, sizeof(NcclUniqueId::bytes))));
    NcclOptions options;
    options.process = process;
    options.members = members;
    options.unique_id = id;
    options.device = device;
    options.connect_deadline = deadline;
    WSYNC_ASSIGN_OR_RETURN(std::unique_ptr<NcclApi> api, MakeApi(factory));
    WSYNC_ASSIGN_OR_RETURN(std::unique_ptr<NcclTransport> nccl,
                           NcclTransport::Create(options, std::move(api)));
    local_index[c] = static_cast<int32_t>(formed.size());
    formed.push_back(std::move(nccl));
  }
  if (formed.empty()) return std::unique_ptr<Transport>();
  if (formed.size() == 1) return std::move(formed.front());
  for (size_t i = 0; i < pairs.size(); ++i) {
    const auto [a, b] = pairs[i];
    if (a == process || b == process) {
      route[a == process ? b : a] = local_index[communicators.of_pair[i]];
    }
  }
  WSYNC_ASSIGN_OR_RETURN(
      std::unique_ptr<RoutedTransport> several,
      RoutedTransport::Create(process, std::move(formed), std::move(route), "nccl"));
  return std::unique_ptr<Transport>(std::move(several));
#else
  return absl::UnimplementedError("this build has no NCCL");
#endif
}

}  // namespace

absl::StatusOr<CudaConnection> ConnectCuda(const Job& job, const std::vector<NcclPair>& pairs,
                                           int32_t process, int device, const absl::Status& routes,
                                           Group& group, absl::Time deadline,
                                           const NcclApiFactory& factory) {
  CudaConnection connection;
  const JobMemoryKinds kinds(job);
  if (!kinds.any_cuda()) return connection;
  absl::Status verdict = routes;
  std::string gpu_identity;
  if (verdict.ok() && kinds.Process(process) == MemoryKind::kCuda) {
#if WSYNC_HAVE_NCCL
    absl::StatusOr<std::unique_ptr<NcclApi>> api = MakeApi(factory);
    absl::StatusOr<std::unique_ptr<CudaDeviceMemory>> memory =
        api.ok() ? CudaDeviceMemory::Create(std::move(*api), device)
                 : absl::StatusOr<std::unique_ptr<CudaDeviceMemory>>(api.status());
    if (memory.ok()) {
      connection.device = std::move(*memory);
    } else {
      verdict = memory.status();
    }
    if (verdict.ok()) {
      absl::StatusOr<std::string> identity = GpuIdentity(job, pairs, process, device, factory);
      if (identity.ok()) {
        gpu_identity = *identity;
      } else {
        verdict = identity.status();
      }
    }
#else
    verdict = absl::UnimplementedError(
        "this process holds CUDA buffers but libwsync was built without NCCL "
        "(WSYNC_WITH_NCCL=OFF, or CUDA/NCCL not found at configure time)");
#endif
  }
  WSYNC_ASSIGN_OR_RETURN(connection.nccl, ExchangeAndForm(job, pairs, process, device, verdict,
                                                          gpu_identity, group, deadline, factory));
  return connection;
}

absl::StatusOr<std::unique_ptr<Transport>> ReformNccl(const Job& job,
                                                      const std::vector<NcclPair>& pairs,
                                                      int32_t process, int device, Group& group,
                                                      absl::Time deadline,
                                                      const NcclApiFactory& factory) {
  absl::StatusOr<std::string> identity = GpuIdentity(job, pairs, process, device, factory);
  return ExchangeAndForm(job, pairs, process, device, identity.status(),
                         identity.ok() ? *identity : "", group, deadline, factory);
}

absl::StatusOr<std::unique_ptr<Transport>> MakeCudaIpc(int32_t process, int device,
                                                       std::unique_ptr<Transport> messenger,
                                                       const NcclApiFactory& factory) {
#if WSYNC_HAVE_NCCL
  WSYNC_ASSIGN_OR_RETURN(std::unique_ptr<NcclApi> api, MakeApi(factory));
  CudaIpcOptions options;
  options.process = process;
  options.device = device;
  WSYNC_ASSIGN_OR_RETURN(std::unique_ptr<CudaIpcTransport> cuda_ipc,
                         CudaIpcTransport::Create(options, std::move(api), std::move(messenger)));
  return std::unique_ptr<Transport>(std::move(cuda_ipc));
#else
  return absl::UnimplementedError("this build has no CUDA IPC backend (no CUDA/NCCL at configure)");
#endif
}

namespace {

class NcclStandIn final : public Transport {
 public:
  explicit NcclStandIn(int32_t process) : process_(process) {}
  int32_t process() const override { return process_; }
  std::string name() const override { return "nccl"; }
  absl::StatusOr<RegistrationId> RegisterMemory(void*, int64_t, MemoryKind) override {
    return absl::UnimplementedError("the NCCL communicator is not formed yet");
  }
  absl::Status DeregisterMemory(RegistrationId) override { return absl::OkStatus(); }
  absl::StatusOr<RequestId> PostSend(int32_t, MessageTag, const void*, int64_t) override {
    return NotFormed();
  }
  absl::StatusOr<RequestId> PostReceive(int32_t, MessageTag, void*, int64_t) override {
    return NotFormed();
  }
  absl::StatusOr<bool> Test(RequestId) override { return NotFormed(); }
  absl::Status WaitAll(absl::Span<const RequestId> requests, absl::Time) override {
    return requests.empty() ? absl::OkStatus() : NotFormed();
  }
  void Abort(const absl::Status&) override {}

 private:
  absl::Status NotFormed() const {
    return absl::FailedPreconditionError(absl::StrCat(
        "process ", process_, " has no NCCL communicator before its first sync forms it"));
  }
  int32_t process_;
};

}  // namespace

std::unique_ptr<Transport> NcclBackendFormedAtFirstSync(int32_t process) {
  return std::make_unique<NcclStandIn>(process);
}

}  // namespace wsync
