// Kernels of the Llama family's block: RMSNorm, the rotary embedding with grouped-query heads
// (rope_expand, rope_reduce) and SwiGLU, each against a naive host reference written from the
// formulas of Hugging Face's LlamaForCausalLM (LlamaRMSNorm, rotate_half, repeat_kv, silu), in
// float and double; the backwards as the transposes of the forwards (<dy, f(x)'dx> = <f'^T dy, dx>
// in double) and, for RMSNorm and SwiGLU, against finite differences.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "gradient_check.hpp"
#include "kernel_test_util.hpp"
#include "kernels/rmsnorm.hpp"
#include "kernels/rope.hpp"
#include "kernels/swiglu.hpp"

namespace {

using namespace tessera;
using tessera::test::random_vector;
using tessera::test::to_device;
using tessera::test::to_host;
using tessera::test::tolerance;

template <class T>
class LlamaKernelTest : public ::testing::Test {};
using Scalars = ::testing::Types<float, double>;
TYPED_TEST_SUITE(LlamaKernelTest, Scalars);

template <class T>
std::vector<T> host_of(const Matrix<T>& m) {
  auto h = Kokkos::create_mirror_view_and_copy(HostSpace(), m);
  return std::vector<T>(h.data(), h.data() + h.size());
}

TYPED_TEST(LlamaKernelTest, RmsNormMatchesReference) {
  using T = TypeParam;
  const std::size_t rows = 7, C = 37;
  const double eps = 1e-6;
  const auto x = random_vector<T>(rows * C, 1, -2, 2), w = random_vector<T>(C, 2, 0.5, 1.5),
             dy = random_vector<T>(rows * C, 3), res = random_vector<T>(rows * C, 4);
  const auto dx_ = to_device(x, rows, C), dres = to_device(res, rows, C), ddy = to_device(dy, rows, C);
  const auto dw = to_device(w);
  Matrix<T> y("y", rows, C), dxg("dx", rows, C);
  Vector<T> rstd("rstd", rows), dwg("dw", C);
  const ExecSpace exec;
  kernels::rmsnorm_forward(exec, dx_, dw, y, rstd, eps);
  kernels::rmsnorm_backward(exec, dx_, dw, rstd, ddy, dxg, dwg, dres);
  const auto hy = host_of(y), hdx = host_of(dxg);
  const auto hdw = to_host(dwg);
  std::vector<double> dw_ref(C, 0.0);
  for (std::size_t r = 0; r < rows; ++r) {
    double ms = 0;
    for (std::size_t c = 0; c < C; ++c) ms += double(x[r * C + c]) * x[r * C + c];
    const double s = 1.0 / std::sqrt(ms / C + eps);
    // y = w * x * s;  dx_c = s (g_c - n_c mean(g n)), g = dy w, n = x s (the derivative of the
    // formula, written out independently of the kernel's arrangement).
    double gn = 0;
    for (std::size_t c = 0; c < C; ++c) gn += double(dy[r * C + c]) * w[c] * x[r * C + c] * s;
    for (std::size_t c = 0; c < C; ++c) {
      const std::size_t i = r * C + c;
      EXPECT_NEAR(hy[i], double(w[c]) * x[i] * s, tolerance<T>() * 10) << i;
      const double dx_ref = s * (double(dy[i]) * w[c] - x[i] * s * gn / C) + res[i];
      EXPECT_NEAR(hdx[i], dx_ref, tolerance<T>() * 20 * (1 + std::abs(dx_ref))) << i;
      dw_ref[c] += double(dy[i]) * x[i] * s;
    }
  }
  for (std::size_t c = 0; c < C; ++c) EXPECT_NEAR(hdw[c], dw_ref[c], tolerance<T>() * 20 * (1 + std::abs(dw_ref[c])));
}

TEST(LlamaGradCheck, RmsNorm) {
  const std::size_t rows = 3, C = 9;
  const double eps = 1e-5;
  const auto dy = random_vector<double>(rows * C, 7);
  const auto x = to_device(random_vector<double>(rows * C, 5, -2, 2), rows, C);
  const auto w = to_device(random_vector<double>(C, 6, 0.5, 1.5));
  const auto ddy = to_device(dy, rows, C);
  Matrix<double> y("y", rows, C), dxg("dx", rows, C);
  Vector<double> rstd("rstd", rows), dwg("dw", C);
  const ExecSpace exec;
  const auto loss = [&] {  // <dy, rmsnorm(x)>
    kernels::rmsnorm_forward(exec, x, w, y, rstd, eps);
    const auto hy = host_of(y);
    double l = 0;
    for (std::size_t i = 0; i < hy.size(); ++i) l += hy[i] * dy[i];
    return l;
  };
  loss();
  kernels::rmsnorm_backward(exec, x, w, rstd, ddy, dxg, dwg);
  const auto gx = host_of(dxg);
  const auto gw = to_host(dwg);
  tessera::test::expect_gradient("x", tessera::test::Flat(x.data(), x.size()), gx, loss);
  tessera::test::expect_gradient("weight", tessera::test::Flat(w.data(), w.size()), gw, loss);
}

// The reference: Hugging Face's apply_rotary_pos_emb (q * cos + rotate_half(q) * sin, cos and sin
// of width hd = cat(freqs, freqs)) and repeat_kv, on (rows, heads * hd) matrices, position = row % T.
std::vector<double> rope_ref(const std::vector<double>& x, std::size_t rows, std::size_t heads, std::size_t hd,
                             std::size_t seq, double theta) {
  std::vector<double> out(x.size());
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t h = 0; h < heads; ++h)
      for (std::size_t j = 0; j < hd; ++j) {
        const std::size_t i = j % (hd / 2);
        const double angle = double(r % seq) / std::pow(theta, double(2 * i) / double(hd));
        const double* v = &x[(r * heads + h) * hd];
        const double rotated = j < hd / 2 ? -v[j + hd / 2] : v[j - hd / 2];  // rotate_half
        out[(r * heads + h) * hd + j] = v[j] * std::cos(angle) + rotated * std::sin(angle);
      }
  return out;
}

