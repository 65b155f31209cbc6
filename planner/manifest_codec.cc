#include "planner/manifest_codec.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/status.h"

namespace wsync {
namespace {

Dims ToDims(const google::protobuf::RepeatedField<int64_t>& values) {
  return Dims(values.begin(), values.end());
}

void FromDims(const Dims& dims, google::protobuf::RepeatedField<int64_t>* out) {
  out->Reserve(static_cast<int>(dims.size()));
  for (int64_t value : dims) out->Add(value);
}

absl::Status CheckCount(absl::string_view what, int count, int32_t limit) {
  if (count > limit) {
    return absl::InvalidArgumentError(
        absl::StrCat("manifest has ", count, " ", what, ", more than the limit of ", limit));
  }
  return absl::OkStatus();
}

absl::Status CheckAxes(absl::string_view what, int index, int count) {
  if (count > kMaxAxes) {
    return absl::InvalidArgumentError(
        absl::StrCat("manifest ", what, " ", index, " has ", count, " axes, more than ", kMaxAxes));
  }
  return absl::OkStatus();
}

}  // namespace

proto::Manifest ToManifest(const Layout& layout) {
  proto::Manifest manifest;
  manifest.set_schema_version(kManifestSchemaVersion);
  manifest.set_role(layout.role == Role::kTrainer ? proto::ROLE_TRAINER : proto::ROLE_ROLLOUT);
  for (const ProcessInfo& process : layout.processes) {
    proto::Process* out = manifest.add_processes();
    out->set_rank(process.rank);
    out->set_node_id(process.node_id);
    if (process.device != kUnknownDevice) out->set_device(process.device);
  }
  for (const BufferInfo& buffer : layout.buffers) {
    proto::Buffer* out = manifest.add_buffers();
    out->set_process(buffer.process);
    out->set_id(buffer.id);
    out->set_bytes(buffer.bytes);
    out->set_kind(buffer.kind == MemoryKind::kCuda ? proto::MEMORY_KIND_CUDA
                                                   : proto::MEMORY_KIND_HOST);
  }
  for (const ParamInfo& param : layout.params) {
    proto::Parameter* out = manifest.add_parameters();
    out->set_name(param.name);
    out->set_dtype(static_cast<int32_t>(param.dtype));
    FromDims(param.shape, out->mutable_shape());
    if (param.quant.quantized()) {
      out->set_quant_block_rows(param.quant.block_rows);
      out->set_quant_block_cols(param.quant.block_cols);
      out->set_quant_scale_param(param.quant.scale_param);
    }
    out->set_wave(param.wave);
  }
  manifest.mutable_pieces()->Reserve(static_cast<int>(layout.pieces.size()));
  for (const Piece& piece : layout.pieces) {
    proto::Piece* out = manifest.add_pieces();
    out->set_param(piece.param);
    out->set_process(piece.process);
    out->set_buffer(piece.buffer);
    FromDims(piece.box.origin, out->mutable_origin());
    FromDims(piece.box.extent, out->mutable_extent());
    out->set_offset(piece.offset);
    FromDims(piece.strides, out->mutable_strides());
  }
  return manifest;
}

absl::StatusOr<Layout> FromManifest(const proto::Manifest& manifest, const ManifestLimits& limits) {
  if (manifest.schema_version() != kManifestSchemaVersion) {
    return absl::InvalidArgumentError(
        absl::StrCat("manifest schema version ", manifest.schema_version(), " is not supported (",
                     "this build reads ", kManifestSchemaVersion, ")"));
  }
  WSYNC_RETURN_IF_ERROR(CheckCount("processes", manifest.processes_size(), limits.max_processes));
  WSYNC_RETURN_IF_ERROR(CheckCount("buffers", manifest.buffers_size(), limits.max_buffers));
  WSYNC_RETURN_IF_ERROR(
      CheckCount("parameters", manifest.parameters_size(), limits.max_parameters));
  WSYNC_RETURN_IF_ERROR(CheckCount("pieces", manifest.pieces_size(), limits.max_pieces));

  Layout layout;
  switch (manifest.role()) {
    case proto::ROLE_TRAINER:
      layout.role = Role::kTrainer;
      break;
    case proto::ROLE_ROLLOUT:
      layout.role = Role::kRollout;
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("manifest role ", static_cast<int>(manifest.role()), " is not valid"));
  }
  layout.processes.reserve(manifest.processes_size());
  for (const proto::Process& process : manifest.processes()) {
    if (static_cast<int64_t>(process.node_id().size()) > limits.max_name_length) {
      return absl::InvalidArgumentError("manifest node id is longer than the limit");
    }
    if (process.has_device() && (process.device() < 0 || process.device() > kMaxDevice)) {
      return absl::InvalidArgumentError(
          absl::StrCat("manifest device ", process.device(), " is outside [0, ", kMaxDevice, "]"));
    }
    layout.processes.push_back(
        ProcessInfo{process.rank(), process.node_id(),
                    process.has_device() ? process.device() : kUnknownDevice});
  }
  layout.buffers.reserve(manifest.buffers_size());
  for (const proto::Buffer& buffer : manifest.buffers()) {
    MemoryKind kind;
    switch (buffer.kind()) {
      case proto::MEMORY_KIND_HOST:
        kind = MemoryKind::kHost;
        break;
      case proto::MEMORY_KIND_CUDA:
        kind = MemoryKind::kCuda;
        break;
      default:
        return absl::InvalidArgumentError(
            absl::StrCat("manifest buffer ", buffer.id(), " of process ", buffer.process(),
                         " has invalid memory kind ", static_cast<int>(buffer.kind())));
    }
    layout.buffers.push_back(BufferInfo{buffer.process(), buffer.id(), buffer.bytes(), kind});
  }
  layout.params.reserve(manifest.parameters_size());
  for (int i = 0; i < manifest.parameters_size(); ++i) {
    const proto::Parameter& param = manifest.parameters(i);
    if (static_cast<int64_t>(param.name().size()) > limits.max_name_length) {
      return absl::InvalidArgumentError(
          absl::StrCat("manifest parameter ", i, " has a name longer than the limit"));
    }
    WSYNC_RETURN_IF_ERROR(CheckAxes("parameter", i, param.shape_size()));
    if (!IsValidDType(param.dtype())) {
      return absl::InvalidArgumentError(absl::StrCat("manifest parameter '", param.name(),
                                                     "' has invalid dtype ", param.dtype()));
    }
    if (static_cast<int64_t>(param.quant_scale_param().size()) > limits.max_name_length) {
      return absl::InvalidArgumentError(
          absl::StrCat("manifest parameter ", i, " has a scale name longer than the limit"));
    }
    layout.params.push_back(ParamInfo{
        param.name(), static_cast<DType>(param.dtype()), ToDims(param.shape()),
        ParamQuant{param.quant_block_rows(), param.quant_block_cols(), param.quant_scale_param()},
        param.wave()});
  }
  layout.pieces.reserve(manifest.pieces_size());
  for (int i = 0; i < manifest.pieces_size(); ++i) {
    const proto::Piece& piece = manifest.pieces(i);
    WSYNC_RETURN_IF_ERROR(CheckAxes("piece", i, piece.extent_size()));
    if (piece.origin_size() != piece.extent_size() || piece.strides_size() != piece.extent_size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("manifest piece ", i, " has ", piece.origin_size(), " origins, ",
                       piece.extent_size(), " extents and ", piece.strides_size(), " strides"));
    }
    layout.pieces.push_back(Piece{piece.param(), piece.process(), piece.buffer(),
                                  Box{ToDims(piece.origin()), ToDims(piece.extent())},
                                  piece.offset(), ToDims(piece.strides())});
  }
  return layout;
}

std::string SerializeLayout(const Layout& layout) { return ToManifest(layout).SerializeAsString(); }

absl::StatusOr<Layout> ParseLayout(absl::string_view bytes, const ManifestLimits& limits) {
  if (static_cast<int64_t>(bytes.size()) > limits.max_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "manifest of ", bytes.size(), " bytes exceeds the limit of ", limits.max_bytes));
  }
  proto::Manifest manifest;
  if (!manifest.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return absl::InvalidArgumentError("manifest bytes do not parse as wsync.proto.Manifest");
  }
  return FromManifest(manifest, limits);
}

}  // namespace wsync
