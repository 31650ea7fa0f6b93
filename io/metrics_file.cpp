#include "io/metrics_file.hpp"

#include <cmath>
#include <limits>
#include <map>
#include <stdexcept>

#include <fmt/format.h>

#include "core/error.hpp"
#include "io/h5.hpp"

namespace tessera::io {

namespace {
constexpr hsize_t chunk_rows = 256;

// Serial driver, and no file lock: the writer keeps the file open for the whole run, and an
// exclusive lock would stop h5py from reading it while the run goes on.
h5::File create_unlocked(const std::string& path) {
  h5::silence_errors();
  h5::PropList fapl(TESSERA_H5(H5Pcreate(H5P_FILE_ACCESS)));
#if H5_VERSION_GE(1, 10, 7)
  TESSERA_H5(H5Pset_file_locking(fapl, false, true));
#endif
  const hid_t file = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
  if (file < 0) throw std::runtime_error(fmt::format("{}: cannot create the metrics file", path));
  return h5::File(file);
}
}  // namespace

struct MetricsFile::Impl {
  struct Column {
    h5::Dataset dataset;
    bool integer = false;
  };
  std::string path;
  h5::File file;
  std::map<std::string, std::vector<Column>> groups;
  std::map<std::string, hsize_t> rows;
};

MetricsFile::MetricsFile(const std::string& path, const std::vector<MetricsGroup>& groups)
    : impl_(std::make_unique<Impl>()) {
  impl_->path = path;
  impl_->file = create_unlocked(path);
  h5::write_attr(impl_->file, "format", std::string(kMetricsFormat));
  h5::write_attr(impl_->file, "format_version", kMetricsFormatVersion);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (const auto& [name, columns] : groups) {
    h5::Group group = h5::open_or_create_group(impl_->file, name);
    auto& out = impl_->groups[name];
    impl_->rows[name] = 0;
    for (const MetricsColumn& c : columns) {
      const hsize_t dims = 0, max_dims = H5S_UNLIMITED;
      h5::Dataspace space(TESSERA_H5(H5Screate_simple(1, &dims, &max_dims)));
      h5::PropList dcpl(TESSERA_H5(H5Pcreate(H5P_DATASET_CREATE)));
      TESSERA_H5(H5Pset_chunk(dcpl, 1, &chunk_rows));
      if (!c.integer) TESSERA_H5(H5Pset_fill_value(dcpl, H5T_NATIVE_DOUBLE, &nan));
      const hid_t type = c.integer ? H5T_STD_I64LE : H5T_IEEE_F64LE;
      out.push_back({h5::Dataset(TESSERA_H5(H5Dcreate2(group, c.name.c_str(), type, space,
                                                       H5P_DEFAULT, dcpl, H5P_DEFAULT))),
                     c.integer});
    }
  }
  TESSERA_H5(H5Fflush(impl_->file, H5F_SCOPE_LOCAL));
}

MetricsFile::~MetricsFile() = default;
MetricsFile::MetricsFile(MetricsFile&&) noexcept = default;
MetricsFile& MetricsFile::operator=(MetricsFile&&) noexcept = default;

void MetricsFile::append(const std::string& group, std::span<const double> values) {
  const auto it = impl_->groups.find(group);
  if (it == impl_->groups.end())
    throw std::invalid_argument(fmt::format("{}: no metrics group {}", impl_->path, group));
  const auto& columns = it->second;
  if (columns.empty() || values.size() % columns.size() != 0)
    throw std::invalid_argument(fmt::format("{}: {} values do not make rows of the {} columns of /{}",
                                            impl_->path, values.size(), columns.size(), group));
  const hsize_t n = values.size() / columns.size();
  if (n == 0) return;
  hsize_t& rows = impl_->rows[group];
  const hsize_t new_rows = rows + n;
  h5::Dataspace mem(TESSERA_H5(H5Screate_simple(1, &n, nullptr)));
  std::vector<double> column(n);
  std::vector<std::int64_t> integers(n);
  for (std::size_t c = 0; c < columns.size(); ++c) {
    for (hsize_t r = 0; r < n; ++r) column[r] = values[r * columns.size() + c];
    const h5::Dataset& dataset = columns[c].dataset;
    TESSERA_H5(H5Dset_extent(dataset, &new_rows));
    h5::Dataspace file_space(TESSERA_H5(H5Dget_space(dataset)));
    TESSERA_H5(H5Sselect_hyperslab(file_space, H5S_SELECT_SET, &rows, nullptr, &n, nullptr));
    if (columns[c].integer) {
      for (hsize_t r = 0; r < n; ++r) integers[r] = std::llround(column[r]);
      TESSERA_H5(H5Dwrite(dataset, H5T_NATIVE_INT64, mem, file_space, H5P_DEFAULT, integers.data()));
    } else {
      TESSERA_H5(H5Dwrite(dataset, H5T_NATIVE_DOUBLE, mem, file_space, H5P_DEFAULT, column.data()));
    }
  }
  rows = new_rows;
  TESSERA_H5(H5Fflush(impl_->file, H5F_SCOPE_LOCAL));
}

std::vector<double> read_metrics_column(const std::string& path, const std::string& group,
                                        const std::string& column) {
  if (auto why = h5::describe_unreadable(path)) throw InputError(*why);
  h5::File file = h5::open_serial(path);
  const std::string name = group + "/" + column;
  if (!h5::is_dataset(file, name)) throw InputError(fmt::format("{}: no dataset /{}", path, name));
  h5::Dataset dataset(TESSERA_H5(H5Dopen2(file, name.c_str(), H5P_DEFAULT)));
  const std::vector<hsize_t> dims = h5::dims(dataset);
  std::vector<double> out(dims.empty() ? 0 : dims[0]);
  if (!out.empty())
    TESSERA_H5(H5Dread(dataset, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()));
  return out;
}

}  // namespace tessera::io
