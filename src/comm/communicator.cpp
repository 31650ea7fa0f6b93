#include "comm/communicator.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include "comm/device_memory.hpp"
#include "comm/device_sharing.hpp"
#include "comm/fault_hook.hpp"
#include "comm/mpi_type.hpp"
#include "comm/nccl_comm.hpp"
#include "core/deck.hpp"
#include "core/error.hpp"

namespace tessera {

namespace {
/// The weakest run-time answer of any rank of comm, so that every rank plans alike.
Answer weakest_answer(Answer mine, MPI_Comm comm) {
  auto rank_of = [](Answer a) { return a == Answer::no ? 0 : a == Answer::unknown ? 1 : 2; };
  int weakest = rank_of(mine);
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &weakest, 1, MPI_INT, MPI_MIN, comm));
  return weakest == 0 ? Answer::no : weakest == 1 ? Answer::unknown : Answer::yes;
}
}  // namespace

Communicator::Communicator(MPI_Comm world, int dp, int tp, int pp, const CommConfig& comm,
                           BufferSpace buffers)
    : Communicator(world, GridShape{dp, tp, pp, 1}, comm, buffers) {}

Communicator::Communicator(MPI_Comm world, GridShape grid, const CommConfig& comm, BufferSpace buffers)
    : dp_(grid.dp), tp_(grid.tp), pp_(grid.pp), sp_(grid.sp), mpi_cuda_(detect_mpi_cuda_support()) {
  set_allreduce(comm.allreduce, static_cast<std::size_t>(comm.ring_segment_kb) * 1024);
  reduce_dtype_ = comm.reduce_dtype;
  // Choose the backend before any communicator exists: a refusal is the same on every rank.
  mpi_cuda_.run_time = weakest_answer(mpi_cuda_.run_time, world);
  // Before any communicator exists too: a malformed test hook is refused on every rank alike.
  world_node_ = comm::world_node_ids(world);
  // Which ranks share a GPU matters only to device buffers (NCCL); host runs ask no device.
  const DeviceSharing sharing =
      buffers == BufferSpace::device ? comm::detect_device_sharing(world) : DeviceSharing{};
  plan_ = resolve_backend(comm, buffers, mpi_cuda_, BuildCaps{}, sharing);
  device_pointers_possible_ = comm::device::count() > 0;
  if (plan_.main() == CommBackend::staged) staging_.reserve(1);  // pinned or not, for the log
  MPI_CHECK(MPI_Comm_dup(world, &world_));
  MPI_CHECK(MPI_Comm_rank(world_, &world_rank_));
  MPI_CHECK(MPI_Comm_size(world_, &world_size_));
  if (static_cast<long long>(dp_) * tp_ * pp_ * sp_ != world_size_)
    throw std::logic_error(fmt::format("Communicator: dp*tp*pp*sp = {} but world has {} ranks",
                                       static_cast<long long>(dp_) * tp_ * pp_ * sp_, world_size_));
  // rank = s + sp*(t + tp*(d + dp*p))
  coord_.spatial = world_rank_ % sp_;
  coord_.tensor = (world_rank_ / sp_) % tp_;
  coord_.data = (world_rank_ / (sp_ * tp_)) % dp_;
  coord_.pipeline = world_rank_ / (sp_ * tp_ * dp_);
  const int d = coord_.data, t = coord_.tensor, p = coord_.pipeline, s = coord_.spatial;
  // Colour by what the group members share; key by the coordinate that varies inside it.
  MPI_CHECK(MPI_Comm_split(world_, s + sp_ * (d + dp_ * p), t, &tensor_));
  MPI_CHECK(MPI_Comm_split(world_, s + sp_ * (t + tp_ * p), d, &data_));
  MPI_CHECK(MPI_Comm_split(world_, s + sp_ * (t + tp_ * d), p, &pipeline_));
  MPI_CHECK(MPI_Comm_split(world_, t + tp_ * (d + dp_ * p), s, &spatial_));
  if (sp_ > 1) MPI_CHECK(MPI_Comm_split(world_, t + tp_ * p, s + sp_ * d, &replica_));
  MPI_Comm node = MPI_COMM_NULL;
  MPI_CHECK(MPI_Comm_split_type(world_, MPI_COMM_TYPE_SHARED, world_rank_, MPI_INFO_NULL, &node));
  MPI_CHECK(MPI_Comm_size(node, &node_size_));
  MPI_CHECK(MPI_Comm_free(&node));
  bf16_ = std::make_unique<comm::MpiBf16>();
  split_replica_by_node();
  // Every rank reads the same environment, so a malformed test hook fails on every rank alike.
  fault_ = test_hooks::comm_fault();
  for (Group g : {Group::world, Group::data, Group::tensor, Group::pipeline, Group::spatial,
                  Group::replica_node, Group::replica_cross})
    comm::flight_recorder().attach(handle(g), group_name(g), members(g));
  if (sp_ > 1) comm::flight_recorder().attach(replica_, group_name(Group::replica), members(Group::replica));
}

