#ifndef WSYNC_PLANNER_LAYOUT_PARTS_H_
#define WSYNC_PLANNER_LAYOUT_PARTS_H_

// A process knows only its own buffers and pieces; at rendezvous each sends its part of its side's
// layout and every process merges the parts it receives back into whole layouts.

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "planner/layout.h"

namespace wsync {

// The part of `layout` that process `rank` contributes: its process entry, its buffers, its pieces
// and every parameter of the layout (a process holding nothing still declares the model).
Layout LayoutPart(const Layout& layout, int32_t rank);

// Joins parts of one side: processes, buffers and pieces are appended; parameters are matched by
// name. Fails with InvalidArgument, naming the parts, when parts have different roles, a part
// lists other than one process, or two parts declare one parameter with different dtypes,
// shapes or quantization (ParamQuant: blocks and scale parameter). The result still needs
// ValidateLayout (Job::Create does it).
absl::StatusOr<Layout> MergeLayoutParts(absl::Span<const Layout> parts);

}  // namespace wsync

#endif  // WSYNC_PLANNER_LAYOUT_PARTS_H_
