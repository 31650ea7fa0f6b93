#include "io/inspect.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.hpp"
#include "io/checkpoint_file.hpp"
#include "io/h5.hpp"
#include "io/h5_probe.hpp"
#include "io/tensor_check.hpp"

namespace tessera::io {

namespace {

struct TensorRow {
  std::string name, shape, dtype, norm, min, max;
};

// One dataset's row of the table: shape, type and, for numbers, its norm and range, read a block
// of rows at a time. A float32 dataset that carries a checksum (a checkpoint tensor) must match
// it, and a checkpoint tensor must hold no NaN or infinity: otherwise the file is damaged.
TensorRow summarize(hid_t file, const std::string& name, bool checkpoint) {
  h5::Dataset dataset(TESSERA_H5(H5Dopen2(file, name.c_str(), H5P_DEFAULT)));
  h5::Datatype type(TESSERA_H5(H5Dget_type(dataset)));
  std::vector<hsize_t> dims = h5::dims(dataset);
  TensorRow row{name, fmt::format("[{}]", fmt::join(dims, ",")), h5::type_name(type), "-", "-", "-"};
  const H5T_class_t kind = H5Tget_class(type);
  if (kind != H5T_FLOAT && kind != H5T_INTEGER) return row;
  if (kind == H5T_FLOAT && !h5::is_ieee_float(type)) return row;  // not read: HDF5 converts those wrongly
  h5::check_storage(dataset, name);  // nothing sized by a shape the file does not hold

  // Read in blocks of rows so a large dataset needs little memory.
  const hsize_t rows = dims.empty() ? 1 : dims[0];
  hsize_t row_elems = 1;
  for (std::size_t d = 1; d < dims.size(); ++d) row_elems *= dims[d];
  if (rows == 0 || row_elems == 0) return row;
  const std::optional<std::uint64_t> stored = h5::find_u64_attr(dataset, kChecksumAttribute);
  const bool float32 = h5::is_ieee_float(type) && H5Tget_size(type) == 4;
  const hsize_t block = std::max<hsize_t>(1, (hsize_t{1} << 20) / row_elems);
  h5::Dataspace file_space(TESSERA_H5(H5Dget_space(dataset)));
  std::vector<double> values;
  std::vector<float> floats;
  std::uint64_t checksum = 0;
  double sum_sq = 0.0, lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (hsize_t first = 0; first < rows; first += block) {
    const hsize_t take = std::min(block, rows - first);
    hsize_t elems = take * row_elems;
    values.resize(elems);
    h5::Dataspace mem(TESSERA_H5(H5Screate_simple(1, &elems, nullptr)));
    if (!dims.empty()) {
      std::vector<hsize_t> start(dims.size(), 0), count = dims;
      start[0] = first;
      count[0] = take;
      TESSERA_H5(H5Sselect_hyperslab(file_space, H5S_SELECT_SET, start.data(), nullptr,
                                     count.data(), nullptr));
    }
    if (float32) {
      floats.resize(elems);
      TESSERA_H5(H5Dread(dataset, H5T_NATIVE_FLOAT, mem, file_space, H5P_DEFAULT, floats.data()));
      for (hsize_t k = 0; k < elems; ++k) {
        values[k] = floats[k];
        checksum += element_checksum(first * row_elems + k, floats[k]);
        if (checkpoint && !std::isfinite(floats[k]))
          h5::fail_with(fmt::format("dataset {} holds {} at element {} (a checkpoint never holds NaN "
                                    "or infinity: the file is damaged)", name, floats[k],
                                    first * row_elems + k));
      }
    } else {
      TESSERA_H5(H5Dread(dataset, H5T_NATIVE_DOUBLE, mem, file_space, H5P_DEFAULT, values.data()));
    }
    for (double v : values) {
      sum_sq += v * v;
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
  }
  if (stored && float32 && *stored != checksum)
    h5::fail_with(fmt::format("dataset {} does not match its checksum (stored {:#018x}, its values "
                              "give {:#018x}): the file is damaged", name, *stored, checksum));
  row.norm = fmt::format("{:.6g}", std::sqrt(sum_sq));
  row.min = fmt::format("{:.6g}", lo);
  row.max = fmt::format("{:.6g}", hi);
  return row;
}

void print_attrs(const std::map<std::string, Attr>& attrs, std::ostream& out) {
  std::size_t width = 0;
  for (const auto& [name, value] : attrs) width = std::max(width, name.size());
  for (const auto& [name, value] : attrs) {
    if (name != "deck") out << fmt::format("  {:<{}}  {}\n", name, width, to_string(value));
  }
  auto deck = attrs.find("deck");
  if (deck == attrs.end()) return;
  out << "  deck:\n";
  std::istringstream lines(to_string(deck->second));
  for (std::string line; std::getline(lines, line);) out << "    " << line << '\n';
}

void print_table(const std::vector<TensorRow>& rows, std::ostream& out) {
  TensorRow header{"dataset", "shape", "dtype", "l2_norm", "min", "max"};
  std::size_t w[6] = {};
  auto widen = [&](const TensorRow& r) {
    const std::string* cells[6] = {&r.name, &r.shape, &r.dtype, &r.norm, &r.min, &r.max};
    for (int c = 0; c < 6; ++c) w[c] = std::max(w[c], cells[c]->size());
  };
  widen(header);
  for (const TensorRow& r : rows) widen(r);
  auto print = [&](const TensorRow& r) {
    out << fmt::format("{:<{}}  {:<{}}  {:<{}}  {:>{}}  {:>{}}  {:>{}}\n", r.name, w[0], r.shape,
                       w[1], r.dtype, w[2], r.norm, w[3], r.min, w[4], r.max, w[5]);
  };
  print(header);
  for (const TensorRow& r : rows) print(r);
}

// The values of a group's small one-dimensional float datasets (a unet's normalisation
// statistics, one per channel), one line each; larger ones are left to the table.
void print_small_tensors(hid_t file, const std::string& group, std::ostream& out) {
  for (const std::string& name : h5::list_datasets(file, group)) {
    h5::Dataset dataset(TESSERA_H5(H5Dopen2(file, name.c_str(), H5P_DEFAULT)));
    h5::Datatype type(TESSERA_H5(H5Dget_type(dataset)));
    const std::vector<hsize_t> dims = h5::dims(dataset);
    if (!h5::is_ieee_float(type) || dims.size() != 1 || dims[0] == 0 || dims[0] > 64) continue;
    h5::check_storage(dataset, name);
    std::vector<double> values(dims[0]);
    TESSERA_H5(H5Dread(dataset, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()));
    out << fmt::format("  {}  [{:.9g}]\n", name.substr(group.size() + 1), fmt::join(values, ", "));
  }
}

}  // namespace

void inspect_checkpoint(const std::string& path, std::ostream& out) {
  h5::check_openable(MPI_COMM_SELF, path);
  const h5::InputScope scope(path);
  h5::File file = h5::open_serial(path);

  out << path << '\n';
  const std::map<std::string, Attr> root = h5::read_attrs(file);
  const auto format = root.find("format");
  const bool checkpoint = format != root.end() && format->second == Attr(std::string(kCheckpointFormat));
  print_attrs(root, out);
  for (const char* group : {"optimizer", "train", "normalization"}) {
    if (!h5::is_group(file, group)) continue;
    h5::Group g(TESSERA_H5(H5Gopen2(file, group, H5P_DEFAULT)));
    std::map<std::string, Attr> attrs = h5::read_attrs(g);
    const bool values = std::string(group) == "normalization";  // a unet's statistics, per channel
    if (attrs.empty() && !values) continue;
    out << '\n' << group << ":\n";
    print_attrs(attrs, out);
    if (values) print_small_tensors(file, group, out);
  }

  std::vector<TensorRow> rows;
  for (const std::string& name : h5::list_datasets(file, "")) rows.push_back(summarize(file, name, checkpoint));
  out << '\n';
  print_table(rows, out);
}

}  // namespace tessera::io
