// peak_flops: what this machine can do in fp32, as the yardstick for Tessera's MFU.
//
//   (a) FMA peak of one core: independent FMA chains held in registers (AVX-512 and AVX2+FMA),
//       and where the CPU has AVX512-BF16, chains of vdpbf16ps (bf16 pairs multiplied and summed
//       into fp32: 32 multiply-adds per instruction, so 64 flops), the bf16 yardstick;
//   (b) the same on every allowed core (at most 2), one pinned std::thread per core, all FMAs
//       over the common wall time;
//   (c) cblas_sgemm (row-major) at square sizes and at the MLP 784-512-512-10's own shapes,
//       with 1 and 2 OpenBLAS threads, each checked against a naive reference before it is timed.
//
// Usage: peak_flops [--csv PATH] [--reps N] [--check-only]
// Timings are medians of --reps repetitions after a warm-up; GFLOP/s = 2mnk / time for GEMM and
// 2 flops per lane per FMA for the FMA chains. The CSV has columns what,threads,m,n,k,gflops,
// coretype, where coretype is what openblas_get_corename() reports (the kernels actually used).
#include <cblas.h>
#include <immintrin.h>
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <latch>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// One result row: a table line on stdout and a CSV line.
struct Row {
  std::string what;
  int threads = 1;
  int m = 0, n = 0, k = 0;  // 0 for the FMA rows
  double gflops = 0.0;
};

// --- (a), (b) FMA chains ------------------------------------------------------------------------

constexpr int kChains = 12;  // independent accumulators: covers 4-cycle latency x 2 FMA pipes, with room

// acc = acc * b + c, kChains independent chains, iters times. b < 1 keeps every value bounded and
// normal. Returns the sum of the accumulators so nothing can be elided.
template <std::size_t... I>
__attribute__((target("avx512f"))) float fma_chains_avx512(long iters, float b_in, float c_in,
                                                            std::index_sequence<I...>) {
  const __m512 b = _mm512_set1_ps(b_in), c = _mm512_set1_ps(c_in);
  __m512 acc[kChains];
  ((acc[I] = _mm512_set1_ps(static_cast<float>(I))), ...);
  for (long i = 0; i < iters; ++i) {
    ((acc[I] = _mm512_fmadd_ps(acc[I], b, c)), ...);
  }
  __m512 sum = _mm512_setzero_ps();
  ((sum = _mm512_add_ps(sum, acc[I])), ...);
  alignas(64) float lanes[16];  // not _mm512_reduce_add_ps: GCC 12's header warns inside it
  _mm512_store_ps(lanes, sum);
  float total = 0.0f;
  for (float x : lanes) total += x;
  return total;
}

template <std::size_t... I>
__attribute__((target("avx2,fma"))) float fma_chains_avx2(long iters, float b_in, float c_in,
                                                          std::index_sequence<I...>) {
  const __m256 b = _mm256_set1_ps(b_in), c = _mm256_set1_ps(c_in);
  __m256 acc[kChains];
  ((acc[I] = _mm256_set1_ps(static_cast<float>(I))), ...);
  for (long i = 0; i < iters; ++i) {
    ((acc[I] = _mm256_fmadd_ps(acc[I], b, c)), ...);
  }
  __m256 sum = _mm256_setzero_ps();
  ((sum = _mm256_add_ps(sum, acc[I])), ...);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, sum);
  float total = 0.0f;
  for (float x : lanes) total += x;
  return total;
}

// acc += dot(a, b) over bf16 pairs: vdpbf16ps chains. a, b hold bf16 pairs of values near 1e-3,
// so the accumulators grow slowly and stay normal.
template <std::size_t... I>
__attribute__((target("avx512f,avx512bf16"))) float dpbf16_chains(long iters, float b_in, float c_in,
                                                                 std::index_sequence<I...>) {
  const __m512bh a = _mm512_cvtne2ps_pbh(_mm512_set1_ps(c_in), _mm512_set1_ps(c_in));
  const __m512bh b = _mm512_cvtne2ps_pbh(_mm512_set1_ps(b_in), _mm512_set1_ps(b_in));
  __m512 acc[kChains];
  ((acc[I] = _mm512_set1_ps(static_cast<float>(I))), ...);
  for (long i = 0; i < iters; ++i) {
    ((acc[I] = _mm512_dpbf16_ps(acc[I], a, b)), ...);
  }
  __m512 sum = _mm512_setzero_ps();
  ((sum = _mm512_add_ps(sum, acc[I])), ...);
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, sum);
  float total = 0.0f;
  for (float x : lanes) total += x;
  return total;
}

