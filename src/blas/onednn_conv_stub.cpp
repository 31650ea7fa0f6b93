// blas/onednn_conv.hpp in a build without oneDNN (-DTESSERA_ENABLE_ONEDNN=OFF): nothing is
// available, and a convolution asked of it anyway is an internal error.
#include <stdexcept>

#include "blas/onednn_conv.hpp"

namespace tessera::blas::onednn {
namespace {

[[noreturn]] void absent() {
  throw std::logic_error("tessera::blas::onednn: this build has no oneDNN convolutions (configured with "
                         "TESSERA_ENABLE_ONEDNN=OFF)");
}

}  // namespace

bool conv_available() { return false; }
bool conv_bf16_native() { return false; }
void conv_forward(const Conv2dShape&, const float*, const float*, const float*, float*) { absent(); }
void conv_backward_data(const Conv2dShape&, const float*, const float*, float*) { absent(); }
void conv_backward_weights(const Conv2dShape&, const float*, const float*, float*, float*) { absent(); }
std::string conv_implementation(const Conv2dShape&) { return "none"; }
std::size_t conv_cache_size() { return 0; }

}  // namespace tessera::blas::onednn
