#include "io/checkpoint_file.hpp"

#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <optional>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.hpp"
#include "core/test_hooks.hpp"
#include "comm/agree.hpp"
#include "io/h5.hpp"
#include "io/h5_probe.hpp"
#include "io/tensor_check.hpp"
#include "comm/mpi_check.hpp"

namespace tessera::io {

namespace {

namespace fs = std::filesystem;

std::uint64_t product(std::span<const std::uint64_t> values) {
  return std::accumulate(values.begin(), values.end(), std::uint64_t{1},
                         [](std::uint64_t a, std::uint64_t b) { return a * b; });
}

}  // namespace

std::uint64_t TensorSlab::elements() const { return by_elements ? (last > first ? last - first : 0) : product(count); }

TensorSlab materialized(const TensorSlab& t, CountedBuffer& buffer) {
  if (t.data != nullptr || !t.fill || t.elements() == 0) return t;
  auto* room = static_cast<float*>(buffer.get(t.elements() * sizeof(float)));
  t.fill(room);
  TensorSlab copy = t;
  copy.data = room;
  copy.fill = nullptr;
  return copy;
}

namespace {

// A bug in the caller, not bad input: the slab does not fit its own shape.
void check_slab(const TensorSlab& t) {
  const std::size_t rank = t.shape.size();
  if (t.by_elements) {
    bool fits = rank > 0 && t.offset.size() == rank && t.count.size() == rank && t.first <= t.last &&
                t.last <= product(t.count) && (t.last == t.first || t.data || t.fill);
    for (std::size_t d = 0; fits && d < rank; ++d) fits = t.offset[d] + t.count[d] <= t.shape[d];
    if (!fits)
      throw std::invalid_argument(fmt::format("checkpoint tensor {}: element range [{}, {}) does "
                                              "not fit its block", t.path, t.first, t.last));
    return;
  }
  if (rank == 0 || t.offset.size() != rank || t.count.size() != rank) {
    throw std::invalid_argument(fmt::format(
        "checkpoint tensor {}: shape, offset and count must have the same rank >= 1", t.path));
  }
  if (product(t.count) == 0) return;
  for (std::size_t d = 0; d < rank; ++d) {
    if (t.offset[d] + t.count[d] > t.shape[d]) {
      throw std::invalid_argument(fmt::format(
          "checkpoint tensor {}: hyperslab [{}, {}) of dimension {} exceeds its size {}", t.path,
          t.offset[d], t.offset[d] + t.count[d], d, t.shape[d]));
    }
  }
  if (t.data == nullptr && !t.fill) {
    throw std::invalid_argument(fmt::format("checkpoint tensor {}: no data", t.path));
  }
}

// Selects the hyperslab (offset, count) of file_space, or nothing if count has a zero, and
// returns a matching one-dimensional memory space.
h5::Dataspace select_slab(hid_t file_space, std::span<const std::uint64_t> offset,
                          std::span<const std::uint64_t> count) {
  const hsize_t elems = product(count);
  hsize_t mem_elems = std::max<hsize_t>(elems, 1);
  h5::Dataspace mem(TESSERA_H5(H5Screate_simple(1, &mem_elems, nullptr)));
  if (elems == 0) {
    TESSERA_H5(H5Sselect_none(file_space));
    TESSERA_H5(H5Sselect_none(mem));
    return mem;
  }
  std::vector<hsize_t> start(offset.begin(), offset.end()), extent(count.begin(), count.end());
  TESSERA_H5(H5Sselect_hyperslab(file_space, H5S_SELECT_SET, start.data(), nullptr, extent.data(),
                                 nullptr));
  return mem;
}

// Appends the hyperslabs covering the row-major elements [lo, hi) of dims[d...] below the fixed
// leading indices `lead`: a partial first row, whole rows, a partial last row, recursively.
void element_blocks(std::span<const std::uint64_t> dims, std::vector<hsize_t> lead,
                    std::uint64_t lo, std::uint64_t hi,
                    std::vector<std::pair<std::vector<hsize_t>, std::vector<hsize_t>>>& out) {
  if (lo >= hi) return;
  const std::size_t d = lead.size();
  const auto block = [&](std::vector<hsize_t> start, hsize_t rows) {
    std::vector<hsize_t> count(d, 1);
    count.push_back(rows);
    for (std::size_t k = d + 1; k < dims.size(); ++k) {
      start.push_back(0);
      count.push_back(dims[k]);
    }
    out.emplace_back(std::move(start), std::move(count));
  };
  const std::uint64_t inner = product(dims.subspan(d + 1));
  if (lo % inner != 0) {  // the partial first row
    const std::uint64_t row = lo / inner, row_end = std::min(hi, (row + 1) * inner);
    auto next = lead;
    next.push_back(row);
    element_blocks(dims, next, lo - row * inner, row_end - row * inner, out);
    lo = row_end;
  }
  if (hi / inner > lo / inner && lo < hi) {  // whole rows
    auto start = lead;
    start.push_back(lo / inner);
    block(start, hi / inner - lo / inner);
    lo = hi / inner * inner;
  }
  if (lo < hi) {  // the partial last row
    auto next = lead;
    next.push_back(lo / inner);
    element_blocks(dims, next, 0, hi - lo, out);
  }
}

// Selects the row-major elements [first, last) of the block (offset, count) of file_space;
// returns a matching memory space.
h5::Dataspace select_elements(hid_t file_space, std::span<const std::uint64_t> offset,
                              std::span<const std::uint64_t> count, std::uint64_t first,
                              std::uint64_t last) {
  hsize_t mem_elems = std::max<hsize_t>(last - first, 1);
  h5::Dataspace mem(TESSERA_H5(H5Screate_simple(1, &mem_elems, nullptr)));
  if (last <= first) {
    TESSERA_H5(H5Sselect_none(file_space));
    TESSERA_H5(H5Sselect_none(mem));
    return mem;
  }
  std::vector<std::pair<std::vector<hsize_t>, std::vector<hsize_t>>> blocks;
  element_blocks(count, {}, first, last, blocks);
  for (auto& [start, extent] : blocks)
    for (std::size_t d = 0; d < start.size(); ++d) start[d] += offset[d];
  for (std::size_t i = 0; i < blocks.size(); ++i)
    TESSERA_H5(H5Sselect_hyperslab(file_space, i == 0 ? H5S_SELECT_SET : H5S_SELECT_OR,
                                   blocks[i].first.data(), nullptr, blocks[i].second.data(), nullptr));
  return mem;
}

// Reads the selection select(file_space) of a float dataset into out: an independent read (no
// collective inside), so a rank whose read fails leaves no other waiting.
template <class Select>
void read_selected(hid_t dataset, float* out, bool any, Select select) {
  h5::Dataspace file_space(TESSERA_H5(H5Dget_space(dataset)));
  h5::Dataspace mem = select(static_cast<hid_t>(file_space));
  h5::PropList xfer = h5::independent_transfer();
  float dummy = 0.0f;
  if (any) TESSERA_H5(H5Dread(dataset, H5T_NATIVE_FLOAT, mem, file_space, xfer, any ? out : &dummy));
}

// Creates tensor t's dataset (contiguous float32, its storage allocated now, never filled: every
// element gets written) with its checksum attribute. Collective.
h5::Dataset create_tensor(hid_t file, const TensorSlab& t, std::uint64_t checksum) {
  std::vector<hsize_t> dims(t.shape.begin(), t.shape.end());
  h5::Dataspace file_space(
      TESSERA_H5(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr)));
  h5::PropList lcpl = h5::intermediate_groups();
  h5::PropList dcpl(TESSERA_H5(H5Pcreate(H5P_DATASET_CREATE)));
  TESSERA_H5(H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER));
  TESSERA_H5(H5Pset_alloc_time(dcpl, H5D_ALLOC_TIME_EARLY));
  h5::Dataset dataset(TESSERA_H5(
      H5Dcreate2(file, t.path.c_str(), H5T_IEEE_F32LE, file_space, lcpl, dcpl, H5P_DEFAULT)));
  h5::write_u64_attr(dataset, kChecksumAttribute, checksum);
  return dataset;
}

