#include "integration/host/plugin_host.h"

#include <dlfcn.h>
#include <link.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/dtype.h"
#include "common/status.h"
#include "quant/fp8.h"

namespace wsync::host {

std::string DefaultLibrary() {
  if (const char* env = std::getenv("WSYNC_LIBRARY"); env != nullptr && env[0] != '\0') {
    return env;
  }
  char self[4096] = {};
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  std::string dir = n > 0 ? std::string(self, n) : std::string(".");
  dir = dir.substr(0, dir.rfind('/'));
  return dir + "/../../plugin/libwsync.so";
}

const char* StatusName(wsync_status_t code) {
  switch (code) {
    case WSYNC_OK:
      return "WSYNC_OK";
    case WSYNC_IN_PROGRESS:
      return "WSYNC_IN_PROGRESS";
    case WSYNC_INVALID_ARGUMENT:
      return "WSYNC_INVALID_ARGUMENT";
    case WSYNC_LAYOUT_REFUSED:
      return "WSYNC_LAYOUT_REFUSED";
    case WSYNC_RANKS_DISAGREE:
      return "WSYNC_RANKS_DISAGREE";
    case WSYNC_TIMED_OUT:
      return "WSYNC_TIMED_OUT";
    case WSYNC_PEER_LOST:
      return "WSYNC_PEER_LOST";
    case WSYNC_ABORTED:
      return "WSYNC_ABORTED";
    case WSYNC_NO_MEMORY:
      return "WSYNC_NO_MEMORY";
    case WSYNC_AUTHENTICATION:
      return "WSYNC_AUTHENTICATION";
    case WSYNC_UNSUPPORTED:
      return "WSYNC_UNSUPPORTED";
    case WSYNC_INTERNAL:
      return "WSYNC_INTERNAL";
  }
  return "an unknown status";
}

// The plugin's outcome as a Status: the code's name and last_error (last_error(NULL), the
// thread's, for an init that made no session).
absl::Status PluginStatus(const wsync_plugin_v1_t& plugin, wsync_session_t* session,
                          wsync_status_t code, absl::string_view call) {
  if (code == WSYNC_OK) return absl::OkStatus();
  const char* detail = plugin.last_error(session);
  return absl::UnknownError(absl::StrFormat("%s returned %s: %s", call, StatusName(code),
                                            detail != nullptr ? detail : ""));
}

absl::StatusOr<std::unique_ptr<Plugin>> Plugin::Load(const std::string& path) {
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* error = dlerror();
    return absl::NotFoundError(absl::StrCat("cannot load the plugin: ", error ? error : path,
                                            " (build target wsync_plugin, or give --library "
                                            "or $WSYNC_LIBRARY)"));
  }
  const auto* table = static_cast<const wsync_plugin_v1_t*>(dlsym(handle, "wsyncPlugin_v1"));
  if (table == nullptr) {
    dlclose(handle);
    return absl::NotFoundError(absl::StrCat(path, " exports no wsyncPlugin_v1"));
  }
  if (table->abi_version != WSYNC_ABI_VERSION) {
    dlclose(handle);
    return absl::FailedPreconditionError(
        absl::StrCat(path, " has ABI version ", table->abi_version, ", not ", WSYNC_ABI_VERSION));
  }
  Dl_info info;
  void* symbol = nullptr;  // The table's const ElfW(Sym).
  const size_t table_size =
      dladdr1(table, &info, &symbol, RTLD_DL_SYMENT) != 0 && symbol != nullptr
          ? static_cast<size_t>(static_cast<const ElfW(Sym)*>(symbol)->st_size)
          : 0;
  return std::unique_ptr<Plugin>(new Plugin(table, table_size));  // `handle` stays open.
}

Plugin::~Plugin() {
  if (session_ != nullptr) api_->finalize(session_);
}

absl::Status Plugin::Call(wsync_status_t code, absl::string_view call) const {
  return PluginStatus(*api_, session_, code, call);
}

absl::Status Plugin::Init(const wsync_config_t& config) {
  return Call(api_->init(&config, &session_), "init");
}

absl::Status Plugin::Finalize() {
  wsync_session_t* session = std::exchange(session_, nullptr);
  return PluginStatus(*api_, nullptr, api_->finalize(session), "finalize");
}

namespace {

// declare_fp8_parameter for `param`, quantized, with its scale tensor as `part` names it.
absl::Status DeclareFp8(const Plugin& plugin, const Layout& part, const ParamInfo& param) {
  const ParamQuant& rule = param.quant;
  const ParamInfo* scale = nullptr;
  for (const ParamInfo& candidate : part.params) {
    if (candidate.name == rule.scale_param) scale = &candidate;
  }
  if (scale == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("the scale tensor ", rule.scale_param, " of ", param.name, " is missing"));
  }
  wsync_fp8_parameter_t fp8;
  std::memset(&fp8, 0, sizeof(fp8));
  fp8.struct_size = sizeof(fp8);
  fp8.parameter = param.name.c_str();
  if (rule.block_rows == quant::kWholeAxis && rule.block_cols == quant::kWholeAxis) {
    fp8.scheme = WSYNC_QUANT_FP8_TENSOR;
  } else if (rule.block_rows == 1 && rule.block_cols == quant::kWholeAxis) {
    fp8.scheme = WSYNC_QUANT_FP8_CHANNEL;
  } else {
    fp8.scheme = WSYNC_QUANT_FP8_BLOCK;
    fp8.block_rows = rule.block_rows;
    fp8.block_cols = rule.block_cols;
  }
  const std::vector<int64_t> scale_shape(scale->shape.begin(), scale->shape.end());
  fp8.scale_num_axes = static_cast<int32_t>(scale_shape.size());
  fp8.scale_name = scale->name.c_str();
  fp8.scale_dtype = "fp32";
  fp8.scale_shape = scale_shape.data();
  return plugin.Call(plugin.api().declare_fp8_parameter(plugin.session(), &fp8),
                     absl::StrCat("declare_fp8_parameter(", param.name, ")"));
}

}  // namespace

