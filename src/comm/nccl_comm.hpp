#pragma once
// An NCCL communicator over the ranks of an MPI communicator, for collectives on device buffers.
// The header names no CUDA or NCCL type (a stream is a void*: a cudaStream_t, nullptr for the
// default stream), so every translation unit may hold one: nccl_comm_cuda.cpp implements it
// where CMake found NCCL (TESSERA_HAVE_NCCL), nccl_comm_stub.cpp otherwise, whose constructor
// throws. The Communicator creates one per group on first use (Communicator::nccl).
#include <mpi.h>

#include <cstddef>
#include <memory>

namespace tessera::comm {

class NcclComm {
 public:
  /// \brief Builds an NCCL communicator with the ranks and rank order of `comm`.
  /// Collective: must be called on every rank of `comm`, each with its CUDA device already
  /// selected (cudaSetDevice; Kokkos does it). Rank 0 creates the unique id and broadcasts it
  /// over MPI. When any rank sees no CUDA device, every rank throws std::runtime_error (no rank
  /// hangs); so does every rank of a build without NCCL.
  explicit NcclComm(MPI_Comm comm);
  ~NcclComm();
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  /// \brief In-place sum of `n` values at device_ptr over all ranks, enqueued on `stream`.
  /// Collective over the ranks of the communicator, same `n` everywhere.
  void allreduce_sum(float* device_ptr, std::size_t n, void* stream);
  void allreduce_sum(double* device_ptr, std::size_t n, void* stream);

  /// \brief Sum over ranks of send (size() * recv_count values), rank r keeping part r in recv
  /// (recv_count values), enqueued on `stream`. Collective; device pointers; send and recv may
  /// be in place (recv = send + rank() * recv_count).
  void reduce_scatter_sum(const float* send, float* recv, std::size_t recv_count, void* stream);
  void reduce_scatter_sum(const double* send, double* recv, std::size_t recv_count, void* stream);

  /// \brief recv (size() * send_count values) = the send buffers of ranks 0, 1, ... in order,
  /// enqueued on `stream`. Collective; device pointers; may be in place
  /// (send = recv + rank() * send_count).
  void allgather(const float* send, float* recv, std::size_t send_count, void* stream);
  void allgather(const double* send, double* recv, std::size_t send_count, void* stream);

  int rank() const { return rank_; }
  int size() const { return size_; }

 private:
  struct Impl;  ///< the ncclComm_t
  std::unique_ptr<Impl> impl_;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace tessera::comm