// Collective; t has its data (materialized).
void write_tensor(hid_t file, const TensorSlab& t, std::uint64_t checksum, hid_t xfer) {
  h5::Dataset dataset = create_tensor(file, t, checksum);
  h5::Dataspace file_space(TESSERA_H5(H5Dget_space(dataset)));
  const bool any = t.by_elements ? t.last > t.first : product(t.count) > 0;
  h5::Dataspace mem = t.by_elements ? select_elements(file_space, t.offset, t.count, t.first, t.last)
                                    : select_slab(file_space, t.offset, t.count);
  const float dummy = 0.0f;
  const float* data = any ? t.data : &dummy;
  TESSERA_H5(H5Dwrite(dataset, H5T_NATIVE_FLOAT, mem, file_space, xfer, data));
}

// Test hooks (core/test_hooks.hpp), each naming checkpoint steps ("20" or "10,11"), once half of
// the checkpoint's tensors are in the temporary file, before the rename:
//   kill_in_checkpoint: rank 1 (rank 0 when alone) raises SIGKILL: a node lost mid-write.
//   signal_in_checkpoint: every rank raises SIGUSR1: a (second) stop signal arriving while the
//     checkpoint is written.
//   fail_in_checkpoint: rank 1 (rank 0 when alone) fails to write a tensor there, the others
//     write on: the failure must reach every rank (exit 2), not leave them waiting.
//   pause_in_checkpoint: every rank prints a line and waits there until a signal arrives (at most
//     180 s), so a test can signal a run at a known step however fast the machine is
//     (tests/slurm/test_slurm.sh). 180 s: Slurm's warning lands anywhere in a 30-s window, which
//     a test must place after a loaded machine's ranks have reached the pause and before a fast
//     machine's pause ends.
// Unset, they cost one getenv per checkpoint.
bool hook_names_step(test_hooks::StepHook hook, const CheckpointContent& content) {
  const auto step = content.root_attrs.find("step");
  return step != content.root_attrs.end() && test_hooks::names_step(hook, to_string(step->second));
}

