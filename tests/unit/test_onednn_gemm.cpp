// tessera::blas::onednn (host pointers) against a double reference and against OpenBLAS: fp32
// within fp32 reassociation, bf16 exactly the products of the bf16 operands summed in fp32;
// every transpose, padded rows, alpha and beta, edge shapes, bad arguments; primitives created
// once per product; run.gemm's choice and its log line. Skipped in a build without oneDNN,
// where the test checks that nothing claims it.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
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

struct Case {
  Op ta, tb;
  int m, n, k, pad;
  float alpha, beta;
};

/// Row-major operands of a case with `pad` extra elements per row, and C0 (padded too).
struct Operands {
  int lda, ldb, ldc;
  std::vector<float> a, b, c0;
};

Operands operands(const Case& c, unsigned seed) {
  Operands o;
  const int a_rows = c.ta == Op::N ? c.m : c.k, a_cols = c.ta == Op::N ? c.k : c.m;
  const int b_rows = c.tb == Op::N ? c.k : c.n, b_cols = c.tb == Op::N ? c.n : c.k;
  o.lda = std::max(a_cols, 1) + c.pad;
  o.ldb = std::max(b_cols, 1) + c.pad;
  o.ldc = std::max(c.n, 1) + c.pad;
  o.a = test::random_vector<float>(std::size_t(std::max(a_rows, 1)) * o.lda, seed);
  o.b = test::random_vector<float>(std::size_t(std::max(b_rows, 1)) * o.ldb, seed + 1);
  o.c0 = test::random_vector<float>(std::size_t(std::max(c.m, 1)) * o.ldc, seed + 2);
  return o;
}

std::vector<std::uint16_t> bf16_bits(const std::vector<float>& x) {
  std::vector<std::uint16_t> h(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) h[i] = k::to_bf16_bits(x[i]);
  return h;
}

/// C against alpha op(r(A)) op(r(B)) + beta C0 in double (r: bf16 rounding or none), within
/// fp32 summation's bound (k + 2) 2^-23 sum |terms|; padding untouched.
void check(const Case& c, const Operands& o, const std::vector<float>& got, bool bf16) {
  auto r = [&](float x) { return bf16 ? k::round_bf16(x) : x; };
  auto A = [&](int i, int q) { return r(c.ta == Op::N ? o.a[i * o.lda + q] : o.a[q * o.lda + i]); };
  auto B = [&](int q, int j) { return r(c.tb == Op::N ? o.b[q * o.ldb + j] : o.b[j * o.ldb + q]); };
  for (int i = 0; i < c.m; ++i) {
    for (int j = 0; j < o.ldc; ++j) {
      const std::size_t at = std::size_t(i) * o.ldc + j;
      if (j >= c.n) {
        ASSERT_EQ(got[at], o.c0[at]) << "padding written at (" << i << "," << j << ")";
        continue;
      }
      double sum = 0.0, magnitude = 0.0;
      for (int q = 0; q < c.k; ++q) {
        const double p = double(A(i, q)) * double(B(q, j));
        sum += p;
        magnitude += std::fabs(p);
      }
      const double c0 = c.beta == 0.0f ? 0.0 : double(o.c0[at]);
      const double want = double(c.alpha) * sum + double(c.beta) * c0;
      const double tol = (c.k + 2) * std::ldexp(1.0, -23) * (std::fabs(c.alpha) * magnitude + std::fabs(c.beta * c0));
      ASSERT_NEAR(double(got[at]), want, tol) << "C(" << i << "," << j << ")";
    }
  }
}

std::vector<Case> cases() {
  std::vector<Case> all;
  for (Op ta : {Op::N, Op::T})
    for (Op tb : {Op::N, Op::T}) {
      all.push_back({ta, tb, 7, 5, 3, 0, 1.5f, -0.75f});
      all.push_back({ta, tb, 13, 17, 11, 3, -0.5f, 2.0f});
      all.push_back({ta, tb, 1, 9, 31, 1, 1.0f, 1.0f});
      all.push_back({ta, tb, 33, 1, 64, 4, 0.25f, 0.0f});
      all.push_back({ta, tb, 64, 48, 300, 2, 1.0f, 0.5f});
      all.push_back({ta, tb, 3, 4, 0, 1, 2.0f, 0.5f});  // k = 0: C = beta C
    }
  return all;
}

class OnednnGemm : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!blas::onednn::available()) GTEST_SKIP() << "this build has no oneDNN";
  }
};