enum class Isa { avx512, avx2, avx512_bf16 };

struct IsaInfo {
  const char* name;
  int lanes;
};

// lanes: multiply-adds per instruction (a vdpbf16ps does two per fp32 lane).
IsaInfo isa_info(Isa isa) {
  switch (isa) {
    case Isa::avx512: return {"fma_avx512", 16};
    case Isa::avx512_bf16: return {"dpbf16_avx512", 32};
    case Isa::avx2: break;
  }
  return {"fma_avx2", 8};
}

volatile float g_sink;     // where every FMA result ends up
volatile float g_b = 0.999999f, g_c = 1e-6f;  // read at run time: the compiler cannot fold the chains

// Run the chains once; return the seconds taken.
double time_fma_chains(Isa isa, long iters) {
  const float b = g_b, c = g_c;
  const auto t0 = Clock::now();
  const float r = isa == Isa::avx512        ? fma_chains_avx512(iters, b, c, std::make_index_sequence<kChains>{})
                  : isa == Isa::avx512_bf16 ? dpbf16_chains(iters, b, c, std::make_index_sequence<kChains>{})
                                            : fma_chains_avx2(iters, b, c, std::make_index_sequence<kChains>{});
  const double dt = seconds_since(t0);
  g_sink = r;
  return dt;
}

double fma_flops(Isa isa, long iters) { return 2.0 * isa_info(isa).lanes * kChains * static_cast<double>(iters); }

// The CPUs this process may run on, in order.
std::vector<int> allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu)
      if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
  }
  if (cpus.empty()) cpus.push_back(0);
  return cpus;
}

// Median GFLOP/s of `threads` concurrent chains, one std::thread pinned per allowed CPU. One
// repetition counts all threads' FMAs over the wall time from the first start to the last finish,
// so threads that were time-sliced rather than run side by side do not add up to a false sum.
double fma_peak(Isa isa, int threads, long iters, int reps) {
  const std::vector<int> cpus = allowed_cpus();
  std::vector<double> rates;
  for (int rep = 0; rep < reps + 1; ++rep) {  // the first repetition is the warm-up
    std::vector<Clock::time_point> begin(threads), end(threads);
    std::latch start(threads);
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        cpu_set_t one;
        CPU_ZERO(&one);
        CPU_SET(cpus[t % cpus.size()], &one);
        if (pthread_setaffinity_np(pthread_self(), sizeof(one), &one) != 0 && rep == 0)
          std::fprintf(stderr, "warning: could not pin thread %d to CPU %d; running unpinned\n", t,
                       cpus[t % cpus.size()]);
        start.arrive_and_wait();
        begin[t] = Clock::now();
        time_fma_chains(isa, iters);
        end[t] = Clock::now();
      });
    }
    for (auto& th : pool) th.join();
    if (rep == 0) continue;
    const double wall = std::chrono::duration<double>(*std::max_element(end.begin(), end.end()) -
                                                      *std::min_element(begin.begin(), begin.end()))
                            .count();
    rates.push_back(threads * fma_flops(isa, iters) / wall * 1e-9);
  }
  return median(rates);
}

// --- (c) SGEMM --------------------------------------------------------------------------------

// C (m,n) = op(A) op(B), row-major; op(A) (m,k), op(B) (k,n).
struct GemmCase {
  std::string what;
  bool trans_a, trans_b;
  int m, n, k;
};

struct GemmData {
  std::vector<float> a, b, c;  // a: (m,k) or (k,m) if trans_a; b: (k,n) or (n,k) if trans_b
  explicit GemmData(const GemmCase& g) : a(std::size_t(g.m) * g.k), b(std::size_t(g.k) * g.n), c(std::size_t(g.m) * g.n) {
    std::mt19937 rng(42);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (float& x : a) x = u(rng);
    for (float& x : b) x = u(rng);
  }
};

void run_sgemm(const GemmCase& g, GemmData& d) {
  const int lda = g.trans_a ? g.m : g.k, ldb = g.trans_b ? g.k : g.n;
  cblas_sgemm(CblasRowMajor, g.trans_a ? CblasTrans : CblasNoTrans, g.trans_b ? CblasTrans : CblasNoTrans,
              g.m, g.n, g.k, 1.0f, d.a.data(), lda, d.b.data(), ldb, 0.0f, d.c.data(), g.n);
}

