// The choice of convolution path (blas/conv_library.hpp) and its line in the run log.
#include "blas/conv_library.hpp"

#include <stdexcept>
#include <string>
#include <type_traits>

#include "blas/onednn_conv.hpp"
#include "blas/onednn_gemm.hpp"
#include "kernels/views.hpp"

namespace tessera::blas {
namespace {

constexpr bool kDeviceMemory = !std::is_same_v<MemSpace, HostSpace>;

/// oneDNN's JIT convolutions exist from AVX2 up; below that it falls back to reference loops.
bool jit_convolutions() {
  const std::string isa = onednn::isa();
  return isa.rfind("avx2", 0) == 0 || isa.rfind("avx512", 0) == 0;
}

/// oneDNN convolves in this precision here: fp32 always, bf16 with bf16 instructions (elsewhere
/// its bf16 convolutions are emulated, slower than im2col's products), fp16 never.
bool onednn_precision(Precision p) {
  return p == Precision::fp32 || (p == Precision::bf16 && onednn::conv_bf16_native());
}

}  // namespace

ConvPath automatic_conv_path(Precision p) {
  if (kDeviceMemory || !onednn::conv_available() || !onednn_precision(p)) return ConvPath::im2col;
  return jit_convolutions() ? ConvPath::onednn : ConvPath::im2col;
}

ConvPath conv_path(ConvLibrary choice, Precision p) {
  if (choice == ConvLibrary::onednn && !onednn::conv_available())
    throw std::invalid_argument("tessera::blas::conv_path: run.conv = \"onednn\" in a build without oneDNN");
  if (kDeviceMemory) return ConvPath::im2col;
  switch (choice) {
    case ConvLibrary::im2col: return ConvPath::im2col;
    case ConvLibrary::onednn: return onednn_precision(p) ? ConvPath::onednn : ConvPath::im2col;
    case ConvLibrary::automatic: break;
  }
  return automatic_conv_path(p);
}

const char* conv_path_name(ConvPath c) { return c == ConvPath::onednn ? "onednn" : "im2col"; }

std::string describe_conv(ConvLibrary choice, Precision p) {
  const ConvPath path = conv_path(choice, p);
  std::string line = std::string("conv: ") + precision_name(p) + " -> " + conv_path_name(path) + " (";
  if (path == ConvPath::onednn)
    line += onednn::conv_implementation(onednn::Conv2dShape::same(8, 16, 32, 14, 14, 3, p == Precision::bf16));
  else
    line += kDeviceMemory ? "GEMM per sample, cuBLAS" : "GEMM per sample, run.gemm's library";
  line += std::string("); run.conv = ") + conv_library_name(choice);
  if (path == ConvPath::im2col && choice != ConvLibrary::im2col && !kDeviceMemory) {
    if (p == Precision::fp16)
      line += "; fp16 convolutions stay on im2col (the GEMMs round as train.precision says)";
    else if (p == Precision::bf16 && onednn::conv_available() && !onednn::conv_bf16_native())
      line += "; bf16 convolutions stay on im2col: no bf16 instructions for oneDNN here (" + onednn::isa() + ")";
    else if (!onednn::conv_available())
      line += "; this build has no oneDNN";
    else
      line += "; oneDNN has no JIT convolutions below AVX2 (" + onednn::isa() + " here)";
  }
  return line;
}

}  // namespace tessera::blas