TEST_F(OnednnGemm, Fp32MatchesTheReferenceAtEveryTransposePaddingAlphaBeta) {
  unsigned seed = 1;
  for (const Case& c : cases()) {
    SCOPED_TRACE(::testing::Message() << "m=" << c.m << " n=" << c.n << " k=" << c.k << " ta=" << int(c.ta)
                                      << " tb=" << int(c.tb));
    const Operands o = operands(c, seed += 3);
    std::vector<float> got = o.c0;
    blas::onednn::gemm(c.ta, c.tb, c.m, c.n, c.k, c.alpha, o.a.data(), o.lda, o.b.data(), o.ldb, c.beta,
                       got.data(), o.ldc);
    check(c, o, got, false);
  }
}

TEST_F(OnednnGemm, Bf16IsTheProductOfTheRoundedOperandsSummedInFp32) {
  if (!blas::onednn::bf16_supported()) GTEST_SKIP() << "oneDNN has no bf16 matmul on " << blas::onednn::isa();
  unsigned seed = 100;
  for (const Case& c : cases()) {
    SCOPED_TRACE(::testing::Message() << "m=" << c.m << " n=" << c.n << " k=" << c.k << " ta=" << int(c.ta)
                                      << " tb=" << int(c.tb));
    const Operands o = operands(c, seed += 3);
    const std::vector<std::uint16_t> a16 = bf16_bits(o.a), b16 = bf16_bits(o.b);
    std::vector<float> got = o.c0;
    blas::onednn::gemm_bf16(c.ta, c.tb, c.m, c.n, c.k, c.alpha, a16.data(), o.lda, b16.data(), o.ldb, c.beta,
                            got.data(), o.ldc);
    check(c, o, got, true);
  }
}

TEST_F(OnednnGemm, Fp32AgreesWithOpenBlasWithinReassociation) {
  // A GPT-like product: the two libraries sum in different orders, nothing more.
  const Case c{Op::N, Op::T, 128, 96, 256, 0, 1.0f, 0.0f};
  const Operands o = operands(c, 7);
  std::vector<float> dnnl = o.c0, openblas = o.c0;
  blas::onednn::gemm(c.ta, c.tb, c.m, c.n, c.k, 1.0f, o.a.data(), o.lda, o.b.data(), o.ldb, 0.0f, dnnl.data(),
                     o.ldc);
  blas::cblas::gemm(c.ta, c.tb, c.m, c.n, c.k, 1.0f, o.a.data(), o.lda, o.b.data(), o.ldb, 0.0f,
                    openblas.data(), o.ldc);
  double worst = 0.0;
  for (std::size_t i = 0; i < dnnl.size(); ++i)
    worst = std::max(worst, std::fabs(double(dnnl[i]) - double(openblas[i])) / (1.0 + std::fabs(double(openblas[i]))));
  EXPECT_LT(worst, 1e-5);
  RecordProperty("onednn_vs_openblas", std::to_string(worst));
}

TEST_F(OnednnGemm, PrimitivesAreCreatedOncePerProduct) {
  const Case c{Op::T, Op::N, 21, 19, 17, 1, 1.0f, 0.0f};
  const Operands o = operands(c, 11);
  std::vector<float> out = o.c0;
  const auto call = [&](float alpha) {
    blas::onednn::gemm(c.ta, c.tb, c.m, c.n, c.k, alpha, o.a.data(), o.lda, o.b.data(), o.ldb, 0.0f, out.data(),
                       o.ldc);
  };
  call(1.0f);
  const std::size_t after_first = blas::onednn::cache_size();
  for (int i = 0; i < 5; ++i) call(1.0f);
  EXPECT_EQ(blas::onednn::cache_size(), after_first) << "the same product created a new primitive";
  call(2.0f);  // another scale is another primitive
  EXPECT_EQ(blas::onednn::cache_size(), after_first + 1);
}

TEST_F(OnednnGemm, BadArgumentsAreRefusedBeforeAnythingIsRead) {
  EXPECT_THROW(blas::onednn::gemm(Op::N, Op::N, 2, 2, 3, 1.0f, nullptr, 2, nullptr, 2, 0.0f, nullptr, 2),
               std::invalid_argument);
  EXPECT_THROW(blas::onednn::gemm_bf16(Op::N, Op::N, -1, 2, 3, 1.0f, nullptr, 3, nullptr, 2, 0.0f, nullptr, 2),
               std::invalid_argument);
  // m = 0 or n = 0: nothing is read or written.
  blas::onednn::gemm(Op::N, Op::N, 0, 4, 3, 1.0f, nullptr, 3, nullptr, 4, 0.0f, nullptr, 4);
  blas::onednn::gemm_bf16(Op::N, Op::N, 3, 0, 3, 1.0f, nullptr, 3, nullptr, 1, 0.0f, nullptr, 1);
}

