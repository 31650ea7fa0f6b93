// comm.backend resolution (comm/backend.hpp) for every request against every kind of memory,
// build and MPI answer: what "auto" picks, and the one-line refusals that name the key.
#include <gtest/gtest.h>

#include <functional>
#include <initializer_list>
#include <string>

#include "comm/backend.hpp"
#include "core/error.hpp"

namespace tessera {
namespace {

constexpr BufferSpace kHost = BufferSpace::host;
constexpr BufferSpace kDevice = BufferSpace::device;
constexpr BuildCaps kCpuOnly{false, false};
constexpr BuildCaps kCudaNoNccl{true, false};
constexpr BuildCaps kCudaNccl{true, true};

MpiCudaSupport mpi(Answer run_time) {
  MpiCudaSupport m;
  m.compile_time = m.run_time = run_time;
  m.library = "Test MPI 1.0";
  m.why = "MPIX_Query_cuda_support() = test";
  return m;
}

CommConfig config(CommBackend backend, AllreduceAlgorithm algorithm = AllreduceAlgorithm::mpi) {
  CommConfig c;
  c.backend = backend;
  c.allreduce = algorithm;
  return c;
}

/// Expects resolve_backend to throw an InputError of one line, starting with `key`, holding
/// every one of `parts`.
void expect_refused(const CommConfig& c, BufferSpace b, const MpiCudaSupport& m, const BuildCaps& caps,
                    const std::string& key, std::initializer_list<std::string> parts,
                    const DeviceSharing& sharing = {}) {
  try {
    resolve_backend(c, b, m, caps, sharing);
    ADD_FAILURE() << "no InputError";
  } catch (const InputError& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind(key + ": ", 0), 0u) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
  }
}

TEST(CommBackend, AutoOnHostMemoryIsMpiWhateverTheBuild) {
  for (const BuildCaps caps : {kCpuOnly, kCudaNoNccl, kCudaNccl})
    for (const Answer a : {Answer::no, Answer::yes, Answer::unknown}) {
      const BackendPlan p = resolve_backend(config(CommBackend::automatic), kHost, mpi(a), caps);
      EXPECT_EQ(p.main(), CommBackend::mpi);
      EXPECT_EQ(p.host, CommBackend::mpi);
      EXPECT_EQ(p.reason, "buffers in host memory");
    }
}

TEST(CommBackend, AutoOnDeviceMemoryPrefersNcclThenCudaAwareMpiThenStaging) {
  const CommConfig a = config(CommBackend::automatic);
  EXPECT_EQ(resolve_backend(a, kDevice, mpi(Answer::yes), kCudaNccl).device, CommBackend::nccl);
  EXPECT_EQ(resolve_backend(a, kDevice, mpi(Answer::no), kCudaNccl).device, CommBackend::nccl);
  const BackendPlan aware = resolve_backend(a, kDevice, mpi(Answer::yes), kCudaNoNccl);
  EXPECT_EQ(aware.device, CommBackend::cuda_aware_mpi);
  EXPECT_NE(aware.reason.find("MPI CUDA-aware: yes"), std::string::npos) << aware.reason;
  EXPECT_EQ(resolve_backend(a, kDevice, mpi(Answer::no), kCudaNoNccl).device, CommBackend::staged);
  // A library that cannot be asked is not trusted with device pointers.
  EXPECT_EQ(resolve_backend(a, kDevice, mpi(Answer::unknown), kCudaNoNccl).device, CommBackend::staged);
  // Small host buffers of a device run (loss sums) still go to MPI directly.
  EXPECT_EQ(resolve_backend(a, kDevice, mpi(Answer::no), kCudaNccl).host, CommBackend::mpi);
}

TEST(CommBackend, AutoSkipsNcclWhereRanksShareAGpu) {
  const CommConfig a = config(CommBackend::automatic);
  const DeviceSharing two{2}, own{1};
  EXPECT_EQ(resolve_backend(a, kDevice, mpi(Answer::yes), kCudaNccl, own).device, CommBackend::nccl);
  const BackendPlan staged = resolve_backend(a, kDevice, mpi(Answer::no), kCudaNccl, two);
  EXPECT_EQ(staged.device, CommBackend::staged);
  EXPECT_NE(staged.reason.find("up to 2 ranks of a node share one GPU"), std::string::npos) << staged.reason;
  EXPECT_NE(staged.reason.find("MPI CUDA-aware: no"), std::string::npos) << staged.reason;
  EXPECT_EQ(resolve_backend(a, kDevice, mpi(Answer::yes), kCudaNccl, two).device, CommBackend::cuda_aware_mpi);
  // Host buffers never ask.
  EXPECT_EQ(resolve_backend(a, kHost, mpi(Answer::no), kCudaNccl, two).main(), CommBackend::mpi);
}

TEST(CommBackend, NcclIsRefusedWhereRanksShareAGpu) {
  expect_refused(config(CommBackend::nccl), kDevice, mpi(Answer::yes), kCudaNccl, "comm.backend",
                 {"\"nccl\" needs a GPU of its own for every rank", "up to 4 ranks of a node share one GPU",
                  "\"staged\""},
                 DeviceSharing{4});
  // Staged and CUDA-aware MPI do not mind.
  EXPECT_EQ(resolve_backend(config(CommBackend::staged), kDevice, mpi(Answer::no), kCudaNccl, DeviceSharing{4})
                .device,
            CommBackend::staged);
  EXPECT_EQ(resolve_backend(config(CommBackend::cuda_aware_mpi), kDevice, mpi(Answer::yes), kCudaNccl,
                            DeviceSharing{4})
                .device,
            CommBackend::cuda_aware_mpi);
}

TEST(CommBackend, AutoStagesWhenTheAlgorithmAddsOnTheHost) {
  for (const AllreduceAlgorithm alg :
       {AllreduceAlgorithm::ring, AllreduceAlgorithm::parameter_server, AllreduceAlgorithm::hierarchical}) {
    const BackendPlan p = resolve_backend(config(CommBackend::automatic, alg), kDevice, mpi(Answer::yes), kCudaNccl);
    EXPECT_EQ(p.device, CommBackend::staged);
    EXPECT_NE(p.reason.find("adds on the host"), std::string::npos) << p.reason;
  }
}

TEST(CommBackend, Bf16WireConvertsOnTheHost) {
  CommConfig bf16 = config(CommBackend::automatic);
  bf16.reduce_dtype = ReduceDtype::bf16;
  const BackendPlan p = resolve_backend(bf16, kDevice, mpi(Answer::yes), kCudaNccl);
  EXPECT_EQ(p.device, CommBackend::staged);
  EXPECT_NE(p.reason.find("comm.reduce_dtype = \"bf16\" converts on the host"), std::string::npos) << p.reason;
  EXPECT_EQ(resolve_backend(bf16, kHost, mpi(Answer::no), kCpuOnly).main(), CommBackend::mpi);
  bf16.backend = CommBackend::nccl;
  expect_refused(bf16, kDevice, mpi(Answer::no), kCudaNccl, "comm.reduce_dtype", {"\"bf16\"", "\"staged\""});
  bf16.backend = CommBackend::cuda_aware_mpi;
  expect_refused(bf16, kDevice, mpi(Answer::yes), kCudaNccl, "comm.reduce_dtype", {"\"bf16\"", "\"fp32\""});
  EXPECT_EQ(resolve_backend(bf16, kHost, mpi(Answer::yes), kCudaNccl).main(), CommBackend::mpi);
  bf16.backend = CommBackend::staged;
  EXPECT_EQ(resolve_backend(bf16, kDevice, mpi(Answer::no), kCudaNccl).device, CommBackend::staged);
}

TEST(CommBackend, NcclWithoutNcclBuiltIsAnError) {
  for (const BuildCaps caps : {kCpuOnly, kCudaNoNccl})
    for (const BufferSpace b : {kHost, kDevice})
      expect_refused(config(CommBackend::nccl), b, mpi(Answer::no), caps, "comm.backend",
                     {"\"nccl\" needs a build with NCCL", "-DTESSERA_ENABLE_CUDA=ON", "\"staged\""});
}

TEST(CommBackend, NcclNeedsDeviceMemoryAndItsOwnAllreduce) {
  const BackendPlan p = resolve_backend(config(CommBackend::nccl), kDevice, mpi(Answer::no), kCudaNccl);
  EXPECT_EQ(p.device, CommBackend::nccl);
  EXPECT_EQ(p.host, CommBackend::mpi);
  expect_refused(config(CommBackend::nccl), kHost, mpi(Answer::no), kCudaNccl, "comm.backend",
                 {"takes device memory", "host memory"});
  expect_refused(config(CommBackend::nccl, AllreduceAlgorithm::ring), kDevice, mpi(Answer::no), kCudaNccl,
                 "comm.allreduce", {"\"ring\"", "NCCL runs its own allreduce"});
}

TEST(CommBackend, MpiRefusesDeviceMemory) {
  EXPECT_EQ(resolve_backend(config(CommBackend::mpi), kHost, mpi(Answer::no), kCpuOnly).main(), CommBackend::mpi);
  expect_refused(config(CommBackend::mpi), kDevice, mpi(Answer::yes), kCudaNccl, "comm.backend",
                 {"\"mpi\" takes host memory", "\"cuda-aware-mpi\", \"nccl\""});
  expect_refused(config(CommBackend::mpi), kDevice, mpi(Answer::yes), kCudaNoNccl, "comm.backend",
                 {"\"staged\", \"cuda-aware-mpi\""});
}

TEST(CommBackend, CudaAwareMpiFollowsTheLibrarysAnswer) {
  const CommConfig c = config(CommBackend::cuda_aware_mpi);
  EXPECT_EQ(resolve_backend(c, kDevice, mpi(Answer::yes), kCudaNoNccl).device, CommBackend::cuda_aware_mpi);
  // The user knows better than a library that cannot be asked; the log says so.
  const BackendPlan trusted = resolve_backend(c, kDevice, mpi(Answer::unknown), kCudaNoNccl);
  EXPECT_EQ(trusted.device, CommBackend::cuda_aware_mpi);
  EXPECT_NE(trusted.reason.find("not confirmed"), std::string::npos) << trusted.reason;
  expect_refused(c, kDevice, mpi(Answer::no), kCudaNoNccl, "comm.backend",
                 {"not CUDA-aware", "MPIX_Query_cuda_support() = test", "Test MPI 1.0", "\"staged\""});
  expect_refused(config(CommBackend::cuda_aware_mpi, AllreduceAlgorithm::parameter_server), kDevice,
                 mpi(Answer::yes), kCudaNoNccl, "comm.allreduce", {"\"parameter-server\" adds on the host"});
  // Host buffers: an MPI that is not CUDA-aware serves them all the same.
  EXPECT_EQ(resolve_backend(c, kHost, mpi(Answer::no), kCpuOnly).main(), CommBackend::mpi);
}

TEST(CommBackend, StagedServesEveryMemoryAndAlgorithm) {
  for (const AllreduceAlgorithm alg : {AllreduceAlgorithm::mpi, AllreduceAlgorithm::ring,
                                       AllreduceAlgorithm::parameter_server})
    for (const BufferSpace b : {kHost, kDevice}) {
      const BackendPlan p = resolve_backend(config(CommBackend::staged, alg), b, mpi(Answer::no), kCpuOnly);
      EXPECT_EQ(p.main(), CommBackend::staged);
      EXPECT_EQ(p.host, CommBackend::staged);
    }
}

TEST(CommBackend, DefaultCapsAreThisBuild) {
  EXPECT_EQ(BuildCaps{}.cuda, build::cuda);
  EXPECT_EQ(BuildCaps{}.nccl, build::nccl);
  if (build::nccl) {
    EXPECT_TRUE(build::cuda);
  }
}

}  // namespace
}  // namespace tessera
