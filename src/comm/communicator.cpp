#include "comm/communicator.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <climits>
#include <stdexcept>

#include "comm/mpi_type.hpp"
#include "comm/parameter_server.hpp"
#include "comm/ring_allreduce.hpp"
#include "core/error.hpp"

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
}  // namespace

Communicator::Communicator(MPI_Comm world, int dp, int tp, int pp, const CommConfig& comm)
    : dp_(dp), tp_(tp), pp_(pp) {
  set_allreduce(comm.allreduce, static_cast<std::size_t>(comm.ring_segment_kb) * 1024);
  MPI_CHECK(MPI_Comm_dup(world, &world_));
  MPI_CHECK(MPI_Comm_rank(world_, &world_rank_));
  MPI_CHECK(MPI_Comm_size(world_, &world_size_));
  if (dp * tp * pp != world_size_)
    throw std::logic_error(fmt::format("Communicator: dp*tp*pp = {} but world has {} ranks",
                                       dp * tp * pp, world_size_));
  // rank = t + tp*(d + dp*p)
  coord_.tensor = world_rank_ % tp_;
  coord_.data = (world_rank_ / tp_) % dp_;
  coord_.pipeline = world_rank_ / (tp_ * dp_);
  const int d = coord_.data, t = coord_.tensor, p = coord_.pipeline;
  // Colour by what the group members share; key by the coordinate that varies inside it.
  MPI_CHECK(MPI_Comm_split(world_, d + dp_ * p, t, &tensor_));
  MPI_CHECK(MPI_Comm_split(world_, t + tp_ * p, d, &data_));
  MPI_CHECK(MPI_Comm_split(world_, t + tp_ * d, p, &pipeline_));
  MPI_Comm node = MPI_COMM_NULL;
  MPI_CHECK(MPI_Comm_split_type(world_, MPI_COMM_TYPE_SHARED, world_rank_, MPI_INFO_NULL, &node));
  MPI_CHECK(MPI_Comm_size(node, &node_size_));
  MPI_CHECK(MPI_Comm_free(&node));
}

Communicator::~Communicator() {
  for (MPI_Comm* c : {&data_, &tensor_, &pipeline_, &world_})
    if (*c != MPI_COMM_NULL) MPI_Comm_free(c);
}

MPI_Comm Communicator::handle(Group g) const {
  switch (g) {
    case Group::world: return world_;
    case Group::data: return data_;
    case Group::tensor: return tensor_;
    case Group::pipeline: return pipeline_;
  }
  return world_;
}

int Communicator::rank(Group g) const {
  switch (g) {
    case Group::world: return world_rank_;
    case Group::data: return coord_.data;
    case Group::tensor: return coord_.tensor;
    case Group::pipeline: return coord_.pipeline;
  }
  return world_rank_;
}

int Communicator::size(Group g) const {
  switch (g) {
    case Group::world: return world_size_;
    case Group::data: return dp_;
    case Group::tensor: return tp_;
    case Group::pipeline: return pp_;
  }
  return world_size_;
}

std::string Communicator::layout(int zero) const {
  return fmt::format("dp={},tp={},pp={},zero={}", dp_, tp_, pp_, zero);
}

void Communicator::set_allreduce(AllreduceAlgorithm algorithm, std::size_t segment_bytes) {
  algorithm_ = algorithm;
  segment_bytes_ = std::max<std::size_t>(segment_bytes, 1);
}

template <class T>
void Communicator::allreduce_sum_impl(T* data, std::size_t n, Group g, std::vector<T>& scratch) const {
  const int p = size(g);
  if (p == 1) return;
  const std::size_t segment = std::max<std::size_t>(1, segment_bytes_ / sizeof(T));
  switch (algorithm_) {
    case AllreduceAlgorithm::mpi:
      allreduce_chunked(data, n, mpi_type<T>(), MPI_SUM, handle(g));
      return;
    case AllreduceAlgorithm::ring: {
      const std::size_t need = ring_allreduce_scratch(n, p, segment);
      if (scratch.size() < need) scratch.resize(need);
      ring_allreduce_sum(data, n, handle(g), segment, scratch.data());
      return;
    }
    case AllreduceAlgorithm::parameter_server: {
      const std::size_t need = rank(g) == 0 ? parameter_server_scratch(n, segment) : 0;
      if (scratch.size() < need) scratch.resize(need);
      parameter_server_allreduce_sum(data, n, handle(g), segment, scratch.data());
      return;
    }
  }
}

void Communicator::allreduce_sum(float* data, std::size_t n, Group g) const {
  allreduce_sum_impl(data, n, g, scratch_float_);
}

void Communicator::allreduce_sum(double* data, std::size_t n, Group g) const {
  allreduce_sum_impl(data, n, g, scratch_double_);
}

void Communicator::allreduce_max(double* data, std::size_t n, Group g) const {
  if (size(g) > 1) allreduce_chunked(data, n, MPI_DOUBLE, MPI_MAX, handle(g));
}

void Communicator::broadcast(std::string& s, int root, Group g) const {
  if (size(g) == 1) return;
  unsigned long long len = s.size();
  MPI_CHECK(MPI_Bcast(&len, 1, MPI_UNSIGNED_LONG_LONG, root, handle(g)));
  s.resize(len);
  if (len > 0) MPI_CHECK(MPI_Bcast(s.data(), static_cast<int>(len), MPI_CHAR, root, handle(g)));
}

void Communicator::barrier(Group g) const { MPI_CHECK(MPI_Barrier(handle(g))); }

}  // namespace tessera
