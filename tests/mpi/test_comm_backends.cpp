// The backends of the Communicator on 1, 2 and 4 ranks: the MPI library's CUDA answer is the same
// on every rank and agrees with itself; staging through the host buffer gives bitwise the sums
// of the plain path for every algorithm; where NCCL or a device is missing, asking for them fails
// on every rank alike. On a machine with CUDA devices the device paths run against MPI on host.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <iostream>
#include <stdexcept>
#include <utility>
#include <vector>

#include "comm/communicator.hpp"
#include "comm/device_memory.hpp"
#include "comm/device_sharing.hpp"
#include "comm/nccl_comm.hpp"
#include "core/deck.hpp"
#include "mpi_test_util.hpp"

namespace tessera {
namespace {

using tessera::test::world_size;

/// The same integer on every rank of comm.
bool same_everywhere(int v, MPI_Comm comm = MPI_COMM_WORLD) {
  int lo = v, hi = v;
  MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_INT, MPI_MIN, comm);
  MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_INT, MPI_MAX, comm);
  return lo == hi;
}

/// Data that is a pure function of (rank, index), not exactly summable, so that any change in
/// the order of the sums would show.
template <class T>
std::vector<T> data_of(int rank, std::size_t n) {
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i)
    v[i] = static_cast<T>(0.1 * static_cast<double>(rank + 1) + 1.0 / static_cast<double>(i + 3));
  return v;
}

CommConfig config(CommBackend backend, AllreduceAlgorithm algorithm) {
  CommConfig c;
  c.backend = backend;
  c.allreduce = algorithm;
  c.ring_segment_kb = 4;  // several segments per chunk at the larger lengths
  return c;
}

TEST(MpiCudaSupport, TheLibraryAnswersTheSameOnEveryRank) {
  const MpiCudaSupport s = detect_mpi_cuda_support();
  EXPECT_TRUE(same_everywhere(static_cast<int>(s.run_time)));
  EXPECT_TRUE(same_everywhere(static_cast<int>(s.compile_time)));
  EXPECT_FALSE(s.library.empty());
  EXPECT_FALSE(s.why.empty());
  EXPECT_EQ(s.cuda_aware(), s.run_time == Answer::yes);
#if defined(OPEN_MPI)
  // Open MPI answers both questions, and a library configured without CUDA cannot have it at
  // run time.
  EXPECT_NE(s.compile_time, Answer::unknown) << s.why;
  EXPECT_NE(s.run_time, Answer::unknown) << s.why;
  EXPECT_NE(s.why.find("MPIX_Query_cuda_support()"), std::string::npos) << s.why;
  if (s.compile_time == Answer::no) {
    EXPECT_EQ(s.run_time, Answer::no) << s.why;
  }
#endif
  if (test::world_rank() == 0)
    std::cout << "[ info     ] " << s.library << ": CUDA-aware " << to_string(s.run_time) << " (" << s.why
              << ")\n";
}

TEST(CommBackend, AutoOnHostBuffersIsMpiAndSaysWhy) {
  Communicator c(MPI_COMM_WORLD, world_size(), 1, 1);
  EXPECT_EQ(c.backend().main(), CommBackend::mpi);
  const std::string line = c.describe_backend();
  EXPECT_NE(line.find("comm: host buffers -> mpi (comm.backend = \"auto\": buffers in host memory)"),
            std::string::npos) << line;
  EXPECT_NE(line.find("MPI CUDA-aware: "), std::string::npos) << line;
  EXPECT_EQ(line.find('\n'), std::string::npos) << line;
  EXPECT_EQ(c.mpi_cuda_support().run_time, detect_mpi_cuda_support().run_time);
}

template <class T>
void expect_staged_equals_plain(AllreduceAlgorithm algorithm) {
  const int n_ranks = world_size();
  Communicator plain(MPI_COMM_WORLD, n_ranks, 1, 1, config(CommBackend::mpi, algorithm));
  Communicator staged(MPI_COMM_WORLD, n_ranks, 1, 1, config(CommBackend::staged, algorithm));
  ASSERT_EQ(staged.backend().main(), CommBackend::staged);
  const std::string line = staged.describe_backend();
  EXPECT_NE(line.find("host buffers -> staged"), std::string::npos) << line;
  EXPECT_NE(line.find("staging buffer: "), std::string::npos) << line;
  if (comm::device::count() == 0) {
    EXPECT_NE(line.find("ordinary host memory"), std::string::npos) << line;
  }
  for (const std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{4099},
                              (std::size_t{1} << 18) + 3}) {
    SCOPED_TRACE(testing::Message() << to_string(algorithm) << ", n = " << n << ", " << sizeof(T) << "-byte");
    std::vector<T> a = data_of<T>(plain.rank(), n), b = a;
    plain.allreduce_sum(a.data(), n, Group::data);
    staged.allreduce_sum(b.data(), n, Group::data);
    ASSERT_EQ(std::memcmp(a.data(), b.data(), n * sizeof(T)), 0) << "staged differs from plain";
    if (n_ranks > 1 && n > 0) {
      EXPECT_NE(a, data_of<T>(plain.rank(), n)) << "nothing was summed";
    }
  }
}

