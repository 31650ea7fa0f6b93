// NCCL communicator built from an MPI communicator: plain C++ on the NCCL host API.
#include "comm/nccl_comm.hpp"

#if defined(TESSERA_HAVE_NCCL)
#include <stdexcept>
#include <string>

#include "blas/cublas_gemm.hpp"

namespace tessera::comm {
namespace {

[[noreturn]] void fail_nccl(ncclResult_t result, const char* call, const char* file, int line) {
  throw std::runtime_error(std::string("tessera: NCCL error '") + ncclGetErrorString(result) +
                           "' in " + call + " at " + file + ":" + std::to_string(line));
}

[[noreturn]] void fail_mpi(int code, const char* call, const char* file, int line) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  throw std::runtime_error(std::string("tessera: MPI error '") + std::string(text, length) +
                           "' in " + call + " at " + file + ":" + std::to_string(line));
}

#define TESSERA_NCCL_CHECK(call)                                                         \
  do {                                                                                   \
    const ncclResult_t tessera_result_ = (call);                                         \
    if (tessera_result_ != ncclSuccess) fail_nccl(tessera_result_, #call, __FILE__, __LINE__); \
  } while (0)

#define TESSERA_MPI_CHECK(call)                                                   \
  do {                                                                            \
    const int tessera_code_ = (call);                                             \
    if (tessera_code_ != MPI_SUCCESS) fail_mpi(tessera_code_, #call, __FILE__, __LINE__); \
  } while (0)

}  // namespace

NcclComm::NcclComm(MPI_Comm comm) {
  TESSERA_MPI_CHECK(MPI_Comm_rank(comm, &rank_));
  TESSERA_MPI_CHECK(MPI_Comm_size(comm, &size_));
  // Agree that every rank has a device, so that no rank waits in NCCL for one that threw.
  int devices = blas::cublas::cuda_device_count();
  int fewest = 0;
  TESSERA_MPI_CHECK(MPI_Allreduce(&devices, &fewest, 1, MPI_INT, MPI_MIN, comm));
  if (fewest == 0) {
    throw std::runtime_error(
        "tessera: NCCL requested but a rank sees no CUDA device. ---> HINT: set comm backend "
        "to MPI on CPU-only nodes, or check CUDA_VISIBLE_DEVICES");
  }
  // Rank 0 creates the id; everyone receives it, and its success, so all fail together.
  ncclUniqueId id{};
  int id_result = ncclSuccess;
  if (rank_ == 0) id_result = ncclGetUniqueId(&id);
  TESSERA_MPI_CHECK(MPI_Bcast(&id_result, 1, MPI_INT, 0, comm));
  TESSERA_NCCL_CHECK(static_cast<ncclResult_t>(id_result));
  TESSERA_MPI_CHECK(MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, comm));
  TESSERA_NCCL_CHECK(ncclCommInitRank(&comm_, size_, id, rank_));
}

NcclComm::~NcclComm() {
  if (comm_ != nullptr) ncclCommDestroy(comm_);  // a destructor cannot report; ignore failure
}

void NcclComm::allreduce_sum(float* device_ptr, std::size_t n, cudaStream_t stream) {
  TESSERA_NCCL_CHECK(ncclAllReduce(device_ptr, device_ptr, n, ncclFloat32, ncclSum, comm_, stream));
}

}  // namespace tessera::comm
#endif
