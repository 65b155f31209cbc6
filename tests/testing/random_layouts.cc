#include "tests/testing/random_layouts.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/checked_math.h"
#include "common/dtype.h"
#include "common/hash.h"
#include "planner/builders.h"
#include "planner/geometry.h"

namespace wsync::test {

int64_t UniformInt(std::mt19937_64& rng, int64_t lo, int64_t hi) {
  const uint64_t span = static_cast<uint64_t>(hi - lo) + 1;
  return lo + static_cast<int64_t>(span == 0 ? rng() : rng() % span);
}

bool Chance(std::mt19937_64& rng, double p) {
  return static_cast<double>(rng() >> 11) * 0x1.0p-53 < p;
}

namespace {

// Fisher-Yates with UniformInt (std::shuffle's output is implementation-defined).
template <typename T>
void Shuffle(std::vector<T>& items, std::mt19937_64& rng) {
  for (size_t i = items.size(); i > 1; --i) {
    std::swap(items[i - 1], items[UniformInt(rng, 0, static_cast<int64_t>(i) - 1)]);
  }
}

std::vector<int32_t> Iota(int32_t n) {
  std::vector<int32_t> values(n);
  for (int32_t i = 0; i < n; ++i) values[i] = i;
  return values;
}

constexpr DType kDTypes[] = {DType::kBFloat16,   DType::kFloat16,    DType::kFloat32,
                             DType::kFloat8E4M3, DType::kFloat8E5M2, DType::kInt8,
                             DType::kInt32,      DType::kInt64};

struct ParamSpec {
  std::string name;
  DType dtype = DType::kBFloat16;
  Dims shape;
};

// Parameters that may be fused: equal dtypes and extents except along `fuse_axis`. A family of
// one parameter has fuse_axis -1.
struct Family {
  std::vector<int32_t> members;  // Indices into Model::params.
  int fuse_axis = -1;
};

struct Model {
  std::vector<ParamSpec> params;
  std::vector<Family> families;
};

// Extents 1..max_extent (1 with probability 0.2), halved on the largest axis until the volume
// fits max_volume.
Dims RandomShape(std::mt19937_64& rng, const RandomLayoutOptions& options, int rank) {
  Dims shape(rank);
  for (int a = 0; a < rank; ++a) {
    shape[a] = Chance(rng, 0.2)
                   ? 1
                   : UniformInt(rng, std::min<int64_t>(2, options.max_extent), options.max_extent);
  }
  while (Volume(shape) > options.max_volume) {
    auto largest = std::max_element(shape.begin(), shape.end());
    *largest = (*largest + 1) / 2;
  }
  return shape;
}

Model RandomModel(std::mt19937_64& rng, const RandomLayoutOptions& options) {
  Model model;
  const int32_t count = static_cast<int32_t>(UniformInt(rng, 1, options.max_params));
  auto new_name = [&]() {
    // Random prefixes make the name order (the job's canonical order) differ from creation order.
    return absl::StrCat("w", UniformInt(rng, 0, 99), ".p", model.params.size());
  };
  while (static_cast<int32_t>(model.params.size()) < count) {
    const int32_t remaining = count - static_cast<int32_t>(model.params.size());
    const int rank = static_cast<int>(UniformInt(rng, 1, options.max_rank));
    const DType dtype = kDTypes[UniformInt(rng, 0, std::size(kDTypes) - 1)];
    const Dims base = RandomShape(rng, options, rank);
    Family family;
    if (options.allow_fused && remaining >= 2 && Chance(rng, 0.4)) {
      family.fuse_axis = static_cast<int>(UniformInt(rng, 0, rank - 1));
      const int64_t members = UniformInt(rng, 2, std::min(3, remaining));
      for (int64_t m = 0; m < members; ++m) {
        Dims shape = base;
        shape[family.fuse_axis] = UniformInt(rng, 1, base[family.fuse_axis]);
        family.members.push_back(static_cast<int32_t>(model.params.size()));
        model.params.push_back(ParamSpec{new_name(), dtype, shape});
      }
    } else {
      family.members.push_back(static_cast<int32_t>(model.params.size()));
      model.params.push_back(ParamSpec{new_name(), dtype, base});
    }
    model.families.push_back(std::move(family));
  }
  return model;
}

// Builds one side of a pair. Buffers are created with size 0 and sized at the end from what was
// placed in them.
class SideGenerator {
 public:
  SideGenerator(Role role, const Model& model, int32_t num_nodes,
                const RandomLayoutOptions& options, std::mt19937_64& rng)
      : model_(model), num_nodes_(num_nodes), options_(options), rng_(rng), builder_(role) {}

