// blas/onednn_gemm.hpp in a build without oneDNN (-DTESSERA_ENABLE_ONEDNN=OFF): nothing is
// available, and a product asked of it anyway is an internal error.
#include <stdexcept>

#include "blas/onednn_gemm.hpp"

namespace tessera::blas::onednn {
namespace {

[[noreturn]] void absent() {
  throw std::logic_error("tessera::blas::onednn: this build has no oneDNN (configured with TESSERA_ENABLE_ONEDNN=OFF)");
}

}  // namespace

bool available() { return false; }
std::string isa() { return "none"; }
bool native_bf16() { return false; }
bool bf16_supported() { return false; }
void gemm(Op, Op, int, int, int, float, const float*, int, const float*, int, float, float*, int) { absent(); }
void gemm_bf16(Op, Op, int, int, int, float, const std::uint16_t*, int, const std::uint16_t*, int, float, float*,
               int) {
  absent();
}
void gemm_batched_bf16(Op, Op, int, int, int, float, const std::uint16_t*, int, const std::uint16_t*, int,
                       std::uint16_t*, int, const Batch&) {
  absent();
}
void gemm_bf16_out(Op, Op, int, int, int, float, const std::uint16_t*, int, const std::uint16_t*, int, const float*,
                   std::uint16_t*, int) {
  absent();
}
std::string implementation(bool) { return "none"; }
void set_threads(int) {}
std::size_t cache_size() { return 0; }

}  // namespace tessera::blas::onednn
