#pragma once
// `tessera inspect`: a checkpoint's attributes and a table of its tensors.
#include <ostream>
#include <string>

namespace tessera::io {

/// \brief Prints the root attributes of the HDF5 file at path (one per line, the multi-line
/// `deck` last and indented), the attributes of its `optimizer` and `train` groups, and a table
/// of every dataset: name, shape, dtype, L2 norm, min, max. Serial: call it on one rank.
/// InputError naming the file if it is missing or not HDF5.
void inspect_checkpoint(const std::string& path, std::ostream& out);

}  // namespace tessera::io
