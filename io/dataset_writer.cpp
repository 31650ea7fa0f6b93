#include "io/dataset_writer.hpp"

#include <stdexcept>

#include <fmt/format.h>

#include "io/h5.hpp"

namespace tessera::io {

namespace {

// The stored (little-endian) type and the in-memory type of an ElementType.
std::pair<hid_t, hid_t> h5_types(ElementType type) {
  switch (type) {
    case ElementType::uint8: return {H5T_STD_U8LE, H5T_NATIVE_UINT8};
    case ElementType::int8: return {H5T_STD_I8LE, H5T_NATIVE_INT8};
    case ElementType::uint16: return {H5T_STD_U16LE, H5T_NATIVE_UINT16};
    case ElementType::int16: return {H5T_STD_I16LE, H5T_NATIVE_INT16};
    case ElementType::int32: return {H5T_STD_I32LE, H5T_NATIVE_INT32};
    case ElementType::int64: return {H5T_STD_I64LE, H5T_NATIVE_INT64};
    case ElementType::float32: return {H5T_IEEE_F32LE, H5T_NATIVE_FLOAT};
    case ElementType::float64: return {H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE};
  }
  throw std::invalid_argument("unknown ElementType");
}

}  // namespace

struct DatasetWriter::Impl {
  h5::File file;
};

DatasetWriter::DatasetWriter(const std::string& path)
    : impl_(std::make_unique<Impl>(Impl{h5::create_serial(path)})) {}

DatasetWriter::~DatasetWriter() = default;

void DatasetWriter::write_raw(const std::string& dataset, ElementType type,
                              const std::vector<std::uint64_t>& shape, const void* data,
                              std::size_t count) {
  std::size_t expected = 1;
  for (std::uint64_t d : shape) expected *= d;
  if (count != expected) {
    throw std::invalid_argument(
        fmt::format("DatasetWriter: {} has {} elements, shape holds {}", dataset, count, expected));
  }
  auto [file_type, mem_type] = h5_types(type);
  std::vector<hsize_t> dims(shape.begin(), shape.end());
  h5::Dataspace space(TESSERA_H5(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr)));
  h5::PropList lcpl = h5::intermediate_groups();
  h5::Dataset dset(TESSERA_H5(
      H5Dcreate2(impl_->file, dataset.c_str(), file_type, space, lcpl, H5P_DEFAULT, H5P_DEFAULT)));
  if (count > 0) TESSERA_H5(H5Dwrite(dset, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data));
}

void DatasetWriter::create_group(const std::string& group) {
  h5::open_or_create_group(impl_->file, group);
}

void DatasetWriter::write_attr(const std::string& object, const std::string& name,
                               const Attr& value) {
  h5::Object obj(TESSERA_H5(H5Oopen(impl_->file, object.c_str(), H5P_DEFAULT)));
  h5::write_attr(obj, name, value);
}

void DatasetWriter::write_float_attr(const std::string& object, const std::string& name,
                                     float value) {
  h5::Object obj(TESSERA_H5(H5Oopen(impl_->file, object.c_str(), H5P_DEFAULT)));
  h5::write_float_attr(obj, name, value);
}

void DatasetWriter::close() { impl_->file.close(); }

}  // namespace tessera::io
