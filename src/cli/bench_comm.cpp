// `tessera bench comm`: for each backend, algorithm and message size, check the result against
// MPI_Allreduce once, then time it: median over iterations of the slowest rank's time.
// Columns as nccl-tests: algbw = bytes / time, busbw = algbw * 2(n-1)/n, with bytes the fp32
// buffer's size also where the sum travels as bf16 (--reduce-dtypes bf16); sent_B and xnode_B
// are the Communicator's counters per call (CommBytes), the mean over ranks.
//
// Backends (the backend column is <comm.backend>-<memory>): mpi-host and staged-host on host
// buffers; cuda-aware-mpi-device, staged-device and nccl-device on device buffers where a CUDA
// device is visible (and, for the first, MPI says it is CUDA-aware; for the last, NCCL is
// built). Rows that cannot run here are listed as skipped, with the reason.
#include "cli/bench_comm.hpp"
#include "cli/commands.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <vector>

#include "comm/agree.hpp"
#include "comm/bf16.hpp"
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
      throw InputError(fmt::format("bench comm --algorithms: unknown algorithm '{}' (allowed: mpi, ring, "
                                   "parameter-server, hierarchical)", name));
    out.push_back(it->value);
    start = comma + 1;
  }
  return out;
}

/// "fp32", "bf16" or both, comma-separated.
std::vector<ReduceDtype> parse_reduce_dtypes(const std::string& s) {
  std::vector<ReduceDtype> out;
  for (std::size_t start = 0; start <= s.size();) {
    const auto comma = std::min(s.find(',', start), s.size());
    const std::string name = s.substr(start, comma - start);
    const auto* it = std::find_if(std::begin(deck::kReduceDtypes), std::end(deck::kReduceDtypes),
                                  [&](const auto& c) { return c.name == name; });
    if (it == std::end(deck::kReduceDtypes))
      throw InputError(fmt::format("bench comm --reduce-dtypes: unknown type '{}' (allowed: fp32, bf16)", name));
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

/// Values in [-1, 1) with 16 fractional bits from (rank, index).
void fill_unit(float* v, std::size_t n, int rank) {
  for (std::size_t i = 0; i < n; ++i)
    v[i] = static_cast<float>((i * 40503u + static_cast<std::size_t>(rank) * 2654435761u) % 65536) / 32768.0f - 1.0f;
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
double time_once(const Communicator& comm, float* buf, std::size_t n, ReduceDtype wire) {
  comm.barrier();
  const double t0 = MPI_Wtime();
  comm.allreduce_sum(buf, n, Group::data, wire);
  double dt = MPI_Wtime() - t0;
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &dt, 1, MPI_DOUBLE, MPI_MAX, comm.handle()));
  return dt;
}

struct Point {
  std::string algorithm, backend, dtype;
  int ranks;
  std::size_t bytes;
  double time_us, algbw_gbps, busbw_gbps;
  double sent_bytes, cross_node_bytes;  ///< per rank and call, from the counters (mean over ranks)
};

/// One row being measured: what runs, on what, in which wire type.
struct Row {
  const Communicator& comm;
  std::string algorithm, label;
  ReduceDtype wire;
  std::size_t bytes;
  std::string what() const {
    return fmt::format("{} on {} ({}) at {} bytes", algorithm, label, to_string(wire), bytes);
  }
};

/// Any rank's failure is every rank's error.
void agree_ok(const Row& row, bool ok, const char* why) {
  int wrong = ok ? 0 : 1;
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &wrong, 1, MPI_INT, MPI_MAX, row.comm.handle()));
  if (wrong) throw std::runtime_error(fmt::format("bench comm: {}: {}", row.what(), why));
}

/// Before timing: small integers give MPI_Allreduce's sum exactly (in bf16 too while |sums| <= 256);
/// values in [-1, 1) give the sum of the wire-rounded inputs within the rounding bound, bitwise
/// the same on every rank.
void check(const Row& row, Buffer& buf, std::vector<float>& ref, std::vector<float>& out) {
  const Communicator& comm = row.comm;
  const std::size_t n = row.bytes / sizeof(float);
  const int p = comm.size(Group::data), me = comm.rank();
  const bool bf16 = row.wire == ReduceDtype::bf16;
  for (const bool integers : {true, false}) {
    if (integers && bf16 && 8 * p > 256) continue;
    if (integers) fill(ref.data(), n, me);
    else fill_unit(ref.data(), n, me);
    buf.upload(ref.data(), n);
    if (bf16) comm::round_to_bf16(ref.data(), n);
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, ref.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM, comm.handle()));
    comm.allreduce_sum(buf.data(), n, Group::data, row.wire);
    buf.download(out.data(), n);
    if (integers) {
      agree_ok(row, std::equal(out.data(), out.data() + n, ref.data()), "a different sum than MPI_Allreduce");
      continue;
    }
    const double unit = bf16 ? 0x1p-8 : 0x1p-24;  // |x| < 1: the sum of magnitudes is below p
    const double tol = (p + 1) * p * (unit + 0x1p-24);
    bool near = true;
    for (std::size_t i = 0; i < n && near; ++i) near = std::abs(static_cast<double>(out[i]) - ref[i]) <= tol;
    agree_ok(row, near, "a sum beyond the rounding bound of MPI_Allreduce's");
    std::copy_n(out.data(), n, ref.data());
    MPI_CHECK(MPI_Bcast(ref.data(), static_cast<int>(n), MPI_FLOAT, 0, comm.handle()));
    agree_ok(row, std::equal(out.data(), out.data() + n, ref.data()), "ranks hold different sums");
  }
}

