// tessera::blas::gemm(exec, Precision, ...) against a double-precision reference on operands
// rounded with kernels/precision.hpp: every precision, all transposes, padded rows, alpha and
// beta != 1; the rounding is visible (bf16 and fp16 results differ from fp32 by about their
// epsilon on random data, bf16 more than fp16); the cblas_sbgemm path through a stand-in; each
// check under run.gemm = openblas and, where the build has it, onednn. Then blas::matmul, a layer's
// product in its precision (C stored in it), and its forms on operands kept in bf16.
// Matrices live in MemSpace, so a CUDA Kokkos build runs the same checks on cublasGemmEx.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "blas/cblas_gemm.hpp"
#include "blas/gemm.hpp"
#include "blas/gemm_library.hpp"
#include "blas/onednn_gemm.hpp"
#include "kernel_test_util.hpp"
#include "kernels/precision.hpp"

namespace {

using namespace tessera;
using blas::Op;
namespace k = tessera::kernels;

constexpr Precision kPrecisions[] = {Precision::fp32, Precision::bf16, Precision::fp16};
constexpr bool kHostMemory = std::is_same_v<MemSpace, HostSpace>;

/// One product: the stored operands (with padding), C before and after.
struct Product {
  Op ta, tb;
  int m, n, k, lda, ldb, ldc;
  float alpha, beta;
  std::vector<float> a, b, c0, c;
};

Product make(Op ta, Op tb, int m, int n, int k, int pad, float alpha, float beta, unsigned seed,
             double range = 1.0) {
  Product p{ta, tb, m, n, k, 0, 0, 0, alpha, beta, {}, {}, {}, {}};
  const int a_rows = ta == Op::N ? m : k, a_cols = ta == Op::N ? k : m;
  const int b_rows = tb == Op::N ? k : n, b_cols = tb == Op::N ? n : k;
  p.lda = std::max(a_cols, 1) + pad;
  p.ldb = std::max(b_cols, 1) + 2 * pad;
  p.ldc = std::max(n, 1) + 3 * pad;
  p.a = test::random_vector<float>(std::size_t(a_rows) * p.lda, seed, -range, range);
  p.b = test::random_vector<float>(std::size_t(b_rows) * p.ldb, seed + 1, -range, range);
  p.c0 = test::random_vector<float>(std::size_t(std::max(m, 1)) * p.ldc, seed + 2);
  return p;
}

/// Runs blas::gemm at precision pr on device copies; checks A and B are left as they were.
void run(Product& p, Precision pr) {
  auto d_a = test::to_device(p.a), d_b = test::to_device(p.b), d_c = test::to_device(p.c0);
  blas::gemm(ExecSpace(), pr, p.ta, p.tb, p.m, p.n, p.k, p.alpha, d_a.data(), p.lda, d_b.data(),
             p.ldb, p.beta, d_c.data(), p.ldc);
  p.c = test::to_host(d_c);
  const std::vector<float> a_after = test::to_host(d_a), b_after = test::to_host(d_b);
  EXPECT_EQ(std::memcmp(a_after.data(), p.a.data(), p.a.size() * sizeof(float)), 0) << "A changed";
  EXPECT_EQ(std::memcmp(b_after.data(), p.b.data(), p.b.size() * sizeof(float)), 0) << "B changed";
}

/// C against alpha op(r(A)) op(r(B)) + beta C0 in double, r rounding to pr; the bound is fp32
/// accumulation's: (k + 2) 2^-22 (|alpha| sum |a b| + |beta c0|). Padding must be untouched.
void check(const Product& p, Precision pr) {
  auto A = [&](int i, int q) { return p.ta == Op::N ? p.a[i * p.lda + q] : p.a[q * p.lda + i]; };
  auto B = [&](int q, int j) { return p.tb == Op::N ? p.b[q * p.ldb + j] : p.b[j * p.ldb + q]; };
  for (int i = 0; i < p.m; ++i) {
    for (int j = 0; j < p.ldc; ++j) {
      const std::size_t at = std::size_t(i) * p.ldc + j;
      if (j >= p.n) {
        ASSERT_EQ(p.c[at], p.c0[at]) << "padding written at row " << i << " col " << j;
        continue;
      }
      double sum = 0.0, magnitude = 0.0;
      for (int q = 0; q < p.k; ++q) {
        const double prod = double(k::round_to(pr, A(i, q))) * double(k::round_to(pr, B(q, j)));
        sum += prod;
        magnitude += std::fabs(prod);
      }
      const double c0 = double(p.c0[at]);
      const double want = double(p.alpha) * sum + double(p.beta) * c0;
      const double tol = (p.k + 2) * std::ldexp(1.0, -22) *
                         (std::fabs(p.alpha) * magnitude + std::fabs(p.beta * c0));
      ASSERT_NEAR(double(p.c[at]), want, tol) << "C(" << i << "," << j << ")";
    }
  }
}

const char* op_name(Op op) { return op == Op::N ? "N" : "T"; }

/// run.gemm for the lifetime of the object, then automatic again.
struct GemmLibraryScope {
  explicit GemmLibraryScope(GemmLibrary g) { blas::set_gemm_library(g); }
  ~GemmLibraryScope() { blas::set_gemm_library(GemmLibrary::automatic); }
};

/// The libraries this build can be told to use.
std::vector<GemmLibrary> libraries() {
  std::vector<GemmLibrary> all = {GemmLibrary::openblas};
  if (blas::onednn::available()) all.push_back(GemmLibrary::onednn);
  return all;
}

TEST(GemmPrecision, EveryPrecisionTransposePaddingAlphaBeta) {
  for (GemmLibrary lib : libraries())
  for (Precision pr : kPrecisions) {
    GemmLibraryScope scope(lib);
    for (Op ta : {Op::N, Op::T}) {
      for (Op tb : {Op::N, Op::T}) {
        SCOPED_TRACE(::testing::Message() << gemm_library_name(lib) << " " << precision_name(pr)
                                          << " ta=" << op_name(ta) << " tb=" << op_name(tb));
        const unsigned seed = 100 + unsigned(pr) * 10 + unsigned(ta) * 2 + unsigned(tb);
        for (Product p : {make(ta, tb, 7, 5, 3, 0, 1.5f, -0.75f, seed),
                          make(ta, tb, 13, 17, 11, 3, -0.5f, 2.0f, seed),
                          make(ta, tb, 1, 9, 31, 1, 1.0f, 1.0f, seed),
                          make(ta, tb, 33, 1, 64, 4, 0.25f, 0.0f, seed),
                          make(ta, tb, 40, 24, 300, 2, 1.0f, 0.5f, seed)}) {
          run(p, pr);
          check(p, pr);
        }
      }
    }
  }
}

TEST(GemmPrecision, MatmulStoresTheOutputInItsPrecisionAndLeavesThePaddingAlone) {
  // train.precision's path: a layer's product, matmul(exec, p, ...), is gemm(exec, p) with C then
  // rounded to p, row by row at stride ldc (a strided, padded C here); under fp32 it is the float
  // gemm, bit for bit, and the float gemm stays fp32 after products in another precision.
  for (Precision pr : kPrecisions) {
    SCOPED_TRACE(precision_name(pr));
    Product p = make(Op::N, Op::T, 19, 37, 23, 5, 1.25f, 0.5f, 900 + unsigned(pr));
    Product want = p;
    run(want, pr);  // gemm(exec, pr, ...): fp32 output
    auto d_a = test::to_device(p.a), d_b = test::to_device(p.b), d_c = test::to_device(p.c0);
    blas::matmul(ExecSpace(), pr, p.ta, p.tb, p.m, p.n, p.k, p.alpha, d_a.data(), p.lda, d_b.data(), p.ldb, p.beta,
                 d_c.data(), p.ldc);
    const std::vector<float> c = test::to_host(d_c);
    for (std::size_t e = 0; e < c.size(); ++e) {
      const bool inside = int(e % std::size_t(p.ldc)) < p.n;
      const float expected = inside ? k::round_to(pr, want.c[e]) : p.c0[e];
      ASSERT_EQ(c[e], expected) << "element " << e << (inside ? "" : " (padding)");
    }
  }
  Product p = make(Op::T, Op::N, 11, 13, 17, 2, 0.75f, -1.0f, 950);
  Product want = p;
  run(want, Precision::fp32);
  auto d_a = test::to_device(p.a), d_b = test::to_device(p.b), d_c = test::to_device(p.c0);
  blas::gemm(ExecSpace(), p.ta, p.tb, p.m, p.n, p.k, p.alpha, d_a.data(), p.lda, d_b.data(), p.ldb, p.beta,
             d_c.data(), p.ldc);
  const std::vector<float> c = test::to_host(d_c);
  EXPECT_EQ(std::memcmp(c.data(), want.c.data(), c.size() * sizeof(float)), 0) << "the float gemm is fp32";
}

/// max |x - y| / max |y|
double relative_difference(const std::vector<float>& x, const std::vector<float>& y) {
  double diff = 0.0, scale = 0.0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    diff = std::max(diff, std::fabs(double(x[i]) - double(y[i])));
    scale = std::max(scale, std::fabs(double(y[i])));
  }
  return diff / scale;
}

