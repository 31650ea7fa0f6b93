// Reduce-scatter, allgather and the nonblocking collectives that bucketed gradient exchange and
// ZeRO build on. MPI counts are int: larger buffers are refused here with a clear message (a
// bucket is far smaller; see comm.bucket_mb).
#include <fmt/format.h>

#include <climits>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <vector>

#include "comm/bf16.hpp"
#include "comm/communicator.hpp"
#include "comm/mpi_type.hpp"

namespace tessera {

namespace {
std::size_t element_bytes(ReduceDtype wire) { return wire == ReduceDtype::bf16 ? 2 : sizeof(float); }

int mpi_count(std::size_t n, const char* what) {
  if (n > static_cast<std::size_t>(INT_MAX))
    throw std::length_error(fmt::format("Communicator::{}: {} elements exceed MPI's int count; use "
                                        "smaller buckets (comm.bucket_mb)", what, n));
  return static_cast<int>(n);
}
}  // namespace

void PendingOp::completed() noexcept {
  if (complete_) {
    complete_();
    complete_ = nullptr;
  }
  comm::flight_recorder().end(id_);
  id_ = 0;
}

void PendingOp::finish() noexcept {
  if (request_ != MPI_REQUEST_NULL) {
    comm::flight_recorder().begin_wait(id_);
    MPI_Wait(&request_, MPI_STATUS_IGNORE);
  }
  completed();
}

PendingOp& PendingOp::operator=(PendingOp&& o) noexcept {
  if (this != &o) {
    finish();
    request_ = o.request_;
    id_ = o.id_;
    complete_ = std::move(o.complete_);
    o.request_ = MPI_REQUEST_NULL;
    o.id_ = 0;
    o.complete_ = nullptr;
  }
  return *this;
}

PendingOp::~PendingOp() { finish(); }

bool PendingOp::test() {
  if (request_ == MPI_REQUEST_NULL) return true;
  int flag = 0;
  MPI_CHECK(MPI_Test(&request_, &flag, MPI_STATUS_IGNORE));
  if (flag != 0) completed();
  return flag != 0;
}

void PendingOp::wait() {
  if (request_ != MPI_REQUEST_NULL) {
    comm::flight_recorder().begin_wait(id_);
    MPI_CHECK(MPI_Wait(&request_, MPI_STATUS_IGNORE));
  }
  completed();
}

void Communicator::reduce_scatter_sum(const float* send, float* recv, std::size_t chunk, Group g,
                                      ReduceDtype wire) const {
  const int elements = mpi_count(chunk, "reduce_scatter_sum");
  const auto p = static_cast<std::size_t>(size(g));
  // send == recv only alone in the group: the sum is there already (MPI's in-place form would
  // copy the whole bucket through a temporary of its own).
  if (send == recv && wire == ReduceDtype::fp32) return;
  const std::uint64_t id = enter("reduce_scatter", g, chunk * element_bytes(wire) * p, true);
  if (id == 0) return;
  const comm::WatchedOp watched(id);
  count(g, chunk * element_bytes(wire) * p, 0, 0);
  if (wire == ReduceDtype::fp32) {
    MPI_CHECK(MPI_Reduce_scatter_block(send, recv, elements, MPI_FLOAT, MPI_SUM, handle(g)));
    return;
  }
  if (scratch_bf16_.size() < chunk * (p + 1)) scratch_bf16_.resize(chunk * (p + 1));
  std::uint16_t* out = scratch_bf16_.data();
  std::uint16_t* in = out + chunk * p;
  comm::encode_bf16(send, out, chunk * p);
  MPI_CHECK(MPI_Reduce_scatter_block(out, in, elements, bf16_->type(), bf16_->sum(), handle(g)));
  comm::decode_bf16(in, recv, chunk);
}

void Communicator::allgather(const float* send, float* recv, std::size_t chunk, Group g) const {
  const int elements = mpi_count(chunk, "allgather");
  const bool in_place = send == recv + static_cast<std::size_t>(rank(g)) * chunk;
  const std::uint64_t id = enter("allgather", g, chunk * sizeof(float) * static_cast<std::size_t>(size(g)), true);
  if (id == 0) return;
  const comm::WatchedOp watched(id);
  count(g, chunk * sizeof(float), 0, 0);
  MPI_CHECK(MPI_Allgather(in_place ? MPI_IN_PLACE : send, elements, MPI_FLOAT, recv, elements, MPI_FLOAT,
                          handle(g)));
}

PendingOp Communicator::iallreduce_sum(float* data, std::size_t n, Group g, ReduceDtype wire) const {
  const int elements = mpi_count(n, "iallreduce_sum");
  const std::uint64_t id = enter("iallreduce", g, n * element_bytes(wire), false);
  if (id == 0) return PendingOp();
  count(g, n * element_bytes(wire), 0, 0);
  MPI_Request r = MPI_REQUEST_NULL;
  if (wire == ReduceDtype::fp32) {
    MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, data, elements, MPI_FLOAT, MPI_SUM, handle(g), &r));
    return PendingOp(r, id);
  }
  // The scratch lives with the op (its heap block never moves); completion writes data.
  auto scratch = std::make_shared<std::vector<std::uint16_t>>(n);
  comm::encode_bf16(data, scratch->data(), n);
  MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, scratch->data(), elements, bf16_->type(), bf16_->sum(), handle(g), &r));
  return PendingOp(r, id, [scratch, data, n] { comm::decode_bf16(scratch->data(), data, n); });
}