/// Checks, then times, one row; the counters give the bytes per call; rank 0 prints the row.
Point measure(const Row& row, Buffer& buf, std::vector<float>& ref, std::vector<float>& out,
              const BenchCommArgs& args) {
  const Communicator& comm = row.comm;
  const std::size_t n = row.bytes / sizeof(float);
  const int p = comm.size(Group::data);
  check(row, buf, ref, out);
  // Time: zeros stay zeros however often they are summed.
  std::fill_n(out.data(), n, 0.0f);
  buf.upload(out.data(), n);
  // Large messages get fewer iterations: at least 3, about iters x 16 MB in all.
  const int iters = row.bytes <= (16u << 20) ? args.iters : std::max(3, static_cast<int>(args.iters * (16u << 20) / row.bytes));
  comm.reset_counters();
  for (int i = 0; i < std::min(args.warmup, iters); ++i) comm.allreduce_sum(buf.data(), n, Group::data, row.wire);
  std::vector<double> t(static_cast<std::size_t>(iters));
  for (double& ti : t) ti = time_once(comm, buf.data(), n, row.wire);
  const CommBytes counted = comm.counters()[Group::data];
  double per_call[2] = {static_cast<double>(counted.total()), static_cast<double>(counted.to_other_nodes)};
  for (double& b : per_call) b /= static_cast<double>(std::max<std::uint64_t>(1, counted.calls)) * p;
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, per_call, 2, MPI_DOUBLE, MPI_SUM, comm.handle()));
  std::nth_element(t.begin(), t.begin() + iters / 2, t.end());
  const double sec = t[static_cast<std::size_t>(iters / 2)];
  const double algbw = sec > 0 ? static_cast<double>(row.bytes) / sec / 1e9 : 0.0;
  const Point pt{row.algorithm, row.label, std::string(to_string(row.wire)), p, row.bytes, sec * 1e6, algbw,
                 algbw * 2.0 * (p - 1) / p, per_call[0], per_call[1]};
  if (comm.is_root()) {
    fmt::print("{:>18} {:>5} {:>21} {:>6} {:>12} {:>12.1f} {:>12.3f} {:>12.3f} {:>12.0f} {:>12.0f}\n", pt.algorithm,
               pt.dtype, pt.backend, pt.ranks, pt.bytes, pt.time_us, pt.algbw_gbps, pt.busbw_gbps, pt.sent_bytes,
               pt.cross_node_bytes);
    std::fflush(stdout);
  }
  return pt;
}

}  // namespace

int bench_comm(const BenchCommArgs& args) {
  const auto sizes = parse_sizes(args.sizes);
  const auto algorithms = parse_algorithms(args.algorithms);
  const auto dtypes = parse_reduce_dtypes(args.reduce_dtypes);
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
  const comm::NodeSplit& nodes = world.node_split(Group::data);  // collective on its first call
  if (world.is_root()) {
    fmt::print("MPI: {}; CUDA-aware: {} ({})\n", mpi.library, to_string(mpi.run_time), mpi.why);
    fmt::print("CUDA devices visible: {}; built with CUDA: {}, NCCL: {}\n", devices, build::cuda, build::nccl);
    for (const std::string& s : skipped) fmt::print("skipped: {}\n", s);
    fmt::print("nodes: {} (ranks on each: {})\n", nodes.nodes, fmt::join(nodes.ranks_per_node, ", "));
    fmt::print("bytes: the buffer (fp32); sent_B: bytes a rank hands to MPI per call (MPI's allreduce: its payload; "
               "ring, parameter-server, hierarchical: what the rank sends), xnode_B: of these sent to another "
               "node's ranks (our algorithms only); both the mean over ranks\n");
    fmt::print("{:>18} {:>5} {:>21} {:>6} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12}\n", "algorithm", "dtype",
               "backend", "ranks", "bytes", "time_us", "algbw_gbps", "busbw_gbps", "sent_B", "xnode_B");
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
      for (const ReduceDtype wire : dtypes) {
        // bf16 converts on the host: device buffers only when staged.
        if (own_only && wire != ReduceDtype::fp32) continue;
        for (const std::size_t bytes : sizes)
          points.push_back(measure(Row{comm, name, target.label(), wire, bytes}, buf, ref, out, args));
      }
    }
  }

  // Write the CSV on rank 0; a failure there is everyone's error.
  agree(world.handle(), [&] {
    if (!world.is_root() || args.csv.empty()) return;
    std::ofstream file(args.csv);
    if (!file) throw InputError(fmt::format("bench comm --csv {}: cannot open for writing", args.csv));
    file << "algorithm,backend,ranks,bytes,time_us,algbw_gbps,busbw_gbps,reduce_dtype,sent_bytes,cross_node_bytes\n";
    for (const Point& pt : points)
      file << fmt::format("{},{},{},{},{:.3f},{:.6f},{:.6f},{},{:.0f},{:.0f}\n", pt.algorithm, pt.backend, pt.ranks,
                          pt.bytes, pt.time_us, pt.algbw_gbps, pt.busbw_gbps, pt.dtype, pt.sent_bytes,
                          pt.cross_node_bytes);
    if (!file.flush()) throw InputError(fmt::format("bench comm --csv {}: write failed", args.csv));
  });
  return 0;
}

}  // namespace tessera::cli
