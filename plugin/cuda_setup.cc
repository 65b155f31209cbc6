#include "plugin/cuda_setup.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "executor/memory_kinds.h"

#if WSYNC_HAVE_NCCL
#include "transport/cuda_ipc/cuda_ipc_transport.h"
#include "transport/nccl/cuda_device_memory.h"
#include "transport/nccl/cuda_module.h"
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

// A new unique id when this process is the communicator's root ("" otherwise).
absl::StatusOr<std::string> UniqueIdIfRoot(const std::vector<int32_t>& members, int32_t process,
                                           const NcclApiFactory& factory) {
  if (members.empty() || members.front() != process) return std::string();
#if WSYNC_HAVE_NCCL
  WSYNC_ASSIGN_OR_RETURN(std::unique_ptr<NcclApi> api, MakeApi(factory));
  WSYNC_ASSIGN_OR_RETURN(NcclUniqueId id, NcclTransport::NewUniqueId(*api));
  return id.ToBytes();
#else
  return absl::UnimplementedError("this build has no NCCL");
#endif
}

// The collective of the header comment: contributes `verdict` (with `unique_id` when OK), fails
// with the first "no", then forms the communicator on its members (nullptr for the others).
absl::StatusOr<std::unique_ptr<Transport>> ExchangeAndForm(const std::vector<int32_t>& members,
                                                           int32_t process, int device,
                                                           const absl::Status& verdict,
                                                           const std::string& unique_id,
                                                           Group& group, absl::Time deadline,
                                                           const NcclApiFactory& factory) {
  const std::string mine =
      verdict.ok() ? absl::StrCat(kYes, unique_id) : absl::StrCat(kNo, verdict.message());
  WSYNC_ASSIGN_OR_RETURN(std::vector<std::string> all, group.AllGather(mine, deadline));
  // A refusing process fails like the others: its own "no" is in `all`.
  for (int32_t p = 0; p < static_cast<int32_t>(all.size()); ++p) {
    if (absl::StartsWith(all[p], kNo)) {
      return absl::UnimplementedError(absl::StrCat(
          "process ", p, " cannot move the job's CUDA memory: ", all[p].substr(kNo.size())));
    }
  }
  if (!verdict.ok()) return verdict;  // Not reached: `all` holds this process's "no".
  if (std::find(members.begin(), members.end(), process) == members.end()) {
    return std::unique_ptr<Transport>();
  }
#if WSYNC_HAVE_NCCL
  WSYNC_ASSIGN_OR_RETURN(NcclUniqueId id,
                         NcclUniqueId::FromBytes(all[members.front()].substr(kYes.size())));
  NcclOptions options;
  options.process = process;
  options.members = members;
  options.unique_id = id;
  options.device = device;
  options.connect_deadline = deadline;
  WSYNC_ASSIGN_OR_RETURN(std::unique_ptr<NcclApi> api, MakeApi(factory));
  WSYNC_ASSIGN_OR_RETURN(std::unique_ptr<NcclTransport> nccl,
                         NcclTransport::Create(options, std::move(api)));
  return std::unique_ptr<Transport>(std::move(nccl));
#else
  return absl::UnimplementedError("this build has no NCCL");
#endif
}

}  // namespace

absl::StatusOr<CudaConnection> ConnectCuda(const Job& job, const std::vector<int32_t>& members,
                                           int32_t process, int device, const absl::Status& routes,
                                           Group& group, absl::Time deadline,
                                           const NcclApiFactory& factory) {
  CudaConnection connection;
  const JobMemoryKinds kinds(job);
  if (!kinds.any_cuda()) return connection;
  absl::Status verdict = routes;
  std::string unique_id;
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
      absl::StatusOr<std::string> id = UniqueIdIfRoot(members, process, factory);
      if (id.ok()) {
        unique_id = *id;
      } else {
        verdict = id.status();
      }
    }
#else
    verdict = absl::UnimplementedError(
        "this process holds CUDA buffers but libwsync was built without NCCL "
        "(WSYNC_WITH_NCCL=OFF, or CUDA/NCCL not found at configure time)");
#endif
  }
  WSYNC_ASSIGN_OR_RETURN(connection.nccl, ExchangeAndForm(members, process, device, verdict,
                                                          unique_id, group, deadline, factory));
  return connection;
}

absl::StatusOr<std::unique_ptr<Transport>> ReformNccl(const std::vector<int32_t>& members,
                                                      int32_t process, int device, Group& group,
                                                      absl::Time deadline,
                                                      const NcclApiFactory& factory) {
  absl::StatusOr<std::string> id = UniqueIdIfRoot(members, process, factory);
  return ExchangeAndForm(members, process, device, id.status(), id.ok() ? *id : "", group, deadline,
                         factory);
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
