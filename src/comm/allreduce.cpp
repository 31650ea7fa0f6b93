// Communicator::allreduce_sum: the backend (comm.backend) picks where the sum runs, the algorithm
// (comm.allreduce) how, the wire type (comm.reduce_dtype) in what; and allreduce_max.
#include <fmt/format.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <stdexcept>
#include <type_traits>

#include "comm/bf16.hpp"
#include "comm/communicator.hpp"
#include "comm/device_memory.hpp"
#include "comm/hierarchical_allreduce.hpp"
#include "comm/mpi_type.hpp"
#include "comm/nccl_comm.hpp"
#include "comm/parameter_server.hpp"
#include "comm/ring_allreduce.hpp"
#include "comm/wire.hpp"
#include "core/deck.hpp"

namespace tessera {

namespace {
// MPI counts are int; split larger buffers so 2^31 elements and beyond still work.
constexpr std::size_t max_chunk = static_cast<std::size_t>(INT_MAX);

template <class T>
void allreduce_chunked(T* data, std::size_t n, MPI_Datatype type, MPI_Op op, MPI_Comm comm) {
  for (std::size_t done = 0; done < n;) {
    const std::size_t count = std::min(max_chunk, n - done);
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, data + done, static_cast<int>(count), type, op, comm));
    done += count;
  }
}

std::size_t wire_bytes(ReduceDtype wire) { return wire == ReduceDtype::bf16 ? 2 : sizeof(float); }
}  // namespace

template <class T>
void Communicator::allreduce_sum_impl(T* data, std::size_t n, Group g, ReduceDtype wire,
                                      std::vector<T>& scratch) const {
  const bool on_device = device_pointers_possible_ && comm::device::is_device_pointer(data);
  const CommBackend backend = on_device ? plan_.device : plan_.host;
  if (on_device && wire != ReduceDtype::fp32 &&
      (backend == CommBackend::nccl || backend == CommBackend::cuda_aware_mpi))
    throw std::runtime_error(fmt::format(
        "allreduce_sum: a {} wire converts on the host and was given a device buffer with comm.backend = "
        "\"{}\"; use comm.backend = \"staged\" or comm.reduce_dtype = \"fp32\"", to_string(wire), to_string(backend)));
  switch (backend) {
    case CommBackend::nccl:
      nccl(g).allreduce_sum(data, n, nullptr);
      comm::device::synchronize(nullptr);
      count(g, n * sizeof(T), 0, 0);
      return;
    case CommBackend::staged:
      allreduce_sum_staged(data, n, g, wire, on_device, scratch);
      return;
    case CommBackend::cuda_aware_mpi:
      if (on_device && algorithm_ != AllreduceAlgorithm::mpi)
        throw std::runtime_error(fmt::format(
            "allreduce_sum: comm.allreduce = \"{}\" adds on the host and was given a device buffer "
            "with comm.backend = \"cuda-aware-mpi\"; use comm.allreduce = \"mpi\" or comm.backend "
            "= \"staged\"", to_string(algorithm_)));
      allreduce_sum_host(data, n, g, wire, scratch);
      return;
    case CommBackend::mpi:
    case CommBackend::automatic:
      if (on_device)
        throw std::runtime_error("allreduce_sum: comm.backend = \"mpi\" takes host memory and was "
                                 "given a device buffer; use comm.backend = \"auto\" or \"staged\"");
      allreduce_sum_host(data, n, g, wire, scratch);
      return;
  }
}

template <class T>
void Communicator::allreduce_sum_host(T* data, std::size_t n, Group g, ReduceDtype wire,
                                      std::vector<T>& scratch) const {
  if constexpr (std::is_same_v<T, float>) {
    if (wire == ReduceDtype::bf16) {
      if (algorithm_ == AllreduceAlgorithm::mpi) {
        allreduce_sum_mpi_bf16(data, n, g);
      } else {
        comm::round_to_bf16(data, n);  // every rank's values count as bf16 values
        allreduce_sum_own<float, std::uint16_t>(data, n, g, scratch_bf16_);
      }
      return;
    }
  }
  if (algorithm_ == AllreduceAlgorithm::mpi) {
    allreduce_chunked(data, n, mpi_type<T>(), MPI_SUM, handle(g));
    count(g, n * sizeof(T), 0, 0);
    return;
  }
  allreduce_sum_own<T, T>(data, n, g, scratch);
}