TYPED_TEST(LlamaKernelTest, RopeExpandIsRotateHalfAndRepeatKv) {
  using T = TypeParam;
  const std::size_t T_ = 5, B = 2, rows = B * T_, H = 6, KV = 2, hd = 8, G = H / KV;
  const double theta = 100.0;
  const auto q = random_vector<T>(rows * H * hd, 11), k = random_vector<T>(rows * KV * hd, 12),
             v = random_vector<T>(rows * KV * hd, 13);
  std::vector<T> cos_t, sin_t;
  kernels::rope_tables(int(T_), int(hd), theta, cos_t, sin_t);
  const auto dq = to_device(q, rows, H * hd), dk = to_device(k, rows, KV * hd), dv = to_device(v, rows, KV * hd);
  const auto dcos = to_device(cos_t), dsin = to_device(sin_t);
  Matrix<T> out("qkv", rows, 3 * H * hd);
  const ExecSpace exec;
  kernels::rope_expand<T>(exec, dq, dk, dv, dcos, dsin, Index(H), Index(KV), Index(T_),
                          kernels::FusedHeads<Matrix<T>>{out, Index(H), Index(hd)});
  const auto got = host_of(out);
  const std::vector<double> qd(q.begin(), q.end()), kd(k.begin(), k.end());
  const auto qr = rope_ref(qd, rows, H, hd, T_, theta), kr = rope_ref(kd, rows, KV, hd, T_, theta);
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t h = 0; h < H; ++h)
      for (std::size_t e = 0; e < hd; ++e) {
        const std::size_t g = h / G;
        EXPECT_NEAR(got[r * 3 * H * hd + h * hd + e], qr[(r * H + h) * hd + e], tolerance<T>() * 4);
        EXPECT_NEAR(got[r * 3 * H * hd + (H + h) * hd + e], kr[(r * KV + g) * hd + e], tolerance<T>() * 4);
        EXPECT_EQ(got[r * 3 * H * hd + (2 * H + h) * hd + e], v[(r * KV + g) * hd + e]);
      }
}

