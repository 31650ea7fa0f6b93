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

Conv2dShape Conv2dShape::same(int batch, int in, int out, int height, int width, int kernel) {
  Conv2dShape s;
  s.batch = batch;
  s.in = in;
  s.out = out;
  s.height = height;
  s.width = width;
  s.kernel = kernel;
  s.pad_top = s.pad_bottom = kernel / 2;
  return s;
}

bool conv_available() { return false; }
void conv_forward(const Conv2dShape&, const float*, const float*, const float*, float*) { absent(); }
void conv_backward_data(const Conv2dShape&, const float*, const float*, float*) { absent(); }
void conv_backward_weights(const Conv2dShape&, const float*, const float*, float*, float*) { absent(); }
std::string conv_implementation(const Conv2dShape&) { return "none"; }
std::size_t conv_cache_size() { return 0; }

}  // namespace tessera::blas::onednn