TEST(GemmLibrary, ChoiceAndLogLine) {
  const std::string isa = blas::onednn::isa();
  std::printf("oneDNN ISA: %s, fp32 implementation: %s, bf16: %s\n", isa.c_str(),
              blas::onednn::implementation(false).c_str(), blas::onednn::implementation(true).c_str());
  const bool avx512 = blas::onednn::available() && isa.rfind("avx512_core", 0) == 0;
  EXPECT_EQ(blas::automatic_library(Precision::fp32), avx512 ? blas::Library::onednn : blas::Library::openblas);
  EXPECT_EQ(blas::automatic_library(Precision::fp16), blas::Library::openblas);
  const bool native = blas::onednn::available() && blas::onednn::native_bf16();
  EXPECT_EQ(blas::automatic_library(Precision::bf16), native ? blas::Library::onednn : blas::Library::openblas);
  const std::string line = blas::describe_gemm();
  std::printf("%s\n", line.c_str());
  EXPECT_EQ(line.rfind(avx512 ? "gemm: fp32 -> onednn (brg:avx512_core), bf16 -> " : "gemm: fp32 -> openblas (cblas_sgemm), bf16 -> ", 0),
            0u)
      << line;
  EXPECT_NE(line.find("run.gemm = auto"), std::string::npos) << line;
  EXPECT_EQ(line.find("not fast here") == std::string::npos,
            native || std::string(blas::lowp_path(Precision::bf16)) == "cblas_sbgemm")
      << line;
  if (native) {
    EXPECT_NE(line.find("bf16 -> onednn (brg:avx512_core"), std::string::npos) << line;
  }

  blas::set_gemm_library(GemmLibrary::openblas);
  EXPECT_EQ(blas::library_for(Precision::bf16), blas::Library::openblas);
  EXPECT_NE(blas::describe_gemm().find("run.gemm = openblas"), std::string::npos);
  if (blas::onednn::available()) {
    blas::set_gemm_library(GemmLibrary::onednn);
    EXPECT_EQ(blas::library_for(Precision::fp32), blas::Library::onednn);
    EXPECT_EQ(blas::library_for(Precision::bf16),
              blas::onednn::bf16_supported() ? blas::Library::onednn : blas::Library::openblas);
    EXPECT_EQ(blas::library_for(Precision::fp16), blas::Library::openblas);  // no fp16 product in oneDNN here
  } else {
    EXPECT_THROW(blas::set_gemm_library(GemmLibrary::onednn), std::invalid_argument);
    EXPECT_EQ(blas::onednn::isa(), "none");
  }
  blas::set_gemm_library(GemmLibrary::automatic);
}

TEST(GemmLibrary, Fp32UnderOpenBlasIsOpenBlasBitForBit) {
  // run.gemm = openblas keeps the layout invariant exactly as before: the float gemm is sgemm.
  const Case c{Op::N, Op::T, 40, 30, 70, 0, 1.0f, 1.0f};
  const Operands o = operands(c, 23);
  std::vector<float> direct = o.c0;
  blas::cblas::gemm(c.ta, c.tb, c.m, c.n, c.k, 1.0f, o.a.data(), o.lda, o.b.data(), o.ldb, 1.0f, direct.data(),
                    o.ldc);
  blas::set_gemm_library(GemmLibrary::openblas);
  auto d_a = test::to_device(o.a), d_b = test::to_device(o.b), d_c = test::to_device(o.c0);
  blas::gemm(ExecSpace(), c.ta, c.tb, c.m, c.n, c.k, 1.0f, d_a.data(), o.lda, d_b.data(), o.ldb, 1.0f, d_c.data(),
             o.ldc);
  blas::set_gemm_library(GemmLibrary::automatic);
  const std::vector<float> via = test::to_host(d_c);
  if constexpr (!std::is_same_v<MemSpace, HostSpace>) GTEST_SKIP() << "device memory multiplies on cuBLAS";
  for (std::size_t i = 0; i < via.size(); ++i) ASSERT_EQ(via[i], direct[i]) << i;
}

}  // namespace
