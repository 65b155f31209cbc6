#include "device/cuda_module.h"

#include <dlfcn.h>
#include <stdlib.h>

#include <cstring>

#include "absl/base/thread_annotations.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"

namespace wsync {
namespace {

absl::Mutex module_mutex(absl::kConstInit);
const WsyncCudaModuleV1* loaded_module ABSL_GUARDED_BY(module_mutex) = nullptr;

// The directory of the binary this code is in ("" when the loader does not say).
std::string ThisBinaryDirectory() {
  Dl_info info;
  if (dladdr(reinterpret_cast<const void*>(&CudaModuleCandidates), &info) == 0 ||
      info.dli_fname == nullptr) {
    return "";
  }
  const absl::string_view file = info.dli_fname;
  const size_t slash = file.rfind('/');
  return slash == absl::string_view::npos ? "" : std::string(file.substr(0, slash));
}

// dlerror() after a failed call, prefixed with `path` unless it names it already.
std::string LoaderError(const std::string& path) {
  const char* error = dlerror();
  const std::string text = error != nullptr ? error : "unknown dynamic loader error";
  return absl::StartsWith(text, path) ? text : absl::StrCat(path, ": ", text);
}

// Opens the module at `path` and checks its table; the error text names `path`.
absl::StatusOr<const WsyncCudaModuleV1*> OpenModule(const std::string& path) {
  dlerror();
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) return absl::UnimplementedError(LoaderError(path));
  const auto entry = reinterpret_cast<WsyncCudaModuleEntryV1>(dlsym(handle, kCudaModuleEntry));
  if (entry == nullptr) {
    const std::string error = LoaderError(path);
    dlclose(handle);
    return absl::UnimplementedError(error);
  }
  const WsyncCudaModuleV1* table = entry();
  if (table == nullptr || table->struct_size < sizeof(WsyncCudaModuleV1) ||
      table->interface != kCudaModuleInterface || table->compiler == nullptr ||
      std::strcmp(table->compiler, __VERSION__) != 0) {
    const std::string error = absl::StrCat(
        path, ": a module of another wsync build (interface ",
        table == nullptr ? -1 : table->interface, ", compiler ",
        table == nullptr || table->compiler == nullptr ? "?" : table->compiler,
        "; this build: interface ", kCudaModuleInterface, ", compiler ", __VERSION__, ")");
    dlclose(handle);
    return absl::UnimplementedError(error);
  }
  return table;  // The handle stays open for the life of the process.
}

absl::StatusOr<const WsyncCudaModuleV1*> Module() {
  absl::MutexLock lock(&module_mutex);
  if (loaded_module != nullptr) return loaded_module;
  const char* configured = getenv(kCudaModuleEnv);
  const bool from_environment = configured != nullptr && configured[0] != '\0';
  std::vector<std::string> errors;
  for (const std::string& path : CudaModuleCandidates()) {
    absl::StatusOr<const WsyncCudaModuleV1*> module = OpenModule(path);
    if (module.ok()) {
      loaded_module = *module;
      return loaded_module;
    }
    errors.emplace_back(module.status().message());
  }
  return absl::UnimplementedError(
      absl::StrCat("cannot load the CUDA module ", kCudaModuleFileName,
                   from_environment ? absl::StrCat(" (", kCudaModuleEnv, ")") : std::string(),
                   ", which CUDA buffers need: ", absl::StrJoin(errors, "; ")));
}

}  // namespace

std::vector<std::string> CudaModuleCandidates() {
  const char* configured = getenv(kCudaModuleEnv);
  if (configured != nullptr && configured[0] != '\0') return {configured};
  std::vector<std::string> paths;
  if (const std::string directory = ThisBinaryDirectory(); !directory.empty()) {
    paths.push_back(absl::StrCat(directory, "/", kCudaModuleFileName));
  }
#ifdef WSYNC_CUDA_MODULE_BUILD_PATH
  if (paths.empty() || paths.front() != WSYNC_CUDA_MODULE_BUILD_PATH) {
    paths.push_back(WSYNC_CUDA_MODULE_BUILD_PATH);
  }
#endif
  return paths;
}

absl::StatusOr<std::unique_ptr<NcclApi>> LoadRealNcclApi() {
  absl::StatusOr<const WsyncCudaModuleV1*> module = Module();
  if (!module.ok()) return module.status();
  std::unique_ptr<NcclApi> api((*module)->new_nccl_api());
  if (api == nullptr) return absl::ResourceExhaustedError("the CUDA module has no memory");
  return api;
}

}  // namespace wsync
