// `tessera bench comm`: for each algorithm and message size, check the result against
// MPI_Allreduce once, then time it: median over iterations of the slowest rank's time.
// Columns as nccl-tests: algbw = bytes / time, busbw = algbw * 2(n-1)/n.
#include "cli/bench_comm.hpp"
#include "cli/commands.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <vector>

#include "comm/agree.hpp"
#include "comm/communicator.hpp"
#include "core/deck_schema.hpp"
#include "core/error.hpp"

namespace tessera::cli {

namespace {

constexpr const char* kBackend = "mpi-host";

/// "4K", "16M", "1G" or plain bytes.
std::size_t parse_bytes(const std::string& s) {
  std::size_t pos = 0;
  unsigned long long v = 0;
  try {
    v = std::stoull(s, &pos);
  } catch (const std::exception&) {
    throw InputError(fmt::format("bench comm --sizes: '{}' is not a size (e.g. 4K, 16M, 1G)", s));
  }
  const std::string unit = s.substr(pos);
  if (unit == "K" || unit == "k") v <<= 10;
  else if (unit == "M" || unit == "m") v <<= 20;
  else if (unit == "G" || unit == "g") v <<= 30;
  else if (!unit.empty())
    throw InputError(fmt::format("bench comm --sizes: unknown unit in '{}' (allowed: K, M, G)", s));
  return v;
}

/// "LO..HI": LO, 4 LO, 16 LO, ... up to HI; "N": N alone. Sizes are whole float32 elements.
std::vector<std::size_t> parse_sizes(const std::string& s) {
  const auto dots = s.find("..");
  const std::size_t lo = parse_bytes(s.substr(0, dots));
  const std::size_t hi = dots == std::string::npos ? lo : parse_bytes(s.substr(dots + 2));
  if (lo < sizeof(float) || hi < lo || lo % sizeof(float) != 0 || hi > (std::size_t{1} << 33))
    throw InputError(fmt::format("bench comm --sizes {}: need 4 <= LO <= HI <= 8G, LO a multiple of 4 bytes", s));
  std::vector<std::size_t> sizes;
  for (std::size_t b = lo; b <= hi; b *= 4) sizes.push_back(b);
  return sizes;
}

std::vector<AllreduceAlgorithm> parse_algorithms(const std::string& s) {
  std::vector<AllreduceAlgorithm> out;
  for (std::size_t start = 0; start <= s.size();) {
    const auto comma = std::min(s.find(',', start), s.size());
    const std::string name = s.substr(start, comma - start);
    const auto* it = std::find_if(std::begin(deck::kAllreduceAlgorithms), std::end(deck::kAllreduceAlgorithms),
                                  [&](const auto& c) { return c.name == name; });
    if (it == std::end(deck::kAllreduceAlgorithms))
      throw InputError(fmt::format("bench comm --algorithms: unknown algorithm '{}' (allowed: mpi, ring, parameter-server)", name));
    out.push_back(it->value);
    start = comma + 1;
  }
  return out;
}

std::string name_of(AllreduceAlgorithm a) {
  for (const auto& c : deck::kAllreduceAlgorithms)
    if (c.value == a) return std::string(c.name);
  return "?";
}

/// Small integers from (rank, index): every order of summation gives the same exact float sum.
void fill(float* v, std::size_t n, int rank) {
  for (std::size_t i = 0; i < n; ++i)
    v[i] = static_cast<float>(static_cast<int>((i * 2654435761u + static_cast<std::size_t>(rank) * 40503u) % 17) - 8);
}

/// The slowest rank's time of one call, in seconds.
double time_once(const Communicator& comm, float* buf, std::size_t n) {
  comm.barrier();
  const double t0 = MPI_Wtime();
  comm.allreduce_sum(buf, n, Group::data);
  double dt = MPI_Wtime() - t0;
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &dt, 1, MPI_DOUBLE, MPI_MAX, comm.handle()));
  return dt;
}

struct Point {
  std::string algorithm;
  int ranks;
  std::size_t bytes;
  double time_us, algbw_gbps, busbw_gbps;
};

}  // namespace