void Communicator::split_replica_by_node() {
  // The replica group's node split (comm/node_split.hpp, TESSERA_TEST_NODE_OF_RANK included), the
  // one the hierarchical allreduce uses too; its two communicators become Groups of their own (the
  // flight recorder, the watchdog and the counters see them) and stay owned by the split.
  const comm::NodeSplit& split = node_split(Group::replica);
  replica_node_ = split.node_comm;
  replica_cross_ = split.cross_comm;
  replica_node_rank_ = split.local_rank;
  replica_node_size_ = split.local_size;
  MPI_CHECK(MPI_Comm_rank(replica_cross_, &replica_cross_rank_));
  MPI_CHECK(MPI_Comm_size(replica_cross_, &replica_cross_size_));
  // Even on every replica group of the world, so that every rank takes the same decision.
  int sizes[2] = {replica_node_size_, -replica_node_size_};  // the largest and the smallest
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, sizes, 2, MPI_INT, MPI_MAX, world_));
  replica_nodes_even_ = sizes[0] == -sizes[1];
  const auto world_ranks = [this](MPI_Comm c, int n) {
    std::vector<int> out(static_cast<std::size_t>(n));
    MPI_CHECK(MPI_Allgather(&world_rank_, 1, MPI_INT, out.data(), 1, MPI_INT, c));
    return out;
  };
  replica_node_members_ = world_ranks(replica_node_, replica_node_size_);
  replica_cross_members_ = world_ranks(replica_cross_, replica_cross_size_);
}

Communicator::~Communicator() {
  for (auto& n : nccl_) n.reset();
  // replica_node_ and replica_cross_ belong to the replica group's node split.
  for (MPI_Comm c : {replica_node_, replica_cross_})
    if (c != MPI_COMM_NULL) comm::flight_recorder().detach(c);
  for (auto& split : splits_) split.reset();
  bf16_.reset();
  for (MPI_Comm* c : {&data_, &tensor_, &pipeline_, &spatial_, &replica_, &world_})
    if (*c != MPI_COMM_NULL) {
      comm::flight_recorder().detach(*c);
      MPI_Comm_free(c);
    }
}

const char* group_name(Group g) {
  switch (g) {
    case Group::world: return "world";
    case Group::data: return "data";
    case Group::tensor: return "tensor";
    case Group::pipeline: return "pipeline";
    case Group::spatial: return "spatial";
    case Group::replica: return "replica";
    case Group::replica_node: return "replica_node";
    case Group::replica_cross: return "replica_cross";
  }
  return "world";
}

int Communicator::world_rank_in(Group g, int r) const {
  const int d = coord_.data, t = coord_.tensor, p = coord_.pipeline, s = coord_.spatial;
  switch (g) {
    case Group::world: return r;
    case Group::data: return world_rank_of(r, t, p, s);
    case Group::tensor: return world_rank_of(d, r, p, s);
    case Group::pipeline: return world_rank_of(d, t, r, s);
    case Group::spatial: return world_rank_of(d, t, p, r);
    case Group::replica: return world_rank_of(r / sp_, t, p, r % sp_);
    case Group::replica_node: return replica_node_members_.at(static_cast<std::size_t>(r));
    case Group::replica_cross: return replica_cross_members_.at(static_cast<std::size_t>(r));
  }
  return r;
}

