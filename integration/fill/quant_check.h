#ifndef WSYNC_INTEGRATION_FILL_QUANT_CHECK_H_
#define WSYNC_INTEGRATION_FILL_QUANT_CHECK_H_

// The check of a rollout's FP8 weights after a sync whose trainers wrote FillPattern (issue 22):
// what the bench host's and `wsync_test_worker`'s --verify_quant run and what `wsync-bench sync`'s
// FP8 verification job relies on. The rollout recomputes the trainers' bf16 or fp32 bytes from the
// pattern (PatternView: no trainer memory needed) and compares its e4m3 bytes and scales with the
// reference quantizer (fp8_reference.h) bit for bit. Pure but for reading `buffers`;
// thread-compatible.

#include <cstdint>

#include "absl/status/statusor.h"
#include "integration/fill/fill.h"
#include "integration/fill/pattern.h"
#include "planner/layout.h"

namespace wsync::test {

// For every piece of a quantized parameter in `part` (the pieces of one rollout process, its
// buffers in `buffers`, keyed by its rank), the e4m3 bytes of the piece's box and the scales of its
// whole-block box (quant_layout.h: WholeBlockBox, ScaleBox) must equal
// testing::ReferenceQuantizeFp8 of the whole-block box's values in the trainers' buffers of
// `source` (the whole trainer layout) after FillPattern(version); each scale is read from the
// scale piece of `part` that holds it. Returns the number of e4m3 elements checked (0 when `part`
// holds no quantized parameter).
// FailedPrecondition naming the parameter and index when an element of a needed block is held by
// no trainer piece, or by several (replicas hold different pattern bytes, and which one the plan
// read is not known here), when a scale is in no scale piece of `part`, or when the source dtype
// is neither bf16 nor fp32; InvalidArgument for an unknown parameter, buffer or an address
// outside a buffer; DataLoss naming the parameter, the index and both values at the first
// e4m3 byte or scale that differs.
absl::StatusOr<int64_t> CheckQuantizedPattern(const Layout& source, const Layout& part,
                                              const HostBuffers& buffers, uint64_t version);

}  // namespace wsync::test

#endif  // WSYNC_INTEGRATION_FILL_QUANT_CHECK_H_
