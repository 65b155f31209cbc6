#ifndef WSYNC_DEVICE_CUDA_MODULE_H_
#define WSYNC_DEVICE_CUDA_MODULE_H_

// libwsync_cuda.so, the CUDA module: the real NcclApi (transport/nccl/nccl_api_real.h) and the
// copy kernel, and the only wsync binary with libcudart and libnccl as DT_NEEDED. The rest of
// wsync (libwsync.so, the wsync CLI) loads it with dlopen when a process first needs CUDA (at
// connect, in a process holding CUDA buffers: plugin/cuda_setup.h), so a host-only process never
// maps the CUDA libraries, and a host without them can load libwsync.so.
//
// The boundary: the module exports one C symbol, `wsyncCudaModule_v1`, a function returning a
// WsyncCudaModuleV1 table that hands out NcclApi objects. Both sides compile nccl_api.h with the
// same compiler and share the shared libraries of Abseil and the C++ runtime, so NcclApi's virtual
// calls and the absl::Status values they return cross unchanged; the table's `interface` and
// `compiler` fields refuse a module of another build. Each side keeps hidden copies of the static
// wsync code it links; nothing else crosses (no globals, no RTTI, no exceptions).
//
// Where the module is looked up, in order: the path in $WSYNC_CUDA_MODULE alone when it is set and
// not empty; otherwise libwsync_cuda.so in the directory of the binary that contains this code
// (libwsync.so, or an executable that links wsync statically), then the module where this build
// tree put it (next to the build's libwsync.so, for the build tree's executables).

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "transport/nccl/nccl_api.h"

namespace wsync {

inline constexpr char kCudaModuleEnv[] = "WSYNC_CUDA_MODULE";
inline constexpr char kCudaModuleFileName[] = "libwsync_cuda.so";
inline constexpr char kCudaModuleEntry[] = "wsyncCudaModule_v1";
// Changes whenever NcclApi or WsyncCudaModuleV1 changes (3: the FP8 quantization kernels).
inline constexpr int32_t kCudaModuleInterface = 3;

struct WsyncCudaModuleV1 {
  uint32_t struct_size;  // sizeof(WsyncCudaModuleV1) in the module's build.
  int32_t interface;     // kCudaModuleInterface of the module's build.
  const char* compiler;  // __VERSION__ of the compiler that built the module.
  // A new NcclApi over libcudart and libnccl, owned by the caller (delete it through NcclApi's
  // virtual destructor); nullptr when out of memory. Never throws.
  NcclApi* (*new_nccl_api)();
};

// The type of `wsyncCudaModule_v1`: returns the module's table (static data, never nullptr).
using WsyncCudaModuleEntryV1 = const WsyncCudaModuleV1* (*)();

// The paths LoadRealNcclApi tries, in the order of the header comment.
std::vector<std::string> CudaModuleCandidates();

// A new real NcclApi from the module. The first call that succeeds loads the module; it then stays
// loaded for the life of the process (the CUDA libraries cannot be unloaded safely) and later
// calls reuse it; a failed load is retried by the next call. Thread-safe.
// Unimplemented "cannot load the CUDA module ...: <path>: <dlerror>" naming every path tried when
// none loads (no such file, libcudart or libnccl not found by the dynamic loader, no entry point,
// or a module of another build); ResourceExhausted when the module has no memory for the object.
absl::StatusOr<std::unique_ptr<NcclApi>> LoadRealNcclApi();

}  // namespace wsync

#endif  // WSYNC_DEVICE_CUDA_MODULE_H_