absl::Status Declare(const Plugin& plugin, const Layout& part, test::HostBuffers& memory) {
  const wsync_plugin_v1_t& api = plugin.api();
  wsync_session_t* session = plugin.session();
  for (const BufferInfo& buffer : part.buffers) {
    WSYNC_RETURN_IF_ERROR(plugin.Call(
        api.register_buffer(session, buffer.id, memory.data({buffer.process, buffer.id}),
                            static_cast<uint64_t>(buffer.bytes), WSYNC_MEMORY_HOST, 0),
        "register_buffer"));
  }
  std::set<std::string> scales;  // Declared by declare_fp8_parameter.
  for (const ParamInfo& param : part.params) {
    if (param.quant.quantized()) scales.insert(param.quant.scale_param);
  }
  for (const ParamInfo& param : part.params) {
    if (scales.count(param.name) > 0) continue;
    const std::string dtype(DTypeName(param.dtype));
    std::vector<int64_t> shape(param.shape.begin(), param.shape.end());
    WSYNC_RETURN_IF_ERROR(
        plugin.Call(api.declare_parameter(session, param.name.c_str(), dtype.c_str(),
                                          static_cast<int32_t>(shape.size()), shape.data()),
                    "declare_parameter"));
    if (param.quant.quantized()) WSYNC_RETURN_IF_ERROR(DeclareFp8(plugin, part, param));
  }
  for (const Piece& piece : part.pieces) {
    std::vector<int64_t> origin(piece.box.origin.begin(), piece.box.origin.end());
    std::vector<int64_t> extent(piece.box.extent.begin(), piece.box.extent.end());
    std::vector<int64_t> strides(piece.strides.begin(), piece.strides.end());
    WSYNC_RETURN_IF_ERROR(
        plugin.Call(api.declare_piece(session, part.params[piece.param].name.c_str(), piece.buffer,
                                      piece.box.rank(), origin.data(), extent.data(), piece.offset,
                                      strides.data()),
                    "declare_piece"));
  }
  return absl::OkStatus();
}

std::string ScheduleReport(const Plugin& plugin) {
  const wsync_plugin_v1_t& api = plugin.api();
  size_t size = 0;
  api.schedule_report(plugin.session(), nullptr, &size);
  std::string report(size, '\0');
  if (size == 0 || api.schedule_report(plugin.session(), report.data(), &size) != WSYNC_OK) {
    return "";
  }
  report.resize(std::strlen(report.c_str()));
  return report;
}

absl::StatusOr<std::map<std::string, int64_t>> PathBytes(const Plugin& plugin, bool sent) {
  const wsync_plugin_v1_t& api = plugin.api();
  size_t size = 0;
  WSYNC_RETURN_IF_ERROR(
      plugin.Call(api.metrics_text(plugin.session(), nullptr, &size), "metrics_text"));
  std::string text(size, '\0');
  WSYNC_RETURN_IF_ERROR(
      plugin.Call(api.metrics_text(plugin.session(), text.data(), &size), "metrics_text"));
  text.resize(std::strlen(text.c_str()));
  const std::string family = sent ? "wsync_bytes_sent_total{" : "wsync_bytes_received_total{";
  constexpr absl::string_view kLabel = "path_class=\"";
  std::map<std::string, int64_t> bytes;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (!absl::StartsWith(line, family)) continue;
    const size_t label = line.find(kLabel);
    const size_t close = line.rfind('}');
    const size_t space = line.rfind(' ');
    double value = 0;
    if (label == absl::string_view::npos || close == absl::string_view::npos || space < close ||
        !absl::SimpleAtod(line.substr(space + 1), &value)) {
      return absl::InternalError(absl::StrCat("metrics_text: cannot read '", line, "'"));
    }
    const size_t start = label + kLabel.size();
    const std::string path(line.substr(start, line.find('"', start) - start));
    bytes[path] += static_cast<int64_t>(value);
  }
  return bytes;
}

absl::StatusOr<std::string> MappedFile(absl::string_view file_name) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    const size_t slash = line.rfind('/');
    if (slash == std::string::npos || absl::string_view(line).substr(slash + 1) != file_name) {
      continue;
    }
    return line.substr(line.find('/'));
  }
  return absl::NotFoundError(absl::StrCat(file_name, " is not mapped into this process"));
}

}  // namespace wsync::host
