#ifndef WSYNC_EXECUTOR_QUANT_DEVICE_H_
#define WSYNC_EXECUTOR_QUANT_DEVICE_H_

// Private to the executor: the quantization steps of quant_work.h on a CUDA process, by the FP8
// kernels of its DeviceMemory (DeviceMemory::QuantizeFp8Async, device/'s
// cuda_quant_kernel.cu), bit-identical to the host kernels (quant/fp8_device.h says why).
//
// A CUDA process's quantization staging and arena are device memory (memory_kinds.h), and every
// step it quantizes reads and writes device memory only (CheckQuantRun refuses the others):
// - sending: each step's whole blocks from its source piece into the staging (e4m3 row-major
//   over `blocks`, then the scales), as QuantizeSends;
// - receiving: each step's blocks from the arena, the e4m3 elements of `box` written straight
//   into the target (the kernel writes only the window of the piece: no scratch) and the scales
//   into the scale target, as QuantizeReceived.
// The launches go on the DeviceMemory's stream in order with its copies; the function waits for
// them (the sender's staging is then complete before any send is posted) and reads back one report
// word per step, so a NaN or infinity fails the process with InvalidArgument naming the parameter
// and the element (the first non-finite one in row-major order of the step's blocks; the host
// kernel names the first in block order). Not thread-safe (the run's thread).

#include <cstddef>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "executor/execute.h"
#include "executor/quant_work.h"
#include "planner/job.h"
#include "transport/device_memory.h"

namespace wsync::executor_internal {

// Runs `calls` (sender-side steps, their outputs in device memory) on `device`, or quant.receives
// from `arena` (device memory of quant.arena_bytes), waiting until `deadline`. The report words
// live in `arenas` (device and host arena `report_slot`), so that a launch or copy still running
// after a failed wait writes memory the run's failure path outlives. InvalidArgument for a NaN or
// infinity (naming the parameter) or a source dtype other than bf16/fp32; the device's errors
// (Unimplemented without kernels, DeadlineExceeded) otherwise.
absl::Status QuantizeSendsOnDevice(const Job& job, absl::Span<const SendQuantCall> calls,
                                   const LocalBuffers& buffers, DeviceMemory& device,
                                   ArenaCache& arenas, size_t report_slot, absl::Time deadline);
absl::Status QuantizeReceivedOnDevice(const Job& job, const QuantWork& quant,
                                      const LocalBuffers& buffers, const char* arena,
                                      DeviceMemory& device, ArenaCache& arenas, size_t report_slot,
                                      absl::Time deadline);

}  // namespace wsync::executor_internal

#endif  // WSYNC_EXECUTOR_QUANT_DEVICE_H_
