// NCCL communicator built from an MPI communicator: plain C++ on the NCCL host API.
#include "comm/nccl_comm.hpp"

#if defined(TESSERA_HAVE_NCCL)
#include <cuda_runtime.h>
#include <nccl.h>

#include <stdexcept>
#include <string>

#include "comm/device_memory.hpp"

namespace tessera::comm {
namespace {

[[noreturn]] void fail(const char* library, const char* text, const char* call, const char* file,
                       int line) {
  std::string s = "tessera: ";
  s += library;
  s += " error '";
  s += text;
  s += "' in ";
  s += call;
  s += " at ";
  s += file;
  s += ':';
  s += std::to_string(line);
  throw std::runtime_error(s);
}

[[noreturn]] void fail_nccl(ncclResult_t result, const char* call, const char* file, int line) {
  fail("NCCL", ncclGetErrorString(result), call, file, line);
}

[[noreturn]] void fail_mpi(int code, const char* call, const char* file, int line) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  fail("MPI", std::string(text, static_cast<std::size_t>(length)).c_str(), call, file, line);
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

template <class T>
constexpr ncclDataType_t nccl_type();
template <>
constexpr ncclDataType_t nccl_type<float>() { return ncclFloat32; }
template <>
constexpr ncclDataType_t nccl_type<double>() { return ncclFloat64; }

cudaStream_t as_stream(void* stream) { return static_cast<cudaStream_t>(stream); }

}  // namespace

struct NcclComm::Impl {
  ncclComm_t comm = nullptr;

  template <class T>
  void allreduce_sum(T* data, std::size_t n, void* stream) {
    TESSERA_NCCL_CHECK(ncclAllReduce(data, data, n, nccl_type<T>(), ncclSum, comm, as_stream(stream)));
  }
  template <class T>
  void reduce_scatter_sum(const T* send, T* recv, std::size_t recv_count, void* stream) {
    TESSERA_NCCL_CHECK(ncclReduceScatter(send, recv, recv_count, nccl_type<T>(), ncclSum, comm,
                                         as_stream(stream)));
  }
  template <class T>
  void allgather(const T* send, T* recv, std::size_t send_count, void* stream) {
    TESSERA_NCCL_CHECK(ncclAllGather(send, recv, send_count, nccl_type<T>(), comm, as_stream(stream)));
  }
};

NcclComm::NcclComm(MPI_Comm comm) : impl_(std::make_unique<Impl>()) {
  TESSERA_MPI_CHECK(MPI_Comm_rank(comm, &rank_));
  TESSERA_MPI_CHECK(MPI_Comm_size(comm, &size_));
  // Agree that every rank has a device, so that no rank waits in NCCL for one that threw.
  int devices = device::count();
  int fewest = 0;
  TESSERA_MPI_CHECK(MPI_Allreduce(&devices, &fewest, 1, MPI_INT, MPI_MIN, comm));
  if (fewest == 0) {
    throw std::runtime_error(
        "tessera: NCCL requested but a rank sees no CUDA device. ---> HINT: set comm.backend to "
        "\"mpi\" or \"auto\" on CPU-only nodes, or check CUDA_VISIBLE_DEVICES");
  }
  // Rank 0 creates the id; everyone receives it, and its success, so all fail together.
  ncclUniqueId id{};
  int id_result = ncclSuccess;
  if (rank_ == 0) id_result = ncclGetUniqueId(&id);
  TESSERA_MPI_CHECK(MPI_Bcast(&id_result, 1, MPI_INT, 0, comm));
  TESSERA_NCCL_CHECK(static_cast<ncclResult_t>(id_result));
  TESSERA_MPI_CHECK(MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, comm));
  TESSERA_NCCL_CHECK(ncclCommInitRank(&impl_->comm, size_, id, rank_));
}

NcclComm::~NcclComm() {
  if (impl_ && impl_->comm != nullptr) ncclCommDestroy(impl_->comm);  // cannot report; ignore
}

void NcclComm::allreduce_sum(float* d, std::size_t n, void* s) { impl_->allreduce_sum(d, n, s); }
void NcclComm::allreduce_sum(double* d, std::size_t n, void* s) { impl_->allreduce_sum(d, n, s); }

void NcclComm::reduce_scatter_sum(const float* send, float* recv, std::size_t n, void* s) {
  impl_->reduce_scatter_sum(send, recv, n, s);
}
void NcclComm::reduce_scatter_sum(const double* send, double* recv, std::size_t n, void* s) {
  impl_->reduce_scatter_sum(send, recv, n, s);
}

void NcclComm::allgather(const float* send, float* recv, std::size_t n, void* s) {
  impl_->allgather(send, recv, n, s);
}
void NcclComm::allgather(const double* send, double* recv, std::size_t n, void* s) {
  impl_->allgather(send, recv, n, s);
}

}  // namespace tessera::comm
#endif
