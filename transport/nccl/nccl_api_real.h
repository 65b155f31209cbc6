#ifndef WSYNC_TRANSPORT_NCCL_NCCL_API_REAL_H_
#define WSYNC_TRANSPORT_NCCL_NCCL_API_REAL_H_

// The NcclApi over libcudart and libnccl themselves (target wsync::cuda_runtime, which links
// them). Only libwsync_cuda.so (device/cuda_module_entry.cc) and binaries that link CUDA anyway
// (the gpu tests) use it directly; everything else loads it through device/cuda_module.h, so that
// linking wsync does not make a process map the CUDA libraries.

#include <memory>

#include "transport/nccl/nccl_api.h"

namespace wsync {

std::unique_ptr<NcclApi> MakeRealNcclApi();

}  // namespace wsync

#endif  // WSYNC_TRANSPORT_NCCL_NCCL_API_REAL_H_