std::vector<int> Communicator::members(Group g) const {
  std::vector<int> m;
  for (int r = 0; r < size(g); ++r) m.push_back(world_rank_in(g, r));
  return m;
}

bool Communicator::fault_at(Group g) const {
  // The first operation the hook can act on at or after the sequence number it names (an agree()
  // or a nested section may hold that number itself), once.
  if (fault_.action == test_hooks::CommFault::Action::none || fault_fired_ || fault_.rank != world_rank_ ||
      fault_.group != group_name(g) || comm::flight_recorder().next_seq(handle(g)) < fault_.seq)
    return false;
  fault_fired_ = true;
  return true;
}

std::uint64_t Communicator::enter(const char* op, Group g, std::size_t bytes, bool blocking, int root) const {
  auto& recorder = comm::flight_recorder();
  if (fault_at(g)) {
    const std::uint64_t seq = recorder.next_seq(handle(g));
    if (fault_.action == test_hooks::CommFault::Action::stall) {
      comm::stall(world_rank_, op, group_name(g), seq);
    } else {
      std::fprintf(stderr, "tessera: rank %d: TESSERA_TEST_COMM_FAULT: skipping %s #%llu of the %s group\n",
                   world_rank_, op, static_cast<unsigned long long>(seq), group_name(g));
      recorder.skip_seq(handle(g));
      return 0;
    }
  }
  return recorder.begin_collective(op, handle(g), bytes, blocking, root >= 0 ? world_rank_in(g, root) : -1);
}

comm::WatchedOp Communicator::watch(const char* op, Group g, std::size_t bytes) const {
  // The test hook's stall applies to a section too; its skip does not (the caller runs the body).
  if (fault_.action == test_hooks::CommFault::Action::stall && fault_at(g))
    comm::stall(world_rank_, op, group_name(g), comm::flight_recorder().next_seq(handle(g)));
  return comm::WatchedOp(comm::flight_recorder().begin_collective(op, handle(g), bytes, true));
}

MPI_Comm Communicator::handle(Group g) const {
  switch (g) {
    case Group::world: return world_;
    case Group::data: return data_;
    case Group::tensor: return tensor_;
    case Group::pipeline: return pipeline_;
    case Group::spatial: return spatial_;
    case Group::replica: return sp_ > 1 ? replica_ : data_;
    case Group::replica_node: return replica_node_;
    case Group::replica_cross: return replica_cross_;
  }
  return world_;
}

int Communicator::rank(Group g) const {
  switch (g) {
    case Group::world: return world_rank_;
    case Group::data: return coord_.data;
    case Group::tensor: return coord_.tensor;
    case Group::pipeline: return coord_.pipeline;
    case Group::spatial: return coord_.spatial;
    case Group::replica: return coord_.spatial + sp_ * coord_.data;
    case Group::replica_node: return replica_node_rank_;
    case Group::replica_cross: return replica_cross_rank_;
  }
  return world_rank_;
}

int Communicator::size(Group g) const {
  switch (g) {
    case Group::world: return world_size_;
    case Group::data: return dp_;
    case Group::tensor: return tp_;
    case Group::pipeline: return pp_;
    case Group::spatial: return sp_;
    case Group::replica: return dp_ * sp_;
    case Group::replica_node: return replica_node_size_;
    case Group::replica_cross: return replica_cross_size_;
  }
  return world_size_;
}

std::string Communicator::layout(int zero) const {
  if (sp_ > 1) return fmt::format("dp={},tp={},pp={},sp={},zero={}", dp_, tp_, pp_, sp_, zero);
  return fmt::format("dp={},tp={},pp={},zero={}", dp_, tp_, pp_, zero);
}