  Layout Generate();

 private:
  struct Slot {
    uint64_t buffer = 0;
    int64_t offset = 0;  // Elements.
  };

  std::string RandomNode() { return absl::StrCat("node", UniformInt(rng_, 0, num_nodes_ - 1)); }
  int64_t ElementSize(int32_t param) const { return DTypeSize(model_.params[param].dtype); }

  Slot Place(int32_t process, int64_t element_size, int64_t elements);
  Dims RandomStrides(const Dims& extent, int64_t* span);
  void AddPlainPiece(int32_t param, int32_t process, const Box& box);
  std::vector<std::vector<int32_t>> AssignParts(int64_t parts);
  std::vector<Box> CutAxis(const Dims& shape, int axis, int64_t parts);
  std::vector<int> SplittableAxes(const Dims& shape) const;

  void EmitReplicated(int32_t param);
  void EmitSplit(int32_t param);
  void EmitGrid(int32_t param);
  void EmitFused(const Family& family);
  void EmitFlat(std::vector<int32_t> params);
  Layout ReplicateGroup(Layout group, int32_t replicas);
  void AddSameProcessCopy(Layout& layout);

  const Model& model_;
  const int32_t num_nodes_;
  const RandomLayoutOptions& options_;
  std::mt19937_64& rng_;
  LayoutBuilder builder_;
  int32_t num_processes_ = 0;     // Of one replica group.
  std::vector<int> buffer_mode_;  // Per process: 0 shared, 1 one per piece, 2 mixed.
  std::vector<std::optional<uint64_t>> shared_buffer_;  // Per process.
  std::map<std::pair<int32_t, uint64_t>, int64_t> used_bytes_;
  std::vector<int32_t> layout_param_;  // Model parameter -> layout parameter index.
};

SideGenerator::Slot SideGenerator::Place(int32_t process, int64_t element_size, int64_t elements) {
  const int mode = buffer_mode_[process];
  if (mode == 0 || (mode == 2 && Chance(rng_, 0.5))) {
    if (!shared_buffer_[process].has_value()) {
      shared_buffer_[process] = builder_.AddBuffer(process, 0);
    }
    int64_t& used = used_bytes_[{process, *shared_buffer_[process]}];
    if (Chance(rng_, 0.5)) used += UniformInt(rng_, 0, 2 * element_size);
    used = RoundUp(used, element_size);
    const Slot slot{*shared_buffer_[process], used / element_size};
    used += elements * element_size;
    return slot;
  }
  const uint64_t buffer = builder_.AddBuffer(process, 0);
  const int64_t lead = Chance(rng_, 0.3) ? UniformInt(rng_, 1, 2) : 0;
  used_bytes_[{process, buffer}] = (lead + elements) * element_size;
  return Slot{buffer, lead};
}

// Strides of a random axis order (outermost to innermost) with optional row padding and an
// optional innermost spacing; extent-1 axes sometimes get arbitrary strides (as torch allows).
// The result is injective by the nesting rule. `span` is the element count the region occupies.
Dims SideGenerator::RandomStrides(const Dims& extent, int64_t* span) {
  const int rank = static_cast<int>(extent.size());
  std::vector<int32_t> order = Iota(rank);
  Shuffle(order, rng_);
  Dims strides(rank, 0);
  int64_t next = Chance(rng_, 0.15) ? 2 : 1;
  for (int i = rank - 1; i >= 0; --i) {
    const int axis = order[i];
    if (extent[axis] == 1) {
      strides[axis] = Chance(rng_, 0.5) ? next : UniformInt(rng_, 0, 7);
      continue;
    }
    strides[axis] = next;
    next = next * extent[axis] + (Chance(rng_, 0.3) ? UniformInt(rng_, 1, 3) : 0);
  }
  *span = 1;
  for (int a = 0; a < rank; ++a) *span += (extent[a] - 1) * strides[a];
  return strides;
}

void SideGenerator::AddPlainPiece(int32_t param, int32_t process, const Box& box) {
  const int64_t element_size = ElementSize(param);
  if (options_.allow_strided && Chance(rng_, 0.3)) {
    int64_t span = 0;
    Dims strides = RandomStrides(box.extent, &span);
    const Slot slot = Place(process, element_size, span);
    builder_.AddPiece(layout_param_[param], process, slot.buffer, box, slot.offset,
                      std::move(strides));
    return;
  }
  const Slot slot = Place(process, element_size, Volume(box));
  builder_.AddPackedPiece(layout_param_[param], process, slot.buffer, box, slot.offset);
}

// Holders of `parts` parts: part j on a distinct process while there are enough processes (j
// modulo the process count after that); when there are more processes than parts, each spare
// process holds a copy of one part with probability 1/2.
std::vector<std::vector<int32_t>> SideGenerator::AssignParts(int64_t parts) {
  std::vector<int32_t> order = Iota(num_processes_);
  Shuffle(order, rng_);
  std::vector<std::vector<int32_t>> holders(parts);
  for (int64_t j = 0; j < parts; ++j) holders[j].push_back(order[j % num_processes_]);
  for (int64_t i = parts; i < num_processes_; ++i) {
    if (Chance(rng_, 0.5)) holders[i % parts].push_back(order[i]);
  }
  return holders;
}

// `parts` non-empty boxes cutting `shape` along `axis`: balanced (SplitBox) or at random points.
std::vector<Box> SideGenerator::CutAxis(const Dims& shape, int axis, int64_t parts) {
  std::vector<Box> boxes;
  if (Chance(rng_, 0.5)) {
    for (int64_t j = 0; j < parts; ++j) {
      boxes.push_back(SplitBox(shape, axis, static_cast<int32_t>(parts), static_cast<int32_t>(j)));
    }
    return boxes;
  }
  std::set<int64_t> cuts;
  while (static_cast<int64_t>(cuts.size()) < parts - 1)
    cuts.insert(UniformInt(rng_, 1, shape[axis] - 1));
  cuts.insert(shape[axis]);
  int64_t begin = 0;
  for (int64_t end : cuts) {
    Box box = WholeBox(shape);
    box.origin[axis] = begin;
    box.extent[axis] = end - begin;
    boxes.push_back(std::move(box));
    begin = end;
  }
  return boxes;
}

std::vector<int> SideGenerator::SplittableAxes(const Dims& shape) const {
  std::vector<int> axes;
  for (int a = 0; a < static_cast<int>(shape.size()); ++a) {
    if (shape[a] >= 2) axes.push_back(a);
  }
  return axes;
}

void SideGenerator::EmitReplicated(int32_t param) {
  std::vector<int32_t> holders;
  if (Chance(rng_, 0.5)) {
    holders = Iota(num_processes_);
  } else {
    for (int32_t p = 0; p < num_processes_; ++p) {
      if (Chance(rng_, 0.5)) holders.push_back(p);
    }
    if (holders.empty())
      holders.push_back(static_cast<int32_t>(UniformInt(rng_, 0, num_processes_ - 1)));
  }
  const Box whole = WholeBox(model_.params[param].shape);
  for (int32_t process : holders) AddPlainPiece(param, process, whole);
}

void SideGenerator::EmitSplit(int32_t param) {
  const Dims& shape = model_.params[param].shape;
  const std::vector<int> axes = SplittableAxes(shape);
  if (axes.empty()) return EmitReplicated(param);
  const int axis = axes[UniformInt(rng_, 0, axes.size() - 1)];
  const int64_t parts = UniformInt(rng_, 2, std::min<int64_t>(shape[axis], 6));
  const std::vector<Box> boxes = CutAxis(shape, axis, parts);
  const std::vector<std::vector<int32_t>> holders = AssignParts(parts);
  for (int64_t j = 0; j < parts; ++j) {
    for (int32_t process : holders[j]) AddPlainPiece(param, process, boxes[j]);
  }
}

void SideGenerator::EmitGrid(int32_t param) {
  const Dims& shape = model_.params[param].shape;
  std::vector<int> axes = SplittableAxes(shape);
  if (axes.size() < 2) return EmitSplit(param);
  Shuffle(axes, rng_);
  const int a = axes[0];
  const int b = axes[1];
  const int64_t parts_a = UniformInt(rng_, 2, std::min<int64_t>(shape[a], 3));
  const int64_t parts_b = UniformInt(rng_, 2, std::min<int64_t>(shape[b], 3));
  std::vector<Box> boxes;
  for (const Box& row : CutAxis(shape, a, parts_a)) {
    for (const Box& column : CutAxis(shape, b, parts_b)) {
      Box box = row;
      box.origin[b] = column.origin[b];
      box.extent[b] = column.extent[b];
      boxes.push_back(std::move(box));
    }
  }
  const std::vector<std::vector<int32_t>> holders = AssignParts(boxes.size());
  for (size_t j = 0; j < boxes.size(); ++j) {
    for (int32_t process : holders[j]) AddPlainPiece(param, process, boxes[j]);
  }
}

// The family's members, in a random order, fused along the family's axis and split (identically
// for every member) into k parts along a random axis; each part is one fused tensor.
void SideGenerator::EmitFused(const Family& family) {
  std::vector<int32_t> members = family.members;
  Shuffle(members, rng_);
  const Dims& first = model_.params[members[0]].shape;
  const int rank = static_cast<int>(first.size());
  const int split_axis = static_cast<int>(UniformInt(rng_, 0, rank - 1));
  int64_t min_extent = first[split_axis];
  for (int32_t m : members) min_extent = std::min(min_extent, model_.params[m].shape[split_axis]);
  const int64_t parts = UniformInt(rng_, 1, std::min<int64_t>(min_extent, 4));
  const std::vector<std::vector<int32_t>> holders = AssignParts(parts);
  const int64_t element_size = ElementSize(members[0]);
  for (int64_t j = 0; j < parts; ++j) {
    std::vector<std::pair<int32_t, Box>> fused_parts;
    Dims fused_extent;
    for (int32_t m : members) {
      Box box = SplitBox(model_.params[m].shape, split_axis, static_cast<int32_t>(parts),
                         static_cast<int32_t>(j));
      if (fused_extent.empty()) {
        fused_extent = box.extent;
        fused_extent[family.fuse_axis] = 0;
      }
      fused_extent[family.fuse_axis] += box.extent[family.fuse_axis];
      fused_parts.emplace_back(layout_param_[m], std::move(box));
    }
    for (int32_t process : holders[j]) {
      const Slot slot = Place(process, element_size, Volume(fused_extent));
      builder_.AddFusedPieces(fused_parts, family.fuse_axis, process, slot.buffer, slot.offset);
    }
  }
}

// FSDP: the parameters (all of one element size), in a random order with optional padding
// between them, are concatenated into one flat range that is cut into one contiguous shard per
// process (balanced or at random points; a shard may be empty).
void SideGenerator::EmitFlat(std::vector<int32_t> params) {
  Shuffle(params, rng_);
  const int64_t element_size = ElementSize(params[0]);
  std::vector<int64_t> starts;
  int64_t total = 0;
  for (int32_t p : params) {
    starts.push_back(total);
    total += Volume(model_.params[p].shape) + (Chance(rng_, 0.3) ? UniformInt(rng_, 1, 3) : 0);
  }
  std::vector<int64_t> bounds = {0};
  if (Chance(rng_, 0.5)) {
    for (int32_t r = 0; r < num_processes_; ++r) {
      bounds.push_back(SplitRange(total, num_processes_, r).begin +
                       SplitRange(total, num_processes_, r).size);
    }
  } else {
    for (int32_t r = 1; r < num_processes_; ++r) bounds.push_back(UniformInt(rng_, 0, total));
    std::sort(bounds.begin(), bounds.end());
    bounds.push_back(total);
  }
  for (int32_t r = 0; r < num_processes_; ++r) {
    const int64_t lo = bounds[r];
    const int64_t hi = bounds[r + 1];
    if (lo >= hi) continue;
    const Slot slot = Place(r, element_size, hi - lo);
    for (size_t i = 0; i < params.size(); ++i) {
      const int64_t begin = std::max(lo, starts[i]);
      const int64_t end = std::min(hi, starts[i] + Volume(model_.params[params[i]].shape));
      if (begin >= end) continue;
      builder_.AddFlatRange(layout_param_[params[i]], r, slot.buffer, begin - starts[i],
                            end - starts[i], slot.offset + (begin - lo));
    }
  }
}

// Another copy of a random piece's box, packed in a new buffer of the same process (a process
// holding one region twice, e.g. a tied weight).
void SideGenerator::AddSameProcessCopy(Layout& layout) {
  const Piece original = layout.pieces[UniformInt(rng_, 0, layout.pieces.size() - 1)];
  uint64_t id = 0;
  for (const BufferInfo& buffer : layout.buffers) {
    if (buffer.process == original.process) id = std::max(id, buffer.id + 1);
  }
  const int64_t element_size = DTypeSize(layout.params[original.param].dtype);
  layout.buffers.push_back(
      BufferInfo{original.process, id, Volume(original.box) * element_size, MemoryKind::kHost});
  layout.pieces.push_back(Piece{original.param, original.process, id, original.box, 0,
                                RowMajorStrides(original.box.extent)});
}

// The group's processes, buffers and pieces repeated `replicas` times (DP): copy g holds ranks
// g*n..g*n+n-1 with fresh random node ids.
Layout SideGenerator::ReplicateGroup(Layout group, int32_t replicas) {
  const int32_t n = static_cast<int32_t>(group.processes.size());
  const std::vector<BufferInfo> buffers = group.buffers;
  const std::vector<Piece> pieces = group.pieces;
  for (int32_t g = 1; g < replicas; ++g) {
    for (int32_t i = 0; i < n; ++i) group.processes.push_back(ProcessInfo{g * n + i, RandomNode()});
    for (BufferInfo buffer : buffers) {
      buffer.process += g * n;
      group.buffers.push_back(buffer);
    }
    for (Piece piece : pieces) {
      piece.process += g * n;
      group.pieces.push_back(std::move(piece));
    }
  }
  return group;
}

Layout SideGenerator::Generate() {
  num_processes_ = static_cast<int32_t>(UniformInt(rng_, 1, options_.max_processes));
  int32_t replicas = 1;
  const int32_t max_replicas = options_.max_processes / num_processes_;
  if (max_replicas > 1 && Chance(rng_, 0.4)) {
    replicas = static_cast<int32_t>(UniformInt(rng_, 2, max_replicas));
  }
  for (int32_t p = 0; p < num_processes_; ++p) {
    builder_.AddProcess(RandomNode());
    buffer_mode_.push_back(static_cast<int>(UniformInt(rng_, 0, 2)));
  }
  shared_buffer_.assign(num_processes_, std::nullopt);

  // Parameters enter the layout in a random order.
  layout_param_.assign(model_.params.size(), -1);
  std::vector<int32_t> order = Iota(static_cast<int32_t>(model_.params.size()));
  Shuffle(order, rng_);
  for (int32_t p : order) {
    const ParamSpec& spec = model_.params[p];
    layout_param_[p] = builder_.AddParam(spec.name, spec.dtype, spec.shape);
  }

  // Units of emission: ('f', family), ('r' | 's' | 'g', param); flat parameters are gathered by
  // element size and emitted as one unit per size.
  std::vector<std::pair<char, int32_t>> units;
  std::map<int64_t, std::vector<int32_t>> flat_by_size;
  for (size_t f = 0; f < model_.families.size(); ++f) {
    const Family& family = model_.families[f];
    if (family.fuse_axis >= 0 && options_.allow_fused && Chance(rng_, 0.5)) {
      units.emplace_back('f', static_cast<int32_t>(f));
      continue;
    }
    for (int32_t p : family.members) {
      const int64_t pick = UniformInt(rng_, 0, 9);
      if (pick >= 7 && options_.allow_flat) {
        flat_by_size[ElementSize(p)].push_back(p);
      } else {
        units.emplace_back(pick < 2 ? 'r' : pick < 5 ? 's' : 'g', p);
      }
    }
  }
  for (int32_t f = 0; f < static_cast<int32_t>(flat_by_size.size()); ++f)
    units.emplace_back('F', f);
  Shuffle(units, rng_);
  for (const auto& [kind, index] : units) {
    switch (kind) {
      case 'f':
        EmitFused(model_.families[index]);
        break;
      case 'F':
        EmitFlat(std::next(flat_by_size.begin(), index)->second);
        break;
      case 'r':
        EmitReplicated(index);
        break;
      case 's':
        EmitSplit(index);
        break;
      default:
        EmitGrid(index);
        break;
    }
  }

  Layout layout = std::move(builder_).Build();
  for (BufferInfo& buffer : layout.buffers) {
    buffer.bytes =
        used_bytes_[{buffer.process, buffer.id}] + (Chance(rng_, 0.3) ? UniformInt(rng_, 1, 9) : 0);
  }
  if (!layout.pieces.empty() && Chance(rng_, options_.same_process_copy)) {
    AddSameProcessCopy(layout);
  }
  layout = ReplicateGroup(std::move(layout), replicas);
  if (layout.role == Role::kRollout && layout.pieces.size() > 1 &&
      Chance(rng_, options_.drop_target_piece)) {
    layout.pieces.erase(layout.pieces.begin() + UniformInt(rng_, 0, layout.pieces.size() - 1));
  }
  Shuffle(layout.pieces, rng_);
  return layout;
}

}  // namespace

LayoutPair RandomLayoutPair(std::mt19937_64& rng, const RandomLayoutOptions& options) {
  const Model model = RandomModel(rng, options);
  const int32_t num_nodes = static_cast<int32_t>(UniformInt(rng, 1, options.max_nodes));
  LayoutPair pair;
  pair.source = SideGenerator(Role::kTrainer, model, num_nodes, options, rng).Generate();
  pair.target = SideGenerator(Role::kRollout, model, num_nodes, options, rng).Generate();
  return pair;
}

Layout ShuffledCopy(const Layout& layout, std::mt19937_64& rng) {
  Layout copy = layout;
  std::vector<int32_t> order = Iota(static_cast<int32_t>(layout.params.size()));
  Shuffle(order, rng);
  std::vector<int32_t> new_index(order.size());
  for (size_t i = 0; i < order.size(); ++i) {
    new_index[order[i]] = static_cast<int32_t>(i);
    copy.params[i] = layout.params[order[i]];
  }
  for (Piece& piece : copy.pieces) piece.param = new_index[piece.param];
  Shuffle(copy.pieces, rng);
  Shuffle(copy.buffers, rng);
  Shuffle(copy.processes, rng);
  return copy;
}

}  // namespace wsync::test