TEST(GemmPrecision, OperandRoundingIsVisibleAtEachFormatsEpsilon) {
  // k = 256 random products: rounding each operand moves every product by about 2^-p
  // relatively (p = 8 for bf16, 11 for fp16); the sums then differ from fp32's by about
  // 2^-p |C|, far above fp32's own error (~1e-6 relative) and far below O(1).
  std::vector<float> out[3];
  for (Precision pr : kPrecisions) {
    Product p = make(Op::N, Op::T, 32, 48, 256, 0, 1.0f, 0.0f, 77);
    run(p, pr);
    check(p, pr);
    out[int(pr)] = p.c;
  }
  const double bf16 = relative_difference(out[int(Precision::bf16)], out[int(Precision::fp32)]);
  const double fp16 = relative_difference(out[int(Precision::fp16)], out[int(Precision::fp32)]);
  RecordProperty("bf16_vs_fp32", std::to_string(bf16));
  RecordProperty("fp16_vs_fp32", std::to_string(fp16));
  EXPECT_GT(bf16, std::ldexp(1.0, -11)) << "bf16 operands were not rounded";
  EXPECT_LT(bf16, std::ldexp(1.0, -5));
  EXPECT_GT(fp16, std::ldexp(1.0, -14)) << "fp16 operands were not rounded";
  EXPECT_LT(fp16, std::ldexp(1.0, -8));
  EXPECT_GT(bf16, 3.0 * fp16) << "bf16 (8 significant bits) should be coarser than fp16 (11)";
}

