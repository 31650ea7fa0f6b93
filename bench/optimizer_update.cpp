// optimizer_update: how fast Tessera's host optimizer updates run (kernels::adamw_step and
// kernels::sgd_step with momentum 0.9), with and without a gradient factor and the bf16 copies,
// against memory-bandwidth yardsticks run the same way on the same ranks.
//
// Usage: [mpirun -n R] optimizer_update [--sizes 1M,16M,64M] [--reps N] [--warmup W] [--csv PATH]
//        optimizer_update --checksum [--sizes N]
// Each size is the total number of elements, split into R contiguous pieces, one per rank (as
// ZeRO splits the update); each rank runs the kernel on its piece with the host execution space
// it was built with (Debian's Kokkos: Serial, one thread). A sample is `inner` calls (enough to
// move about 1 GB, at least one), timed on every rank from a barrier to its fence; the slowest
// rank's time counts. A row is the median of --reps samples after --warmup ones.
//
// Bytes counted per element (4-byte floats, 2-byte bf16; nothing for write-allocate or the
// caches): adamw reads p, g, m, v and writes p, m, v: 28; sgd (momentum) reads p, g, buf and
// writes p, buf: 20; the bf16 copies add 2 written. Yardsticks: triad (STREAM's a = b + s c)
// 12, as STREAM counts it; streams_4r3w (p, m, v = (x + g) / 2: adamw's arrays with no
// arithmetic to speak of) 28; streams_3r2w (sgd's) 20.
//
// --checksum: runs every variant 3 steps on fixed data (one rank) and prints a 64-bit FNV-1a hash
// of the bits of p, the state and the bf16 copies, to show that a change of the kernels keeps
// their results bit for bit.
//
// The CSV has columns kernel,variant,elements,ranks,threads_per_rank,host_space,bytes_per_element,
// seconds,gelem_per_s,gb_per_s.
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "kernels/optimizer.hpp"
#include "kernels/views.hpp"

