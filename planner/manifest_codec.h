#ifndef WSYNC_PLANNER_MANIFEST_CODEC_H_
#define WSYNC_PLANNER_MANIFEST_CODEC_H_

// Conversion between Layout and its protobuf wire form. Decoding bounds every count before use and
// refuses a schema version other than kManifestSchemaVersion; it does not validate geometry
// (ValidateLayout does).

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "planner/layout.h"
#include "planner/manifest.pb.h"

namespace wsync {

inline constexpr uint32_t kManifestSchemaVersion = 1;

// Upper bounds on decoded counts, so a hostile manifest cannot make the decoder allocate without
// limit.
struct ManifestLimits {
  int64_t max_bytes = int64_t{1} << 30;
  int32_t max_processes = 1 << 16;
  int32_t max_buffers = 1 << 22;
  int32_t max_parameters = 1 << 22;
  int32_t max_pieces = 1 << 24;
  int32_t max_name_length = 4096;
};

proto::Manifest ToManifest(const Layout& layout);
absl::StatusOr<Layout> FromManifest(const proto::Manifest& manifest,
                                    const ManifestLimits& limits = {});

std::string SerializeLayout(const Layout& layout);
absl::StatusOr<Layout> ParseLayout(absl::string_view bytes, const ManifestLimits& limits = {});

}  // namespace wsync

#endif  // WSYNC_PLANNER_MANIFEST_CODEC_H_