TEST(GemmPrecision, Fp16OverflowsWhereBf16DoesNot) {
  // 70000 is beyond fp16's 65504: the fp16 product is inf, bf16 keeps fp32's range.
  std::vector<float> a = {70000.0f, 1.0f}, b = {1.0f, 1.0f};
  for (Precision pr : {Precision::bf16, Precision::fp16}) {
    auto d_a = test::to_device(a), d_b = test::to_device(b);
    auto d_c = test::to_device(std::vector<float>{0.0f});
    blas::gemm(ExecSpace(), pr, Op::N, Op::N, 1, 1, 2, 1.0f, d_a.data(), 2, d_b.data(), 1, 0.0f,
               d_c.data(), 1);
    EXPECT_EQ(k::all_finite(ExecSpace(), d_c), pr == Precision::bf16) << precision_name(pr);
  }
}

TEST(GemmPrecision, EdgeShapesAndBadArguments) {
  for (GemmLibrary lib : libraries())
  for (Precision pr : kPrecisions) {
    GemmLibraryScope scope(lib);
    SCOPED_TRACE(::testing::Message() << gemm_library_name(lib) << " " << precision_name(pr));
    // k = 0: C = beta C.
    Product p = make(Op::N, Op::N, 3, 4, 0, 1, 2.0f, 0.5f, 5);
    run(p, pr);
    check(p, pr);
    // m = 0 or n = 0: nothing is read or written.
    blas::gemm(ExecSpace(), pr, Op::N, Op::N, 0, 4, 3, 1.0f, nullptr, 3, nullptr, 4, 0.0f, nullptr,
               4);
    blas::gemm(ExecSpace(), pr, Op::N, Op::N, 3, 0, 3, 1.0f, nullptr, 3, nullptr, 1, 0.0f, nullptr,
               1);
    // A leading dimension below the stored row width is refused before anything is read.
    EXPECT_THROW(blas::gemm(ExecSpace(), pr, Op::N, Op::N, 2, 2, 3, 1.0f, nullptr, 2, nullptr, 2,
                            0.0f, nullptr, 2),
                 std::invalid_argument);
    EXPECT_THROW(blas::gemm(ExecSpace(), pr, Op::T, Op::N, 2, 2, 3, 1.0f, nullptr, 1, nullptr, 2,
                            0.0f, nullptr, 2),
                 std::invalid_argument);
    EXPECT_THROW(blas::gemm(ExecSpace(), pr, Op::N, Op::N, -1, 2, 3, 1.0f, nullptr, 3, nullptr, 2,
                            0.0f, nullptr, 2),
                 std::invalid_argument);
  }
}

