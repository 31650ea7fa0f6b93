// Reduce-scatter, allgather and the nonblocking collectives that bucketed gradient exchange and
// ZeRO build on. MPI counts are int: larger buffers are refused here with a clear message (a
// bucket is far smaller; see comm.bucket_mb).
#include <fmt/format.h>

#include <climits>
#include <stdexcept>

#include "comm/communicator.hpp"
#include "comm/mpi_type.hpp"

namespace tessera {

namespace {
int mpi_count(std::size_t n, const char* what) {
  if (n > static_cast<std::size_t>(INT_MAX))
    throw std::length_error(fmt::format("Communicator::{}: {} elements exceed MPI's int count; use "
                                        "smaller buckets (comm.bucket_mb)", what, n));
  return static_cast<int>(n);
}
}  // namespace

void PendingOp::finish() noexcept {
  if (request_ != MPI_REQUEST_NULL) {
    comm::flight_recorder().begin_wait(id_);
    MPI_Wait(&request_, MPI_STATUS_IGNORE);
  }
  comm::flight_recorder().end(id_);
  id_ = 0;
}

PendingOp& PendingOp::operator=(PendingOp&& o) noexcept {
  if (this != &o) {
    finish();
    request_ = o.request_;
    id_ = o.id_;
    o.request_ = MPI_REQUEST_NULL;
    o.id_ = 0;
  }
  return *this;
}

PendingOp::~PendingOp() { finish(); }

bool PendingOp::test() {
  if (request_ == MPI_REQUEST_NULL) return true;
  int flag = 0;
  MPI_CHECK(MPI_Test(&request_, &flag, MPI_STATUS_IGNORE));
  if (flag != 0) {
    comm::flight_recorder().end(id_);
    id_ = 0;
  }
  return flag != 0;
}

void PendingOp::wait() {
  if (request_ != MPI_REQUEST_NULL) {
    comm::flight_recorder().begin_wait(id_);
    MPI_CHECK(MPI_Wait(&request_, MPI_STATUS_IGNORE));
  }
  comm::flight_recorder().end(id_);
  id_ = 0;
}

void Communicator::reduce_scatter_sum(const float* send, float* recv, std::size_t chunk, Group g) const {
  const std::uint64_t id = enter("reduce_scatter", g, chunk * sizeof(float) * static_cast<std::size_t>(size(g)), true);
  if (id == 0) return;
  const comm::WatchedOp watched(id);
  MPI_CHECK(MPI_Reduce_scatter_block(send, recv, mpi_count(chunk, "reduce_scatter_sum"), MPI_FLOAT,
                                     MPI_SUM, handle(g)));
}

void Communicator::allgather(const float* send, float* recv, std::size_t chunk, Group g) const {
  const int count = mpi_count(chunk, "allgather");
  const bool in_place = send == recv + static_cast<std::size_t>(rank(g)) * chunk;
  const std::uint64_t id = enter("allgather", g, chunk * sizeof(float) * static_cast<std::size_t>(size(g)), true);
  if (id == 0) return;
  const comm::WatchedOp watched(id);
  MPI_CHECK(MPI_Allgather(in_place ? MPI_IN_PLACE : send, count, MPI_FLOAT, recv, count, MPI_FLOAT,
                          handle(g)));
}

PendingOp Communicator::iallreduce_sum(float* data, std::size_t n, Group g) const {
  const int count = mpi_count(n, "iallreduce_sum");
  const std::uint64_t id = enter("iallreduce", g, n * sizeof(float), false);
  if (id == 0) return PendingOp();
  MPI_Request r = MPI_REQUEST_NULL;
  MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, data, count, MPI_FLOAT, MPI_SUM, handle(g), &r));
  return PendingOp(r, id);
}

PendingOp Communicator::ireduce_scatter_sum(const float* send, float* recv, std::size_t chunk,
                                            Group g) const {
  const int count = mpi_count(chunk, "ireduce_scatter_sum");
  const std::uint64_t id = enter("ireduce_scatter", g, chunk * sizeof(float) * static_cast<std::size_t>(size(g)), false);
  if (id == 0) return PendingOp();
  MPI_Request r = MPI_REQUEST_NULL;
  MPI_CHECK(MPI_Ireduce_scatter_block(send, recv, count, MPI_FLOAT, MPI_SUM, handle(g), &r));
  return PendingOp(r, id);
}

PendingOp Communicator::iallgather(const float* send, float* recv, std::size_t chunk, Group g) const {
  const int count = mpi_count(chunk, "iallgather");
  const bool in_place = send == recv + static_cast<std::size_t>(rank(g)) * chunk;
  const std::uint64_t id = enter("iallgather", g, chunk * sizeof(float) * static_cast<std::size_t>(size(g)), false);
  if (id == 0) return PendingOp();
  MPI_Request r = MPI_REQUEST_NULL;
  MPI_CHECK(MPI_Iallgather(in_place ? MPI_IN_PLACE : send, count, MPI_FLOAT, recv, count,
                           MPI_FLOAT, handle(g), &r));
  return PendingOp(r, id);
}

template <class T>
PendingOp Communicator::isend_impl(const T* data, std::size_t n, int dest, int tag, Group g) const {
  const int count = mpi_count(n, "isend");
  const std::uint64_t id = comm::flight_recorder().begin_p2p("send", handle(g), world_rank_in(g, dest), dest,
                                                             true, n * sizeof(T), false);
  MPI_Request r = MPI_REQUEST_NULL;
  MPI_CHECK(MPI_Isend(data, count, mpi_type<T>(), dest, tag, handle(g), &r));
  return PendingOp(r, id);
}

template <class T>
PendingOp Communicator::irecv_impl(T* data, std::size_t n, int source, int tag, Group g) const {
  const int count = mpi_count(n, "irecv");
  const std::uint64_t id = comm::flight_recorder().begin_p2p("recv", handle(g), world_rank_in(g, source), source,
                                                             false, n * sizeof(T), false);
  MPI_Request r = MPI_REQUEST_NULL;
  MPI_CHECK(MPI_Irecv(data, count, mpi_type<T>(), source, tag, handle(g), &r));
  return PendingOp(r, id);
}

PendingOp Communicator::isend(const float* data, std::size_t n, int dest, int tag, Group g) const {
  return isend_impl(data, n, dest, tag, g);
}

PendingOp Communicator::isend(const double* data, std::size_t n, int dest, int tag, Group g) const {
  return isend_impl(data, n, dest, tag, g);
}

PendingOp Communicator::irecv(float* data, std::size_t n, int source, int tag, Group g) const {
  return irecv_impl(data, n, source, tag, g);
}

PendingOp Communicator::irecv(double* data, std::size_t n, int source, int tag, Group g) const {
  return irecv_impl(data, n, source, tag, g);
}

void Communicator::recv(float* data, std::size_t n, int source, int tag, Group g) const {
  const int count = mpi_count(n, "recv");
  const comm::WatchedOp watched(comm::flight_recorder().begin_p2p(
      "recv", handle(g), world_rank_in(g, source), source, false, n * sizeof(float), true));
  MPI_CHECK(MPI_Recv(data, count, MPI_FLOAT, source, tag, handle(g), MPI_STATUS_IGNORE));
}

}  // namespace tessera
