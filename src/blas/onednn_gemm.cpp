// oneDNN matmul behind blas/onednn_gemm.hpp: a primitive per distinct product, created once and
// kept with its memory objects, whose data handles each call points at the caller's buffers.
#include "blas/onednn_gemm.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <map>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <stdexcept>
#include <tuple>
#include <unordered_map>

#include "blas/cblas_gemm.hpp"
#include "core/counted_buffer.hpp"

namespace tessera::blas::onednn {
namespace {

using dt = dnnl::memory::data_type;

/// Everything that makes a primitive different: a product of another shape, layout, scale,
/// element type, batch or thread count gets its own. batched false: one 2-D product.
struct Key {
  dt in, out;
  Op ta, tb;
  int m, n, k, lda, ldb, ldc;
  std::uint32_t alpha, beta;  // bit patterns
  int threads;
  bool batched = false;
  int outer = 1, inner = 1;
  std::array<std::int64_t, 6> strides{};  // A's, B's and C's (outer, inner)
  bool bias = false;                      // an fp32 bias (n) added to every row before C's rounding
  auto tie() const {
    return std::tie(in, out, ta, tb, m, n, k, lda, ldb, ldc, alpha, beta, threads, batched, outer, inner, strides,
                    bias);
  }
  bool operator<(const Key& o) const { return tie() < o.tie(); }
};

/// A primitive and the memory objects of its arguments (their data handles set per call).
struct Entry {
  dnnl::matmul primitive;
  dnnl::memory a, b, c, bias;
  dnnl::memory scratchpad;  ///< its scratchpad's descriptor, on Library::scratchpad when run
  std::unordered_map<int, dnnl::memory> args;
};

std::uint32_t bits(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

/// oneDNN's OpenMP thread count for the threads that call it (1 until set_threads).
int threads_now = 1;

struct Library {
  std::mutex mutex;
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  std::map<Key, Entry> cache;
  CountedBuffer scratchpad;  ///< the primitives' own (scratchpad_mode::user), counted as mem "lib"
};

Library& library() {
  static Library lib;
  return lib;
}

/// The row-major op(X) (rows x cols) stored at row stride ld, as a oneDNN descriptor.
dnnl::memory::desc operand(dt type, Op op, int rows, int cols, int ld) {
  const dnnl::memory::dims strides = op == Op::N ? dnnl::memory::dims{ld, 1} : dnnl::memory::dims{1, ld};
  return dnnl::memory::desc({rows, cols}, type, strides);
}

/// The same for operand `which` (0 A, 1 B, 2 C) of the key: 4-D (outer, inner, rows, cols) at the
/// batch's strides where the key is a batch.
dnnl::memory::desc operand(const Key& key, int which, dt type, Op op, int rows, int cols, int ld) {
  if (!key.batched) return operand(type, op, rows, cols, ld);
  // A count of 1 gets stride 1 (any stride describes one item; oneDNN checks them all).
  const auto stride = [&](int index, int count) {
    return count > 1 ? key.strides[std::size_t(2 * which + index)] : std::int64_t{1};
  };
  const dnnl::memory::dims strides = {stride(0, key.outer), stride(1, key.inner), op == Op::N ? ld : 1,
                                      op == Op::N ? 1 : ld};
  return dnnl::memory::desc({key.outer, key.inner, rows, cols}, type, strides);
}

Entry make_entry(const Library& lib, const Key& key, float alpha, float beta) {
  const auto a = operand(key, 0, key.in, key.ta, key.m, key.k, key.lda);
  const auto b = operand(key, 1, key.in, key.tb, key.k, key.n, key.ldb);
  const auto c = operand(key, 2, key.out, Op::N, key.m, key.n, key.ldc);
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
  if (beta != 0.0f) {
    dnnl::post_ops ops;
    ops.append_sum(beta);
    attr.set_post_ops(ops);
  }
  const dnnl::memory::desc bias({1, key.n}, dt::f32, dnnl::memory::dims{key.n, 1});
  const dnnl::matmul::primitive_desc pd(key.bias ? dnnl::matmul::desc(a, b, bias, c) : dnnl::matmul::desc(a, b, c),
                                        attr, lib.engine);
  Entry e{dnnl::matmul(pd),
          dnnl::memory(a, lib.engine, nullptr),
          dnnl::memory(b, lib.engine, nullptr),
          dnnl::memory(c, lib.engine, nullptr),
          dnnl::memory(bias, lib.engine, nullptr),
          dnnl::memory(pd.scratchpad_desc(), lib.engine, nullptr),
          {}};
  e.args = {{DNNL_ARG_SRC, e.a}, {DNNL_ARG_WEIGHTS, e.b}, {DNNL_ARG_DST, e.c}};
  if (key.bias) e.args.emplace(DNNL_ARG_BIAS, e.bias);
  if (e.scratchpad.get_desc().get_size() > 0) e.args.emplace(DNNL_ARG_SCRATCHPAD, e.scratchpad);
  return e;
}

/// C = beta C where k == 0 (no product to run; oneDNN refuses an empty reduction).
void scale_only(int m, int n, float beta, float* C, int ldc) {
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) C[std::size_t(i) * ldc + j] = beta == 0.0f ? 0.0f : beta * C[std::size_t(i) * ldc + j];
}

/// Runs the product (or batch) of key on A, B and C: its cached primitive, made at the first call.
/// Called with the library's mutex held.
void execute(const Key& key, float alpha, float beta, const void* A, const void* B, void* C,
             const float* bias = nullptr) {
  Library& lib = library();
  try {
    auto it = lib.cache.find(key);
    if (it == lib.cache.end()) {
      if (lib.cache.size() >= 4096) lib.cache.clear();  // a bound on a run whose shapes keep changing
      it = lib.cache.emplace(key, make_entry(lib, key, alpha, beta)).first;
    }
    Entry& e = it->second;
    e.a.set_data_handle(const_cast<void*>(A));
    e.b.set_data_handle(const_cast<void*>(B));
    e.c.set_data_handle(C);
    if (key.bias) e.bias.set_data_handle(const_cast<float*>(bias));
    if (const std::size_t bytes = e.scratchpad.get_desc().get_size(); bytes > 0)
      e.scratchpad.set_data_handle(lib.scratchpad.get(bytes));
    e.primitive.execute(lib.stream, e.args);
    lib.stream.wait();
  } catch (const dnnl::error& err) {
    throw std::runtime_error(std::string("tessera::blas::onednn::gemm: oneDNN failed (") + err.what() + ") on a " +
                             (key.in == dt::bf16 ? "bf16" : "fp32") + (key.batched ? " batched" : "") +
                             " product m=" + std::to_string(key.m) + " n=" + std::to_string(key.n) +
                             " k=" + std::to_string(key.k));
  }
}

void run(dt in, Op ta, Op tb, int m, int n, int k, float alpha, const void* A, int lda, const void* B, int ldb,
         float beta, float* C, int ldc) {
  cblas::check_args(ta, tb, m, n, k, lda, ldb, ldc);
  if (m == 0 || n == 0) return;
  if (k == 0) {
    scale_only(m, n, beta, C, ldc);
    return;
  }
  std::lock_guard<std::mutex> lock(library().mutex);
  execute(Key{in, dt::f32, ta, tb, m, n, k, lda, ldb, ldc, bits(alpha), bits(beta), threads_now}, alpha, beta, A,
          B, C);
}

}  // namespace

bool available() { return true; }

std::string isa() {
  switch (dnnl::get_effective_cpu_isa()) {
    case dnnl::cpu_isa::sse41: return "sse41";
    case dnnl::cpu_isa::avx: return "avx";
    case dnnl::cpu_isa::avx2: return "avx2";
    case dnnl::cpu_isa::avx2_vnni: return "avx2_vnni";
    case dnnl::cpu_isa::avx512_mic: return "avx512_mic";
    case dnnl::cpu_isa::avx512_mic_4ops: return "avx512_mic_4ops";
    case dnnl::cpu_isa::avx512_core: return "avx512_core";
    case dnnl::cpu_isa::avx512_core_vnni: return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core_bf16: return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_amx: return "avx512_core_amx";
    default: break;
  }
  return "generic";
}

bool native_bf16() {
  const auto i = dnnl::get_effective_cpu_isa();
  return i == dnnl::cpu_isa::avx512_core_bf16 || i == dnnl::cpu_isa::avx512_core_amx;
}

bool bf16_supported() {
  static const bool supported = implementation(true).rfind("unavailable", 0) != 0;
  return supported;
}

void gemm(Op ta, Op tb, int m, int n, int k, float alpha, const float* A, int lda, const float* B, int ldb,
          float beta, float* C, int ldc) {
  run(dt::f32, ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
}

void gemm_bf16(Op ta, Op tb, int m, int n, int k, float alpha, const std::uint16_t* A, int lda,
               const std::uint16_t* B, int ldb, float beta, float* C, int ldc) {
  run(dt::bf16, ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
}

void gemm_batched_bf16(Op ta, Op tb, int m, int n, int k, float alpha, const std::uint16_t* A, int lda,
                       const std::uint16_t* B, int ldb, std::uint16_t* C, int ldc, const Batch& batch) {
  cblas::check_args(ta, tb, m, n, k, lda, ldb, ldc);
  if (batch.outer < 0 || batch.inner < 0)
    throw std::invalid_argument("tessera::blas::onednn::gemm_batched_bf16: batch counts " +
                                std::to_string(batch.outer) + " x " + std::to_string(batch.inner));
  if (m == 0 || n == 0 || batch.outer == 0 || batch.inner == 0) return;
  if (k == 0) {  // no product to run: every item is zero
    for (int o = 0; o < batch.outer; ++o)
      for (int i = 0; i < batch.inner; ++i)
        for (int r = 0; r < m; ++r) {
          std::uint16_t* row = C + o * batch.c[0] + i * batch.c[1] + std::int64_t{r} * ldc;
          std::fill(row, row + n, std::uint16_t{0});
        }
    return;
  }
  Key key{dt::bf16, dt::bf16, ta, tb, m, n, k, lda, ldb, ldc, bits(alpha), bits(0.0f), threads_now};
  key.batched = true;
  key.outer = batch.outer;
  key.inner = batch.inner;
  key.strides = {batch.a[0], batch.a[1], batch.b[0], batch.b[1], batch.c[0], batch.c[1]};
  std::lock_guard<std::mutex> lock(library().mutex);
  execute(key, alpha, 0.0f, A, B, C);
}

void gemm_bf16_out(Op ta, Op tb, int m, int n, int k, float alpha, const std::uint16_t* A, int lda,
                   const std::uint16_t* B, int ldb, const float* bias, std::uint16_t* C, int ldc) {
  cblas::check_args(ta, tb, m, n, k, lda, ldb, ldc);
  if (bias != nullptr && alpha != 1.0f)
    throw std::invalid_argument("tessera::blas::onednn::gemm_bf16_out: a bias with alpha = " + std::to_string(alpha) +
                                " (only alpha = 1)");
  if (k == 0)  // oneDNN refuses an empty reduction; blas::gemm fills such a C itself
    throw std::invalid_argument("tessera::blas::onednn::gemm_bf16_out: k = 0 (no product to run)");
  if (m == 0 || n == 0) return;
  Key key{dt::bf16, dt::bf16, ta, tb, m, n, k, lda, ldb, ldc, bits(alpha), bits(0.0f), threads_now};
  key.bias = bias != nullptr;
  std::lock_guard<std::mutex> lock(library().mutex);
  execute(key, alpha, 0.0f, A, B, C, bias);
}

std::string implementation(bool bf16) {
  const dt in = bf16 ? dt::bf16 : dt::f32;
  try {
    const dnnl::matmul::primitive_desc pd(
        dnnl::matmul::desc(operand(in, Op::N, 1024, 256, 256), operand(in, Op::T, 256, 768, 256),
                           operand(dt::f32, Op::N, 1024, 768, 768)),
        library().engine);
    return pd.impl_info_str();
  } catch (const dnnl::error& err) {
    return std::string("unavailable (") + err.what() + ")";
  }
}

void set_threads(int n) {
  if (n < 1) throw std::invalid_argument("tessera::blas::onednn::set_threads: n = " + std::to_string(n));
  // oneDNN's OpenMP runtime, loaded with it; absent (nullptr) under a sequential build.
  using SetThreads = void (*)(int);
  static const auto omp_set = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "omp_set_num_threads"));
  if (omp_set != nullptr) omp_set(n);
  std::lock_guard<std::mutex> lock(library().mutex);
  threads_now = n;
}

std::size_t cache_size() {
  std::lock_guard<std::mutex> lock(library().mutex);
  return library().cache.size();
}

}  // namespace tessera::blas::onednn
