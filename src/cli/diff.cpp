// `tessera diff A B`: per-tensor maximum absolute and relative differences of two checkpoints,
// the attributes that differ, a summary, and an exit code for scripts.
#include "cli/diff.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <iostream>
#include <set>
#include <utility>
#include <vector>

#include "cli/commands.hpp"
#include "cli/tensor_diff.hpp"
#include "comm/agree.hpp"
#include "comm/communicator.hpp"
#include "core/error.hpp"
#include "io/checkpoint_file.hpp"
#include "io/tensor_check.hpp"
#include "train/field_norm.hpp"

namespace tessera::cli {

namespace {

using Shape = std::vector<std::uint64_t>;

// Elements per read of one file on one rank: two float buffers of 4 MiB bound the memory.
constexpr std::uint64_t kBlockElements = std::uint64_t{1} << 20;

enum class Status { equal, differs, exceeds, only_in_a, only_in_b, shape_differs };

const char* name_of(Status s) {
  switch (s) {
    case Status::equal: return "equal";
    case Status::differs: return "differs";
    case Status::exceeds: return "exceeds";
    case Status::only_in_a: return "only_in_a";
    case Status::only_in_b: return "only_in_b";
    case Status::shape_differs: return "shape_differs";
  }
  return "?";
}

struct Row {
  std::string name;
  Shape shape_a, shape_b;  ///< empty where the file lacks the tensor
  Status status = Status::equal;
  TensorDiff diff;         ///< meaningful when compared()

