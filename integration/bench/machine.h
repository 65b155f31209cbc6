#ifndef WSYNC_INTEGRATION_BENCH_MACHINE_H_
#define WSYNC_INTEGRATION_BENCH_MACHINE_H_

// What a benchmark figure holds for: the machine it ran on, the CPU's vector extensions and the
// FP8 kernel that quantized (quant/fp8.h), printed at the top of every benchmark's output.

#include <string>

namespace wsync::bench {

// "2 cores (AMD EPYC), 23 GiB, Linux 6.1.0; load average at start 0.52 0.31 0.20".
std::string MachineDescription();

// /proc/loadavg's 1, 5 and 15 minute load averages now: "0.52 0.31 0.20".
std::string LoadAverage();

// The CPU's vector extensions that decide the kernels' speed, from /proc/cpuinfo's flags ("avx2
// fma avx512f avx512bw avx512cd avx512dq avx512vl"; "none of ..." when it has none of them).
std::string CpuVectorFlags();

// "fp8 kernel avx2 (runnable: portable avx2 avx512; WSYNC_FP8_KERNEL=avx2)": the kernel
// quant::QuantizeFp8 runs in this process, the ones it could run, and the cap when it is set.
// Child processes inherit the cap (the variable) and so run the same kernel on the same CPU.
std::string Fp8KernelDescription();

}  // namespace wsync::bench

#endif  // WSYNC_INTEGRATION_BENCH_MACHINE_H_
