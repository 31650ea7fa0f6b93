#include "io/field_writer.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <stdexcept>

#include "io/h5.hpp"

namespace tessera::io {

struct FieldWriter::Impl {
  h5::File file;
  h5::PropList xfer;
  std::map<std::string, h5::Dataset> datasets;
};

FieldWriter::FieldWriter(MPI_Comm comm, const std::string& path)
    : impl_(std::make_unique<Impl>(Impl{h5::create_parallel(comm, path), h5::collective_transfer(), {}})) {}

FieldWriter::~FieldWriter() = default;

void FieldWriter::create(const std::string& dataset, const std::vector<std::uint64_t>& shape) {
  if (shape.size() != 4) throw std::invalid_argument("FieldWriter::create: fields are [N, C, H, W]");
  const std::vector<hsize_t> dims(shape.begin(), shape.end());
  h5::Dataspace space(TESSERA_H5(H5Screate_simple(4, dims.data(), nullptr)));
  h5::PropList lcpl = h5::intermediate_groups();
  h5::PropList dcpl(TESSERA_H5(H5Pcreate(H5P_DATASET_CREATE)));
  TESSERA_H5(H5Pset_alloc_time(dcpl, H5D_ALLOC_TIME_EARLY));
  impl_->datasets[dataset] = h5::Dataset(
      TESSERA_H5(H5Dcreate2(impl_->file, dataset.c_str(), H5T_IEEE_F32LE, space, lcpl, dcpl, H5P_DEFAULT)));
}

void FieldWriter::write_rows(const std::string& dataset, std::uint64_t first, std::uint64_t count,
                             std::uint64_t row0, std::uint64_t rows, const float* data) {
  const auto it = impl_->datasets.find(dataset);
  if (it == impl_->datasets.end()) throw std::invalid_argument("FieldWriter::write_rows: no dataset " + dataset);
  const hid_t d = it->second;
  const std::vector<hsize_t> dims = h5::dims(d);
  h5::Dataspace file_space(TESSERA_H5(H5Dget_space(d)));
  const hsize_t start[4] = {first, 0, row0, 0}, extent[4] = {count, dims[1], rows, dims[3]};
  const hsize_t elems = count * dims[1] * rows * dims[3];
  const hsize_t one = std::max<hsize_t>(elems, 1);
  h5::Dataspace memory(TESSERA_H5(H5Screate_simple(1, &one, nullptr)));
  if (elems == 0) {
    TESSERA_H5(H5Sselect_none(file_space));
    TESSERA_H5(H5Sselect_none(memory));
  } else {
    TESSERA_H5(H5Sselect_hyperslab(file_space, H5S_SELECT_SET, start, nullptr, extent, nullptr));
  }
  const float dummy = 0.0f;
  TESSERA_H5(H5Dwrite(d, H5T_NATIVE_FLOAT, memory, file_space, impl_->xfer, elems > 0 ? data : &dummy));
}

void FieldWriter::write_attr(const std::string& object, const std::string& name, const Attr& value) {
  h5::Object obj(TESSERA_H5(H5Oopen(impl_->file, object.c_str(), H5P_DEFAULT)));
  h5::write_attr(obj, name, value);
}

void FieldWriter::write_float_attr(const std::string& object, const std::string& name, float value) {
  h5::Object obj(TESSERA_H5(H5Oopen(impl_->file, object.c_str(), H5P_DEFAULT)));
  h5::write_float_attr(obj, name, value);
}

void FieldWriter::close() {
  impl_->datasets.clear();
  impl_->file.close();
}

}  // namespace tessera::io
