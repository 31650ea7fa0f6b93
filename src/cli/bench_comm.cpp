// `tessera bench comm`: for each backend, algorithm and message size, check the result against
// MPI_Allreduce once, then time it: median over iterations of the slowest rank's time.
// Columns as nccl-tests: algbw = bytes / time, busbw = algbw * 2(n-1)/n.
//
// Backends (the backend column is <comm.backend>-<memory>): mpi-host and staged-host on host
// buffers; cuda-aware-mpi-device, staged-device and nccl-device on device buffers where a CUDA
// device is visible (and, for the first, MPI says it is CUDA-aware; for the last, NCCL is
// built). Rows that cannot run here are listed as skipped, with the reason.
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
#include "comm/device_memory.hpp"
#include "comm/device_sharing.hpp"
#include "core/deck.hpp"
#include "core/deck_schema.hpp"
#include "core/error.hpp"

namespace tessera::cli {

namespace {

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

/// One backend on one kind of memory: a group of rows of the table.
struct Target {
  CommBackend backend;
  BufferSpace memory;
  std::string label() const { return fmt::format("{}-{}", to_string(backend), to_string(memory)); }
};

/// "all" or a comma-separated list of mpi, staged, cuda-aware-mpi, nccl.
std::vector<CommBackend> parse_backends(const std::string& s) {
  if (s == "all") return {CommBackend::mpi, CommBackend::staged, CommBackend::cuda_aware_mpi, CommBackend::nccl};
  std::vector<CommBackend> out;
  for (std::size_t start = 0; start <= s.size();) {
    const auto comma = std::min(s.find(',', start), s.size());
    const std::string name = s.substr(start, comma - start);
    const auto* it = std::find_if(std::begin(deck::kCommBackends), std::end(deck::kCommBackends),
                                  [&](const auto& c) { return c.name == name; });
    if (it == std::end(deck::kCommBackends) || it->value == CommBackend::automatic)
      throw InputError(fmt::format("bench comm --backends: unknown backend '{}' (allowed: all, or some of "
                                   "mpi, staged, cuda-aware-mpi, nccl)", name));
    out.push_back(it->value);
    start = comma + 1;
  }
  return out;
}

/// The targets this machine can run, in table order; the others go to `skipped` with the reason.
std::vector<Target> plan_targets(const std::vector<CommBackend>& wanted, bool devices, bool cuda_aware,
                                 const DeviceSharing& sharing, std::vector<std::string>& skipped) {
  const auto want = [&](CommBackend b) { return std::find(wanted.begin(), wanted.end(), b) != wanted.end(); };
  std::vector<Target> out;
  for (const CommBackend b : {CommBackend::mpi, CommBackend::staged})
    if (want(b)) out.push_back({b, BufferSpace::host});
  for (const CommBackend b : {CommBackend::cuda_aware_mpi, CommBackend::staged, CommBackend::nccl}) {
    if (!want(b)) continue;
    const Target t{b, BufferSpace::device};
    std::string why;
    if (!devices) why = build::cuda ? "no CUDA device visible on every rank" : "built without CUDA";
    else if (b == CommBackend::nccl && !build::nccl) why = "built without NCCL";
    else if (b == CommBackend::nccl && sharing.shared())
      why = fmt::format("up to {} ranks share a GPU; NCCL needs one per rank", sharing.ranks_per_device);
    else if (b == CommBackend::cuda_aware_mpi && !cuda_aware) why = "the MPI library does not say it is CUDA-aware";
    if (why.empty()) out.push_back(t);
    else skipped.push_back(fmt::format("{} ({})", t.label(), why));
  }
  return out;
}

/// The message buffer of one target: host memory, or device memory with a host copy for checks.
class Buffer {
 public:
  Buffer(BufferSpace memory, std::size_t n) : memory_(memory), host_(memory == BufferSpace::host ? n : 0) {
    if (memory == BufferSpace::device) device_ = static_cast<float*>(comm::device::alloc_device(n * sizeof(float)));
  }
  ~Buffer() { comm::device::free_device(device_); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  float* data() { return memory_ == BufferSpace::host ? host_.data() : device_; }
  void upload(const float* src, std::size_t n) {
    if (device_ == nullptr) std::copy_n(src, n, host_.data());
    else comm::device::copy(device_, src, n * sizeof(float));
  }
  void download(float* dst, std::size_t n) {
    if (device_ == nullptr) std::copy_n(host_.data(), n, dst);
    else comm::device::copy(dst, device_, n * sizeof(float));
  }

 private:
  BufferSpace memory_;
  std::vector<float> host_;
  float* device_ = nullptr;
};

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
  std::string algorithm, backend;
  int ranks;
  std::size_t bytes;
  double time_us, algbw_gbps, busbw_gbps;
};

/// Checks, then times, one (target, algorithm, size); rank 0 prints the row.
Point measure(const Communicator& comm, const std::string& algorithm, const std::string& label, Buffer& buf,
              std::vector<float>& ref, std::vector<float>& out, std::size_t bytes, const BenchCommArgs& args) {
  const std::size_t n = bytes / sizeof(float);
  const int p = comm.size(Group::data);
  // Verify against MPI_Allreduce before timing.
  fill(ref.data(), n, comm.rank());
  buf.upload(ref.data(), n);
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, ref.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM, comm.handle()));
  comm.allreduce_sum(buf.data(), n, Group::data);
  buf.download(out.data(), n);
  int wrong = std::equal(out.data(), out.data() + n, ref.data()) ? 0 : 1;
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &wrong, 1, MPI_INT, MPI_MAX, comm.handle()));
  if (wrong)
    throw std::runtime_error(fmt::format("bench comm: {} on {} gives a different sum than MPI_Allreduce at {} bytes",
                                         algorithm, label, bytes));
  // Time: zeros stay zeros however often they are summed.
  std::fill_n(out.data(), n, 0.0f);
  buf.upload(out.data(), n);
  // Large messages get fewer iterations: at least 3, about iters x 16 MB in all.
  const int iters = bytes <= (16u << 20) ? args.iters : std::max(3, static_cast<int>(args.iters * (16u << 20) / bytes));
  for (int i = 0; i < std::min(args.warmup, iters); ++i) comm.allreduce_sum(buf.data(), n, Group::data);
  std::vector<double> t(static_cast<std::size_t>(iters));
  for (double& ti : t) ti = time_once(comm, buf.data(), n);
  std::nth_element(t.begin(), t.begin() + iters / 2, t.end());
  const double sec = t[static_cast<std::size_t>(iters / 2)];
  const double algbw = sec > 0 ? static_cast<double>(bytes) / sec / 1e9 : 0.0;
  const Point pt{algorithm, label, p, bytes, sec * 1e6, algbw, algbw * 2.0 * (p - 1) / p};
  if (comm.is_root()) {
    fmt::print("{:>18} {:>21} {:>6} {:>12} {:>12.1f} {:>12.3f} {:>12.3f}\n", pt.algorithm, pt.backend, pt.ranks,
               pt.bytes, pt.time_us, pt.algbw_gbps, pt.busbw_gbps);
    std::fflush(stdout);
  }
  return pt;
}

}  // namespace