void run_test_hooks(MPI_Comm comm, const CheckpointContent& content) {
  int rank = 0, size = 1;
  MPI_CHECK(MPI_Comm_rank(comm, &rank));
  MPI_CHECK(MPI_Comm_size(comm, &size));
  if (hook_names_step(test_hooks::StepHook::fail_in_checkpoint, content) && rank == std::min(1, size - 1))
    h5::fail_with("TESSERA_TEST_FAIL_IN_CHECKPOINT: this rank's write fails (a full disk, say)");
  if (hook_names_step(test_hooks::StepHook::signal_in_checkpoint, content)) std::raise(SIGUSR1);
  if (hook_names_step(test_hooks::StepHook::pause_in_checkpoint, content)) {
    std::fprintf(stderr, "tessera: rank %d: TESSERA_TEST_PAUSE_IN_CHECKPOINT: waiting for a signal\n", rank);
    std::fflush(stderr);
    // A caught signal ends nanosleep early (EINTR); SA_RESTART never restarts it.
    timespec left{180, 0};
    nanosleep(&left, &left);
  }
  if (hook_names_step(test_hooks::StepHook::kill_in_checkpoint, content) && rank == std::min(1, size - 1)) {
    std::fprintf(stderr, "tessera: rank %d: TESSERA_TEST_KILL_IN_CHECKPOINT: SIGKILL mid-checkpoint\n", rank);
    std::fflush(stderr);
    std::raise(SIGKILL);
  }
}

