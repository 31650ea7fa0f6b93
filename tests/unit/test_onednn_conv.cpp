// tessera::blas::onednn convolutions (host pointers) against a naive double reference and against
// the im2col + GEMM path: forward with bias, backward data, backward weights and bias (which
// accumulate over calls, as micro-batches need), for channels 1, 3 and 16, odd sizes, batch 1
// and 3, kernels 1, 3 and 5; rows "valid" over a block with its halo rows in place, inside
// taller buffers; bad shapes; one primitive per shape; run.conv's choice and its log line; the
// memory counters see the working buffers given to oneDNN (mem category "lib").
// Without oneDNN the test checks that nothing claims it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "blas/conv_library.hpp"
#include "core/counted_buffer.hpp"
#include "blas/gemm.hpp"
#include "blas/onednn_conv.hpp"
#include "core/memory.hpp"
#include "kernel_test_util.hpp"
#include "kernels/conv2d.hpp"
#include "kernels/precision.hpp"

namespace {

using namespace tessera;
using blas::onednn::Conv2dShape;

/// A convolution's tensors (dense, float) and their double references.
struct Case {
  Conv2dShape s;
  std::vector<float> x, w, b, dy;
  int oh() const { return s.out_height(); }
  std::size_t xi(int n, int c, int r, int q) const { return ((std::size_t(n) * s.in + c) * s.height + r) * s.width + q; }
  std::size_t yi(int n, int o, int r, int q) const { return ((std::size_t(n) * s.out + o) * oh() + r) * s.width + q; }
  std::size_t wi(int o, int c, int ky, int kx) const { return ((std::size_t(o) * s.in + c) * s.kernel + ky) * s.kernel + kx; }
  /// The input element read by output (r, q) through kernel tap (ky, kx), or -1 in the padding.
  long tap(int n, int c, int r, int q, int ky, int kx) const {
    const int yy = r + ky - s.pad_top, xx = q + kx - s.kernel / 2;
    if (yy < 0 || yy >= s.height || xx < 0 || xx >= s.width) return -1;
    return long(xi(n, c, yy, xx));
  }
};

Case make_case(const Conv2dShape& s, unsigned seed) {
  Case c{s, {}, {}, {}, {}};
  c.x = test::random_vector<float>(std::size_t(s.batch) * s.in * s.height * s.width, seed);
  c.w = test::random_vector<float>(std::size_t(s.out) * s.in * s.kernel * s.kernel, seed + 1);
  c.b = test::random_vector<float>(std::size_t(s.out), seed + 2);
  c.dy = test::random_vector<float>(std::size_t(s.batch) * s.out * s.out_height() * s.width, seed + 3);
  return c;
}

/// Naive double references: y = conv(x) + b, dx, dw, db.
struct Reference {
  std::vector<double> y, dx, dw, db;
};

Reference reference(const Case& c) {
  const Conv2dShape& s = c.s;
  Reference r{std::vector<double>(c.dy.size()), std::vector<double>(c.x.size()), std::vector<double>(c.w.size()),
              std::vector<double>(c.b.size())};
  for (int n = 0; n < s.batch; ++n)
    for (int o = 0; o < s.out; ++o)
      for (int row = 0; row < c.oh(); ++row)
        for (int q = 0; q < s.width; ++q) {
          const std::size_t at = c.yi(n, o, row, q);
          double sum = c.b[std::size_t(o)];
          r.db[std::size_t(o)] += c.dy[at];
          for (int ch = 0; ch < s.in; ++ch)
            for (int ky = 0; ky < s.kernel; ++ky)
              for (int kx = 0; kx < s.kernel; ++kx) {
                const long t = c.tap(n, ch, row, q, ky, kx);
                if (t < 0) continue;
                const std::size_t wat = c.wi(o, ch, ky, kx);
                sum += double(c.w[wat]) * c.x[std::size_t(t)];
                r.dx[std::size_t(t)] += double(c.w[wat]) * c.dy[at];
                r.dw[wat] += double(c.x[std::size_t(t)]) * c.dy[at];
              }
          r.y[at] = sum;
        }
  return r;
}

/// Within fp32 summation of up to `terms` products of values in [-1, 1].
void expect_close(const std::vector<float>& got, const std::vector<double>& want, int terms, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  const double tol = 4.0 * (terms + 2) * std::ldexp(1.0, -23);
  for (std::size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(double(got[i]), want[i], tol) << what << "[" << i << "]";
}

class OnednnConv : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!blas::onednn::conv_available()) {
      EXPECT_EQ(blas::onednn::conv_implementation(Conv2dShape::same(1, 1, 1, 3, 3, 3)), "none");
      EXPECT_EQ(blas::conv_path(ConvLibrary::automatic, Precision::fp32), blas::ConvPath::im2col);
      EXPECT_THROW(blas::conv_path(ConvLibrary::onednn, Precision::fp32), std::invalid_argument);
      GTEST_SKIP() << "this build has no oneDNN";
    }
  }
};