TEST(CommBackend, StagedOnHostMemoryEqualsPlainBitwise) {
  for (const AllreduceAlgorithm a : {AllreduceAlgorithm::mpi, AllreduceAlgorithm::ring,
                                     AllreduceAlgorithm::parameter_server}) {
    expect_staged_equals_plain<float>(a);
    expect_staged_equals_plain<double>(a);
  }
}

TEST(CommBackend, StagedInSubgroups) {
  // tp = 2 where the rank count is even: each data group stages and sums on its own.
  const int n = world_size(), tp = n % 2 == 0 ? 2 : 1;
  Communicator plain(MPI_COMM_WORLD, n / tp, tp, 1, config(CommBackend::mpi, AllreduceAlgorithm::ring));
  Communicator staged(MPI_COMM_WORLD, n / tp, tp, 1, config(CommBackend::staged, AllreduceAlgorithm::ring));
  std::vector<float> a = data_of<float>(plain.rank(), 10000), b = a;
  plain.allreduce_sum(a.data(), a.size(), Group::data);
  staged.allreduce_sum(b.data(), b.size(), Group::data);
  EXPECT_EQ(a, b);
}

TEST(CommBackend, NcclWithoutNcclOrDeviceFailsOnEveryRank) {
  if (build::nccl && comm::device::count() > 0) GTEST_SKIP() << "NCCL and a CUDA device are here";
  Communicator c(MPI_COMM_WORLD, world_size(), 1, 1);
  try {
    c.nccl(Group::data);
    FAIL() << "no error";
  } catch (const std::runtime_error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(build::nccl ? "no CUDA device" : "this build has no NCCL"), std::string::npos) << msg;
  }
  // The communicator still works afterwards.
  double x = 1.0;
  c.allreduce_sum(&x, 1, Group::world);
  EXPECT_EQ(x, world_size());
}

TEST(CommBackend, NcclOnHostBuffersIsRefusedOnEveryRank) {
  if (!build::nccl) GTEST_SKIP() << "no NCCL: the deck check refuses comm.backend = \"nccl\" earlier";
  test::expect_input_error(
      [] { Communicator c(MPI_COMM_WORLD, world_size(), 1, 1, config(CommBackend::nccl, AllreduceAlgorithm::mpi)); },
      {"comm.backend: \"nccl\" takes device memory"});
}

// --- On a machine with CUDA devices ----------------------------------------------------------

/// A device copy of host values, freed on scope exit.
template <class T>
struct DeviceVector {
  T* ptr;
  std::size_t n;
  explicit DeviceVector(const std::vector<T>& host)
      : ptr(static_cast<T*>(comm::device::alloc_device(host.size() * sizeof(T)))), n(host.size()) {
    comm::device::copy(ptr, host.data(), n * sizeof(T));
  }
  ~DeviceVector() { comm::device::free_device(ptr); }
  std::vector<T> to_host() const {
    std::vector<T> h(n);
    comm::device::copy(h.data(), ptr, n * sizeof(T));
    return h;
  }
};

/// Ranks of this rank's node, and this rank's place among them.
std::pair<int, int> node_rank_and_size() {
  int node_rank = 0, node_size = 1;
  MPI_Comm node = MPI_COMM_NULL;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  MPI_Comm_rank(node, &node_rank);
  MPI_Comm_size(node, &node_size);
  MPI_Comm_free(&node);
  return {node_rank, node_size};
}

/// Every rank has a device of its own (NCCL refuses two ranks on one device); selects it.
bool one_device_per_rank() {
  const int node_rank = node_rank_and_size().first;
  int ok = node_rank < comm::device::count() ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (ok) comm::device::select(node_rank);
  return ok == 1;
}