TEST(GemmPrecision, ScratchGrowsAndIsReused) {
  // Small, large, small again, then the large one: each must be right whatever the scratch holds.
  for (GemmLibrary lib : libraries())
  for (Precision pr : {Precision::bf16, Precision::fp16}) {
    GemmLibraryScope scope(lib);
    for (int round = 0; round < 2; ++round) {
      for (int size : {3, 120, 5}) {
        Product p = make(Op::T, Op::N, size, size + 1, size + 2, 1, 1.0f, 0.0f, unsigned(size));
        run(p, pr);
        check(p, pr);
      }
    }
  }
}

TEST(GemmPrecision, LowpPathNamesWhatRuns) {
#if defined(KOKKOS_ENABLE_CUDA)
  EXPECT_STREQ(blas::lowp_path(Precision::fp32), "cublasSgemm");
  EXPECT_STREQ(blas::lowp_path(Precision::bf16), "cublasGemmEx (CUDA_R_16BF, CUBLAS_COMPUTE_32F)");
  EXPECT_STREQ(blas::lowp_path(Precision::fp16), "cublasGemmEx (CUDA_R_16F, CUBLAS_COMPUTE_32F)");
#else
  std::printf("bf16 GEMM here (run.gemm = auto): %s\n", blas::lowp_path(Precision::bf16));
  {
    GemmLibraryScope scope(GemmLibrary::openblas);
    EXPECT_STREQ(blas::lowp_path(Precision::fp32), "cblas_sgemm");
    EXPECT_STREQ(blas::lowp_path(Precision::fp16), "emulated (rounded operands, sgemm)");
    const bool library = blas::cblas::is_library_sbgemm(blas::cblas::sbgemm());
    EXPECT_STREQ(blas::lowp_path(Precision::bf16),
                 library ? "cblas_sbgemm" : "emulated (rounded operands, sgemm)");
  }
  if (blas::onednn::available()) {
    GemmLibraryScope scope(GemmLibrary::onednn);
    EXPECT_STREQ(blas::lowp_path(Precision::fp32), "onednn matmul (fp32)");
    EXPECT_STREQ(blas::lowp_path(Precision::bf16), blas::onednn::bf16_supported()
                                                       ? "onednn matmul (bf16 operands, fp32 accumulation)"
                                                       : "emulated (rounded operands, sgemm)");
    EXPECT_STREQ(blas::lowp_path(Precision::fp16), "emulated (rounded operands, sgemm)");
  }
#endif
}

// --- The cblas_sbgemm path, through a stand-in with its contract --------------------------

int sbgemm_calls = 0;

/// Row-major C = alpha op(A) op(B) + beta C on bf16 patterns, summed in double and stored as
/// float: what an exact bf16 GEMM with fp32 output gives. Records that it ran.
void reference_sbgemm(Op ta, Op tb, int m, int n, int k, float alpha, const std::uint16_t* A,
                      int lda, const std::uint16_t* B, int ldb, float beta, float* C, int ldc) {
  ++sbgemm_calls;
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      double sum = 0.0;
      for (int q = 0; q < k; ++q) {
        const std::uint16_t a = ta == Op::N ? A[i * lda + q] : A[q * lda + i];
        const std::uint16_t b = tb == Op::N ? B[q * ldb + j] : B[j * ldb + q];
        sum += double(k::from_bf16_bits(a)) * double(k::from_bf16_bits(b));
      }
      float& c = C[i * ldc + j];
      c = float(double(alpha) * sum + (beta == 0.0f ? 0.0 : double(beta) * double(c)));
    }
  }
}

/// Installs a bf16 GEMM for the lifetime of the object, then puts the previous one back.
class InstalledSbgemm {
 public:
  explicit InstalledSbgemm(blas::cblas::SbgemmFn fn) : previous_(blas::cblas::set_sbgemm(fn)) {}
  ~InstalledSbgemm() { blas::cblas::set_sbgemm(previous_); }
  InstalledSbgemm(const InstalledSbgemm&) = delete;
  InstalledSbgemm& operator=(const InstalledSbgemm&) = delete;