TEST_F(OnednnConv, ForwardAndBackwardEqualNaiveDoubleAndAccumulate) {
  for (const Conv2dShape& s : {Conv2dShape::same(1, 1, 4, 5, 7, 3), Conv2dShape::same(3, 3, 16, 9, 6, 3),
                               Conv2dShape::same(3, 16, 8, 7, 7, 3), Conv2dShape::same(1, 16, 16, 11, 13, 3),
                               Conv2dShape::same(2, 3, 5, 6, 5, 5), Conv2dShape::same(3, 3, 4, 5, 5, 1)}) {
    SCOPED_TRACE(::testing::Message() << "batch " << s.batch << " in " << s.in << " out " << s.out << " "
                                      << s.height << "x" << s.width << " k " << s.kernel);
    const Case c = make_case(s, 11);
    const Reference r = reference(c);
    const int taps = s.in * s.kernel * s.kernel;
    std::vector<float> y(c.dy.size(), 7.0f), dx(c.x.size(), 7.0f);
    blas::onednn::conv_forward(s, c.x.data(), c.w.data(), c.b.data(), y.data());
    expect_close(y, r.y, taps + 1, "y");
    blas::onednn::conv_backward_data(s, c.dy.data(), c.w.data(), dx.data());
    expect_close(dx, r.dx, s.out * s.kernel * s.kernel, "dx");
    // Accumulation: dw and db start from random values; two calls add dw twice (the second
    // without a bias gradient, so db once).
    std::vector<float> dw = test::random_vector<float>(c.w.size(), 5), db = test::random_vector<float>(c.b.size(), 6);
    std::vector<double> want_w(dw.size()), want_b(db.size());
    for (std::size_t i = 0; i < dw.size(); ++i) want_w[i] = dw[i] + 2.0 * r.dw[i];
    for (std::size_t i = 0; i < db.size(); ++i) want_b[i] = db[i] + r.db[i];
    blas::onednn::conv_backward_weights(s, c.x.data(), c.dy.data(), dw.data(), db.data());
    blas::onednn::conv_backward_weights(s, c.x.data(), c.dy.data(), dw.data(), nullptr);
    const int positions = 2 * s.batch * s.out_height() * s.width + 2;
    expect_close(dw, want_w, positions, "dw");
    expect_close(db, want_b, positions, "db");
  }
}

TEST_F(OnednnConv, EqualsIm2colAndGemm) {
  const ExecSpace exec;
  const Conv2dShape s = Conv2dShape::same(3, 16, 32, 14, 14, 3);
  const Case c = make_case(s, 21);
  const kernels::ConvShape k{s.in, s.height, s.width, s.kernel, s.kernel / 2};
  const Index rows = k.rows(), pos = k.positions();
  const Vector<float> x = test::to_device(c.x), w = test::to_device(c.w);
  Vector<float> col("col", std::size_t(s.batch * rows * pos)), z("z", c.dy.size());
  kernels::im2col(exec, k, x.data(), col.data(), Index(s.batch));
  for (Index b = 0; b < s.batch; ++b)
    blas::gemm(exec, blas::Op::N, blas::Op::N, s.out, int(pos), int(rows), 1.0f, w.data(), int(rows),
               col.data() + b * rows * pos, int(pos), 0.0f, z.data() + b * s.out * pos, int(pos));
  const std::vector<float> im2col = test::to_host(z);
  std::vector<float> y(c.dy.size());
  blas::onednn::conv_forward(s, c.x.data(), c.w.data(), nullptr, y.data());
  const std::vector<double> want(im2col.begin(), im2col.end());
  expect_close(y, want, 2 * int(rows), "y against im2col");
}