// The checksum of every tensor: each rank sums its own slab (a slab with a fill reads its
// elements; a failure there is agreed before the sums meet), the sums are added over comm. For the
// asynchronous save's layout, made before its data is written.
std::vector<std::uint64_t> tensor_checksums(MPI_Comm comm, const CheckpointContent& content) {
  std::vector<std::uint64_t> sums;
  agree(comm, [&] {
    for (const TensorSlab& t : content.tensors) sums.push_back(check_of(t).sum);
  });
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, sums.data(), static_cast<int>(sums.size()), MPI_UINT64_T,
                          MPI_SUM, comm));
  return sums;
}

// The checkpoint file with its root and group attributes. Collective.
h5::File create_with_attributes(MPI_Comm comm, const std::string& path, const CheckpointContent& content) {
  h5::File file = h5::create_parallel(comm, path);
  for (const auto& [name, value] : content.root_attrs) h5::write_attr(file, name, value);
  h5::write_attr(file, "format", std::string(kCheckpointFormat));
  h5::write_attr(file, "format_version", kCheckpointFormatVersion);
  for (const auto& [group_name, attrs] : content.group_attrs) {
    h5::Group group = h5::open_or_create_group(file, group_name);
    for (const auto& [name, value] : attrs) h5::write_attr(group, name, value);
  }
  return file;
}

// Writes the file; each step that could fail on one rank alone (a tensor's write, the close that
// flushes) is agreed, so a failure reaches every rank together.
// Test hook (core/test_hooks.hpp): fail_in_read = K makes rank 1 (rank 0 when alone) fail its
// K-th tensor read of the process, as a damaged block seen by one rank: the failure must reach
// every rank (exit 2), not leave the others waiting. Unset, one getenv per read.
void read_test_hook(MPI_Comm comm) {
  static long reads = 0;
  const std::optional<long> wanted = test_hooks::fail_in_read();
  if (!wanted) return;
  int rank = 0, size = 1;
  MPI_CHECK(MPI_Comm_rank(comm, &rank));
  MPI_CHECK(MPI_Comm_size(comm, &size));
  if (++reads == *wanted && rank == std::min(1, size - 1))
    h5::fail_with("TESSERA_TEST_FAIL_IN_READ: this rank's read fails (a damaged block)");
}

void write_content(MPI_Comm comm, const std::string& path, const CheckpointContent& content) {
  const h5::InputScope scope(path, "", h5::InputScope::Access::write);
  h5::File file;
  agree(comm, [&] { file = create_with_attributes(comm, path, content); });
  h5::PropList xfer = h5::collective_transfer();
  const std::size_t half = std::max<std::size_t>(1, content.tensors.size() / 2);
  CountedBuffer buffer(mem::Category::param);  // a slab with a fill: its elements, one tensor at a time
  for (std::size_t i = 0; i < content.tensors.size(); ++i) {
    // Each tensor's elements once: the local reads (a slab with a fill) and this rank's part of
    // its checksum, agreed; the checksum summed over comm; then the write.
    TensorSlab t;
    std::uint64_t sum = 0;
    agree(comm, [&] {
      t = materialized(content.tensors[i], buffer);
      sum = check_of(t).sum;
    });
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &sum, 1, MPI_UINT64_T, MPI_SUM, comm));
    agree(comm, [&] {
      write_tensor(file, t, sum, xfer);
      if (i + 1 == half) run_test_hooks(comm, content);
    });
  }
  agree(comm, [&] { file.close(); });
}

void fsync_path(const std::string& path, int flags) {
  int fd = ::open(path.c_str(), flags);
  if (fd < 0) throw InputError(fmt::format("{}: cannot open to sync: {}", path, std::strerror(errno)));
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0) throw InputError(fmt::format("{}: fsync failed: {}", path, std::strerror(err)));
}

void create_parent_directory(const fs::path& path) {
  if (!path.has_parent_path()) return;
  std::error_code ec;
  fs::create_directories(path.parent_path(), ec);
  if (ec) {
    throw InputError(fmt::format("{}: cannot create directory: {}", path.parent_path().string(),
                                 ec.message()));
  }
}

