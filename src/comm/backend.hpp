#pragma once
// Which backend carries a buffer between ranks (deck key comm.backend), decided once when the
// Communicator is built from the deck, the memory the buffers live in, what the MPI library
// says about CUDA (mpi_cuda_support.hpp) and what this binary was built with.
//
//   mpi             buffers in host memory, straight to MPI (any comm.allreduce algorithm)
//   cuda-aware-mpi  device pointers straight to MPI; MPI_Allreduce only (ring and
//                   parameter-server add on the host)
//   staged          copy to a persistent pinned host buffer, run the chosen algorithm there,
//                   copy back: works with any MPI
//   nccl            NCCL communicators, one per group, created on first use
//   auto            host memory: mpi. Device memory: staged when comm.allreduce is ring,
//                   parameter-server or hierarchical, or comm.reduce_dtype is bf16; else
//                   nccl if built and every rank has a GPU of its own, else cuda-aware-mpi if
//                   the MPI library's run-time query says yes, else staged.
#include <string>

#include "comm/mpi_cuda_support.hpp"
#include "core/build_features.hpp"
#include "core/config.hpp"

namespace tessera {

/// Where the buffers handed to allreduce_sum live: host memory (a Serial/OpenMP Kokkos) or
/// device memory (a CUDA Kokkos; not host-accessible).
enum class BufferSpace { host, device };

/// What the binary can do; tests pass other values to check the rules of a build they are not.
struct BuildCaps {
  bool cuda = build::cuda;
  bool nccl = build::nccl;
};

/// Whether ranks of one node run on the same GPU (comm/device_sharing.hpp): NCCL refuses two
/// ranks on one device, so "auto" does not pick it then and "nccl" is refused.
struct DeviceSharing {
  int ranks_per_device = 1;  ///< the most ranks of any node on one device (1: none shared)
  bool shared() const { return ranks_per_device > 1; }
};

struct BackendPlan {
  CommBackend requested = CommBackend::automatic;
  BufferSpace buffers = BufferSpace::host;
  /// Backend of host-memory buffers: mpi, or staged where comm.backend = "staged" asked for it.
  /// Small host buffers (loss sums, norms) take this path also in a device-memory run.
  CommBackend host = CommBackend::mpi;
  /// Backend of device-memory buffers: cuda_aware_mpi, staged or nccl (mpi: refused on use).
  CommBackend device = CommBackend::staged;
  /// Why `device` (or `host` for host buffers) was chosen, for the log line.
  std::string reason;

  /// The backend the run's main buffers (gradients) take.
  CommBackend main() const { return buffers == BufferSpace::device ? device : host; }
};

/// \brief Resolves comm.backend. Pure: no MPI, no CUDA. Throws InputError naming comm.backend
/// (or comm.allreduce) for a choice this build, this memory or this MPI cannot serve:
/// nccl without NCCL built, nccl on host buffers, nccl with ring/parameter-server, mpi on device
/// buffers, cuda-aware-mpi on device buffers where MPI says it is not CUDA-aware or with
/// ring/parameter-server, nccl on device buffers where ranks share a GPU (`sharing`); and
/// comm.reduce_dtype = "bf16" with nccl, or with cuda-aware-mpi on device buffers.
BackendPlan resolve_backend(const CommConfig& cfg, BufferSpace buffers, const MpiCudaSupport& mpi,
                            const BuildCaps& caps = {}, const DeviceSharing& sharing = {});

/// "host", "device".
const char* to_string(BufferSpace s);

}  // namespace tessera