void Communicator::set_allreduce(AllreduceAlgorithm algorithm, std::size_t segment_bytes) {
  algorithm_ = algorithm;
  segment_bytes_ = std::max<std::size_t>(segment_bytes, 1);
}

void Communicator::broadcast(std::string& s, int root, Group g) const {
  if (size(g) == 1) return;
  const std::uint64_t id = enter("broadcast", g, rank(g) == root ? s.size() : 0, true, root);
  if (id == 0) return;
  const comm::WatchedOp watched(id);
  count(g, rank(g) == root ? s.size() : 0, 0, 0);
  unsigned long long len = s.size();
  MPI_CHECK(MPI_Bcast(&len, 1, MPI_UNSIGNED_LONG_LONG, root, handle(g)));
  s.resize(len);
  if (len > 0) MPI_CHECK(MPI_Bcast(s.data(), static_cast<int>(len), MPI_CHAR, root, handle(g)));
}

std::vector<std::string> Communicator::allgather_strings(const std::string& s, Group g) const {
  const int n = size(g);
  if (n == 1) return {s};
  const std::uint64_t id = enter("allgather", g, s.size(), true);
  if (id == 0) return std::vector<std::string>(static_cast<std::size_t>(n), s);
  const comm::WatchedOp watched(id);
  // Lengths, then the bytes one after another.
  if (s.size() > static_cast<std::size_t>(INT_MAX))
    throw std::length_error("Communicator::allgather_strings: a string beyond 2 GiB");
  const int mine = static_cast<int>(s.size());
  count(g, s.size(), 0, 0);
  std::vector<int> lengths(static_cast<std::size_t>(n)), offsets(static_cast<std::size_t>(n), 0);
  MPI_CHECK(MPI_Allgather(&mine, 1, MPI_INT, lengths.data(), 1, MPI_INT, handle(g)));
  long long total = 0;
  for (int len : lengths) total += len;
  if (total > INT_MAX) throw std::length_error("Communicator::allgather_strings: beyond 2 GiB in all");
  for (std::size_t i = 1; i < lengths.size(); ++i) offsets[i] = offsets[i - 1] + lengths[i - 1];
  std::string all(static_cast<std::size_t>(total), '\0');
  MPI_CHECK(MPI_Allgatherv(s.data(), mine, MPI_CHAR, all.data(), lengths.data(), offsets.data(), MPI_CHAR, handle(g)));
  std::vector<std::string> out;
  for (std::size_t i = 0; i < lengths.size(); ++i)
    out.push_back(all.substr(static_cast<std::size_t>(offsets[i]), static_cast<std::size_t>(lengths[i])));
  return out;
}

std::vector<std::uint64_t> Communicator::allgather_u64(const std::vector<std::uint64_t>& mine, Group g) const {
  const auto n = static_cast<std::size_t>(size(g));
  std::vector<std::uint64_t> all;
  for (std::size_t r = 0; r < n; ++r) all.insert(all.end(), mine.begin(), mine.end());
  if (n == 1) return all;
  const std::uint64_t id = enter("allgather", g, mine.size() * sizeof(std::uint64_t), true);
  if (id == 0) return all;
  const comm::WatchedOp watched(id);
  if (mine.size() > static_cast<std::size_t>(INT_MAX)) throw std::length_error("Communicator::allgather_u64: too long");
  const int elements = static_cast<int>(mine.size());
  count(g, mine.size() * sizeof(std::uint64_t), 0, 0);
  MPI_CHECK(MPI_Allgather(mine.data(), elements, MPI_UINT64_T, all.data(), elements, MPI_UINT64_T, handle(g)));
  return all;
}

