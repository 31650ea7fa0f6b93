#pragma once
// Which code runs the host convolutions of the CNN and the U-Net (run.conv). Free of every other
// header, so core/, blas/ and the models can all name it.

namespace tessera {

/// run.conv: automatic picks from a table measured on the CPU (blas/conv_library.hpp); im2col
/// and onednn force one path for every float convolution in host memory.
enum class ConvLibrary { automatic, im2col, onednn };

/// The deck spelling: "auto", "im2col", "onednn".
constexpr const char* conv_library_name(ConvLibrary c) {
  switch (c) {
    case ConvLibrary::im2col: return "im2col";
    case ConvLibrary::onednn: return "onednn";
    case ConvLibrary::automatic: break;
  }
  return "auto";
}

}  // namespace tessera