int bench_comm(const BenchCommArgs& args) {
  const auto sizes = parse_sizes(args.sizes);
  const auto algorithms = parse_algorithms(args.algorithms);
  const auto backends = parse_backends(args.backends);
  if (args.iters < 1 || args.warmup < 0 || args.segment_kb < 1)
    throw InputError("bench comm: need --iters >= 1, --warmup >= 0, --segment-kb >= 1");
  const Communicator world(MPI_COMM_WORLD, world_size(), 1, 1);

  // Device rows only where every rank sees a device.
  int devices = comm::device::count();
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &devices, 1, MPI_INT, MPI_MIN, world.handle()));
  const MpiCudaSupport& mpi = world.mpi_cuda_support();
  std::vector<std::string> skipped;
  const DeviceSharing sharing = devices > 0 ? comm::detect_device_sharing(world.handle()) : DeviceSharing{};
  const auto targets = plan_targets(backends, devices > 0, mpi.cuda_aware(), sharing, skipped);
  if (world.is_root()) {
    fmt::print("MPI: {}; CUDA-aware: {} ({})\n", mpi.library, to_string(mpi.run_time), mpi.why);
    fmt::print("CUDA devices visible: {}; built with CUDA: {}, NCCL: {}\n", devices, build::cuda, build::nccl);
    for (const std::string& s : skipped) fmt::print("skipped: {}\n", s);
    fmt::print("{:>18} {:>21} {:>6} {:>12} {:>12} {:>12} {:>12}\n", "algorithm", "backend", "ranks", "bytes",
               "time_us", "algbw_gbps", "busbw_gbps");
  }

  // Host copies for the checks, allocated once at the largest size.
  const std::size_t max_n = sizes.back() / sizeof(float);
  std::vector<float> ref(max_n), out(max_n);
  std::vector<Point> points;
  for (const Target& target : targets) {
    CommConfig cc;
    cc.backend = target.backend;
    cc.ring_segment_kb = args.segment_kb;
    Communicator comm(MPI_COMM_WORLD, world_size(), 1, 1, cc, target.memory);
    Buffer buf(target.memory, max_n);
    for (const AllreduceAlgorithm algorithm : algorithms) {
      // NCCL and a CUDA-aware MPI reduce device memory with their own allreduce only.
      const bool own_only = target.memory == BufferSpace::device && target.backend != CommBackend::staged;
      if (own_only && algorithm != AllreduceAlgorithm::mpi) continue;
      comm.set_allreduce(algorithm, static_cast<std::size_t>(args.segment_kb) * 1024);
      const std::string name = target.backend == CommBackend::nccl ? "nccl" : name_of(algorithm);
      for (const std::size_t bytes : sizes)
        points.push_back(measure(comm, name, target.label(), buf, ref, out, bytes, args));
    }
  }

  // Write the CSV on rank 0; a failure there is everyone's error.
  agree(world.handle(), [&] {
    if (!world.is_root() || args.csv.empty()) return;
    std::ofstream file(args.csv);
    if (!file) throw InputError(fmt::format("bench comm --csv {}: cannot open for writing", args.csv));
    file << "algorithm,backend,ranks,bytes,time_us,algbw_gbps,busbw_gbps\n";
    for (const Point& pt : points)
      file << fmt::format("{},{},{},{},{:.3f},{:.6f},{:.6f}\n", pt.algorithm, pt.backend, pt.ranks, pt.bytes,
                          pt.time_us, pt.algbw_gbps, pt.busbw_gbps);
    if (!file.flush()) throw InputError(fmt::format("bench comm --csv {}: write failed", args.csv));
  });
  return 0;
}

}  // namespace tessera::cli
