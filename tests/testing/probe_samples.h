#ifndef WSYNC_TESTS_TESTING_PROBE_SAMPLES_H_
#define WSYNC_TESTS_TESTING_PROBE_SAMPLES_H_

// The samples per pattern a calibration of `n` processes at `sizes` sizes and `widths` fan widths
// (relay on), on nodes with `node_pairs` ordered pairs of distinct nodes and `nodes_inside` nodes
// of at least two processes (each probed inside: half to half), and with a quantize probe
// (`quantize`: one sample per process) and the delta probes (`delta`: one `delta_encode` and one
// `delta_apply` sample per process), must hold, counted from the patterns' definitions
// (calibration/probe.h), independently of the probe's own loops. Header-only; test code.

#include <cstdint>
#include <map>
#include <string>

namespace wsync::test {

inline std::map<std::string, int64_t> ExpectedProbeSamples(int64_t n, int64_t sizes, int64_t widths,
                                                           int64_t node_pairs, int64_t nodes_inside,
                                                           bool quantize = false,
                                                           bool delta = false) {
  std::map<std::string, int64_t> count = {{"local", n * sizes},
                                          {"peer", n * (n - 1) * sizes},
                                          {"both_ways", n * (n - 1) / 2 * sizes},
                                          {"fan_out", n * widths * sizes},
                                          {"fan_in", n * widths * sizes},
                                          {"relay", n * sizes}};
  if (node_pairs + nodes_inside > 0) count["node_link"] = (node_pairs + nodes_inside) * sizes;
  if (quantize) count["quantize"] = n;
  if (delta) count["delta_encode"] = count["delta_apply"] = n;
  return count;
}

}  // namespace wsync::test

#endif  // WSYNC_TESTS_TESTING_PROBE_SAMPLES_H_