void Communicator::all_to_all(const float* send, float* recv, std::size_t per_rank, Group g) const {
  const auto n = static_cast<std::size_t>(size(g));
  if (n == 1) {
    std::copy_n(send, per_rank, recv);
    return;
  }
  const std::uint64_t id = enter("alltoall", g, n * per_rank * sizeof(float), true);
  if (id == 0) return;
  const comm::WatchedOp watched(id);
  if (per_rank > static_cast<std::size_t>(INT_MAX)) throw std::length_error("Communicator::all_to_all: too long");
  count(g, n * per_rank * sizeof(float), 0, 0);
  const int elements = static_cast<int>(per_rank);
  MPI_CHECK(MPI_Alltoall(send, elements, MPI_FLOAT, recv, elements, MPI_FLOAT, handle(g)));
}

void Communicator::barrier(Group g) const {
  const std::uint64_t id = enter("barrier", g, 0, true);
  if (id == 0) return;
  const comm::WatchedOp watched(id);
  count(g, 0, 0, 0);
  MPI_CHECK(MPI_Barrier(handle(g)));
}

void Communicator::count(Group g, std::uint64_t collective, std::uint64_t point_to_point,
                         std::uint64_t to_other_nodes) const {
  auto& c = counts_[static_cast<std::size_t>(g)];
  c[0].fetch_add(1, std::memory_order_relaxed);
  c[1].fetch_add(collective, std::memory_order_relaxed);
  c[2].fetch_add(point_to_point, std::memory_order_relaxed);
  c[3].fetch_add(to_other_nodes, std::memory_order_relaxed);
}

CommCounters Communicator::counters() const {
  CommCounters out;
  for (std::size_t g = 0; g < counts_.size(); ++g) {
    const auto& c = counts_[g];
    out.groups[g] = CommBytes{c[0].load(std::memory_order_relaxed), c[1].load(std::memory_order_relaxed),
                              c[2].load(std::memory_order_relaxed), c[3].load(std::memory_order_relaxed)};
  }
  return out;
}

void Communicator::reset_counters() const {
  for (auto& c : counts_)
    for (auto& field : c) field.store(0, std::memory_order_relaxed);
}

CommBytes CommCounters::total() const {
  CommBytes t;
  for (const CommBytes& b : groups) {
    t.calls += b.calls;
    t.collective += b.collective;
    t.point_to_point += b.point_to_point;
    t.to_other_nodes += b.to_other_nodes;
  }
  return t;
}

bool Communicator::on_other_node(Group g, int r) const {
  return node_id_of_world_rank(world_rank_in(g, r)) != node_id_of_world_rank(world_rank_);
}

const comm::NodeSplit& Communicator::node_split(Group g) const {
  auto& slot = splits_[static_cast<std::size_t>(g)];
  if (!slot) {
    std::vector<int> ids;
    for (const int w : members(g)) ids.push_back(node_id_of_world_rank(w));
    slot = std::make_unique<comm::NodeSplit>(comm::split_by_node(handle(g), ids));
  }
  return *slot;
}

comm::NcclComm& Communicator::nccl(Group g) const {
  auto& slot = nccl_[static_cast<std::size_t>(g)];
  if (!slot) slot = std::make_unique<comm::NcclComm>(handle(g));
  return *slot;
}

std::string Communicator::describe_backend() const {
  const CommBackend main = plan_.main();
  std::string s = fmt::format("comm: {} buffers -> {} (comm.backend = \"{}\": {})",
                              to_string(plan_.buffers), to_string(main), to_string(plan_.requested),
                              plan_.reason);
  if (plan_.buffers == BufferSpace::device && plan_.host != main)
    s += fmt::format(", small host buffers -> {}", to_string(plan_.host));
  if (main == CommBackend::nccl) {
    s += "; allreduce by NCCL";
  } else {
    s += fmt::format("; allreduce {}", to_string(algorithm_));
    if (algorithm_ != AllreduceAlgorithm::mpi) s += fmt::format(" ({} KiB segments)", segment_bytes_ >> 10);
  }
  if (main == CommBackend::staged) s += fmt::format("; staging buffer: {}", staging_.describe());
  s += fmt::format("; MPI CUDA-aware: {} ({}; {})", to_string(mpi_cuda_.run_time), mpi_cuda_.why,
                   mpi_cuda_.library);
  return s;
}

}  // namespace tessera