 private:
  blas::cblas::SbgemmFn previous_;
};

TEST(GemmPrecision, Bf16TakesTheSbgemmPathWhenOneIsThere) {
  if (!kHostMemory)
    GTEST_SKIP() << "cblas_sbgemm is the host path; this build multiplies on the device";
  GemmLibraryScope openblas(GemmLibrary::openblas);
  InstalledSbgemm installed(&reference_sbgemm);
  EXPECT_STREQ(blas::lowp_path(Precision::bf16), "bf16 GEMM installed by cblas::set_sbgemm");
  EXPECT_STREQ(blas::lowp_path(Precision::fp16), "emulated (rounded operands, sgemm)");
  sbgemm_calls = 0;
  for (Op ta : {Op::N, Op::T}) {
    for (Op tb : {Op::N, Op::T}) {
      SCOPED_TRACE(::testing::Message() << "ta=" << op_name(ta) << " tb=" << op_name(tb));
      Product p = make(ta, tb, 13, 17, 11, 3, -0.5f, 2.0f, 9);
      run(p, Precision::bf16);
      check(p, Precision::bf16);
    }
  }
  EXPECT_EQ(sbgemm_calls, 4);
  // fp16 has no such routine and fp32 never uses it.
  Product p = make(Op::N, Op::N, 4, 4, 4, 0, 1.0f, 0.0f, 3);
  run(p, Precision::fp16);
  run(p, Precision::fp32);
  EXPECT_EQ(sbgemm_calls, 4);
}

TEST(GemmPrecision, SbgemmAndEmulationAgree) {
  if (!kHostMemory)
    GTEST_SKIP() << "cblas_sbgemm is the host path; this build multiplies on the device";
  GemmLibraryScope openblas(GemmLibrary::openblas);
  Product with = make(Op::T, Op::N, 24, 20, 200, 2, 1.0f, 0.25f, 21), without = with;
  {
    InstalledSbgemm installed(&reference_sbgemm);
    run(with, Precision::bf16);
  }
  {
    InstalledSbgemm installed(nullptr);  // force the emulation even where OpenBLAS has sbgemm
    EXPECT_STREQ(blas::lowp_path(Precision::bf16), "emulated (rounded operands, sgemm)");
    run(without, Precision::bf16);
  }
  check(with, Precision::bf16);
  check(without, Precision::bf16);
  EXPECT_LT(relative_difference(with.c, without.c), 1e-5);
}

/// The bf16 bit patterns of a stored operand.
std::vector<std::uint16_t> bf16_bits(const std::vector<float>& x) {
  std::vector<std::uint16_t> out(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) out[i] = k::to_bf16_bits(x[i]);
  return out;
}

