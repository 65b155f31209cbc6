#include "integration/bench/machine.h"

#include <sys/utsname.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "integration/bench/perftest.h"
#include "quant/fp8.h"

namespace wsync::bench {
namespace {

// The value of the first "key : value" line of /proc/cpuinfo with `key`; empty when none.
std::string CpuInfoField(absl::string_view key) {
  for (absl::string_view line : absl::StrSplit(ReadWholeFile("/proc/cpuinfo"), '\n')) {
    if (absl::StartsWith(line, key) && line.find(':') != absl::string_view::npos) {
      return std::string(absl::StripAsciiWhitespace(line.substr(line.find(':') + 1)));
    }
  }
  return "";
}

}  // namespace

std::string MachineDescription() {
  const std::string cpu = CpuInfoField("model name");
  double mem_gib = 0;
  for (absl::string_view line : absl::StrSplit(ReadWholeFile("/proc/meminfo"), '\n')) {
    if (absl::ConsumePrefix(&line, "MemTotal:")) {
      int64_t kib = 0;
      if (absl::SimpleAtoi(absl::StripSuffix(absl::StripAsciiWhitespace(line), " kB"), &kib)) {
        mem_gib = kib / 1048576.0;
      }
    }
  }
  utsname name = {};
  uname(&name);
  return absl::StrFormat("%d cores (%s), %.0f GiB, Linux %s; load average at start %s",
                         sysconf(_SC_NPROCESSORS_ONLN), cpu, mem_gib, name.release, LoadAverage());
}

std::string LoadAverage() {
  const std::string load(absl::StripAsciiWhitespace(ReadWholeFile("/proc/loadavg")));
  return load.substr(0, load.find(' ', load.find(' ', load.find(' ') + 1) + 1));
}

std::string CpuVectorFlags() {
  static constexpr absl::string_view kShown[] = {"avx2",     "fma",      "avx512f", "avx512bw",
                                                 "avx512cd", "avx512dq", "avx512vl"};
  const std::string flags = CpuInfoField("flags");
  const absl::flat_hash_set<absl::string_view> present = absl::StrSplit(flags, ' ');
  std::vector<absl::string_view> shown;
  for (const absl::string_view flag : kShown) {
    if (present.contains(flag)) shown.push_back(flag);
  }
  if (shown.empty()) return absl::StrCat("none of ", absl::StrJoin(kShown, " "));
  return absl::StrJoin(shown, " ");
}

std::string Fp8KernelDescription() {
  std::vector<std::string> runnable;
  for (const quant::Fp8Kernel kernel : quant::RunnableFp8Kernels()) {
    runnable.emplace_back(quant::Fp8KernelName(kernel));
  }
  const char* cap = std::getenv(quant::kFp8KernelVariable);
  return absl::StrCat("fp8 kernel ", quant::Fp8KernelName(quant::SelectedFp8Kernel()),
                      " (runnable: ", absl::StrJoin(runnable, " "), "; ", quant::kFp8KernelVariable,
                      cap == nullptr ? " unset" : absl::StrCat("=", cap), ")");
}

}  // namespace wsync::bench
