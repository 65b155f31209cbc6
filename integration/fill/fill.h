#ifndef WSYNC_INTEGRATION_FILL_FILL_H_
#define WSYNC_INTEGRATION_FILL_FILL_H_

// The values a job's trainers write and its rollouts check: logical element values (the value of
// every element of every parameter at a weight version, whatever the layout), host buffers with
// guard bytes, and filling and checking a layout's pieces with them. Shared by the programs that
// host wsync (the demo process, the CUDA job) and the tests (tests/testing/reference.h adds the
// reference copier that executes a plan on these buffers).
//
// Typical use:
//   HostBuffers trainer(trainer_part, kSourceFill);
//   WSYNC_RETURN_IF_ERROR(FillLogical(trainer_part, /*version=*/1, &trainer));
//   HostBuffers rollout(rollout_part, kPoison);
//   ... sync version 1 into `rollout` ...
//   WSYNC_RETURN_IF_ERROR(CheckLogical(rollout_part, rollout, /*version=*/1));
//
// Everything here is deliberately slow and simple (one element at a time, every address computed
// from scratch) so that it can serve as the ground truth.

#include <compare>
#include <cstdint>
#include <map>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "planner/layout.h"

// The namespace is the one these functions had in tests/testing/reference.h, kept so that the
// move changed no caller.
namespace wsync::test {

// ---------------------------------------------------------------------------------------------
// Logical values.

// The key of a parameter for LogicalValue: a hash of its name, so that both sides (which may list
// parameters in different orders) agree.
uint64_t ParamKey(absl::string_view name);

// The value of element `flat_index` (row-major index in the whole parameter) of the parameter with
// key `param_key` at weight `version`. An element of dtype size n (1, 2, 4 or 8) is the low n
// bytes of the result, stored little-endian (StoreValue). Contract: values of neighbouring flat
// indices always differ, even in their lowest byte (bit 0 is the parity of flat_index); values of
// different parameters, versions or distant indices differ in all other bits with the probability
// of a 64-bit hash, so a stale, shifted or misplaced element is caught.
uint64_t LogicalValue(uint64_t param_key, int64_t flat_index, uint64_t version);

// The version whose logical value element `flat_index` of the parameter with key `param_key` holds
// at `version` when each version after 1 changes about `per_mille` / 1000 of the elements (a
// small update, as an optimizer step at a low learning rate makes): the latest w in [2, version]
// that a hash of (param_key, flat_index, w) picks, else 1. `per_mille` >= 1000: `version`.
uint64_t SparseVersion(uint64_t param_key, int64_t flat_index, uint64_t version, int32_t per_mille);

// Writes the low `element_size` bytes of `value` to `out`, little-endian.
void StoreValue(uint64_t value, int64_t element_size, unsigned char* out);

// Row-major flat index of the absolute logical index `index` in a parameter of shape `shape`.
int64_t FlatIndex(const Dims& shape, const Dims& index);

// ---------------------------------------------------------------------------------------------
// Host buffers.

// Fill bytes. kPoison marks target bytes nothing has written; kSourceFill marks source bytes that
// no source piece covers (padding), so copying from them is caught by the value check.
inline constexpr unsigned char kPoison = 0xCD;
inline constexpr unsigned char kSourceFill = 0x5A;

// Bytes of the known pattern (GuardByte) before and after every buffer.
inline constexpr int64_t kGuardBytes = 64;
unsigned char GuardByte(int64_t position);

struct BufferKey {
  int32_t process = 0;  // Rank within the buffer's layout.
  uint64_t buffer = 0;  // BufferInfo::id.
  friend auto operator<=>(const BufferKey&, const BufferKey&) = default;
};

// Every buffer of one layout in host memory, keyed by (process rank, buffer id), each framed by
// kGuardBytes guard bytes on both sides. Copyable (a copy is a deep copy).
class HostBuffers {
 public:
  // Allocates each buffer of `layout` with its declared byte size, every byte set to `fill`.
  // Buffers with a negative size are allocated empty.
  HostBuffers(const Layout& layout, unsigned char fill);

  // The first byte of a buffer, or nullptr for an unknown key.
  unsigned char* data(BufferKey key);
  const unsigned char* data(BufferKey key) const;
  // The byte size of a buffer, or -1 for an unknown key.
  int64_t bytes(BufferKey key) const;
  std::vector<BufferKey> keys() const;

  // OK when every guard byte still holds its pattern; otherwise names the buffer and position.
  absl::Status CheckGuards() const;

 private:
  struct Storage {
    std::vector<unsigned char> bytes;  // kGuardBytes + size + kGuardBytes.
    int64_t size = 0;
  };
  std::map<BufferKey, Storage> buffers_;
};

// Writes the logical values of `version` into every element of every piece of `layout` (through
// the piece's affine map). Fails when a piece names an unknown buffer, an unknown parameter or an
// address outside its buffer.
absl::Status FillLogical(const Layout& layout, uint64_t version, HostBuffers* buffers);

// OK when every element of every piece of `layout` holds its logical value of `version`; otherwise
// the first mismatch with the parameter, process, buffer, logical index and both values. Used by
// processes that see only their own buffers (multi-process tests, the demo).
absl::Status CheckLogical(const Layout& layout, const HostBuffers& buffers, uint64_t version);

// FillLogical and CheckLogical where each element holds its value of its SparseVersion at
// `version` (each version after 1 changes about per_mille / 1000 of the elements).
absl::Status FillSparseLogical(const Layout& layout, uint64_t version, int32_t per_mille,
                               HostBuffers* buffers);
absl::Status CheckSparseLogical(const Layout& layout, const HostBuffers& buffers, uint64_t version,
                                int32_t per_mille);

}  // namespace wsync::test

#endif  // WSYNC_INTEGRATION_FILL_FILL_H_
