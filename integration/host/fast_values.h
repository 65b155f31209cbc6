#ifndef WSYNC_INTEGRATION_HOST_FAST_VALUES_H_
#define WSYNC_INTEGRATION_HOST_FAST_VALUES_H_

// The logical values of integration/fill/fill.h (test::LogicalValue), written and checked fast:
// the hash inlined and every piece walked row by row along its last axis instead of one index
// vector per element (qwen2.5-0.5b has 494M elements per side, and every host process fills or
// checks its part every step). About 1.5 s per process and step for that model on 2 cores.

#include <cstdint>

#include "absl/status/status.h"
#include "integration/fill/fill.h"
#include "planner/layout.h"

namespace wsync::host {

// Internal when the fast values differ from test::LogicalValue (a host checks at start-up).
absl::Status CheckFastValues();

// Writes the logical value of `version` into every element of every piece of `part` in `memory`.
// OutOfRange when a piece lies outside its buffer, InvalidArgument for an unknown buffer.
absl::Status FillLogicalFast(const Layout& part, uint64_t version, test::HostBuffers& memory);

// Checks every element of every piece of `part` against its logical value of `version`, then the
// guard bytes: DataLoss naming the parameter, index and buffer of the first wrong element.
absl::Status CheckLogicalFast(const Layout& part, uint64_t version,
                              const test::HostBuffers& memory);

// Testing only: flips the lowest bit of the first element of every piece of `part` in `memory`
// (the demo's --corrupt_step, wsync_host's --corrupt_version), so that the rollouts must refuse
// that version.
void CorruptFirstElements(const Layout& part, test::HostBuffers& memory);

}  // namespace wsync::host

#endif  // WSYNC_INTEGRATION_HOST_FAST_VALUES_H_
