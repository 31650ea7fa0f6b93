#pragma once
// Which library runs the host matrix products (run.gemm). Free of every other header, so core/,
// blas/ and the trainer can all name it.

namespace tessera {

/// run.gemm: automatic picks per precision from the CPU and the build (blas/gemm_library.hpp);
/// openblas and onednn force one library for every host product.
enum class GemmLibrary { automatic, openblas, onednn };

/// The deck spelling: "auto", "openblas", "onednn".
constexpr const char* gemm_library_name(GemmLibrary g) {
  switch (g) {
    case GemmLibrary::openblas: return "openblas";
    case GemmLibrary::onednn: return "onednn";
    case GemmLibrary::automatic: break;
  }
  return "auto";
}

}  // namespace tessera
