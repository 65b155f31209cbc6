// The one export of libwsync_cuda.so (cuda_module.h): its table. The module's version script
// (cuda_module.map) keeps every other symbol local.

#include <new>

#include "device/cuda_module.h"
#include "transport/nccl/nccl_api_real.h"

namespace {

wsync::NcclApi* NewNcclApi() {
  try {
    return wsync::MakeRealNcclApi().release();
  } catch (...) {
    return nullptr;
  }
}

constexpr wsync::WsyncCudaModuleV1 kModule = {
    sizeof(wsync::WsyncCudaModuleV1),
    wsync::kCudaModuleInterface,
    __VERSION__,
    &NewNcclApi,
};

}  // namespace

extern "C" __attribute__((visibility("default"))) const wsync::WsyncCudaModuleV1*
wsyncCudaModule_v1() {
  return &kModule;
}
