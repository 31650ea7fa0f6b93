// tessera::blas::gemm against a naive triple loop: all four transpose combinations,
// non-square shapes, padded rows (ld > row width), alpha and beta != 1, float and double.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "blas/gemm.hpp"

namespace {

using tessera::blas::Op;

template <class T>
struct GemmCase {
  Op ta, tb;
  int m, n, k;
};

template <class T>
void check_gemm(Op ta, Op tb, int m, int n, int k, T alpha, T beta, int pad, double tol) {
  // Stored shapes: A is (m,k) or (k,m) when transposed; B (k,n) or (n,k).
  const int a_rows = ta == Op::N ? m : k, a_cols = ta == Op::N ? k : m;
  const int b_rows = tb == Op::N ? k : n, b_cols = tb == Op::N ? n : k;
  const int lda = a_cols + pad, ldb = b_cols + 2 * pad, ldc = n + 3 * pad;
  std::mt19937 gen(1234 + m + 7 * n + 13 * k + int(ta) * 2 + int(tb));
  std::uniform_real_distribution<double> dist(-1.0, 1.0);
  std::vector<T> a(std::size_t(a_rows) * lda), b(std::size_t(b_rows) * ldb), c(std::size_t(m) * ldc);
  for (auto& v : a) v = T(dist(gen));
  for (auto& v : b) v = T(dist(gen));
  for (auto& v : c) v = T(dist(gen));
  const std::vector<T> c0 = c;

  tessera::blas::gemm(ta, tb, m, n, k, alpha, a.data(), lda, b.data(), ldb, beta, c.data(), ldc);

  auto A = [&](int i, int p) { return ta == Op::N ? a[i * lda + p] : a[p * lda + i]; };
  auto B = [&](int p, int j) { return tb == Op::N ? b[p * ldb + j] : b[j * ldb + p]; };
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < ldc; ++j) {
      const std::size_t at = std::size_t(i) * ldc + j;
      if (j >= n) {  // padding between rows is never touched
        EXPECT_EQ(c[at], c0[at]) << "padding written at row " << i << " col " << j;
        continue;
      }
      double sum = 0.0;
      for (int p = 0; p < k; ++p) sum += double(A(i, p)) * double(B(p, j));
      const double expected = double(alpha) * sum + double(beta) * double(c0[at]);
      EXPECT_NEAR(double(c[at]), expected, tol) << "C(" << i << "," << j << ")";
    }
  }
}

template <class T>
class GemmTest : public ::testing::Test {};
using Scalars = ::testing::Types<float, double>;
TYPED_TEST_SUITE(GemmTest, Scalars);

TYPED_TEST(GemmTest, AllTransposesNonSquarePaddedAlphaBeta) {
  using T = TypeParam;
  const double tol = std::is_same_v<T, float> ? 2e-5 : 1e-12;
  for (Op ta : {Op::N, Op::T}) {
    for (Op tb : {Op::N, Op::T}) {
      SCOPED_TRACE(::testing::Message() << "ta=" << (ta == Op::N ? "N" : "T")
                                        << " tb=" << (tb == Op::N ? "N" : "T"));
      check_gemm<T>(ta, tb, 7, 5, 3, T(1.5), T(-0.75), 0, tol);
      check_gemm<T>(ta, tb, 7, 5, 3, T(1.5), T(-0.75), 2, tol);
      check_gemm<T>(ta, tb, 13, 17, 11, T(-0.5), T(2), 3, tol);
      check_gemm<T>(ta, tb, 1, 9, 31, T(1), T(1), 1, tol);
      check_gemm<T>(ta, tb, 33, 1, 64, T(0.25), T(0), 4, tol);
    }
  }
}

TYPED_TEST(GemmTest, BetaZeroOverwritesAndEmptyIsANoOp) {
  using T = TypeParam;
  std::vector<T> a = {1, 2, 3, 4}, b = {5, 6, 7, 8};
  std::vector<T> c(4, T(1e30));
  tessera::blas::gemm(Op::N, Op::N, 2, 2, 2, T(1), a.data(), 2, b.data(), 2, T(0), c.data(), 2);
  EXPECT_EQ(c, (std::vector<T>{19, 22, 43, 50}));
  // m = 0: nothing happens (no BLAS complaint about leading dimensions).
  tessera::blas::gemm(Op::N, Op::N, 0, 2, 2, T(1), a.data(), 2, b.data(), 2, T(0), c.data(), 2);
  EXPECT_EQ(c, (std::vector<T>{19, 22, 43, 50}));
}

TEST(Gemm, TooSmallLeadingDimensionThrows) {
  std::vector<double> a(6), b(6), c(4);
  EXPECT_THROW(tessera::blas::gemm(Op::N, Op::N, 2, 2, 3, 1.0, a.data(), 2, b.data(), 2, 0.0,
                                   c.data(), 2),
               std::invalid_argument);
}

}  // namespace
