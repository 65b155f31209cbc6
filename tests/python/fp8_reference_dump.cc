// fp8_reference_dump EXPERTS ROWS COLS BLOCK_ROWS BLOCK_COLS: reads EXPERTS * ROWS * COLS bf16
// values (little-endian bit patterns, row-major) from standard input and writes the C++ reference
// quantizer's output (integration/fill/fp8_reference.h) to standard output: the e4m3 bytes
// (row-major), then the fp32 scales ([EXPERTS, scale rows, scale cols], little-endian). A block
// extent of 0 means the whole axis. test_fp8.py checks wsync.fp8.quantize against it bit for bit.
// Exit status 1 with the reason on stderr for a refused input (NaN, infinity, short input).

#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "integration/fill/fp8_reference.h"

namespace {

int Run(int argc, char** argv) {
  int64_t args[5];
  if (argc != 6) {
    std::fprintf(stderr, "usage: %s EXPERTS ROWS COLS BLOCK_ROWS BLOCK_COLS\n", argv[0]);
    return 2;
  }
  for (int i = 0; i < 5; ++i) {
    if (!absl::SimpleAtoi(argv[i + 1], &args[i]) || args[i] < 0) {
      std::fprintf(stderr, "not a count: %s\n", argv[i + 1]);
      return 2;
    }
  }
  const int64_t count = args[0] * args[1] * args[2];
  std::vector<uint16_t> bits(count);
  if (std::fread(bits.data(), sizeof(uint16_t), count, stdin) != static_cast<size_t>(count)) {
    std::fprintf(stderr, "expected %lld bf16 values on standard input\n",
                 static_cast<long long>(count));
    return 1;
  }
  std::vector<double> values(count);
  for (int64_t i = 0; i < count; ++i) values[i] = wsync::testing::Bf16Value(bits[i]);
  const auto block = [](int64_t b) { return b == 0 ? std::numeric_limits<int64_t>::max() : b; };
  absl::StatusOr<wsync::testing::ReferenceFp8> out = wsync::testing::ReferenceQuantizeFp8(
      values, args[0], args[1], args[2], block(args[3]), block(args[4]), "stdin");
  if (!out.ok()) {
    std::fprintf(stderr, "%s\n", std::string(out.status().message()).c_str());
    return 1;
  }
  std::fwrite(out->fp8.data(), 1, out->fp8.size(), stdout);
  std::fwrite(out->scales.data(), sizeof(float), out->scales.size(), stdout);
  return std::fflush(stdout) == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) { return Run(argc, argv); }
