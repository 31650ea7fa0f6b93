// Mixed-precision GEMM: operands rounded or converted to bf16 / fp16 by Kokkos kernels into
// grow-only scratch, then the vendor BLAS (blas/gemm.hpp documents the contract).
#include <algorithm>
#include <cstdint>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>

#include "blas/cblas_gemm.hpp"
#include "blas/gemm.hpp"
#include "blas/gemm_library.hpp"
#include "blas/onednn_gemm.hpp"
#include "core/memory.hpp"
#include "core/test_hooks.hpp"
#include "kernels/precision.hpp"
#include "kernels/simd.hpp"

#if defined(KOKKOS_ENABLE_CUDA)
#include "blas/cublas_gemm.hpp"
#define TESSERA_GEMM_CUBLAS 1
#endif

namespace tessera::blas {
namespace {

/// Converts one element of an operand.
struct ToBf16Bits {
  KOKKOS_INLINE_FUNCTION std::uint16_t operator()(float x) const {
    return kernels::to_bf16_bits(x);
  }
};
struct ToFp16Bits {
  KOKKOS_INLINE_FUNCTION std::uint16_t operator()(float x) const {
    return kernels::to_fp16_bits(x);
  }
};

/// The stored shape of an operand: op(X) is (rows_op x cols_op), X is stored transposed for T.
struct Stored {
  int rows, cols, ld;
  Index size() const { return Index(rows) * Index(cols); }
  int packed_ld() const { return cols > 1 ? cols : 1; }
};
Stored stored(Op op, int rows_op, int cols_op, int ld) {
  return op == Op::N ? Stored{rows_op, cols_op, ld} : Stored{cols_op, rows_op, ld};
}

/// \brief dst (rows, cols) packed = convert(src (rows, ld)) over the stored rows. On a CPU one
/// thread per row with a vectorised loop over its columns; on a GPU one thread per element.
template <class Out, class Convert>
void pack(const ExecSpace& exec, const float* src, const Stored& s, Out* dst, Convert convert) {
  if constexpr (Kokkos::SpaceAccessibility<HostSpace, MemSpace>::accessible) {
    const Index cols = s.cols, ld = s.ld;
    Kokkos::parallel_for(
        "tessera::blas::gemm::pack", range(exec, Index(s.rows)), KOKKOS_LAMBDA(const Index r) {
          const float* in = src + r * ld;
          Out* out = dst + r * cols;
          TESSERA_SIMD
          for (Index c = 0; c < cols; ++c) out[c] = convert(in[c]);
        });
    return;
  }
  if (s.ld == s.cols || s.rows == 1) {  // contiguous: one flat loop
    Kokkos::parallel_for(
        "tessera::blas::gemm::pack", range(exec, s.size()),
        KOKKOS_LAMBDA(const Index i) { dst[i] = convert(src[i]); });
    return;
  }
  const Index cols = s.cols, ld = s.ld;
  using Policy = Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<2>, Kokkos::IndexType<Index>>;
  Kokkos::parallel_for(
      "tessera::blas::gemm::pack_strided", Policy(exec, {0, 0}, {Index(s.rows), cols}),
      KOKKOS_LAMBDA(const Index r, const Index c) {
        dst[r * cols + c] = convert(src[r * ld + c]);
      });
}

/// A grow-only buffer in MemSpace, counted as activation memory; never shrinks, so a training
/// loop that repeats its shapes allocates once. Released by a Kokkos finalize hook.
template <class T>
class Scratch {
 public:
  explicit Scratch(const char* what) : label_(mem::label(mem::Category::act, what)) {}

  /// At least n elements (n may be 0). Work enqueued on `last` may still read the old buffer,
  /// so it is fenced before the buffer is replaced.
  T* reserve(const ExecSpace& last, Index n) {
    if (Index(view_.extent(0)) < n || view_.data() == nullptr) {
      last.fence();
      view_ = Vector<T>();  // free first: never hold both
      view_ = Vector<T>(Kokkos::view_alloc(Kokkos::WithoutInitializing, label_),
                        std::size_t(n > 0 ? n : 1));
    }
    return view_.data();
  }
  void release() { view_ = Vector<T>(); }

 private:
  std::string label_;
  Vector<T> view_;
};

/// Everything the mixed-precision GEMM keeps between calls, behind one mutex.
struct State {
  std::mutex mutex;
  bool hooked = false;
  std::optional<ExecSpace> last;  // CUDA: the instance the previous call enqueued on
  Scratch<std::uint16_t> a16{"blas::gemm::A (16-bit)"}, b16{"blas::gemm::B (16-bit)"};
  Scratch<float> a32{"blas::gemm::A (rounded)"}, b32{"blas::gemm::B (rounded)"};