// matmul(exec, p, ta, ..., Operand, Operand, ...): operands already in bf16 (a weight's copy, an
// activation a kernel wrote in bf16) give the bits of matmul under bf16 on their values, packed
// ones alongside; padded (strided) bf16 operands are right too. Where the products take no bf16
// operands (fp32 here) it refuses.
TEST(GemmPrecision, Bf16OperandsGiveTheFloatGemmsBits) {
  if (!kHostMemory) GTEST_SKIP() << "bf16 operands are a host path";
  {
    EXPECT_FALSE(blas::bf16_operands(Precision::fp32));
    float c = 0.0f;
    const std::uint16_t one = k::to_bf16_bits(1.0f);
    EXPECT_THROW(blas::matmul(ExecSpace(), Precision::fp32, Op::N, Op::N, 1, 1, 1, 1.0f,
                              blas::Operand{nullptr, &one, 1}, blas::Operand{nullptr, &one, 1}, 0.0f, &c, 1),
                 std::logic_error);
  }
  InstalledSbgemm installed(&reference_sbgemm);  // the OpenBLAS path has a bf16 GEMM too
  for (GemmLibrary lib : libraries()) {
    GemmLibraryScope scope(lib);
    if (!blas::bf16_operands(Precision::bf16)) continue;  // oneDNN without a bf16 matmul on this CPU
    for (Op ta : {Op::N, Op::T}) {
      for (Op tb : {Op::N, Op::T}) {
        SCOPED_TRACE(::testing::Message() << gemm_library_name(lib) << " ta=" << op_name(ta) << " tb=" << op_name(tb));
        for (int pad : {0, 3}) {
          Product p = make(ta, tb, 21, 34, 45, pad, 1.0f, 1.0f, 40 + unsigned(pad));
          auto d_a = test::to_device(p.a), d_b = test::to_device(p.b);
          auto d_a16 = test::to_device(bf16_bits(p.a)), d_b16 = test::to_device(bf16_bits(p.b));
          auto d_want = test::to_device(p.c0);
          blas::matmul(ExecSpace(), Precision::bf16, ta, tb, p.m, p.n, p.k, p.alpha, d_a.data(), p.lda, d_b.data(),
                       p.ldb, p.beta, d_want.data(), p.ldc);
          const std::vector<float> want = test::to_host(d_want);
          const blas::Operand a32{d_a.data(), nullptr, p.lda}, a16{nullptr, d_a16.data(), p.lda};
          const blas::Operand b32{d_b.data(), nullptr, p.ldb}, b16{nullptr, d_b16.data(), p.ldb};
          for (const auto& [a, b] : {std::pair{a16, b32}, std::pair{a32, b16}, std::pair{a16, b16}}) {
            auto d_c = test::to_device(p.c0);
            blas::matmul(ExecSpace(), Precision::bf16, ta, tb, p.m, p.n, p.k, p.alpha, a, b, p.beta, d_c.data(),
                         p.ldc);
            p.c = test::to_host(d_c);
            if (pad == 0) {  // the layout of the packed copies: the same product, the same bits
              ASSERT_EQ(std::memcmp(p.c.data(), want.data(), want.size() * sizeof(float)), 0);
            } else {  // another layout may sum in another order: a bf16 step at most, or fp32 sums' error
              for (std::size_t e = 0; e < want.size(); ++e)
                ASSERT_NEAR(p.c[e], want[e], std::ldexp(std::fabs(want[e]), -7) + 1e-3) << "element " << e;
            }
          }
        }
      }
    }
  }
  float c = 0.0f;
  EXPECT_THROW(blas::matmul(ExecSpace(), Precision::bf16, Op::N, Op::N, 1, 1, 1, 1.0f, blas::Operand{&c, nullptr, 1},
                            blas::Operand{nullptr, nullptr, 1}, 0.0f, &c, 1),
               std::invalid_argument);
}

/// Runs f(library, exact) under each GEMM library whose products take bf16 operands here; exact:
/// the stand-in sbgemm runs them (its sums exact in double), else oneDNN (a bf16 step at most).
template <class F>
void each_bf16_library(const F& f) {
  for (GemmLibrary lib : libraries()) {
    GemmLibraryScope scope(lib);
    if (!blas::bf16_operands(Precision::bf16)) continue;
    f(lib, blas::lowp_path(Precision::bf16) == std::string("bf16 GEMM installed by cblas::set_sbgemm"));
  }
}