// Checks this rank's slabs (a bug otherwise) and creates the parent directory (rank 0); agreed.
void check_and_create_directory(MPI_Comm comm, const std::string& final_path, const CheckpointContent& content) {
  int rank = 0;
  MPI_CHECK(MPI_Comm_rank(comm, &rank));
  agree(comm, [&] {
    for (const TensorSlab& t : content.tensors) check_slab(t);
    if (rank == 0) create_parent_directory(final_path);
  });
}

// Makes the temporary file durable, then renames it into place and makes the rename durable.
void commit_file(const std::string& tmp_path, const fs::path& final_path) {
  fsync_path(tmp_path, O_RDONLY);
  std::error_code ec;
  fs::rename(tmp_path, final_path, ec);
  if (ec) {
    throw InputError(fmt::format("cannot rename {} to {}: {}", tmp_path, final_path.string(),
                                 ec.message()));
  }
  fs::path dir = final_path.has_parent_path() ? final_path.parent_path() : fs::path(".");
  fsync_path(dir.string(), O_RDONLY | O_DIRECTORY);
}

}  // namespace

void write_checkpoint(MPI_Comm comm, const std::string& final_path,
                      const CheckpointContent& content) {
  // Check this rank's slabs; create the directory.
  check_and_create_directory(comm, final_path, content);

  // Write every tensor collectively into the temporary file.
  write_content(comm, temporary_path(final_path), content);

  // Sync and rename on rank 0; the agreement is the closing barrier.
  commit_checkpoint(comm, final_path);
}

std::string temporary_path(const std::string& final_path) { return final_path + ".tmp"; }

std::vector<std::uint64_t> create_checkpoint_layout(MPI_Comm comm, const std::string& final_path,
                                                    const CheckpointContent& content) {
  check_and_create_directory(comm, final_path, content);
  const std::string path = temporary_path(final_path);
  const std::vector<std::uint64_t> sums = tensor_checksums(comm, content);
  const h5::InputScope scope(path, "", h5::InputScope::Access::write);
  std::vector<std::uint64_t> offsets;
  agree(comm, [&] {
    h5::File file = create_with_attributes(comm, path, content);
    for (std::size_t i = 0; i < content.tensors.size(); ++i) {
      const h5::Dataset dataset = create_tensor(file, content.tensors[i], sums[i]);
      const haddr_t address = H5Dget_offset(dataset);
      if (address == HADDR_UNDEF) h5::fail_with("dataset " + content.tensors[i].path + " has no storage to write into");
      offsets.push_back(address);
    }
    file.close();
  });
  return offsets;
}

void commit_checkpoint(MPI_Comm comm, const std::string& final_path) {
  int rank = 0;
  MPI_CHECK(MPI_Comm_rank(comm, &rank));
  agree(comm, [&] {
    if (rank == 0) commit_file(temporary_path(final_path), final_path);
  });
}

struct CheckpointFile::Impl {
  MPI_Comm comm = MPI_COMM_NULL;
  std::string path;
  h5::File file;
  std::int64_t format_version = 0;  ///< the root attribute, checked at open

  std::int64_t check_format() const;
  std::string missing(const std::string& dataset_path) const {
    return fmt::format("{}: no dataset {}", path, dataset_path);
  }
};

std::int64_t CheckpointFile::Impl::check_format() const {
  std::optional<Attr> format = h5::find_attr(file, "format");
  const std::string* text = format ? std::get_if<std::string>(&*format) : nullptr;
  if (text == nullptr || *text != kCheckpointFormat) {
    throw InputError(fmt::format(
        "{}: not a Tessera checkpoint (root attribute format is {}, expected \"{}\")", path,
        format ? "\"" + to_string(*format) + "\"" : std::string("missing"), kCheckpointFormat));
  }
  std::optional<Attr> version = h5::find_attr(file, "format_version");
  const auto* number = version ? std::get_if<std::int64_t>(&*version) : nullptr;
  if (number == nullptr || *number < 1 || *number > kCheckpointFormatVersion) {
    throw InputError(fmt::format(
        "{}: checkpoint format_version is {}, this Tessera reads 1 to {}", path,
        version ? to_string(*version) : std::string("missing"), kCheckpointFormatVersion));
  }
  return *number;
}