TEST_F(OnednnConv, ValidRowsOverABlockWithHalosInsideTallerBuffers) {
  // x: 4 + 2 halo rows of planes of 9 rows; y: 4 rows written at the top of planes of 6 rows.
  Conv2dShape s = Conv2dShape::same(2, 3, 5, 6, 7, 3);
  s.pad_top = s.pad_bottom = 0;
  ASSERT_EQ(s.out_height(), 4);
  const Case c = make_case(s, 31);
  const Reference r = reference(c);
  Conv2dShape strided = s;
  strided.plane_rows_x = 9;
  strided.plane_rows_y = 6;
  std::vector<float> xt(std::size_t(s.batch) * s.in * 9 * s.width, 0.0f), yt(std::size_t(s.batch) * s.out * 6 * s.width, 7.0f);
  for (int n = 0; n < s.batch; ++n)
    for (int ch = 0; ch < s.in; ++ch)
      for (int row = 0; row < s.height; ++row)
        for (int q = 0; q < s.width; ++q)
          xt[((std::size_t(n) * s.in + ch) * 9 + row) * s.width + q] = c.x[c.xi(n, ch, row, q)];
  blas::onednn::conv_forward(strided, xt.data(), c.w.data(), c.b.data(), yt.data());
  std::vector<float> y(c.dy.size());
  for (int plane = 0; plane < s.batch * s.out; ++plane)
    for (int e = 0; e < 6 * s.width; ++e) {
      const float v = yt[std::size_t(plane) * 6 * s.width + std::size_t(e)];
      if (e < 4 * s.width) y[std::size_t(plane) * 4 * s.width + std::size_t(e)] = v;
      else ASSERT_EQ(v, 7.0f) << "row beyond the output written in plane " << plane;
    }
  expect_close(y, r.y, s.in * 9 + 1, "y");
  // Asymmetric: the top rows padded (the field's first block), the bottom from the halo.
  s.pad_top = 1;
  const Case a = make_case(s, 41);
  std::vector<float> ya(a.dy.size()), dxa(a.x.size()), dwa(a.w.size(), 0.0f);
  blas::onednn::conv_forward(s, a.x.data(), a.w.data(), a.b.data(), ya.data());
  blas::onednn::conv_backward_data(s, a.dy.data(), a.w.data(), dxa.data());
  blas::onednn::conv_backward_weights(s, a.x.data(), a.dy.data(), dwa.data(), nullptr);
  const Reference ra = reference(a);
  expect_close(ya, ra.y, s.in * 9 + 1, "asymmetric y");
  expect_close(dxa, ra.dx, s.out * 9, "asymmetric dx");
  expect_close(dwa, ra.dw, s.batch * s.out_height() * s.width, "asymmetric dw");
}

TEST_F(OnednnConv, PrimitivesAreCachedAndBadShapesThrow) {
  const Conv2dShape s = Conv2dShape::same(2, 3, 4, 6, 6, 3);
  const Case c = make_case(s, 51);
  std::vector<float> y(c.dy.size());
  blas::onednn::conv_forward(s, c.x.data(), c.w.data(), c.b.data(), y.data());
  const std::size_t cached = blas::onednn::conv_cache_size();
  blas::onednn::conv_forward(s, c.x.data(), c.w.data(), c.b.data(), y.data());
  EXPECT_EQ(blas::onednn::conv_cache_size(), cached);
  EXPECT_NE(blas::onednn::conv_implementation(s).find("fwd "), std::string::npos);
  for (auto bad : {Conv2dShape::same(1, 1, 1, 4, 4, 2), Conv2dShape::same(1, 0, 1, 4, 4, 3),
                   Conv2dShape::same(-1, 1, 1, 4, 4, 3), Conv2dShape::same(1, 1, 1, 0, 4, 3)})
    EXPECT_THROW(blas::onednn::conv_forward(bad, c.x.data(), c.w.data(), nullptr, y.data()), std::invalid_argument);
  Conv2dShape thin = Conv2dShape::same(1, 1, 1, 2, 4, 5);
  thin.pad_top = thin.pad_bottom = 0;  // 2 rows, kernel 5: no output row
  EXPECT_THROW(blas::onednn::conv_forward(thin, c.x.data(), c.w.data(), nullptr, y.data()), std::invalid_argument);
  Conv2dShape short_planes = s;
  short_planes.plane_rows_x = 5;
  EXPECT_THROW(blas::onednn::conv_forward(short_planes, c.x.data(), c.w.data(), nullptr, y.data()),
               std::invalid_argument);
  Conv2dShape empty = s;
  empty.batch = 0;  // nothing to do, nothing written
  EXPECT_NO_THROW(blas::onednn::conv_forward(empty, nullptr, c.w.data(), nullptr, nullptr));
}

