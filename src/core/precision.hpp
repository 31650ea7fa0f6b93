#pragma once
// The arithmetic precision of activations and matrix products (train.precision). Free of every
// other header, so kernels/, blas/ and the CUDA wrappers can all name it.

namespace tessera {

/// Arithmetic of activations and matrix products (master weights and reductions stay fp32).
enum class Precision { fp32, bf16, fp16 };

/// The deck spelling: "fp32", "bf16", "fp16".
constexpr const char* precision_name(Precision p) {
  switch (p) {
    case Precision::bf16: return "bf16";
    case Precision::fp16: return "fp16";
    case Precision::fp32: break;
  }
  return "fp32";
}

}  // namespace tessera
