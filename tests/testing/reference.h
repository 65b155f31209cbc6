#ifndef WSYNC_TESTS_TESTING_REFERENCE_H_
#define WSYNC_TESTS_TESTING_REFERENCE_H_

// A test oracle for plans, independent of the planner's internals: an element-by-element plan
// executor that counts every byte it writes and checks that the targets hold exactly the logical
// tensors. The logical values and host buffers it works on are integration/fill/fill.h, the
// pseudo-random fill pattern for chunk-hash verification integration/fill/pattern.h (included
// here for the suites that use both), shared with the programs.
//
// Typical use:
//   HostBuffers source(pair.source, kSourceFill);
//   FillLogical(pair.source, /*version=*/1, &source);
//   HostBuffers target(pair.target, kPoison);
//   WriteCounts counts(pair.target);
//   WSYNC_RETURN_IF_ERROR(ExecutePlanReference(job, plan.segments, source, &target, &counts));
//   WSYNC_RETURN_IF_ERROR(CheckTargets(pair.target, target, counts, /*version=*/1));
//
// Everything here is deliberately slow and simple (one element at a time, every address computed
// from scratch) so that it can serve as the ground truth for the planner and executor.

#include <cstdint>
#include <map>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "integration/fill/fill.h"
#include "integration/fill/pattern.h"
#include "planner/job.h"
#include "planner/layout.h"
#include "planner/plan.h"

namespace wsync::test {

// ---------------------------------------------------------------------------------------------
// Reference execution and checks.

// How many times each byte of each buffer of one layout was written.
class WriteCounts {
 public:
  // All counters of every buffer of `layout` start at zero.
  explicit WriteCounts(const Layout& layout);

  // The counters of a buffer (one per byte), or nullptr for an unknown key.
  std::vector<uint32_t>* counts(BufferKey key);
  const std::vector<uint32_t>* counts(BufferKey key) const;

 private:
  std::map<BufferKey, std::vector<uint32_t>> counts_;
};

// Executes `segments` element by element: for each segment and each index i of its box, copies
// the element at from.offset + sum_a (i[a] - box.origin[a]) * from.strides[a] (elements of the
// dtype of job.target().params[param]) of source buffer (from.process, from.buffer) to the
// analogous address of target buffer (to.process - S, to.buffer), S being the number of source
// processes, and counts the bytes written in `write_counts`. Endpoint processes are global job ids
// (see Job). Fails, naming the segment, on an unknown parameter, process or buffer, a rank
// mismatch, or an address outside its buffer (nothing of that segment is copied then). Does not
// look at the layouts' pieces: a wrong plan is executed as written and caught by CheckTargets.
// Relays (planner/relay.h): segments from a target process (stage-2 forwards) run after all the
// others and read the target buffer or relay arena (endpoint buffer kRelayArenaBuffer) they name;
// relay arenas are host memory per target process, as large as the segments writing them need,
// filled with kPoison, and their bytes are not counted.
absl::Status ExecutePlanReference(const Job& job, absl::Span<const Segment> segments,
                                  const HostBuffers& source, HostBuffers* target,
                                  WriteCounts* write_counts);

// Checks the target buffers after a run of version `version`, in this order, returning the first
// failure with the parameter, process, buffer, logical index and bytes involved:
//   1. every guard byte is intact;
//   2. every byte of every element of every target piece (of rank `only_process` when set) was
//      written exactly once and the element equals its logical value;
//   3. every other byte (bytes no checked piece covers, and every byte of other processes when
//      `only_process` is set) was never written and still holds kPoison.
// `target_buffers` must have been created with kPoison.
absl::Status CheckTargets(const Layout& target, const HostBuffers& target_buffers,
                          const WriteCounts& write_counts, uint64_t version,
                          std::optional<int32_t> only_process = std::nullopt);

// Convenience: allocates and fills the source buffers, runs ExecutePlanReference into fresh
// poisoned target buffers and runs CheckTargets. The layouts are the ones the job was created
// from (in any listing order).
absl::Status RunReference(const Job& job, absl::Span<const Segment> segments, const Layout& source,
                          const Layout& target, uint64_t version,
                          std::optional<int32_t> only_process = std::nullopt);

}  // namespace wsync::test

#endif  // WSYNC_TESTS_TESTING_REFERENCE_H_