  bool compared() const {
    return status == Status::equal || status == Status::differs || status == Status::exceeds;
  }
};

// "model/...", the field statistics a unet standardises with ("normalization/...", where the file
// stores them: part of what the model computes, so also under model_only), then, unless
// model_only, "optimizer/...".
std::vector<std::string> tensor_names(const io::CheckpointFile& f, bool model_only) {
  std::vector<std::string> names = f.list("model");
  for (const char* name : kFieldNormTensors)
    if (f.has(name)) names.emplace_back(name);
  if (!model_only) {
    const std::vector<std::string> state = f.list("optimizer");
    names.insert(names.end(), state.begin(), state.end());
  }
  return names;
}

// [64,784] in the table; 64x784 in the CSV, free of commas.
std::string bracketed(const Shape& s) { return fmt::format("[{}]", fmt::join(s, ",")); }
std::string crossed(const Shape& s) { return fmt::format("{}", fmt::join(s, "x")); }

std::string shape_cell(const Row& r, std::string (*show)(const Shape&)) {
  if (r.status == Status::shape_differs) return fmt::format("{} vs {}", show(r.shape_a), show(r.shape_b));
  return show(r.shape_a.empty() ? r.shape_b : r.shape_a);
}

// The rows [begin, end) of `rows` that rank r of n compares: contiguous, as the checkpointer
// splits them.
std::pair<std::uint64_t, std::uint64_t> rank_rows(std::uint64_t rows, int r, int n) {
  const auto un = static_cast<std::uint64_t>(n), ur = static_cast<std::uint64_t>(r);
  const std::uint64_t q = rows / un, extra = rows % un;
  const std::uint64_t begin = ur * q + std::min(ur, extra);
  return {begin, begin + q + (ur < extra ? 1 : 0)};
}

// Reads this rank's rows of one tensor from both files, a block at a time, and reduces the maxima
// over the ranks. Collective: every rank makes the same number of reads, some of nothing.
TensorDiff compare_tensor(const Communicator& comm, const io::CheckpointFile& a,
                          const io::CheckpointFile& b, const std::string& name, const Shape& shape,
                          io::TensorCheck& check_a, io::TensorCheck& check_b) {
  const std::uint64_t rows = shape[0];
  std::uint64_t row_elems = 1;
  for (std::size_t d = 1; d < shape.size(); ++d) row_elems *= shape[d];
  const auto ranks = static_cast<std::uint64_t>(comm.size());
  const auto [begin, end] = rank_rows(rows, comm.rank(), comm.size());
  const std::uint64_t block = std::max<std::uint64_t>(1, kBlockElements / std::max<std::uint64_t>(1, row_elems));
  const std::uint64_t reads = ((rows + ranks - 1) / ranks + block - 1) / block;

  TensorDiff d;
  std::vector<float> va, vb;
  Shape offset(shape.size(), 0), count = shape;
  for (std::uint64_t i = 0; i < reads; ++i) {
    offset[0] = std::min(begin + i * block, end);
    count[0] = std::min(block, end - offset[0]);
    const std::size_t elems = count[0] * row_elems;
    va.resize(elems);
    vb.resize(elems);
    a.read(name, offset, count, va.data());
    b.read(name, offset, count, vb.data());
    d.add(va.data(), vb.data(), elems);
    // What was read, for the files' checksums (the ranks' rows cover each tensor once).
    io::TensorSlab slab{name, shape, offset, count, va.data()};
    check_a.merge(io::check_of(slab));
    slab.data = vb.data();
    check_b.merge(io::check_of(slab));
  }
  double maxima[2] = {d.max_abs, d.max_scale};
  comm.allreduce_max(maxima, 2, Group::world);
  return TensorDiff{maxima[0], maxima[1]};
}

std::vector<Row> compare_all(const Communicator& comm, const io::CheckpointFile& a,
                             const io::CheckpointFile& b, const DiffArgs& args) {
  const std::vector<std::string> in_a = tensor_names(a, args.model_only);
  const std::vector<std::string> in_b = tensor_names(b, args.model_only);
  std::set<std::string> names(in_a.begin(), in_a.end());
  names.insert(in_b.begin(), in_b.end());

  std::vector<Row> rows;
  std::vector<io::TensorCheck> checks_a, checks_b;
  for (const std::string& name : names) {
    Row r;
    r.name = name;
    if (a.has(name)) r.shape_a = a.shape(name);
    if (b.has(name)) r.shape_b = b.shape(name);
    for (const auto* f : {&a, &b}) {
      if (f->has(name) && f->shape(name).empty()) {
        throw InputError(fmt::format("{}: dataset {} is a scalar; checkpoint tensors have rank >= 1",
                                     f->path(), name));
      }
    }
    if (r.shape_b.empty()) {
      r.status = Status::only_in_a;
    } else if (r.shape_a.empty()) {
      r.status = Status::only_in_b;
    } else if (r.shape_a != r.shape_b) {
      r.status = Status::shape_differs;
    } else {
      checks_a.push_back(io::TensorCheck{name});
      checks_b.push_back(io::TensorCheck{name});
      r.diff = compare_tensor(comm, a, b, name, r.shape_a, checks_a.back(), checks_b.back());
      r.status = r.diff.max_abs == 0.0                                   ? Status::equal
                 : args.tolerance && r.diff.max_rel() > *args.tolerance ? Status::exceeds
                                                                         : Status::differs;
    }
    rows.push_back(std::move(r));
  }
  // Damage is an error, not a difference.
  a.verify(checks_a);
  b.verify(checks_b);
  return rows;
}

std::string quoted(const io::Attr& value) {
  if (std::holds_alternative<std::string>(value)) return fmt::format("\"{}\"", io::to_string(value));
  return io::to_string(value);
}

// (name, what differs) for each attribute (root, and /optimizer and /train unless model_only)
// whose values differ or that only one file has. `created` is not compared; the multi-line `deck`
// is not printed.
std::vector<std::pair<std::string, std::string>> attribute_differences(
    const io::CheckpointFile& a, const io::CheckpointFile& b, bool model_only) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const std::string group : {"", "optimizer", "train"}) {
    if (model_only && !group.empty()) break;
    const auto in_a = group.empty() ? a.root_attrs() : a.group_attrs(group);
    const auto in_b = group.empty() ? b.root_attrs() : b.group_attrs(group);
    std::set<std::string> keys;
    for (const auto& [key, value] : in_a) keys.insert(key);
    for (const auto& [key, value] : in_b) keys.insert(key);
    for (const std::string& key : keys) {
      if (group.empty() && key == "created") continue;
      const auto ia = in_a.find(key), ib = in_b.find(key);
      const bool has_a = ia != in_a.end(), has_b = ib != in_b.end();
      if (has_a && has_b && ia->second == ib->second) continue;
      std::string label = group.empty() ? key : fmt::format("{}/{}", group, key);
      if (has_a && has_b && key == "deck") {
        out.emplace_back(std::move(label), "differs (tessera inspect prints each)");
        continue;
      }
      const auto show = [&](bool has, const auto& it) {
        if (!has) return std::string("(absent)");
        return key == "deck" ? std::string("(present)") : quoted(it->second);
      };
      out.emplace_back(std::move(label), fmt::format("A {}  B {}", show(has_a, ia), show(has_b, ib)));
    }
  }
  return out;
}

std::string header_line(char which, const io::CheckpointFile& f) {
  const auto attrs = f.root_attrs();
  std::string line = fmt::format("{}  {}", which, f.path());
  for (const char* key : {"step", "layout"}) {
    const auto it = attrs.find(key);
    if (it != attrs.end()) line += fmt::format("  {} {}", key, io::to_string(it->second));
  }
  return line;
}

void print_table(const std::vector<Row>& rows, std::ostream& out) {
  struct Cells {
    std::string name, shape, max_abs, max_rel, status;
  };
  std::vector<Cells> cells{{"tensor", "shape", "max_abs", "max_rel", "status"}};
  for (const Row& r : rows) {
    const bool c = r.compared();
    cells.push_back({r.name, shape_cell(r, bracketed), c ? fmt::format("{:.3e}", r.diff.max_abs) : "-",
                     c ? fmt::format("{:.3e}", r.diff.max_rel()) : "-", name_of(r.status)});
  }
  std::size_t w[4] = {};
  for (const Cells& c : cells) {
    w[0] = std::max(w[0], c.name.size());
    w[1] = std::max(w[1], c.shape.size());
    w[2] = std::max(w[2], c.max_abs.size());
    w[3] = std::max(w[3], c.max_rel.size());
  }
  for (const Cells& c : cells) {
    out << fmt::format("{:<{}}  {:<{}}  {:>{}}  {:>{}}  {}\n", c.name, w[0], c.shape, w[1], c.max_abs,
                       w[2], c.max_rel, w[3], c.status);
  }
}

