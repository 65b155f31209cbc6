#include "planner/layout.h"

#include "absl/strings/string_view.h"

namespace wsync {

absl::string_view RoleName(Role role) {
  switch (role) {
    case Role::kTrainer:
      return "trainer";
    case Role::kRollout:
      return "rollout";
  }
  return "invalid";
}

int64_t Layout::PieceBytes() const {
  int64_t bytes = 0;
  for (const Piece& piece : pieces) {
    bytes += Volume(piece.box) * DTypeSize(params[piece.param].dtype);
  }
  return bytes;
}

}  // namespace wsync