int bench_comm(const BenchCommArgs& args) {
  const auto sizes = parse_sizes(args.sizes);
  const auto algorithms = parse_algorithms(args.algorithms);
  if (args.iters < 1 || args.warmup < 0 || args.segment_kb < 1)
    throw InputError("bench comm: need --iters >= 1, --warmup >= 0, --segment-kb >= 1");
  Communicator comm(MPI_COMM_WORLD, world_size(), 1, 1);
  const int p = comm.size(Group::data);

  // Allocate the largest buffers once and touch them once.
  const std::size_t max_n = sizes.back() / sizeof(float);
  std::vector<float> buf(max_n), ref(max_n);

  std::vector<Point> points;
  if (comm.is_root())
    fmt::print("{:>18} {:>9} {:>6} {:>12} {:>12} {:>12} {:>12}\n", "algorithm", "backend", "ranks",
               "bytes", "time_us", "algbw_gbps", "busbw_gbps");
  for (const AllreduceAlgorithm algorithm : algorithms) {
    comm.set_allreduce(algorithm, static_cast<std::size_t>(args.segment_kb) * 1024);
    for (const std::size_t bytes : sizes) {
      const std::size_t n = bytes / sizeof(float);
      // Verify against MPI_Allreduce before timing.
      fill(ref.data(), n, comm.rank());
      std::copy_n(ref.data(), n, buf.data());
      MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, ref.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM, comm.handle()));
      comm.allreduce_sum(buf.data(), n, Group::data);
      int wrong = std::equal(buf.data(), buf.data() + n, ref.data()) ? 0 : 1;
      MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &wrong, 1, MPI_INT, MPI_MAX, comm.handle()));
      if (wrong)
        throw std::runtime_error(fmt::format("bench comm: {} gives a different sum than MPI_Allreduce at {} bytes",
                                             name_of(algorithm), bytes));
      // Time: zeros stay zeros however often they are summed.
      std::fill_n(buf.data(), n, 0.0f);
      // Large messages get fewer iterations: at least 3, about iters x 16 MB in all.
      const int iters = bytes <= (16u << 20) ? args.iters
                                             : std::max(3, static_cast<int>(args.iters * (16u << 20) / bytes));
      for (int i = 0; i < std::min(args.warmup, iters); ++i) comm.allreduce_sum(buf.data(), n, Group::data);
      std::vector<double> t(static_cast<std::size_t>(iters));
      for (double& ti : t) ti = time_once(comm, buf.data(), n);
      std::nth_element(t.begin(), t.begin() + iters / 2, t.end());
      const double sec = t[static_cast<std::size_t>(iters / 2)];
      const double algbw = sec > 0 ? static_cast<double>(bytes) / sec / 1e9 : 0.0;
      const Point pt{name_of(algorithm), p, bytes, sec * 1e6, algbw, algbw * 2.0 * (p - 1) / p};
      if (comm.is_root()) {
        fmt::print("{:>18} {:>9} {:>6} {:>12} {:>12.1f} {:>12.3f} {:>12.3f}\n", pt.algorithm, kBackend,
                   pt.ranks, pt.bytes, pt.time_us, pt.algbw_gbps, pt.busbw_gbps);
        std::fflush(stdout);
      }
      points.push_back(pt);
    }
  }

  // Write the CSV on rank 0; a failure there is everyone's error.
  agree(comm.handle(), [&] {
    if (!comm.is_root() || args.csv.empty()) return;
    std::ofstream out(args.csv);
    if (!out) throw InputError(fmt::format("bench comm --csv {}: cannot open for writing", args.csv));
    out << "algorithm,backend,ranks,bytes,time_us,algbw_gbps,busbw_gbps\n";
    for (const Point& pt : points)
      out << fmt::format("{},{},{},{},{:.3f},{:.6f},{:.6f}\n", pt.algorithm, kBackend, pt.ranks, pt.bytes,
                         pt.time_us, pt.algbw_gbps, pt.busbw_gbps);
    if (!out.flush()) throw InputError(fmt::format("bench comm --csv {}: write failed", args.csv));
  });
  return 0;
}

}  // namespace tessera::cli
