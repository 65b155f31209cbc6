#include "transport/nccl/nccl_api.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace wsync {

absl::StatusOr<NcclUniqueId> NcclUniqueId::FromBytes(const std::string& serialized) {
  NcclUniqueId id;
  if (serialized.size() != id.bytes.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("an NCCL unique id is ", id.bytes.size(), " bytes, not ", serialized.size()));
  }
  std::memcpy(id.bytes.data(), serialized.data(), id.bytes.size());
  return id;
}

}  // namespace wsync