template <class T, class W>
void Communicator::allreduce_sum_own(T* data, std::size_t n, Group g, std::vector<W>& scratch) const {
  const int p = size(g), me = rank(g);
  const std::size_t segment = std::max<std::size_t>(1, segment_bytes_ / sizeof(W));
  constexpr bool converts = comm::kConverts<T, W>;
  auto grow = [&scratch](std::size_t need) {
    if (scratch.size() < need) scratch.resize(need);
  };
  switch (algorithm_) {
    case AllreduceAlgorithm::ring: {
      grow(ring_allreduce_scratch(n, p, segment, converts));
      const std::uint64_t sent = ring_allreduce_sum(data, n, handle(g), segment, scratch.data());
      count(g, sent, 0, on_other_node(g, (me + 1) % p) ? sent : 0);
      return;
    }
    case AllreduceAlgorithm::parameter_server: {
      grow(me == 0 || converts ? parameter_server_scratch(n, segment) : 0);
      const std::uint64_t sent = parameter_server_allreduce_sum(data, n, handle(g), segment, scratch.data());
      const std::uint64_t broadcast = me == 0 ? n * sizeof(W) : 0;
      count(g, sent + broadcast, 0, on_other_node(g, 0) ? sent : 0);
      return;
    }
    case AllreduceAlgorithm::hierarchical: {
      const comm::NodeSplit& split = node_split(g);
      grow(hierarchical_scratch(n, split, segment, converts));
      const HierarchicalSent sent = hierarchical_allreduce_sum(data, n, split, segment, scratch.data());
      count(g, sent.within + sent.across + sent.broadcast, 0, sent.across);
      return;
    }
    case AllreduceAlgorithm::mpi: break;
  }
  throw std::logic_error("allreduce_sum_own: MPI's own algorithm is not ours");
}

void Communicator::allreduce_sum_mpi_bf16(float* data, std::size_t n, Group g) const {
  if (scratch_bf16_.size() < n) scratch_bf16_.resize(n);
  std::uint16_t* wire = scratch_bf16_.data();
  comm::encode_bf16(data, wire, n);
  allreduce_chunked(wire, n, bf16_->type(), bf16_->sum(), handle(g));
  comm::decode_bf16(wire, data, n);
  count(g, n * sizeof(std::uint16_t), 0, 0);
}

template <class T>
void Communicator::allreduce_sum_staged(T* data, std::size_t n, Group g, ReduceDtype wire, bool on_device,
                                        std::vector<T>& scratch) const {
  const std::size_t bytes = n * sizeof(T);
  T* host = static_cast<T*>(staging_.reserve(bytes));
  // Copy out, reduce on the host, copy back.
  if (on_device) comm::device::copy(host, data, bytes);
  else std::memcpy(host, data, bytes);
  allreduce_sum_host(host, n, g, wire, scratch);
  if (on_device) comm::device::copy(data, host, bytes);
  else std::memcpy(data, host, bytes);
}

void Communicator::allreduce_sum(float* data, std::size_t n, Group g, ReduceDtype wire) const {
  if (size(g) == 1 || n == 0) return;
  const std::uint64_t id = enter("allreduce", g, n * wire_bytes(wire), true);
  if (id == 0) return;
  const comm::WatchedOp watched(id);
  allreduce_sum_impl(data, n, g, wire, scratch_float_);
}

void Communicator::allreduce_sum(double* data, std::size_t n, Group g) const {
  if (size(g) == 1 || n == 0) return;
  const std::uint64_t id = enter("allreduce", g, n * sizeof(double), true);
  if (id == 0) return;
  const comm::WatchedOp watched(id);
  allreduce_sum_impl(data, n, g, ReduceDtype::fp32, scratch_double_);
}

void Communicator::allreduce_max(double* data, std::size_t n, Group g) const {
  if (size(g) == 1) return;
  const std::uint64_t id = enter("allreduce_max", g, n * sizeof(double), true);
  if (id == 0) return;
  const comm::WatchedOp watched(id);
  allreduce_chunked(data, n, MPI_DOUBLE, MPI_MAX, handle(g));
  count(g, n * sizeof(double), 0, 0);
}

}  // namespace tessera