// matmul_batched: a batch over two nested indices with strides of their own (a gap between items,
// the inner items of A side by side in shared rows as the attention's head slices are) gives each item's product
// of the bf16 values, rounded to bf16: against double sums, one bf16 step at most (fp32 sums may
// round the other way at a tie); the stand-in sbgemm's fallback (one product per item) exactly.
// Empty batches and k = 0 are handled; without bf16 operands (fp32 here) it refuses.
TEST(GemmPrecision, BatchedBf16ProductsEqualEachItems) {
  if (!kHostMemory) GTEST_SKIP() << "bf16 operands are a host path";
  const std::uint16_t one = k::to_bf16_bits(1.0f);
  std::uint16_t out = 0;
  EXPECT_THROW(blas::matmul_batched(ExecSpace(), Precision::fp32, Op::N, Op::N, 1, 1, 1, 1.0f, &one, 1, &one, 1, &out,
                                    1, {}),
               std::logic_error);
  InstalledSbgemm installed(&reference_sbgemm);
  each_bf16_library([&](GemmLibrary lib, bool exact) {
    for (Op ta : {Op::N, Op::T}) {
      for (Op tb : {Op::N, Op::T}) {
        SCOPED_TRACE(::testing::Message() << gemm_library_name(lib) << " ta=" << op_name(ta) << " tb=" << op_name(tb));
        const int m = 7, n = 9, kk = 13, outer = 2, inner = 3;
        const int ra = ta == Op::N ? m : kk, ca = ta == Op::N ? kk : m, rb = tb == Op::N ? kk : n,
                  cb = tb == Op::N ? n : kk;
        // Row strides with padding; A's inner items side by side in shared rows (as the attention's
        // heads in the fused qkv rows), B's and C's items whole blocks apart with a gap.
        const int lda = inner * (ca + 1) + 1, ldb = cb + 3, ldc = n + 2;
        blas::Batch batch{outer,
                          inner,
                          {std::int64_t(ra) * lda, ca + 1},
                          {std::int64_t(inner) * rb * ldb + 5, std::int64_t(rb) * ldb},
                          {std::int64_t(inner) * m * ldc + 4, std::int64_t(m) * ldc}};
        const std::vector<float> a = test::random_vector<float>(std::size_t(outer) * ra * lda, 51, -2, 2);
        const std::vector<float> b = test::random_vector<float>(std::size_t(batch.b[0]) * outer, 52, -2, 2);
        const std::vector<std::uint16_t> a16 = bf16_bits(a), b16 = bf16_bits(b);
        const std::size_t c_size = std::size_t(batch.c[0]) * outer;
        const std::uint16_t untouched = k::to_bf16_bits(-7.0f);
        auto d_a = test::to_device(a16), d_b = test::to_device(b16);
        auto d_c = test::to_device(std::vector<std::uint16_t>(c_size, untouched));
        const float alpha = 0.75f;
        blas::matmul_batched(ExecSpace(), Precision::bf16, ta, tb, m, n, kk, alpha, d_a.data(), lda, d_b.data(), ldb,
                             d_c.data(), ldc, batch);
        const std::vector<std::uint16_t> c = test::to_host(d_c);
        std::vector<bool> written(c_size, false);
        for (int o = 0; o < outer; ++o)
          for (int i = 0; i < inner; ++i) {
            const std::uint16_t* ai = a16.data() + o * batch.a[0] + i * batch.a[1];
            const std::uint16_t* bi = b16.data() + o * batch.b[0] + i * batch.b[1];
            const std::size_t ci = std::size_t(o * batch.c[0] + i * batch.c[1]);
            for (int r = 0; r < m; ++r)
              for (int j = 0; j < n; ++j) {
                double sum = 0.0;
                for (int q = 0; q < kk; ++q)
                  sum += double(k::from_bf16_bits(ta == Op::N ? ai[r * lda + q] : ai[q * lda + r])) *
                         double(k::from_bf16_bits(tb == Op::N ? bi[q * ldb + j] : bi[j * ldb + q]));
                const float want = k::round_bf16(float(double(alpha) * sum));
                const std::size_t e = ci + std::size_t(r) * ldc + std::size_t(j);
                written[e] = true;
                const float got = k::from_bf16_bits(c[e]);
                if (exact) ASSERT_EQ(got, want) << "item " << o << "," << i << " (" << r << "," << j << ")";
                else ASSERT_NEAR(got, want, std::ldexp(std::fabs(want), -7) + 1e-6) << "item " << o << "," << i;
              }
          }
        for (std::size_t e = 0; e < c_size; ++e) {
          if (!written[e]) {
            ASSERT_EQ(c[e], untouched) << "element " << e << " lies outside every item";
          }
        }
      }
    }
    // k = 0: each item is zero; an empty batch writes nothing.
    const std::uint16_t untouched = k::to_bf16_bits(-7.0f);
    std::uint16_t c2[2] = {untouched, untouched};
    blas::matmul_batched(ExecSpace(), Precision::bf16, Op::N, Op::N, 1, 1, 0, 1.0f, &one, 1, &one, 1, c2, 1,
                         blas::Batch{1, 2, {0, 0}, {0, 0}, {0, 1}});
    EXPECT_EQ(c2[0], 0);
    EXPECT_EQ(c2[1], 0);
    blas::matmul_batched(ExecSpace(), Precision::bf16, Op::N, Op::N, 1, 1, 1, 1.0f, &one, 1, &one, 1, c2, 1,
                         blas::Batch{0, 3});
    EXPECT_EQ(c2[0], 0);
    EXPECT_THROW(blas::matmul_batched(ExecSpace(), Precision::bf16, Op::N, Op::N, 1, 1, 1, 1.0f, &one, 1, &one, 1, c2,
                                      1, blas::Batch{-1, 1}),
                 std::invalid_argument);
  });
}