TEST(CountedBuffer, GrowsOnlyAndIsCountedUnderLib) {
  const std::size_t before = mem::current(mem::Category::lib);
  {
    CountedBuffer b;
    EXPECT_EQ(b.get(0), nullptr);
    void* p = b.get(100);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(b.bytes(), 128u);  // 64-byte multiples
    EXPECT_EQ(mem::current(mem::Category::lib), before + 128);
    EXPECT_EQ(b.get(50), p);  // no shrink, no new allocation
    b.get(1000);
    EXPECT_EQ(mem::current(mem::Category::lib), before + 1024);
    EXPECT_GE(mem::peak(mem::Category::lib), before + 1024);
  }
  EXPECT_EQ(mem::current(mem::Category::lib), before);
}

TEST_F(OnednnConv, WorkingBuffersAreCounted) {
  // 16 input channels at 40 x 40: oneDNN computes in a blocked layout (nChw16c or 8c), so the
  // input is reordered into a buffer at least as large as the caller's, which the counters see.
  const Conv2dShape s = Conv2dShape::same(4, 16, 32, 40, 40, 3);
  const Case c = make_case(s, 61);
  std::vector<float> y(c.dy.size()), dw(c.w.size()), db(c.b.size());
  blas::onednn::conv_forward(s, c.x.data(), c.w.data(), c.b.data(), y.data());
  blas::onednn::conv_backward_weights(s, c.x.data(), c.dy.data(), dw.data(), db.data());
  EXPECT_GE(mem::current(mem::Category::lib), c.x.size() * sizeof(float));
  EXPECT_GE(mem::peak_total(), mem::current(mem::Category::lib));
}

// bf16 (Conv2dShape::bf16): against the double reference on the bf16 values of x, w and dy, y
// and dx within a bf16 step of the fp32 sums (and exactly bf16 values, as the float gemm under
// bf16 stores them), dw and db summed and accumulated in fp32. A halo-row block inside taller
// buffers as well.
TEST_F(OnednnConv, Bf16ConvolutionsRoundOperandsAndOutputs) {
  if (!blas::onednn::conv_bf16_native()) GTEST_SKIP() << "no bf16 instructions for oneDNN here";
  Conv2dShape block = Conv2dShape::same(2, 3, 8, 7, 9, 3, true);
  block.pad_top = 0;
  block.plane_rows_x = 9;
  block.plane_rows_y = 8;
  for (Conv2dShape s : {Conv2dShape::same(3, 16, 8, 7, 7, 3, true), Conv2dShape::same(2, 3, 5, 6, 5, 5, true), block}) {
    SCOPED_TRACE(::testing::Message() << "in " << s.in << " out " << s.out << " k " << s.kernel << " pad_top "
                                      << s.pad_top);
    Conv2dShape dense = s;
    dense.plane_rows_x = dense.plane_rows_y = 0;
    Case c = make_case(dense, 21);
    for (auto* v : {&c.x, &c.w, &c.dy})
      for (float& e : *v) e = kernels::round_bf16(e);
    const Reference r = reference(c);
    // The caller's buffers: planes of plane_rows rows where the shape says so (the rest NaN).
    const int px = s.plane_rows_x ? s.plane_rows_x : s.height, py = s.plane_rows_y ? s.plane_rows_y : s.out_height();
    const auto spread = [](const std::vector<float>& dense_v, int planes, int rows, int plane_rows, int width) {
      std::vector<float> out(std::size_t(planes) * plane_rows * width, std::nanf(""));
      for (int p = 0; p < planes; ++p)
        std::copy_n(dense_v.begin() + long(p) * rows * width, rows * width, out.begin() + long(p) * plane_rows * width);
      return out;
    };
    const auto gather = [](const std::vector<float>& v, int planes, int rows, int plane_rows, int width) {
      std::vector<float> out;
      for (int p = 0; p < planes; ++p)
        out.insert(out.end(), v.begin() + long(p) * plane_rows * width, v.begin() + long(p) * plane_rows * width + rows * width);
      return out;
    };
    const std::vector<float> x = spread(c.x, s.batch * s.in, s.height, px, s.width);
    const std::vector<float> dy = spread(c.dy, s.batch * s.out, s.out_height(), py, s.width);
    std::vector<float> y(std::size_t(s.batch) * s.out * py * s.width, 7.0f), dx(x.size(), 7.0f);
    blas::onednn::conv_forward(s, x.data(), c.w.data(), c.b.data(), y.data());
    blas::onednn::conv_backward_data(s, dy.data(), c.w.data(), dx.data());
    std::vector<float> dw(c.w.size(), 0.0f), db(c.b.size(), 0.0f);
    blas::onednn::conv_backward_weights(s, x.data(), dy.data(), dw.data(), db.data());
    const std::vector<float> yd = gather(y, s.batch * s.out, s.out_height(), py, s.width);
    const std::vector<float> dxd = gather(dx, s.batch * s.in, s.height, px, s.width);
    const auto bf16_step = [](const std::vector<float>& got, const std::vector<double>& want, const char* what) {
      for (std::size_t i = 0; i < want.size(); ++i) {
        ASSERT_EQ(got[i], kernels::round_bf16(got[i])) << what << "[" << i << "] is not a bf16 value";
        ASSERT_NEAR(got[i], want[i], std::ldexp(std::fabs(want[i]), -7) + 1e-5) << what << "[" << i << "]";
      }
    };
    bf16_step(yd, r.y, "y");
    bf16_step(dxd, r.dx, "dx");
    expect_close(dw, r.dw, 2 * s.batch * s.out_height() * s.width, "dw");
    expect_close(db, r.db, 2 * s.batch * s.out_height() * s.width, "db");
  }
}

