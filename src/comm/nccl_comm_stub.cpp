// comm/nccl_comm.hpp in a build without NCCL: constructing one is an error on every rank (the
// deck check refuses comm.backend = "nccl" before this is reached).
#include "comm/nccl_comm.hpp"

#if !defined(TESSERA_HAVE_NCCL)
#include <stdexcept>

namespace tessera::comm {

struct NcclComm::Impl {};

NcclComm::NcclComm(MPI_Comm) {
  throw std::runtime_error(
      "tessera: NCCL requested, but this build has no NCCL. ---> HINT: configure with "
      "-DTESSERA_ENABLE_CUDA=ON where nccl.h and libnccl are installed, or set comm.backend to "
      "\"auto\", \"cuda-aware-mpi\" or \"staged\"");
}

NcclComm::~NcclComm() = default;

// Unreachable: no NcclComm can be constructed.
void NcclComm::allreduce_sum(float*, std::size_t, void*) {}
void NcclComm::allreduce_sum(double*, std::size_t, void*) {}
void NcclComm::reduce_scatter_sum(const float*, float*, std::size_t, void*) {}
void NcclComm::reduce_scatter_sum(const double*, double*, std::size_t, void*) {}
void NcclComm::allgather(const float*, float*, std::size_t, void*) {}
void NcclComm::allgather(const double*, double*, std::size_t, void*) {}

}  // namespace tessera::comm
#endif
