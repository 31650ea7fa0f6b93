#include "comm/backend.hpp"

#include <fmt/format.h>

#include "core/deck.hpp"
#include "core/error.hpp"

namespace tessera {

namespace {

[[noreturn]] void refuse(std::string_view key, const std::string& what) {
  throw InputError(fmt::format("{}: {}", key, what));
}

std::string mpi_says(const MpiCudaSupport& mpi) {
  return fmt::format("MPI CUDA-aware: {} ({})", to_string(mpi.run_time), mpi.why);
}

std::string shared_gpus(const DeviceSharing& sharing) {
  return fmt::format("up to {} ranks of a node share one GPU", sharing.ranks_per_device);
}

/// comm.backend = "auto" on device buffers.
CommBackend automatic_device(const CommConfig& cfg, const MpiCudaSupport& mpi, const BuildCaps& caps,
                             const DeviceSharing& sharing, std::string& reason) {
  if (cfg.allreduce != AllreduceAlgorithm::mpi) {
    reason = fmt::format("comm.allreduce = \"{}\" adds on the host", to_string(cfg.allreduce));
    return CommBackend::staged;
  }
  if (cfg.reduce_dtype != ReduceDtype::fp32) {
    reason = fmt::format("comm.reduce_dtype = \"{}\" converts on the host", to_string(cfg.reduce_dtype));
    return CommBackend::staged;
  }
  if (caps.nccl && !sharing.shared()) {
    reason = "built with NCCL";
    return CommBackend::nccl;
  }
  const std::string why_not_nccl =
      caps.nccl ? fmt::format("{} and NCCL needs one per rank", shared_gpus(sharing)) : "not built with NCCL";
  reason = fmt::format("{}; {}", why_not_nccl, mpi_says(mpi));
  return mpi.cuda_aware() ? CommBackend::cuda_aware_mpi : CommBackend::staged;
}

}  // namespace

const char* to_string(BufferSpace s) { return s == BufferSpace::device ? "device" : "host"; }

BackendPlan resolve_backend(const CommConfig& cfg, BufferSpace buffers, const MpiCudaSupport& mpi,
                            const BuildCaps& caps, const DeviceSharing& sharing) {
  BackendPlan plan;
  plan.requested = cfg.backend;
  plan.buffers = buffers;
  const bool on_device = buffers == BufferSpace::device;
  const bool own_algorithm = cfg.allreduce != AllreduceAlgorithm::mpi;
  const std::string_view algorithm = to_string(cfg.allreduce);

  switch (cfg.backend) {
    case CommBackend::automatic:
      plan.host = CommBackend::mpi;
      plan.device = automatic_device(cfg, mpi, caps, sharing, plan.reason);
      if (!on_device) plan.reason = "buffers in host memory";
      break;
    case CommBackend::mpi:
      if (on_device)
        refuse("comm.backend", fmt::format("\"mpi\" takes host memory, but this build keeps its buffers "
                                           "in device memory; allowed here: \"auto\", \"staged\", "
                                           "\"cuda-aware-mpi\"{}",
                                           caps.nccl ? ", \"nccl\"" : ""));
      plan.host = plan.device = CommBackend::mpi;
      plan.reason = "requested";
      break;
    case CommBackend::cuda_aware_mpi:
      if (on_device && mpi.run_time == Answer::no)
        refuse("comm.backend", fmt::format("\"cuda-aware-mpi\", but the MPI library says it is not "
                                           "CUDA-aware ({}; {}); allowed here: \"staged\" or \"auto\"",
                                           mpi.why, mpi.library));
      if (on_device && own_algorithm)
        refuse("comm.allreduce", fmt::format("\"{}\" adds on the host and cannot run on device buffers "
                                             "with comm.backend = \"cuda-aware-mpi\"; set comm.allreduce "
                                             "= \"mpi\", or comm.backend = \"staged\"",
                                             algorithm));
      if (on_device && cfg.reduce_dtype != ReduceDtype::fp32)
        refuse("comm.reduce_dtype", fmt::format("\"{}\" converts on the host and cannot run on device "
                                                "buffers with comm.backend = \"cuda-aware-mpi\"; set "
                                                "comm.reduce_dtype = \"fp32\", or comm.backend = \"staged\"",
                                                to_string(cfg.reduce_dtype)));
      plan.host = CommBackend::mpi;
      plan.device = CommBackend::cuda_aware_mpi;
      plan.reason = mpi.run_time == Answer::yes
                        ? "requested"
                        : fmt::format("requested; not confirmed by MPI ({})", mpi.why);
      break;
    case CommBackend::staged:
      plan.host = plan.device = CommBackend::staged;
      plan.reason = "requested";
      break;
    case CommBackend::nccl:
      if (!caps.nccl)
        refuse("comm.backend", "\"nccl\" needs a build with NCCL, and this one has none (configured "
                               "without -DTESSERA_ENABLE_CUDA=ON, or CMake found no nccl.h/libnccl); "
                               "allowed here: \"auto\", \"mpi\", \"cuda-aware-mpi\", \"staged\"");
      if (own_algorithm)
        refuse("comm.allreduce", fmt::format("\"{}\" with comm.backend = \"nccl\": NCCL runs its own "
                                             "allreduce; set comm.allreduce = \"mpi\" (the library's "
                                             "own), or comm.backend = \"staged\"",
                                             algorithm));
      if (cfg.reduce_dtype != ReduceDtype::fp32)
        refuse("comm.reduce_dtype", fmt::format("\"{}\" with comm.backend = \"nccl\": the conversion runs "
                                                "on the host; set comm.reduce_dtype = \"fp32\", or "
                                                "comm.backend = \"staged\"",
                                                to_string(cfg.reduce_dtype)));
      if (!on_device)
        refuse("comm.backend", "\"nccl\" takes device memory, but this build keeps its buffers in host "
                               "memory (a Serial/OpenMP Kokkos); allowed here: \"auto\", \"mpi\", "
                               "\"staged\"");
      if (sharing.shared())
        refuse("comm.backend", fmt::format("\"nccl\" needs a GPU of its own for every rank, but {}; "
                                           "start one rank per GPU, or set comm.backend = \"staged\" "
                                           "or \"auto\"",
                                           shared_gpus(sharing)));
      plan.host = CommBackend::mpi;
      plan.device = CommBackend::nccl;
      plan.reason = "requested";
      break;
  }
  return plan;
}

}  // namespace tessera