CheckpointFile::CheckpointFile(MPI_Comm comm, const std::string& path)
    : impl_(std::make_unique<Impl>()) {
  impl_->comm = comm;
  impl_->path = path;
  const h5::InputScope scope(path);
  h5::check_openable(comm, path);
  impl_->file = h5::open_parallel(comm, path);
  agree(comm, [&] { impl_->format_version = impl_->check_format(); });
}

CheckpointFile::~CheckpointFile() = default;
CheckpointFile::CheckpointFile(CheckpointFile&&) noexcept = default;
CheckpointFile& CheckpointFile::operator=(CheckpointFile&&) noexcept = default;

const std::string& CheckpointFile::path() const { return impl_->path; }

MPI_Comm CheckpointFile::comm() const { return impl_->comm; }

std::int64_t CheckpointFile::format_version() const { return impl_->format_version; }

std::map<std::string, Attr> CheckpointFile::root_attrs() const {
  const h5::InputScope scope(impl_->path, "root attributes");
  return h5::read_attrs(impl_->file);
}

std::map<std::string, Attr> CheckpointFile::group_attrs(const std::string& group) const {
  const h5::InputScope scope(impl_->path, "group /" + group);
  if (!h5::is_group(impl_->file, group)) return {};
  h5::Group g(TESSERA_H5(H5Gopen2(impl_->file, group.c_str(), H5P_DEFAULT)));
  return h5::read_attrs(g);
}

bool CheckpointFile::has(const std::string& dataset_path) const {
  const h5::InputScope scope(impl_->path);
  return h5::is_dataset(impl_->file, dataset_path);
}

std::vector<std::uint64_t> CheckpointFile::shape(const std::string& dataset_path) const {
  if (!has(dataset_path)) throw InputError(impl_->missing(dataset_path));
  const h5::InputScope scope(impl_->path, "dataset " + dataset_path);
  h5::Dataset dataset(TESSERA_H5(H5Dopen2(impl_->file, dataset_path.c_str(), H5P_DEFAULT)));
  std::vector<hsize_t> dims = h5::dims(dataset);
  if (dims.empty()) h5::fail_with("a scalar, expected a tensor of rank >= 1");
  h5::check_storage(dataset, dataset_path);  // no buffer is sized by a shape the file does not hold
  return {dims.begin(), dims.end()};
}

std::vector<std::string> CheckpointFile::list(const std::string& group) const {
  const h5::InputScope scope(impl_->path, "group /" + group);
  return h5::list_datasets(impl_->file, group);
}

void CheckpointFile::verify(const std::vector<TensorCheck>& parts) const {
  // Add the parts over the ranks: checksums modulo 2^64, the first non-finite index by minimum.
  std::vector<std::uint64_t> sums, firsts;
  for (const TensorCheck& p : parts) {
    sums.push_back(p.sum);
    firsts.push_back(p.first_non_finite);
  }
  const int n = static_cast<int>(parts.size());
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, sums.data(), n, MPI_UINT64_T, MPI_SUM, impl_->comm));
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, firsts.data(), n, MPI_UINT64_T, MPI_MIN, impl_->comm));
  agree(impl_->comm, [&] {
    for (std::size_t i = 0; i < parts.size(); ++i) {
      const std::string& ds = parts[i].path;
      const h5::InputScope scope(impl_->path, "dataset " + ds);
      if (firsts[i] != TensorCheck::kNone)
        throw InputError(fmt::format("{}: dataset {} holds a NaN or infinite value at element {} "
                                     "(a checkpoint never does: the file is damaged)", impl_->path,
                                     ds, firsts[i]));
      h5::Dataset dataset(TESSERA_H5(H5Dopen2(impl_->file, ds.c_str(), H5P_DEFAULT)));
      const std::optional<std::uint64_t> stored = h5::find_u64_attr(dataset, kChecksumAttribute);
      if (!stored && impl_->format_version >= 2)
        throw InputError(fmt::format("{}: dataset {} has no attribute {} (format_version {} stores "
                                     "one with every tensor): the file is damaged", impl_->path, ds,
                                     kChecksumAttribute, impl_->format_version));
      if (stored && *stored != sums[i])
        throw InputError(fmt::format("{}: dataset {} does not match its checksum (stored {:#018x}, "
                                     "its values give {:#018x}): the file is damaged", impl_->path,
                                     ds, *stored, sums[i]));
    }
  });
}