// One element of op(A) op(B) in double.
double reference_element(const GemmCase& g, const GemmData& d, int i, int j) {
  double s = 0.0;
  for (int p = 0; p < g.k; ++p) {
    const float a = g.trans_a ? d.a[std::size_t(p) * g.m + i] : d.a[std::size_t(i) * g.k + p];
    const float b = g.trans_b ? d.b[std::size_t(j) * g.k + p] : d.b[std::size_t(p) * g.n + j];
    s += double(a) * double(b);
  }
  return s;
}

// Compare C with the reference on every element (small sizes) or on `samples` random elements.
// Entries are sums of k products of U(-1,1) values; fp32 error grows like sqrt(k) eps.
bool check_sgemm(const GemmCase& g, int samples) {
  GemmData d(g);
  run_sgemm(g, d);
  const double tol = 1e-5 * std::sqrt(double(g.k)) + 1e-6 * g.k;
  std::mt19937 rng(7);
  const bool all = samples <= 0;
  const long count = all ? long(g.m) * g.n : samples;
  double worst = 0.0;
  for (long e = 0; e < count; ++e) {
    const int i = all ? int(e / g.n) : int(rng() % g.m);
    const int j = all ? int(e % g.n) : int(rng() % g.n);
    const double err = std::abs(d.c[std::size_t(i) * g.n + j] - reference_element(g, d, i, j));
    worst = std::max(worst, err);
  }
  if (worst > tol) {
    std::fprintf(stderr, "error: sgemm %s (%dx%dx%d, transA=%d transB=%d) differs from the reference by %.3g > %.3g\n",
                 g.what.c_str(), g.m, g.n, g.k, g.trans_a, g.trans_b, worst, tol);
    return false;
  }
  return true;
}

// Median GFLOP/s of cblas_sgemm; each repetition times enough calls to last ~20 ms.
double time_sgemm(const GemmCase& g, int reps) {
  GemmData d(g);
  const double flops = 2.0 * g.m * g.n * double(g.k);
  run_sgemm(g, d);  // warm-up: OpenBLAS thread start, page faults
  auto t0 = Clock::now();
  run_sgemm(g, d);
  const double once = std::max(seconds_since(t0), 1e-7);
  const int calls = std::max(1, int(0.02 / once));
  std::vector<double> rates;
  for (int rep = 0; rep < reps; ++rep) {
    t0 = Clock::now();
    for (int c = 0; c < calls; ++c) run_sgemm(g, d);
    rates.push_back(flops * calls / seconds_since(t0) * 1e-9);
  }
  g_sink = d.c[0];
  return median(rates);
}

// The square sizes and the MLP 784-512-512-10's shapes (Linear: Y (B,out) = X (B,in) W (out,in)^T).
std::vector<GemmCase> gemm_cases() {
  std::vector<GemmCase> cases;
  for (int s : {256, 512, 1024, 2048}) cases.push_back({"sgemm_square", false, false, s, s, s});
  for (int batch : {64, 128}) {
    cases.push_back({"mlp_fwd_l1", false, true, batch, 512, 784});    // (B,784) (512,784)^T
    cases.push_back({"mlp_fwd_l2", false, true, batch, 512, 512});    // (B,512) (512,512)^T
    cases.push_back({"mlp_fwd_l3", false, true, batch, 10, 512});     // (B,512) (10,512)^T
    cases.push_back({"mlp_bwd_dW_l1", true, false, 512, 784, batch}); // dY (B,512)^T X (B,784)
    cases.push_back({"mlp_bwd_dX_l2", false, false, batch, 512, 512}); // dY (B,512) W (512,512)
  }
  // The GPT of inputs/kjv_gpt.toml on one of 2 data-parallel ranks: 8 sequences x 128 tokens = 1024
  // rows, width 256 (qkv 768, MLP 1024); forward Y = X W^T, backward dX = dY W, dW = dY^T X; and one
  // head's attention products (context 128, head width 64).
  const int n = 1024, C = 256;
  for (auto [what, out, in] : {std::tuple{"qkv", 3 * C, C}, {"proj", C, C}, {"fc", 4 * C, C}, {"mproj", C, 4 * C}}) {
    cases.push_back({std::string("gpt_fwd_") + what, false, true, n, out, in});
    cases.push_back({std::string("gpt_bwd_dX_") + what, false, false, n, in, out});
    cases.push_back({std::string("gpt_bwd_dW_") + what, true, false, out, in, n});
  }
  cases.push_back({"gpt_att_qk", false, true, 128, 128, 64});
  cases.push_back({"gpt_att_pv", false, false, 128, 64, 128});
  return cases;
}

