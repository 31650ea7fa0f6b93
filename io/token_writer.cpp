#include "io/token_writer.hpp"

#include <stdexcept>
#include <vector>

#include "io/h5.hpp"

namespace tessera::io {

struct TokenWriter::Impl {
  h5::File file;
  h5::PropList xfer;
};

TokenWriter::TokenWriter(MPI_Comm comm, const std::string& path)
    : impl_(std::make_unique<Impl>(Impl{h5::create_parallel(comm, path), h5::collective_transfer()})) {}

TokenWriter::~TokenWriter() = default;

void TokenWriter::write(const std::string& dataset, std::uint64_t length, ElementType type, std::uint64_t first,
                        std::span<const std::int32_t> values) {
  hid_t file_type = H5T_STD_U8LE, memory_type = H5T_NATIVE_UINT8;
  std::size_t element = 1;
  if (type == ElementType::uint16) file_type = H5T_STD_U16LE, memory_type = H5T_NATIVE_UINT16, element = 2;
  else if (type == ElementType::int32) file_type = H5T_STD_I32LE, memory_type = H5T_NATIVE_INT32, element = 4;
  else if (type != ElementType::uint8) throw std::invalid_argument("TokenWriter::write: uint8, uint16 or int32");
  if (first + values.size() > length) throw std::invalid_argument("TokenWriter::write: range past the end");

  const hsize_t dims = length;
  h5::Dataspace space(TESSERA_H5(H5Screate_simple(1, &dims, nullptr)));
  h5::PropList lcpl = h5::intermediate_groups();
  h5::PropList dcpl(TESSERA_H5(H5Pcreate(H5P_DATASET_CREATE)));
  TESSERA_H5(H5Pset_alloc_time(dcpl, H5D_ALLOC_TIME_EARLY));
  h5::Dataset d(TESSERA_H5(H5Dcreate2(impl_->file, dataset.c_str(), file_type, space, lcpl, dcpl, H5P_DEFAULT)));

  // The values in the stored width.
  std::vector<unsigned char> packed(values.size() * element + 1);
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (element == 1) packed[i] = static_cast<std::uint8_t>(values[i]);
    else if (element == 2) reinterpret_cast<std::uint16_t*>(packed.data())[i] = static_cast<std::uint16_t>(values[i]);
    else reinterpret_cast<std::int32_t*>(packed.data())[i] = values[i];
  }
  const hsize_t start = first, count = values.size(), one = std::max<hsize_t>(count, 1);
  h5::Dataspace memory(TESSERA_H5(H5Screate_simple(1, &one, nullptr)));
  if (count == 0) {
    TESSERA_H5(H5Sselect_none(space));
    TESSERA_H5(H5Sselect_none(memory));
  } else {
    TESSERA_H5(H5Sselect_hyperslab(space, H5S_SELECT_SET, &start, nullptr, &count, nullptr));
  }
  TESSERA_H5(H5Dwrite(d, memory_type, memory, space, impl_->xfer, packed.data()));
}

void TokenWriter::write_attr(const std::string& object, const std::string& name, const Attr& value) {
  h5::Object obj(TESSERA_H5(H5Oopen(impl_->file, object.c_str(), H5P_DEFAULT)));
  h5::write_attr(obj, name, value);
}

void TokenWriter::close() { impl_->file.close(); }

}  // namespace tessera::io