TEST(LlamaKernels, RopeReduceIsTheTransposeOfRopeExpand) {
  // <din, expand(q, k, v)> = <reduce(din), (q, k, v)> for random din: reduce is expand's adjoint
  // (the rotation transposed, the repeated heads' gradients summed).
  const std::size_t T_ = 4, rows = 2 * T_, H = 4, KV = 1, hd = 6;
  const auto q = random_vector<double>(rows * H * hd, 21), k = random_vector<double>(rows * KV * hd, 22),
             v = random_vector<double>(rows * KV * hd, 23), din = random_vector<double>(rows * 3 * H * hd, 24);
  std::vector<double> cos_t, sin_t;
  kernels::rope_tables(int(T_), int(hd), 10000.0, cos_t, sin_t);
  const auto dcos = to_device(cos_t), dsin = to_device(sin_t);
  Matrix<double> out("qkv", rows, 3 * H * hd), gq("dq", rows, H * hd), gk("dk", rows, KV * hd), gv("dv", rows, KV * hd);
  const ExecSpace exec;
  kernels::rope_expand<double>(exec, to_device(q, rows, H * hd), to_device(k, rows, KV * hd),
                               to_device(v, rows, KV * hd), dcos, dsin, Index(H), Index(KV), Index(T_),
                               kernels::FusedHeads<Matrix<double>>{out, Index(H), Index(hd)});
  const auto ddin = to_device(din, rows, 3 * H * hd);
  kernels::rope_reduce<double>(exec, kernels::FusedHeads<Matrix<double>>{ddin, Index(H), Index(hd)}, dcos, dsin,
                               Index(H), Index(KV), Index(T_), gq, gk, gv);
  const auto e = host_of(out), a = host_of(gq), b = host_of(gk), c = host_of(gv);
  double lhs = 0, rhs = 0;
  for (std::size_t i = 0; i < e.size(); ++i) lhs += din[i] * e[i];
  for (std::size_t i = 0; i < q.size(); ++i) rhs += a[i] * q[i];
  for (std::size_t i = 0; i < k.size(); ++i) rhs += b[i] * k[i] + c[i] * v[i];
  EXPECT_NEAR(lhs, rhs, 1e-12 * (1 + std::abs(lhs)));
}

TYPED_TEST(LlamaKernelTest, SwigluMatchesReference) {
  using T = TypeParam;
  const std::size_t rows = 5, N = 33;
  const auto g = random_vector<T>(rows * N, 31, -6, 6), u = random_vector<T>(rows * N, 32, -2, 2),
             dh = random_vector<T>(rows * N, 33);
  const auto dg_ = to_device(g, rows, N), du_ = to_device(u, rows, N), ddh = to_device(dh, rows, N);
  Matrix<T> h("h", rows, N), dg("dg", rows, N), du("du", rows, N);
  const ExecSpace exec;
  kernels::swiglu_forward<T>(exec, dg_, du_, h);
  kernels::swiglu_backward<T>(exec, dg_, du_, ddh, dg, du);
  const auto hh = host_of(h), hdg = host_of(dg), hdu = host_of(du);
  for (std::size_t i = 0; i < g.size(); ++i) {
    const double z = g[i], s = 1.0 / (1.0 + std::exp(-z)), silu = z * s;
    EXPECT_NEAR(hh[i], silu * u[i], tolerance<T>() * 10 * (1 + std::abs(silu * u[i]))) << i;
    EXPECT_NEAR(hdu[i], dh[i] * silu, tolerance<T>() * 10 * (1 + std::abs(silu))) << i;
    const double dsilu = s + z * s * (1 - s);  // d/dz z sigmoid(z)
    EXPECT_NEAR(hdg[i], dh[i] * u[i] * dsilu, tolerance<T>() * 10 * (1 + std::abs(dsilu * u[i]))) << i;
  }
}

}  // namespace