// Ranks on one GPU (the device machine has one; Kokkos puts every rank of a node on device
// local_rank % count): "auto" does not pick NCCL, which would fail in ncclCommInitRank, and
// asking for it is refused on every rank.
TEST(CommBackendOnDevice, RanksSharingAGpuAreToldApart) {
  const DeviceSharing s = comm::detect_device_sharing(MPI_COMM_WORLD);
  EXPECT_TRUE(same_everywhere(s.ranks_per_device));
  if (comm::device::count() == 0) {
    EXPECT_EQ(s.ranks_per_device, 1);
    GTEST_SKIP() << "no CUDA device on this machine";
  }
  comm::device::select(0);
  const int node_size = node_rank_and_size().second;
  EXPECT_EQ(comm::detect_device_sharing(MPI_COMM_WORLD).ranks_per_device, node_size);
  if (node_size == 1 || !build::nccl) return;
  Communicator automatic(MPI_COMM_WORLD, world_size(), 1, 1, config(CommBackend::automatic, AllreduceAlgorithm::mpi),
                         BufferSpace::device);
  EXPECT_NE(automatic.backend().device, CommBackend::nccl) << automatic.describe_backend();
  test::expect_input_error(
      [] {
        Communicator c(MPI_COMM_WORLD, world_size(), 1, 1, config(CommBackend::nccl, AllreduceAlgorithm::mpi),
                       BufferSpace::device);
      },
      {"comm.backend: \"nccl\" needs a GPU of its own for every rank"});
}

TEST(CommBackendOnDevice, StagedAndCudaAwareEqualPlainOnHost) {
  if (comm::device::count() == 0) GTEST_SKIP() << "no CUDA device on this machine";
  const int n_ranks = world_size();
  Communicator plain(MPI_COMM_WORLD, n_ranks, 1, 1, config(CommBackend::mpi, AllreduceAlgorithm::mpi));
  std::vector<CommBackend> backends = {CommBackend::staged};
  if (plain.mpi_cuda_support().cuda_aware()) backends.push_back(CommBackend::cuda_aware_mpi);
  for (const CommBackend b : backends) {
    Communicator dev(MPI_COMM_WORLD, n_ranks, 1, 1, config(b, AllreduceAlgorithm::mpi), BufferSpace::device);
    ASSERT_EQ(dev.backend().device, b);
    std::vector<float> ref = data_of<float>(plain.rank(), 100003);
    DeviceVector<float> d(ref);
    plain.allreduce_sum(ref.data(), ref.size(), Group::data);
    dev.allreduce_sum(d.ptr, d.n, Group::data);
    EXPECT_EQ(d.to_host(), ref) << to_string(b);
  }
}

TEST(CommBackendOnDevice, NcclAllreduceReduceScatterAllgather) {
  if (!build::nccl || comm::device::count() == 0) GTEST_SKIP() << "no NCCL or no CUDA device";
  const int p = world_size();
  if (!one_device_per_rank()) GTEST_SKIP() << "fewer CUDA devices than ranks on a node";
  Communicator c(MPI_COMM_WORLD, p, 1, 1, config(CommBackend::nccl, AllreduceAlgorithm::mpi), BufferSpace::device);
  // Allreduce of small integers: exact in any order.
  const std::size_t n = 4096 * static_cast<std::size_t>(p);
  std::vector<double> mine(n);
  for (std::size_t i = 0; i < n; ++i) mine[i] = static_cast<double>((i % 13) * (c.rank() + 1));
  const double ranks_sum = p * (p + 1) / 2.0;
  DeviceVector<double> d(mine);
  c.allreduce_sum(d.ptr, n, Group::data);
  const std::vector<double> sum = d.to_host();
  for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(sum[i], static_cast<double>(i % 13) * ranks_sum) << i;
  // Reduce-scatter: rank r keeps part r of the sum; allgather puts the parts back together.
  comm::NcclComm& nc = c.nccl(Group::data);
  const std::size_t part = n / static_cast<std::size_t>(p);
  const DeviceVector<double> send(mine);
  const DeviceVector<double> recv{std::vector<double>(part)};
  const DeviceVector<double> all{std::vector<double>(n)};
  nc.reduce_scatter_sum(send.ptr, recv.ptr, part, nullptr);
  nc.allgather(recv.ptr, all.ptr, part, nullptr);
  comm::device::synchronize(nullptr);
  const std::vector<double> mine_part = recv.to_host();
  for (std::size_t i = 0; i < part; ++i)
    ASSERT_EQ(mine_part[i], sum[static_cast<std::size_t>(c.rank()) * part + i]) << i;
  EXPECT_EQ(all.to_host(), sum);
}

}  // namespace
}  // namespace tessera
