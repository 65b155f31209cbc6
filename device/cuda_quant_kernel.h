#ifndef WSYNC_DEVICE_CUDA_QUANT_KERNEL_H_
#define WSYNC_DEVICE_CUDA_QUANT_KERNEL_H_

// Launches the FP8 quantization of `q` (quant/fp8_device.h) on `stream` (a cudaStream_t): four
// kernels in stream order (reset the report and the scale slots, tile maxima, quantize, scales).
// `q` must pass quant::CheckFp8DeviceQuant. Returns the cudaError_t of the launches as an int (0:
// enqueued). The report word says, once the stream reached this point, whether an element was NaN
// or infinite. Internal to the real NcclApi: use NcclApi::QuantizeFp8Async.

#include "quant/fp8_device.h"

namespace wsync {

int LaunchQuantizeFp8(const quant::Fp8DeviceQuant& q, void* stream);

}  // namespace wsync

#endif  // WSYNC_DEVICE_CUDA_QUANT_KERNEL_H_