// matmul with a bf16 C (the GPT's activations under bf16): each element is the fp32 sum plus the
// bias, rounded to bf16 once; against double sums exactly through the stand-in sbgemm (fp32
// scratch, then bias and rounding), within a bf16 step through oneDNN (the primitive adds the
// bias and rounds as it stores). The padding of C is left alone; k = 0 stores the bias; a bias
// with alpha != 1 is refused.
TEST(GemmPrecision, Bf16OutputAddsTheBiasAndRoundsOnce) {
  if (!kHostMemory) GTEST_SKIP() << "bf16 operands are a host path";
  InstalledSbgemm installed(&reference_sbgemm);
  const std::uint16_t untouched = k::to_bf16_bits(-7.0f);
  each_bf16_library([&](GemmLibrary lib, bool exact) {
    for (Op ta : {Op::N, Op::T}) {
      for (Op tb : {Op::N, Op::T}) {
        for (bool with_bias : {false, true}) {
          SCOPED_TRACE(::testing::Message() << gemm_library_name(lib) << " ta=" << op_name(ta)
                                            << " tb=" << op_name(tb) << " bias=" << with_bias);
          const int m = 19, n = 23, kk = 37, ldc = n + 3;
          const float alpha = with_bias ? 1.0f : -0.5f;
          const int lda = (ta == Op::N ? kk : m) + 1, ldb = (tb == Op::N ? n : kk) + 2;
          const std::vector<std::uint16_t> a16 =
              bf16_bits(test::random_vector<float>(std::size_t(ta == Op::N ? m : kk) * lda, 61, -2, 2));
          const std::vector<std::uint16_t> b16 =
              bf16_bits(test::random_vector<float>(std::size_t(tb == Op::N ? kk : n) * ldb, 62, -2, 2));
          const std::vector<float> bias = test::random_vector<float>(std::size_t(n), 63, -3, 3);
          auto d_a = test::to_device(a16), d_b = test::to_device(b16);
          auto d_bias = test::to_device(bias);
          auto d_c = test::to_device(std::vector<std::uint16_t>(std::size_t(m) * ldc, untouched));
          blas::matmul(ExecSpace(), Precision::bf16, ta, tb, m, n, kk, alpha, blas::Operand{nullptr, d_a.data(), lda},
                       blas::Operand{nullptr, d_b.data(), ldb}, d_c.data(), ldc, with_bias ? d_bias.data() : nullptr);
          const std::vector<std::uint16_t> c = test::to_host(d_c);
          for (int r = 0; r < m; ++r) {
            for (int j = 0; j < ldc; ++j) {
              const std::uint16_t got16 = c[std::size_t(r) * ldc + j];
              if (j >= n) {
                ASSERT_EQ(got16, untouched) << "padding (" << r << "," << j << ")";
                continue;
              }
              double sum = 0.0;
              for (int q = 0; q < kk; ++q)
                sum += double(k::from_bf16_bits(ta == Op::N ? a16[r * lda + q] : a16[q * lda + r])) *
                       double(k::from_bf16_bits(tb == Op::N ? b16[q * ldb + j] : b16[j * ldb + q]));
              const float want = k::round_bf16(float(double(alpha) * sum) + (with_bias ? bias[j] : 0.0f));
              const float got = k::from_bf16_bits(got16);
              if (exact) ASSERT_EQ(got, want) << "(" << r << "," << j << ")";
              else ASSERT_NEAR(got, want, std::ldexp(std::fabs(want), -7) + 1e-5) << "(" << r << "," << j << ")";
            }
          }
        }
      }
    }
    const std::uint16_t one = k::to_bf16_bits(1.0f);
    const float bias[2] = {0.3f, -2.5f};
    std::uint16_t c2[2] = {untouched, untouched};
    blas::matmul(ExecSpace(), Precision::bf16, Op::N, Op::N, 1, 2, 0, 1.0f, blas::Operand{nullptr, &one, 1},
                 blas::Operand{nullptr, &one, 2}, c2, 2, bias);
    EXPECT_EQ(c2[0], k::to_bf16_bits(0.3f));
    EXPECT_EQ(c2[1], k::to_bf16_bits(-2.5f));
    EXPECT_THROW(blas::matmul(ExecSpace(), Precision::bf16, Op::N, Op::N, 1, 2, 1, 2.0f,
                              blas::Operand{nullptr, &one, 1}, blas::Operand{nullptr, &one, 2}, c2, 2, bias),
                 std::invalid_argument);
  });
}

}  // namespace