struct Summary {
  std::size_t compared = 0, exceeds = 0, only_in_a = 0, only_in_b = 0, shapes = 0;
  const Row* worst_abs = nullptr;  ///< the compared tensor with the largest max_abs
  const Row* worst_rel = nullptr;  ///< ... and with the largest max_rel

  /// Tensor sets or shapes differ, or a tensor exceeds the tolerance: exit 1 under --tolerance.
  bool differ() const { return exceeds + only_in_a + only_in_b + shapes > 0; }
};

Summary summarize(const std::vector<Row>& rows) {
  Summary s;
  for (const Row& r : rows) {
    s.exceeds += r.status == Status::exceeds;
    s.only_in_a += r.status == Status::only_in_a;
    s.only_in_b += r.status == Status::only_in_b;
    s.shapes += r.status == Status::shape_differs;
    if (!r.compared()) continue;
    ++s.compared;
    if (!s.worst_abs || r.diff.max_abs > s.worst_abs->diff.max_abs) s.worst_abs = &r;
    if (!s.worst_rel || r.diff.max_rel() > s.worst_rel->diff.max_rel()) s.worst_rel = &r;
  }
  return s;
}

void print_summary(const Summary& s, std::size_t tensors, const DiffArgs& args, std::ostream& out) {
  std::string line = fmt::format("{} tensors: {} compared, {} only in A, {} only in B, {} with different shapes",
                                 tensors, s.compared, s.only_in_a, s.only_in_b, s.shapes);
  if (s.worst_abs != nullptr) {
    line += fmt::format("; max_abs {:.3e} ({}), max_rel {:.3e} ({})", s.worst_abs->diff.max_abs,
                        s.worst_abs->name, s.worst_rel->diff.max_rel(), s.worst_rel->name);
  }
  out << line << '\n';
  if (!args.tolerance) return;
  if (s.differ()) {
    out << fmt::format("tolerance {:g}: FAILED ({} tensors exceed it, {} in one file only, {} with "
                       "different shapes)\n",
                       *args.tolerance, s.exceeds, s.only_in_a + s.only_in_b, s.shapes);
  } else {
    out << fmt::format("tolerance {:g}: passed\n", *args.tolerance);
  }
}

void write_csv(const std::vector<Row>& rows, const std::string& path) {
  std::ofstream out(path);
  if (!out) throw InputError(fmt::format("diff --csv {}: cannot open for writing", path));
  out << "name,shape,max_abs,max_rel,status\n";
  for (const Row& r : rows) {
    const bool c = r.compared();
    out << fmt::format("{},{},{},{},{}\n", r.name, shape_cell(r, crossed),
                       c ? fmt::format("{}", r.diff.max_abs) : std::string(),
                       c ? fmt::format("{}", r.diff.max_rel()) : std::string(), name_of(r.status));
  }
  if (!out.flush()) throw InputError(fmt::format("diff --csv {}: write failed", path));
}

}  // namespace

int diff(const DiffArgs& args) {
  if (args.tolerance && !(*args.tolerance >= 0.0)) {
    throw InputError(fmt::format("diff --tolerance {}: must be a relative difference >= 0", *args.tolerance));
  }
  const Communicator comm(MPI_COMM_WORLD, world_size(), 1, 1);
  const io::CheckpointFile a(comm.handle(), args.a);
  const io::CheckpointFile b(comm.handle(), args.b);
  const std::vector<Row> rows = compare_all(comm, a, b, args);

  // Every rank holds the same rows (the maxima are reduced), so every rank reaches the same verdict.
  const Summary summary = summarize(rows);
  if (comm.is_root()) {
    std::cout << header_line('A', a) << '\n' << header_line('B', b) << '\n';
    const auto attrs = attribute_differences(a, b, args.model_only);
    std::cout << (attrs.empty() ? "attributes: the same (created aside)\n" : "attributes that differ:\n");
    std::size_t width = 0;
    for (const auto& [name, what] : attrs) width = std::max(width, name.size());
    for (const auto& [name, what] : attrs) std::cout << fmt::format("  {:<{}}  {}\n", name, width, what);
    std::cout << '\n';
    print_table(rows, std::cout);
    std::cout << '\n';
    print_summary(summary, rows.size(), args, std::cout);
    std::cout << std::flush;
  }
  agree(comm.handle(), [&] {
    if (comm.is_root() && !args.csv.empty()) write_csv(rows, args.csv);
  });
  return args.tolerance && summary.differ() ? kDiffExitDiffers : 0;
}

}  // namespace tessera::cli
