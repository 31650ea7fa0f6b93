// The fused attention of nn/attention.hpp: kernels/flash_attention.hpp on the layer's views.
#include "kernels/flash_attention.hpp"
#include "nn/attention.hpp"

namespace tessera::nn {

template <class T>
void fused_attention_forward(const ExecSpace& exec, const MatrixU<const T>& qkv, const MatrixU<T>& y,
                             const AttentionScores<T>& att, int window) {
  kernels::flash_attention_forward(exec, qkv, y, att, window);
}

template <class T>
void fused_attention_backward(const ExecSpace& exec, const MatrixU<const T>& qkv,
                              const AttentionScores<T>& att, const MatrixU<const T>& dy,
                              const MatrixU<T>& dqkv, const AttentionScores<T>& dscores, int window) {
  kernels::flash_attention_backward(exec, qkv, att, dy, dqkv, dscores, window);
}

template void fused_attention_forward<float>(const ExecSpace&, const MatrixU<const float>&, const MatrixU<float>&,
                                             const AttentionScores<float>&, int);
template void fused_attention_forward<double>(const ExecSpace&, const MatrixU<const double>&,
                                              const MatrixU<double>&, const AttentionScores<double>&, int);
template void fused_attention_backward<float>(const ExecSpace&, const MatrixU<const float>&,
                                              const AttentionScores<float>&, const MatrixU<const float>&,
                                              const MatrixU<float>&, const AttentionScores<float>&, int);
template void fused_attention_backward<double>(const ExecSpace&, const MatrixU<const double>&,
                                               const AttentionScores<double>&, const MatrixU<const double>&,
                                               const MatrixU<double>&, const AttentionScores<double>&, int);

}  // namespace tessera::nn
