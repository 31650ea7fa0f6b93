#pragma once
// `tessera prepare`: turning public datasets into Tessera's HDF5 dataset layout (DESIGN.md).
#include <string>

namespace tessera::io {

/// \brief Converts Fashion-MNIST's four IDX files in source_dir ({train,t10k}-{images-idx3,
/// labels-idx1}-ubyte, each either .gz or plain) into out_path: /train and /test groups with
/// `inputs` uint8 [N,28,28] (attributes scale = 1/255, offset = 0) and `labels` uint8 [N]
/// (attribute classes = 10), N = 60000 and 10000. Writes out_path + ".tmp" and renames it, creating
/// the parent directory. Serial: call it on one rank. InputError naming the file on bad input.
void prepare_fashion_mnist(const std::string& source_dir, const std::string& out_path);

}  // namespace tessera::io
