#pragma once
// An NCCL communicator over the ranks of an MPI communicator, for gradient allreduce on
// device buffers. Only in builds where CMake found NCCL (TESSERA_HAVE_NCCL).
#if defined(TESSERA_HAVE_NCCL)
#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#include <cstddef>

namespace tessera::comm {

class NcclComm {
 public:
  /// \brief Builds an NCCL communicator with the ranks and rank order of `comm`.
  /// Collective: must be called on every rank of `comm`, each with its CUDA device already
  /// selected (cudaSetDevice). Rank 0 creates the unique id and broadcasts it over MPI. When
  /// any rank sees no CUDA device, every rank throws std::runtime_error (no rank hangs).
  explicit NcclComm(MPI_Comm comm);
  ~NcclComm();
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  /// \brief In-place sum of `n` floats at device_ptr over all ranks, enqueued on `stream`.
  /// Collective over the ranks of the communicator.
  void allreduce_sum(float* device_ptr, std::size_t n, cudaStream_t stream);

  int rank() const { return rank_; }
  int size() const { return size_; }

 private:
  ncclComm_t comm_ = nullptr;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace tessera::comm
#endif