// Check every transpose combination in use, in full at a small odd size and by sampling at the
// timed sizes, before anything is timed.
bool check_all_sgemm(const std::vector<GemmCase>& cases) {
  bool ok = true;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) ok = check_sgemm({"small", ta, tb, 37, 29, 23}, 0) && ok;
  for (const GemmCase& g : cases) ok = check_sgemm(g, 64) && ok;
  return ok;
}

void print_row(const Row& r) {
  if (r.m == 0)
    std::printf("%-16s %7d %6s %6s %6s %10.1f\n", r.what.c_str(), r.threads, "-", "-", "-", r.gflops);
  else
    std::printf("%-16s %7d %6d %6d %6d %10.1f\n", r.what.c_str(), r.threads, r.m, r.n, r.k, r.gflops);
  std::fflush(stdout);
}

bool write_csv(const std::string& path, const std::vector<Row>& rows, const std::string& coretype) {
  std::ofstream out(path);
  if (!out) {
    std::fprintf(stderr, "error: cannot open --csv %s for writing\n", path.c_str());
    return false;
  }
  out << "what,threads,m,n,k,gflops,coretype\n";
  for (const Row& r : rows) {
    char gf[32];
    std::snprintf(gf, sizeof gf, "%.1f", r.gflops);
    out << r.what << ',' << r.threads << ',' << r.m << ',' << r.n << ',' << r.k << ',' << gf << ',' << coretype << '\n';
  }
  return bool(out);
}

}  // namespace

int main(int argc, char** argv) {
  std::string csv_path;
  int reps = 7;
  bool check_only = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--csv" && i + 1 < argc) csv_path = argv[++i];
    else if (arg == "--reps" && i + 1 < argc) reps = std::max(1, std::atoi(argv[++i]));
    else if (arg == "--check-only") check_only = true;
    else {
      std::fprintf(stderr, "usage: %s [--csv PATH] [--reps N] [--check-only]\n  unknown or incomplete argument '%s'\n",
                   argv[0], arg.c_str());
      return 2;
    }
  }

  const std::string coretype = openblas_get_corename();
  const char* env_coretype = std::getenv("OPENBLAS_CORETYPE");
  const bool has_avx512 = __builtin_cpu_supports("avx512f");
  const bool has_avx512_bf16 = has_avx512 && __builtin_cpu_supports("avx512bf16");
  const int cores = std::min<int>(2, int(allowed_cpus().size()));
  std::printf("OpenBLAS core: %s (OPENBLAS_CORETYPE=%s), CPU avx512f: %s, avx512_bf16: %s, cores used: %d, reps: %d\n",
              coretype.c_str(), env_coretype ? env_coretype : "<unset>", has_avx512 ? "yes" : "no",
              has_avx512_bf16 ? "yes" : "no", cores, reps);

  const std::vector<GemmCase> cases = gemm_cases();
  openblas_set_num_threads(1);
  if (!check_all_sgemm(cases)) return 1;
  openblas_set_num_threads(cores);
  if (!check_all_sgemm(cases)) return 1;
  std::printf("sgemm checks against the naive reference: passed\n");
  if (check_only) return 0;

  std::vector<Row> rows;
  std::printf("\n%-16s %7s %6s %6s %6s %10s\n", "what", "threads", "m", "n", "k", "GFLOP/s");
  const long iters = 20'000'000;  // 240M vector FMAs per thread: ~50-100 ms at peak
  std::vector<Isa> isas{Isa::avx2};
  if (has_avx512) isas.insert(isas.begin(), Isa::avx512);
  if (has_avx512_bf16) isas.insert(isas.begin(), Isa::avx512_bf16);
  for (Isa isa : isas)
    for (int t = 1; t <= cores; ++t) {
      rows.push_back({isa_info(isa).name, t, 0, 0, 0, fma_peak(isa, t, iters, reps)});
      print_row(rows.back());
    }
  for (int t = 1; t <= cores; ++t) {
    openblas_set_num_threads(t);
    for (const GemmCase& g : cases) {
      rows.push_back({g.what, t, g.m, g.n, g.k, time_sgemm(g, reps)});
      print_row(rows.back());
    }
  }
  if (!csv_path.empty() && !write_csv(csv_path, rows, coretype)) return 1;
  return 0;
}