void CheckpointFile::read(const std::string& dataset_path, std::span<const std::uint64_t> offset,
                          std::span<const std::uint64_t> count, float* out) const {
  const h5::InputScope scope(impl_->path, "dataset " + dataset_path);
  h5::Dataset dataset;
  agree(impl_->comm, [&] {
    std::vector<std::uint64_t> dims = shape(dataset_path);
    dataset = h5::Dataset(TESSERA_H5(H5Dopen2(impl_->file, dataset_path.c_str(), H5P_DEFAULT)));
    h5::Datatype type(TESSERA_H5(H5Dget_type(dataset)));
    if (!h5::is_ieee_float(type)) {
      throw InputError(fmt::format("{}: dataset {} has type {}, expected float32", impl_->path,
                                   dataset_path, h5::type_name(type)));
    }
    bool fits = offset.size() == dims.size() && count.size() == dims.size();
    for (std::size_t d = 0; fits && d < dims.size(); ++d) fits = offset[d] + count[d] <= dims[d];
    if (!fits && product(count) > 0) {
      throw InputError(fmt::format("{}: dataset {} has shape [{}], cannot read [{}] at [{}]",
                                   impl_->path, dataset_path, fmt::join(dims, ","),
                                   fmt::join(count, ","), fmt::join(offset, ",")));
    }
    if (product(count) > 0 && out == nullptr) {
      throw std::invalid_argument("CheckpointFile::read: null output buffer");
    }
    read_test_hook(impl_->comm);
    read_selected(dataset, out, product(count) > 0, [&](hid_t file_space) {
      return select_slab(file_space, offset, count);
    });
  });
}

void CheckpointFile::read_elements(const std::string& dataset_path,
                                   std::span<const std::uint64_t> offset,
                                   std::span<const std::uint64_t> count, std::uint64_t first,
                                   std::uint64_t last, float* out) const {
  const h5::InputScope scope(impl_->path, "dataset " + dataset_path);
  h5::Dataset dataset;
  std::vector<std::uint64_t> dims;
  agree(impl_->comm, [&] {
    dims = shape(dataset_path);
    dataset = h5::Dataset(TESSERA_H5(H5Dopen2(impl_->file, dataset_path.c_str(), H5P_DEFAULT)));
    h5::Datatype type(TESSERA_H5(H5Dget_type(dataset)));
    if (!h5::is_ieee_float(type))
      throw InputError(fmt::format("{}: dataset {} has type {}, expected float32", impl_->path,
                                   dataset_path, h5::type_name(type)));
    bool fits = offset.size() == dims.size() && count.size() == dims.size() && first <= last &&
                last <= product(count);
    for (std::size_t d = 0; fits && d < dims.size(); ++d) fits = offset[d] + count[d] <= dims[d];
    if (!fits)
      throw InputError(fmt::format("{}: dataset {} has shape [{}], cannot read elements [{}, {}) of "
                                   "[{}] at [{}]", impl_->path, dataset_path, fmt::join(dims, ","),
                                   first, last, fmt::join(count, ","), fmt::join(offset, ",")));
    if (last > first && out == nullptr)
      throw std::invalid_argument("CheckpointFile::read_elements: null output buffer");
    read_test_hook(impl_->comm);
    read_selected(dataset, out, last > first, [&](hid_t file_space) {
      return select_elements(file_space, offset, count, first, last);
    });
  });
}


}  // namespace tessera::io