TEST_F(OnednnConv, RunConvChoosesAndLogs) {
  using blas::ConvPath;
  const ConvPath bf16_path = blas::onednn::conv_bf16_native() ? ConvPath::onednn : ConvPath::im2col;
  EXPECT_EQ(blas::conv_path(ConvLibrary::im2col, Precision::fp32), ConvPath::im2col);
  EXPECT_EQ(blas::conv_path(ConvLibrary::onednn, Precision::fp32), ConvPath::onednn);
  EXPECT_EQ(blas::conv_path(ConvLibrary::onednn, Precision::bf16), bf16_path);
  EXPECT_EQ(blas::conv_path(ConvLibrary::onednn, Precision::fp16), ConvPath::im2col);
  EXPECT_EQ(blas::conv_path(ConvLibrary::automatic, Precision::fp16), ConvPath::im2col);
  EXPECT_EQ(blas::conv_path(ConvLibrary::im2col, Precision::bf16), ConvPath::im2col);
  EXPECT_EQ(blas::conv_path(ConvLibrary::automatic, Precision::fp32), blas::automatic_conv_path(Precision::fp32));
  EXPECT_EQ(blas::conv_path(ConvLibrary::automatic, Precision::bf16), blas::automatic_conv_path(Precision::bf16));
  const std::string line = blas::describe_conv(ConvLibrary::onednn, Precision::fp32);
  EXPECT_EQ(line.rfind("conv: fp32 -> onednn (fwd ", 0), 0u) << line;
  EXPECT_NE(line.find("; run.conv = onednn"), std::string::npos) << line;
  const std::string bf16 = blas::describe_conv(ConvLibrary::onednn, Precision::bf16);
  if (bf16_path == ConvPath::onednn) {
    EXPECT_EQ(bf16.rfind("conv: bf16 -> onednn (fwd ", 0), 0u) << bf16;
    EXPECT_NE(bf16.find("bf16"), std::string::npos) << bf16;
  } else {
    EXPECT_EQ(bf16.rfind("conv: bf16 -> im2col", 0), 0u) << bf16;
    EXPECT_NE(bf16.find("no bf16 instructions"), std::string::npos) << bf16;
  }
  const std::string fp16 = blas::describe_conv(ConvLibrary::automatic, Precision::fp16);
  EXPECT_EQ(fp16.rfind("conv: fp16 -> im2col", 0), 0u) << fp16;
}

}  // namespace