PendingOp Communicator::ireduce_scatter_sum(const float* send, float* recv, std::size_t chunk, Group g,
                                            ReduceDtype wire) const {
  const int elements = mpi_count(chunk, "ireduce_scatter_sum");
  const auto p = static_cast<std::size_t>(size(g));
  if (send == recv && wire == ReduceDtype::fp32) return PendingOp();  // alone in the group, as above
  const std::uint64_t id = enter("ireduce_scatter", g, chunk * element_bytes(wire) * p, false);
  if (id == 0) return PendingOp();
  count(g, chunk * element_bytes(wire) * p, 0, 0);
  MPI_Request r = MPI_REQUEST_NULL;
  if (wire == ReduceDtype::fp32) {
    MPI_CHECK(MPI_Ireduce_scatter_block(send, recv, elements, MPI_FLOAT, MPI_SUM, handle(g), &r));
    return PendingOp(r, id);
  }
  // Send part (chunk * p) and receive part (chunk) of one scratch that lives with the op.
  auto scratch = std::make_shared<std::vector<std::uint16_t>>(chunk * (p + 1));
  std::uint16_t* in = scratch->data() + chunk * p;
  comm::encode_bf16(send, scratch->data(), chunk * p);
  MPI_CHECK(MPI_Ireduce_scatter_block(scratch->data(), in, elements, bf16_->type(), bf16_->sum(), handle(g), &r));
  return PendingOp(r, id, [scratch, in, recv, chunk] { comm::decode_bf16(in, recv, chunk); });
}

PendingOp Communicator::iallgather(const float* send, float* recv, std::size_t chunk, Group g) const {
  const int elements = mpi_count(chunk, "iallgather");
  const bool in_place = send == recv + static_cast<std::size_t>(rank(g)) * chunk;
  const std::uint64_t id = enter("iallgather", g, chunk * sizeof(float) * static_cast<std::size_t>(size(g)), false);
  if (id == 0) return PendingOp();
  count(g, chunk * sizeof(float), 0, 0);
  MPI_Request r = MPI_REQUEST_NULL;
  MPI_CHECK(MPI_Iallgather(in_place ? MPI_IN_PLACE : send, elements, MPI_FLOAT, recv, elements,
                           MPI_FLOAT, handle(g), &r));
  return PendingOp(r, id);
}

template <class T>
PendingOp Communicator::isend_impl(const T* data, std::size_t n, int dest, int tag, Group g) const {
  const int elements = mpi_count(n, "isend");
  const std::uint64_t id = comm::flight_recorder().begin_p2p("send", handle(g), world_rank_in(g, dest), dest,
                                                             true, n * sizeof(T), false);
  count(g, 0, n * sizeof(T), on_other_node(g, dest) ? n * sizeof(T) : 0);
  MPI_Request r = MPI_REQUEST_NULL;
  MPI_CHECK(MPI_Isend(data, elements, mpi_type<T>(), dest, tag, handle(g), &r));
  return PendingOp(r, id);
}

template <class T>
PendingOp Communicator::irecv_impl(T* data, std::size_t n, int source, int tag, Group g) const {
  const int elements = mpi_count(n, "irecv");
  const std::uint64_t id = comm::flight_recorder().begin_p2p("recv", handle(g), world_rank_in(g, source), source,
                                                             false, n * sizeof(T), false);
  MPI_Request r = MPI_REQUEST_NULL;
  MPI_CHECK(MPI_Irecv(data, elements, mpi_type<T>(), source, tag, handle(g), &r));
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
  const int elements = mpi_count(n, "recv");
  const comm::WatchedOp watched(comm::flight_recorder().begin_p2p(
      "recv", handle(g), world_rank_in(g, source), source, false, n * sizeof(float), true));
  MPI_CHECK(MPI_Recv(data, elements, MPI_FLOAT, source, tag, handle(g), MPI_STATUS_IGNORE));
}

}  // namespace tessera
