#include "plugin/roster_check.h"

#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/checked_math.h"
#include "common/status.h"
#include "planner/geometry.h"

namespace wsync {
namespace {

absl::Status Tampered(absl::string_view what) {
  return WithErrorKind(absl::FailedPreconditionError(
                           absl::StrCat("the roster from the coordinator is not what this process "
                                        "sent (tampered on the way, or a "
                                        "coordinator bug); refused before any byte moves: ",
                                        what)),
                       kErrorLayoutRefused);
}

const BufferInfo* FindRegistered(absl::Span<const BufferInfo> registered, uint64_t id) {
  for (const BufferInfo& buffer : registered) {
    if (buffer.id == id) return &buffer;
  }
  return nullptr;
}

// The region (extent, offset, strides; elements of `element_size` bytes) lies in buffer `id`.
absl::Status CheckInside(absl::Span<const BufferInfo> registered, uint64_t id, const Dims& extent,
                         int64_t offset, const Dims& strides, int64_t element_size,
                         absl::string_view what) {
  const BufferInfo* buffer = FindRegistered(registered, id);
  if (buffer == nullptr)
    return Tampered(absl::StrCat(what, " names buffer ", id, ", never registered"));
  absl::StatusOr<std::optional<AddressSpan>> span = RegionSpan(extent, offset, strides);
  if (!span.ok()) return Tampered(absl::StrCat(what, ": ", span.status().message()));
  if (!span->has_value()) return absl::OkStatus();
  std::optional<int64_t> end = CheckedMul((*span)->last + 1, element_size);
  if (!end || *end > buffer->bytes) {
    return Tampered(absl::StrCat(what, " reaches past the ", buffer->bytes,
                                 " bytes registered for buffer ", id));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckOwnRosterEntry(const Roster& roster, int32_t process, ControlRole role,
                                 int32_t rank, absl::string_view sent_manifest) {
  if (process < 0 || process >= roster.size()) {
    return Tampered(absl::StrCat("it has ", roster.size(), " processes, none for this process (",
                                 process, ")"));
  }
  const RosterEntry& entry = roster.processes[process];
  if (entry.process != process || entry.role != role || entry.rank != rank) {
    return Tampered(absl::StrCat("its entry ", process, " is ", ControlRoleName(entry.role),
                                 " rank ", entry.rank, ", this process is ", ControlRoleName(role),
                                 " rank ", rank));
  }
  if (entry.manifest_blob < 0 || entry.manifest_blob >= static_cast<int32_t>(roster.blobs.size())) {
    return Tampered("this process's manifest is missing");
  }
  const std::string& manifest = roster.manifest(process);
  if (manifest != sent_manifest) {
    return Tampered(absl::StrCat("this process's manifest differs from the one it sent (",
                                 manifest.size(), " bytes instead of ", sent_manifest.size(), ")"));
  }
  return absl::OkStatus();
}

absl::Status CheckOwnMemory(const Job& job, absl::Span<const Segment> segments, int32_t process,
                            absl::Span<const BufferInfo> registered) {
  if (process < 0 || process >= job.num_processes()) {
    return Tampered(absl::StrCat("the job has no process ", process));
  }
  const bool source = job.IsSource(process);
  const Layout& layout = source ? job.source() : job.target();
  const int32_t rank = job.processes()[process].rank;
  for (const BufferInfo& buffer : layout.buffers) {
    if (buffer.process != rank) continue;
    const BufferInfo* mine = FindRegistered(registered, buffer.id);
    if (mine == nullptr || mine->bytes != buffer.bytes || mine->kind != buffer.kind) {
      return Tampered(absl::StrCat(
          "buffer ", buffer.id, " of this process has ", buffer.bytes, " bytes of ",
          MemoryKindName(buffer.kind), " memory in the roster, ",
          mine == nullptr ? std::string("but was never registered")
                          : absl::StrCat(mine->bytes, " bytes of ", MemoryKindName(mine->kind),
                                         " memory registered")));
    }
  }
  for (const Piece& piece : layout.pieces) {
    if (piece.process != rank) continue;
    const ParamInfo& param = layout.params[piece.param];
    WSYNC_RETURN_IF_ERROR(CheckInside(
        registered, piece.buffer, piece.box.extent, piece.offset, piece.strides,
        DTypeSize(param.dtype),
        absl::StrCat("piece of parameter '", param.name, "' box ", BoxToString(piece.box))));
  }
  for (const Segment& s : segments) {
    const int64_t element_size = job.ElementSize(s.param);
    if (s.from.process == process && s.from.buffer != kRelayArenaBuffer) {
      WSYNC_RETURN_IF_ERROR(CheckInside(registered, s.from.buffer, s.box.extent, s.from.offset,
                                        s.from.strides, element_size,
                                        absl::StrCat("a segment read at offset ", s.from.offset)));
    }
    if (s.to.process == process && s.to.buffer != kRelayArenaBuffer) {
      WSYNC_RETURN_IF_ERROR(CheckInside(registered, s.to.buffer, s.box.extent, s.to.offset,
                                        s.to.strides, element_size,
                                        absl::StrCat("a segment write at offset ", s.to.offset)));
    }
  }
  return absl::OkStatus();
}

}  // namespace wsync