namespace {

using tessera::ExecSpace;
using tessera::Index;
using tessera::Vector;
using tessera::VectorU;
namespace kernels = tessera::kernels;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// A float in [-1, 1) from element i's global index and a seed: the same data on any number of ranks.
KOKKOS_INLINE_FUNCTION float pattern(std::int64_t i, std::uint32_t seed) {
  std::uint32_t h = std::uint32_t(i) * 2654435761u ^ seed;
  h ^= h >> 15;
  h *= 2246822519u;
  h ^= h >> 13;
  return float(h >> 8) * (2.0f / 16777216.0f) - 1.0f;
}

// One rank's piece of the arrays: parameters, gradients, two state buffers, the bf16 copies.
struct Arrays {
  Vector<float> p, g, m, v;
  Vector<std::uint16_t> bf16;
  std::int64_t first = 0;  // global index of element 0
  explicit Arrays(Index n, std::int64_t first_)
      : p("bench::p", n), g("bench::g", n), m("bench::m", n), v("bench::v", n), bf16("bench::bf16", n),
        first(first_) {}
  // Fresh data: p in [-0.1, 0.1), g in [-0.01, 0.01), zero state. Every element is written, in
  // the kernels' own order (first touch).
  void reset(const ExecSpace& exec) {
    const auto p_ = p, g_ = g, m_ = m, v_ = v;
    const auto bf = bf16;
    const std::int64_t at = first;
    Kokkos::parallel_for("bench::reset", tessera::range(exec, Index(p.extent(0))), KOKKOS_LAMBDA(const Index i) {
      p_(i) = 0.1f * pattern(at + i, 0x9e3779b9u);
      g_(i) = 0.01f * pattern(at + i, 0x85ebca6bu);
      m_(i) = 0.0f;
      v_(i) = 0.0f;
      bf(i) = 0;
    });
    exec.fence();
  }
};

struct Case {
  std::string kernel, variant;
  int bytes_per_element;
  std::function<void(std::int64_t step)> run;  // one call; step counts from 1
};

std::vector<Case> cases(const ExecSpace& exec, Arrays& a) {
  const Index n = Index(a.p.extent(0));
  const VectorU<float> p(a.p.data(), n), g(a.g.data(), n), m(a.m.data(), n), v(a.v.data(), n);
  const VectorU<std::uint16_t> bf16(a.bf16.data(), n);
  const kernels::AdamWHyper adamw{1e-3, 0.9, 0.999, 1e-8, 0.01};  // torch.optim.AdamW's defaults, lr 1e-3
  const kernels::SgdHyper sgd{1e-2, 0.9, 0.0, false};             // torch.optim.SGD(lr=1e-2, momentum=0.9)
  std::vector<Case> out;
  for (const bool factor : {false, true}) {
    for (const bool copies : {false, true}) {
      const kernels::UpdateExtras x{factor ? 0.5 : 1.0, copies ? bf16 : VectorU<std::uint16_t>()};
      const std::string variant = std::string(factor ? "grad_factor" : "plain") + (copies ? "+bf16" : "");
      const int extra = copies ? 2 : 0;
      out.push_back({"adamw", variant, 28 + extra, [=, &exec](std::int64_t step) {
                       kernels::adamw_step(exec, p, g, m, v, adamw, step, x);
                     }});
      out.push_back({"sgd", variant, 20 + extra, [=, &exec](std::int64_t) { kernels::sgd_step(exec, p, g, m, sgd, x); }});
    }
  }
  out.push_back({"triad", "yardstick", 12, [=, &exec](std::int64_t) {
                   Kokkos::parallel_for("bench::triad", tessera::range(exec, n),
                                        KOKKOS_LAMBDA(const Index i) { m(i) = p(i) + 0.5f * g(i); });
                 }});
  out.push_back({"streams_4r3w", "yardstick", 28, [=, &exec](std::int64_t) {
                   Kokkos::parallel_for("bench::streams_4r3w", tessera::range(exec, n), KOKKOS_LAMBDA(const Index i) {
                     const float gi = g(i);
                     p(i) = 0.5f * (p(i) + gi);
                     m(i) = 0.5f * (m(i) + gi);
                     v(i) = 0.5f * (v(i) + gi);
                   });
                 }});
  out.push_back({"streams_3r2w", "yardstick", 20, [=, &exec](std::int64_t) {
                   Kokkos::parallel_for("bench::streams_3r2w", tessera::range(exec, n), KOKKOS_LAMBDA(const Index i) {
                     const float gi = g(i);
                     p(i) = 0.5f * (p(i) + gi);
                     m(i) = 0.5f * (m(i) + gi);
                   });
                 }});
  return out;
}

// "1M" -> 1048576, "16M", "64K", or a plain count.
std::int64_t parse_size(const std::string& s) {
  char* end = nullptr;
  const long long k = std::strtoll(s.c_str(), &end, 10);
  std::int64_t mult = 1;
  if (*end == 'K') mult = 1 << 10;
  else if (*end == 'M') mult = 1 << 20;
  else if (*end == 'G') mult = 1 << 30;
  else if (*end != '\0') return -1;
  return k * mult;
}

std::uint64_t fnv1a(std::uint64_t h, const void* data, std::size_t bytes) {
  const auto* b = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < bytes; ++i) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

int checksum(const std::vector<std::int64_t>& sizes) {
  const ExecSpace exec;
  for (const std::int64_t n : sizes) {
    Arrays a(Index(n), 0);
    auto all = cases(exec, a);
    for (auto& c : all) {
      if (c.variant == "yardstick") continue;
      a.reset(exec);
      for (std::int64_t step = 1; step <= 3; ++step) c.run(step);
      exec.fence();
      const auto bytes = std::size_t(n) * sizeof(float);
      std::uint64_t h = 1469598103934665603ull;
      h = fnv1a(h, a.p.data(), bytes);
      h = fnv1a(h, a.m.data(), bytes);
      h = fnv1a(h, a.v.data(), bytes);
      h = fnv1a(h, a.bf16.data(), std::size_t(n) * sizeof(std::uint16_t));
      std::printf("checksum %-6s %-18s n=%-10" PRId64 " %016" PRIx64 "\n", c.kernel.c_str(), c.variant.c_str(), n, h);
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, ranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  std::vector<std::int64_t> sizes{1 << 20, 16 << 20, 64 << 20};
  int reps = 9, warmup = 2;
  bool do_checksum = false;
  std::string csv;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const bool has_value = i + 1 < argc;
    if (arg == "--checksum") {
      do_checksum = true;
    } else if (arg == "--sizes" && has_value) {
      sizes.clear();
      std::string list = argv[++i];
      for (std::size_t at = 0; at <= list.size();) {
        const std::size_t comma = std::min(list.find(',', at), list.size());
        const std::int64_t n = parse_size(list.substr(at, comma - at));
        if (n <= 0) {
          if (rank == 0) std::fprintf(stderr, "error: --sizes '%s': each size is a count, optionally with K, M or G\n", argv[i]);
          MPI_Finalize();
          return 2;
        }
        sizes.push_back(n);
        at = comma + 1;
      }
    } else if (arg == "--reps" && has_value) {
      reps = std::atoi(argv[++i]);
    } else if (arg == "--warmup" && has_value) {
      warmup = std::atoi(argv[++i]);
    } else if (arg == "--csv" && has_value) {
      csv = argv[++i];
    } else {
      if (rank == 0)
        std::fprintf(stderr, "error: unknown argument '%s'\n---> HINT: optimizer_update [--sizes 1M,16M,64M] "
                             "[--reps N] [--warmup W] [--csv PATH] | --checksum [--sizes N]\n", arg.c_str());
      MPI_Finalize();
      return 2;
    }
  }
  if (reps < 1 || warmup < 0) {
    if (rank == 0) std::fprintf(stderr, "error: --reps must be >= 1 and --warmup >= 0\n");
    MPI_Finalize();
    return 2;
  }
  int rc = 0;
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    if (do_checksum) {
      if (ranks != 1) {
        if (rank == 0) std::fprintf(stderr, "error: --checksum runs on one rank\n");
        rc = 2;
      } else {
        rc = checksum(sizes);
      }
    } else {
      const ExecSpace exec;
      const int threads = int(exec.concurrency());
      const std::string space = ExecSpace::name();
      std::ofstream out;
      if (rank == 0 && !csv.empty()) {
        out.open(csv);
        out << "kernel,variant,elements,ranks,threads_per_rank,host_space,bytes_per_element,seconds,gelem_per_s,gb_per_s\n";
      }
      if (rank == 0)
        std::printf("# %d rank(s) x %d %s thread(s); median of %d after %d warm-up\n%-13s %-17s %10s %10s %9s %8s\n",
                    ranks, threads, space.c_str(), reps, warmup, "kernel", "variant", "elements", "ms/call", "Gelem/s",
                    "GB/s");
      for (const std::int64_t n : sizes) {
        const std::int64_t first = n * rank / ranks, last = n * (rank + 1) / ranks;
        Arrays a(Index(last - first), first);
        auto all = cases(exec, a);
        // Enough calls per sample to move about 1 GB of adamw traffic.
        const int inner = int(std::max<std::int64_t>(1, (std::int64_t(1) << 25) / n));
        for (auto& c : all) {
          a.reset(exec);
          std::int64_t step = 0;
          std::vector<double> t;
          for (int r = 0; r < warmup + reps; ++r) {
            MPI_Barrier(MPI_COMM_WORLD);
            const auto t0 = std::chrono::steady_clock::now();
            for (int k = 0; k < inner; ++k) c.run(++step);
            exec.fence();
            double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / inner;
            MPI_Allreduce(MPI_IN_PLACE, &s, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
            if (r >= warmup) t.push_back(s);
          }
          const double s = median(t);
          const double gelem = double(n) / s / 1e9, gb = gelem * c.bytes_per_element;
          if (rank == 0) {
            std::printf("%-13s %-17s %10" PRId64 " %10.3f %9.3f %8.2f\n", c.kernel.c_str(), c.variant.c_str(), n,
                        s * 1e3, gelem, gb);
            if (out) {
              out << c.kernel << ',' << c.variant << ',' << n << ',' << ranks << ',' << threads << ',' << space << ','
                  << c.bytes_per_element << ',' << s << ',' << gelem << ',' << gb << '\n';
            }
          }
        }
      }
    }
  }
  MPI_Finalize();
  return rc;
}