  void release() {
    a16.release();
    b16.release();
    a32.release();
    b32.release();
    last.reset();
    hooked = false;
  }
};

State& state() {
  static State s;
  return s;
}

/// state() locked, with its finalize hook pushed once.
std::unique_lock<std::mutex> locked_state() {
  State& s = state();
  std::unique_lock<std::mutex> lock(s.mutex);
  if (!s.hooked) {
    Kokkos::push_finalize_hook([] { state().release(); });
    s.hooked = true;
  }
  return lock;
}

/// The checks of the Operand products: exactly one pointer per operand, and a bf16 GEMM to take them.
void check_operands(Precision p, const Operand& A, const Operand& B) {
  if ((A.f32 == nullptr) == (A.bf16 == nullptr) || (B.f32 == nullptr) == (B.bf16 == nullptr))
    throw std::invalid_argument("tessera::blas::matmul: an Operand needs exactly one of f32 and bf16");
  if (!bf16_operands(p))
    throw std::logic_error(std::string("tessera::blas::matmul: bf16 operands of a ") + precision_name(p) +
                           " product without a bf16 GEMM (blas::bf16_operands)");
}

#if !defined(TESSERA_GEMM_CUBLAS)
/// The host bf16 GEMM of library_for(bf16): oneDNN's matmul or cblas_sbgemm, nullptr where
/// neither runs (the emulation).
cblas::SbgemmFn bf16_gemm() {
  return library_for(Precision::bf16) == Library::onednn ? &onednn::gemm_bf16 : cblas::sbgemm();
}

/// Operand x of op(x) (rows_op x cols_op) as bf16: itself where it is bf16 already, else packed
/// into `scratch`; ld becomes the stride of what is returned.
const std::uint16_t* bf16_operand(const ExecSpace& exec, Scratch<std::uint16_t>& scratch, const Operand& x,
                                  Op op, int rows_op, int cols_op, int& ld) {
  ld = x.ld;
  if (x.bf16 != nullptr) return x.bf16;
  const Stored st = stored(op, rows_op, cols_op, x.ld);
  std::uint16_t* out = scratch.reserve(exec, st.size());
  pack(exec, x.f32, st, out, ToBf16Bits{});
  ld = st.packed_ld();
  return out;
}

/// Packs both operands with `convert` and runs `product` on the packed copies.
template <class Out, class Convert, class Product>
void packed_product(const ExecSpace& exec, Scratch<Out>& sa, Scratch<Out>& sb, const float* A,
                    const Stored& a, const float* B, const Stored& b, Convert convert,
                    Product product) {
  Out* pa = sa.reserve(exec, a.size());
  Out* pb = sb.reserve(exec, b.size());
  pack(exec, A, a, pa, convert);
  pack(exec, B, b, pb, convert);
  exec.fence();  // host BLAS reads the copies next
  product(pa, pb);
}
#endif

}  // namespace

void gemm(const ExecSpace& exec, Precision p, Op ta, Op tb, int m, int n, int k, float alpha,
          const float* A, int lda, const float* B, int ldb, float beta, float* C, int ldc) {
  if (p == Precision::fp32) {
    gemm(exec, ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  cblas::check_args(ta, tb, m, n, k, lda, ldb, ldc);
  if (m == 0 || n == 0) return;
  const Stored a = stored(ta, m, k, lda), b = stored(tb, k, n, ldb);
  const int pa_ld = a.packed_ld(), pb_ld = b.packed_ld();

  const auto lock = locked_state();
  State& s = state();
#if defined(TESSERA_GEMM_CUBLAS)
  // The previous call's GEMM may still read the scratch on another stream.
  if (s.last && s.last->cuda_stream() != exec.cuda_stream()) s.last->fence();
  s.last = exec;
  std::uint16_t* pa = s.a16.reserve(exec, a.size());
  std::uint16_t* pb = s.b16.reserve(exec, b.size());
  if (p == Precision::bf16) {
    pack(exec, A, a, pa, ToBf16Bits{});
    pack(exec, B, b, pb, ToBf16Bits{});
  } else {
    pack(exec, A, a, pa, ToFp16Bits{});
    pack(exec, B, b, pb, ToFp16Bits{});
  }
  cublas::gemm_ex(exec.cuda_stream(), p, ta, tb, m, n, k, alpha, pa, pa_ld, pb, pb_ld, beta, C,
                  ldc);
#else
  const cblas::SbgemmFn sbgemm = p == Precision::bf16 ? bf16_gemm() : nullptr;
  if (sbgemm != nullptr) {
    packed_product(exec, s.a16, s.b16, A, a, B, b, ToBf16Bits{},
                   [&](const std::uint16_t* pa, const std::uint16_t* pb) {
                     sbgemm(ta, tb, m, n, k, alpha, pa, pa_ld, pb, pb_ld, beta, C, ldc);
                   });
    return;
  }
  const auto sgemm = [&](const float* pa, const float* pb) {
    cblas::gemm(ta, tb, m, n, k, alpha, pa, pa_ld, pb, pb_ld, beta, C, ldc);
  };
  if (p == Precision::bf16) {
    packed_product(exec, s.a32, s.b32, A, a, B, b, kernels::RoundBf16{}, sgemm);
  } else {
    packed_product(exec, s.a32, s.b32, A, a, B, b, kernels::RoundFp16{}, sgemm);
  }
#endif
}

bool bf16_operands(Precision p) {
#if defined(TESSERA_GEMM_CUBLAS)
  (void)p;
  return false;
#else
  // Test hook (core/test_hooks.hpp): pack_bf16 keeps every operand fp32, packed at each product
  // (the path before bf16 operands), so a test can compare the bits of both.
  return !test_hooks::pack_bf16() && p == Precision::bf16 && bf16_gemm() != nullptr;
#endif
}

void matmul(const ExecSpace& exec, Precision p, Op ta, Op tb, int m, int n, int k, float alpha,
            const Operand& A, const Operand& B, float beta, float* C, int ldc) {
  check_operands(p, A, B);
  if (A.bf16 == nullptr && B.bf16 == nullptr) {
    matmul(exec, p, ta, tb, m, n, k, alpha, A.f32, A.ld, B.f32, B.ld, beta, C, ldc);
    return;
  }
#if !defined(TESSERA_GEMM_CUBLAS)
  cblas::check_args(ta, tb, m, n, k, A.ld, B.ld, ldc);
  if (m == 0 || n == 0) return;
  {
    const auto lock = locked_state();
    State& s = state();
    int lda = 0, ldb = 0;
    const std::uint16_t* pa = bf16_operand(exec, s.a16, A, ta, m, k, lda);
    const std::uint16_t* pb = bf16_operand(exec, s.b16, B, tb, k, n, ldb);
    exec.fence();  // the producers of bf16 operands and the packing are done: the host BLAS reads
    bf16_gemm()(ta, tb, m, n, k, alpha, pa, lda, pb, ldb, beta, C, ldc);
  }
  kernels::round_rows(exec, Precision::bf16, C, m, n, ldc);  // stored in bf16, as matmul's C
#endif
}

#if !defined(TESSERA_GEMM_CUBLAS)
namespace {

/// The products of matmul_batched on bf16 operands the host library can read now; called with
/// s.mutex held. oneDNN: one primitive for the batch; another bf16 GEMM: each item into fp32
/// scratch, rounded into C.
void batched_bf16_out(const ExecSpace& exec, State& s, Op ta, Op tb, int m, int n, int k, float alpha,
                      const std::uint16_t* A, int lda, const std::uint16_t* B, int ldb, std::uint16_t* C, int ldc,
                      const Batch& batch) {
  const cblas::SbgemmFn sbgemm = bf16_gemm();
  if (sbgemm == &onednn::gemm_bf16) {
    onednn::gemm_batched_bf16(ta, tb, m, n, k, alpha, A, lda, B, ldb, C, ldc, batch);
    return;
  }
  if (m == 0 || n == 0) return;
  float* item = s.a32.reserve(exec, Index(m) * Index(n));
  for (int o = 0; o < batch.outer; ++o)
    for (int i = 0; i < batch.inner; ++i) {
      sbgemm(ta, tb, m, n, k, alpha, A + o * batch.a[0] + i * batch.a[1], lda, B + o * batch.b[0] + i * batch.b[1],
             ldb, 0.0f, item, n);
      std::uint16_t* c = C + o * batch.c[0] + i * batch.c[1];
      for (int r = 0; r < m; ++r)
        for (int j = 0; j < n; ++j) c[std::int64_t{r} * ldc + j] = kernels::to_bf16_bits(item[std::int64_t{r} * n + j]);
    }
}

}  // namespace
#endif

void matmul_batched(const ExecSpace& exec, Precision p, Op ta, Op tb, int m, int n, int k, float alpha,
                    const std::uint16_t* A, int lda, const std::uint16_t* B, int ldb, std::uint16_t* C, int ldc,
                    const Batch& batch) {
  if (!bf16_operands(p))
    throw std::logic_error(std::string("tessera::blas::matmul_batched: bf16 operands of a ") + precision_name(p) +
                           " product without a bf16 GEMM (blas::bf16_operands)");
  cblas::check_args(ta, tb, m, n, k, lda, ldb, ldc);
  if (batch.outer < 0 || batch.inner < 0)
    throw std::invalid_argument("tessera::blas::matmul_batched: batch counts " + std::to_string(batch.outer) + " x " +
                                std::to_string(batch.inner));
#if !defined(TESSERA_GEMM_CUBLAS)
  exec.fence();  // the operands' producers are done: the host library reads them
  const auto lock = locked_state();
  batched_bf16_out(exec, state(), ta, tb, m, n, k, alpha, A, lda, B, ldb, C, ldc, batch);
#endif
}

void matmul(const ExecSpace& exec, Precision p, Op ta, Op tb, int m, int n, int k, float alpha,
            const Operand& A, const Operand& B, std::uint16_t* C, int ldc, const float* bias) {
  check_operands(p, A, B);
  cblas::check_args(ta, tb, m, n, k, A.ld, B.ld, ldc);
  if (bias != nullptr && alpha != 1.0f)
    throw std::invalid_argument("tessera::blas::matmul: a bias with alpha = " + std::to_string(alpha) +
                                " (only alpha = 1)");
#if !defined(TESSERA_GEMM_CUBLAS)
  if (m == 0 || n == 0) return;
  const auto lock = locked_state();
  State& s = state();
  int lda = 0, ldb = 0;
  const std::uint16_t* pa = bf16_operand(exec, s.a16, A, ta, m, k, lda);
  const std::uint16_t* pb = bf16_operand(exec, s.b16, B, tb, k, n, ldb);
  exec.fence();  // the producers of bf16 operands and the packing are done: the host library reads
  const cblas::SbgemmFn sbgemm = bf16_gemm();
  if (sbgemm == &onednn::gemm_bf16 && k > 0) {  // the primitive adds the bias and rounds as it stores
    onednn::gemm_bf16_out(ta, tb, m, n, k, alpha, pa, lda, pb, ldb, bias, C, ldc);
    return;
  }
  // Another bf16 GEMM: the fp32 sums into scratch, then the bias and the rounding.
  float* sums = s.a32.reserve(exec, Index(m) * Index(n));
  if (k > 0) sbgemm(ta, tb, m, n, k, alpha, pa, lda, pb, ldb, 0.0f, sums, n);
  else std::fill(sums, sums + Index(m) * Index(n), 0.0f);
  for (int r = 0; r < m; ++r) {
    const float* row = sums + std::int64_t{r} * n;
    std::uint16_t* c = C + std::int64_t{r} * ldc;
    if (bias != nullptr)
      for (int j = 0; j < n; ++j) c[j] = kernels::to_bf16_bits(row[j] + bias[j]);
    else
      for (int j = 0; j < n; ++j) c[j] = kernels::to_bf16_bits(row[j]);
  }
#endif
}

const char* lowp_path(Precision p) {
#if defined(TESSERA_GEMM_CUBLAS)
  switch (p) {
    case Precision::bf16:
      return "cublasGemmEx (CUDA_R_16BF, CUBLAS_COMPUTE_32F)";
    case Precision::fp16:
      return "cublasGemmEx (CUDA_R_16F, CUBLAS_COMPUTE_32F)";
    case Precision::fp32:
      break;
  }
  return "cublasSgemm";
#else
  if (p == Precision::fp32) return library_for(p) == Library::onednn ? "onednn matmul (fp32)" : "cblas_sgemm";
  if (p == Precision::bf16 && library_for(p) == Library::onednn)
    return "onednn matmul (bf16 operands, fp32 accumulation)";
  const cblas::SbgemmFn sbgemm = p == Precision::bf16 ? cblas::sbgemm() : nullptr;
  if (sbgemm == nullptr) return "emulated (rounded operands, sgemm)";
  return cblas::is_library_sbgemm(sbgemm) ? "cblas_sbgemm"
                                          : "bf16 GEMM installed by cblas::set_sbgemm";
#endif
}

void gemm(Precision p, Op ta, Op tb, int m, int n, int k, float alpha, const float* A, int lda,
          const float* B, int ldb, float beta, float* C, int ldc) {
  gemm(ExecSpace(), p, ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
}

}  // namespace tessera::blas
