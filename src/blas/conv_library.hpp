#pragma once
// Which code runs the float convolutions of the CNN and the U-Net in host memory (run.conv):
// im2col + one GEMM per sample (kernels/conv2d.hpp, kernels/halo_conv.hpp, through blas::gemm and
// so run.gemm's library) or oneDNN's convolution primitives (blas/onednn_conv.hpp). Double
// models and CUDA memory keep im2col whatever this says (oneDNN here takes host pointers only).
#include <string>

#include "core/conv_library.hpp"
#include "core/precision.hpp"

namespace tessera::blas {

enum class ConvPath { im2col, onednn };

/// \brief What run.conv = "auto" picks for float convolutions of train.precision p in this build
/// and on this CPU, from the table in docs/performance.md ("oneDNN convolutions"): fp32 -> onednn
/// where oneDNN is built in and dispatches to AVX2 or better (its JIT convolutions; measured
/// 2-8x im2col + GEMM per layer on Zen 4), else im2col; bf16 -> onednn where the CPU has bf16
/// instructions (onednn::conv_bf16_native(); measured 2.5-5.9x im2col's bf16 GEMMs on Zen 4),
/// else im2col; fp16 -> im2col (its rounding of every GEMM's operands and outputs is what
/// blas::gemm does, docs/precision.md).
ConvPath automatic_conv_path(Precision p);

/// \brief The path run.conv = choice gives float convolutions of precision p in host memory:
/// im2col and automatic as above; onednn forces oneDNN for fp32 and for bf16 with bf16
/// instructions, and keeps im2col otherwise. Throws std::invalid_argument for onednn in a build
/// without oneDNN (the deck check refuses that first).
ConvPath conv_path(ConvLibrary choice, Precision p);
const char* conv_path_name(ConvPath c);

/// \brief One line for the run log, e.g. "conv: fp32 -> onednn (fwd jit:avx512_core, bwd_d
/// jit:avx512_core, bwd_w jit:avx512_core); run.conv = auto".
std::string describe_conv(ConvLibrary choice, Precision p);

}  // namespace tessera::blas
