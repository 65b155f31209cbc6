#ifndef WSYNC_QUANT_FP8_DEVICE_HOST_H_
#define WSYNC_QUANT_FP8_DEVICE_HOST_H_

// The host side of device quantization (fp8_device.h): checking a request before it is launched,
// turning its report word into a status, and the kernels' host emulation.
//
// Thread safety: pure functions over their arguments.

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "quant/fp8_device.h"

namespace wsync::quant {

// OK when `q` can be launched: input type bf16 or fp32, extents >= 0, blocks >= 1, the window
// inside the region, and non-null pointers for a non-empty region (fp8 may be null for an empty
// window). InvalidArgument naming `parameter` otherwise.
absl::Status CheckFp8DeviceQuant(const Fp8DeviceQuant& q, absl::string_view parameter);

// The status a finished quantization reports: OK for kFp8NoNonFinite, else InvalidArgument
// "parameter <parameter>: cannot quantize NaN|an infinity at element (e, r, c) of the region to
// FP8" (QuantizeFp8's words) for the element the word names.
absl::Status Fp8ReportStatus(unsigned long long report,  // NOLINT(runtime/int)
                             const Fp8DeviceQuant& q, absl::string_view parameter);

// Runs `q` on host memory in the kernels' order (report and scale slots reset, tile maxima,
// quantization, scales), with the same per-element code. For the fake device of the unit tests
// and for the tests of the tiling. `q` must pass CheckFp8DeviceQuant.
void QuantizeFp8DeviceOnHost(const Fp8DeviceQuant& q);

}  // namespace wsync::quant

#endif  // WSYNC_QUANT_FP8_DEVICE_HOST_H_
