#ifndef WSYNC_PLUGIN_LOCAL_LAYOUT_H_
#define WSYNC_PLUGIN_LOCAL_LAYOUT_H_

// The layout of one process as its host declares it before connect: registered buffers (with
// their addresses), declared parameters and FP8 parameters, pieces, or a whole manifest or named
// layout cut to this rank; the parameters' waves; the buffers' addresses as rebinds move them.
// The session (session.h) owns one and forwards its layout calls to it after checking its state;
// what the builder holds becomes the runtime's `part`, `buffer_addresses`, `cuda_device` and
// `node_id` at connect (RuntimeConfig, runtime.h).
//
// Validation: each call refuses with InvalidArgument, naming the buffer or parameter, what it can
// tell on its own: a buffer registered twice or without an address, a CUDA buffer without a
// device or on a device other than the process's earlier CUDA buffers, an unknown memory kind; a
// parameter declared twice; a piece of an undeclared parameter; FP8 declarations that break the
// rules of declare_fp8_parameter (wsync.h); a manifest or named layout of the other role, or
// without this rank; a device the layout gives that differs from the configured one; waves the
// rules of set_parameter_wave refuse. A refused call changes nothing. Pieces are checked against
// their buffers and parameters only at connect (planner/validate.h), not here.
//
// Thread safety: none; the caller serializes every call (the session's layout calls are).
// The addresses are the host's: the builder never reads or writes through them.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "planner/layout.h"

namespace wsync {

class LocalLayoutBuilder {
 public:
  // The layout of `role` process `rank`, on node `node_id` and GPU `device` (kUnknownDevice:
  // unknown) as configured; empty until declared.
  LocalLayoutBuilder(Role role, int32_t rank, std::string node_id, int32_t device);

  // Buffer `id` of `bytes` at `address` (NULL only when `bytes` is 0), in host memory or on CUDA
  // device `device` (at most one device per process; `device` is ignored for host memory).
  absl::Status RegisterBuffer(uint64_t id, void* address, int64_t bytes, MemoryKind kind,
                              int32_t device);
  // Parameter `name` of `dtype` and `shape`, unquantized, in wave 0.
  absl::Status DeclareParameter(const std::string& name, DType dtype, const Dims& shape);
  // A piece of declared parameter `parameter` in `buffer` (which need not be registered yet).
  absl::Status DeclarePiece(const std::string& parameter, uint64_t buffer, const Box& box,
                            int64_t offset, const Dims& strides);

  // Marks declared parameter `name` (fp8_e4m3, 2 or 3 axes, not yet quantized) as quantized by
  // `quant` and declares its scale parameter quant.scale_param (scale_dtype fp32, shape
  // QuantScaleShape of the parameter's blocks). Rollout processes only. InvalidArgument naming the
  // parameter otherwise (the ABI's declare_fp8_parameter states each refusal).
  absl::Status DeclareFp8Parameter(const std::string& name, const ParamQuant& quant,
                                   DType scale_dtype, const Dims& scale_shape);

  // Replace the parameters and pieces (never the registered buffers) with this rank's part of a
  // manifest (SerializeLayout's bytes) or of named layout `layout` of built-in model `model`.
  // SetManifest keeps the manifest's device of this rank (ProcessInfo::device) and places the
  // process on node_id(). SetNamedLayout with placement keys in `layout` (ppn=K, colocated=0|1)
  // places it as BuildNamedLayout does (its node, which replaces node_id(), and with colocated=1
  // its GPU), as `wsync plan` places this rank when both sides give the keys; without them, on
  // node_id() with the configured device.
  absl::Status SetManifest(absl::string_view bytes);
  absl::Status SetNamedLayout(const std::string& model, const std::string& layout);

  // Puts declared parameter `name` of this rollout in `wave` (ParamInfo::wave); InvalidArgument
  // naming the parameter for a trainer, a wave outside [0, kMaxWaves), an undeclared parameter,
  // or a quantized parameter or scale put in a wave other than 0.
  absl::Status SetParameterWave(const std::string& name, int32_t wave);

  // Records that registered buffer `id` now lies at `address` (after the connected runtime
  // accepted the move); InvalidArgument for a buffer never registered.
  absl::Status RebindAddress(uint64_t id, void* address);

  // The layout part declared so far (after SetNamedLayout: that layout's part of this rank).
  const Layout& part() const { return part_; }
  // The registered buffers' addresses, parallel to part().buffers.
  const std::vector<void*>& buffer_addresses() const { return buffer_addresses_; }
  // The device of this process's CUDA buffers; -1: none registered.
  int32_t cuda_device() const { return cuda_device_; }
  // This process's node: the configured one, or a named layout's with placement keys.
  const std::string& node_id() const { return node_id_; }

 private:
  const Role role_;
  const int32_t rank_;
  const int32_t device_;  // As configured; kUnknownDevice: not said.
  std::string node_id_;
  Layout part_;
  std::vector<void*> buffer_addresses_;  // Parallel to part_.buffers.
  int32_t cuda_device_ = -1;
};

}  // namespace wsync

#endif  // WSYNC_PLUGIN_LOCAL_LAYOUT_H_
