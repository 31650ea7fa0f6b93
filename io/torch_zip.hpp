#pragma once
// A PyTorch state_dict file as torch.save writes it (its zip format, version 3), written here
// for float32 tensors only: an uncompressed zip whose records are
//   archive/data.pkl    a protocol-2 pickle of an OrderedDict name -> tensor, each tensor a call of
//                       torch._utils._rebuild_tensor_v2 on a torch.FloatStorage named by a
//                       persistent id ("storage", torch.FloatStorage, "<i>", "cpu", numel)
//   archive/data/<i>    tensor i's float32 values, little-endian, row-major
//   archive/byteorder   "little"
//   archive/version     "3\n"
// with every record's bytes aligned to 64 in the file. torch.load(path, weights_only=True)
// accepts it: the pickle uses only the globals and opcodes its restricted unpickler allows.
// No HDF5 here.
#include <string>
#include <vector>

#include "io/safetensors.hpp"

namespace tessera::io {

/// \brief Writes tensors as a PyTorch state_dict to path (through path.tmp renamed into place:
/// nothing is left at path on failure). InputError naming the file where it cannot be written,
/// or where it would exceed 4 GiB (a plain zip's limit; safetensors has none).
void write_torch_state_dict(const std::string& path, const std::vector<NamedTensor>& tensors);

/// \brief The pickle of archive/data.pkl for these tensors' names and shapes (storage i for
/// tensor i); exposed for tests.
std::string torch_state_dict_pickle(const std::vector<NamedTensor>& tensors);

}  // namespace tessera::io
