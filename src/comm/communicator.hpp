#pragma once
// The one communicator API of Tessera: every byte between ranks goes through here (parallel HDF5
// takes the raw MPI_Comm handles this class owns).
//
// Process grid (DESIGN.md, docs/design.md): world = data x pipeline x tensor x spatial,
// rank = s + sp*(t + tp*(d + dp*p)): the spatial rank varies fastest (its halos cross between
// neighbours before every convolution, forward and backward), then tensor, data and pipeline; with
// sp = 1 this is DESIGN.md's rank = t + tp*(d + dp*p). Each rank owns the sub-communicators
// spatial (same d,t,p), tensor (same s,d,p), data (same s,t,p), pipeline (same s,t,d), and replica
// (same t,p: every rank holding the same parameters, data x spatial, the group that sums the
// gradients and that ZeRO shards over; the data group itself where sp = 1).
//
// allreduce_sum goes through the backend of comm.backend (comm/backend.hpp): MPI on host memory;
// device memory straight to a CUDA-aware MPI, staged through a pinned host buffer, or NCCL.
//
// Every collective and transfer is recorded in the flight recorder (comm/flight_recorder.hpp:
// operation, group, peer, bytes, sequence number, start and end), which the watchdog
// (comm/watchdog.hpp) watches: a rank blocked in one longer than comm.timeout_s ends the run.
// Every one is also counted, in bytes per group (counters(), CommBytes says what counts).
//
// The gradient exchange's calls for the lead's wiring:
//   allreduce_sum(grad, n, Group::replica, comm.reduce_dtype())     blocking, comm.allreduce's algorithm
//   iallreduce_sum(grad, n, Group::replica, comm.reduce_dtype())    nonblocking, MPI's algorithm
//   reduce_scatter_sum / ireduce_scatter_sum(..., comm.reduce_dtype())   ZeRO
//   node_split(Group::replica)   hybrid sharding: shard over node_comm, replicate over cross_comm
// With ReduceDtype::bf16 the fp32 buffers are rounded to bf16 on the way out, summed with an fp32
// addition at each step, and the (bf16) sums written back as fp32: half the bytes, bitwise the
// same on every rank; a nonblocking call writes its result when wait() or test() completes it.
#include <mpi.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/backend.hpp"
#include "comm/flight_recorder.hpp"
#include "comm/mpi_bf16.hpp"
#include "comm/mpi_check.hpp"
#include "comm/mpi_cuda_support.hpp"
#include "comm/node_split.hpp"
#include "comm/staging_buffer.hpp"
#include "core/config.hpp"
#include "core/test_hooks.hpp"

namespace tessera {

namespace comm {
class NcclComm;
}

/// replica_node: the ranks of this rank's replica group on its node (hybrid sharding spreads the
/// state over them); replica_cross: the ranks of its replica group with its index in
/// replica_node, one per node (they hold the same shard and sum it across nodes). A node is
/// MPI's shared-memory domain (MPI_Comm_split_type), or, for tests on one machine,
/// TESSERA_TEST_NODE_OF_RANK=k consecutive world ranks (comm/node_split.hpp).
enum class Group { world, data, tensor, pipeline, spatial, replica, replica_node, replica_cross };

/// "world", "data", "tensor", "pipeline", "spatial", "replica", "replica_node", "replica_cross"
/// (a string literal).
const char* group_name(Group g);

/// Coordinates of one rank in the grid.
struct GridCoord {
  int data = 0;
  int tensor = 0;
  int pipeline = 0;
  int spatial = 0;
};

/// The grid's dimensions: data, tensor, pipeline and spatial ranks.
struct GridShape {
  int dp = 1, tp = 1, pp = 1, sp = 1;
};

/// \brief A nonblocking collective in flight. Its buffers must stay untouched until it is done.
/// Move-only; destroying one still in flight waits for it. `id` is its flight-recorder entry:
/// its end is recorded when it completes, and the watchdog watches waits on it. `complete` is
/// run once when the request completes (in wait(), in the test() that sees it done, or in the
/// destructor or move-assignment that waits for it), before the op counts as done: a bf16 sum
/// owns its scratch through it and writes the caller's fp32 buffer there. It must not throw.
class PendingOp {
 public:
  PendingOp() = default;
  explicit PendingOp(MPI_Request r, std::uint64_t id = 0, std::function<void()> complete = {})
      : request_(r), id_(id), complete_(std::move(complete)) {}
  PendingOp(PendingOp&& o) noexcept
      : request_(o.request_), id_(o.id_), complete_(std::move(o.complete_)) {
    o.request_ = MPI_REQUEST_NULL;
    o.id_ = 0;
    o.complete_ = nullptr;
  }
  PendingOp& operator=(PendingOp&& o) noexcept;
  PendingOp(const PendingOp&) = delete;
  PendingOp& operator=(const PendingOp&) = delete;
  ~PendingOp();

  /// \brief Lets MPI progress it; true once it is complete (then always true).
  bool test();
  /// \brief Blocks until it is complete.
  void wait();
  bool done() const { return request_ == MPI_REQUEST_NULL; }

 private:
  void finish() noexcept;  ///< waits, unchecked (destructor, move-assignment)
  void completed() noexcept;  ///< the request is done: run complete_ once, record the end
  MPI_Request request_ = MPI_REQUEST_NULL;
  std::uint64_t id_ = 0;
  std::function<void()> complete_;
};

/// \brief Bytes this rank handed to one group's communication (Communicator::counters()).
///
/// What counts is the logical payload this rank contributes, never MPI's internal traffic:
///   - MPI's own collectives: the payload of the call in its wire type: allreduce n elements,
///     reduce-scatter chunk * size(g) (the send buffer), allgather chunk (this rank's part),
///     broadcast the message on the root only (0 elsewhere), barrier 0. With bf16 an element is 2
///     bytes, so the same call counts half.
///   - our own algorithms (ring, parameter-server, hierarchical): the bytes of the messages this
///     rank itself sends (a ring allreduce of B bytes over p ranks: about 2(p-1)/p B; the
///     parameter server's broadcast counts on rank 0 as MPI's collective would).
///   - point-to-point: isend's n elements; receives count nothing.
/// `to_other_nodes` is the part that this rank itself sent to a rank on another node (nodes as
/// node_split() sees them): known for our own algorithms' messages and isend; MPI's own
/// collectives and broadcasts route inside the library and are never counted there.
struct CommBytes {
  std::uint64_t calls = 0;           ///< collectives and sends counted
  std::uint64_t collective = 0;      ///< bytes handed to collectives
  std::uint64_t point_to_point = 0;  ///< bytes of sends
  std::uint64_t to_other_nodes = 0;  ///< of both, bytes this rank sent to another node's ranks
  std::uint64_t total() const { return collective + point_to_point; }
};

/// \brief The counts of every group since the Communicator was built or reset_counters().
struct CommCounters {
  std::array<CommBytes, 8> groups{};  ///< by Group
  const CommBytes& operator[](Group g) const { return groups[static_cast<std::size_t>(g)]; }
  /// Every group's counts added up.
  CommBytes total() const;
};

class Communicator {
 public:
  /// \brief Builds the grid over `world`; collective over world. dp*tp*pp must equal its size.
  /// `comm` picks the algorithm and the backend of allreduce_sum (deck section [comm]);
  /// `buffers` says where the run's large buffers (gradients) live, which decides
  /// comm.backend = "auto" and which explicit choices are refused. Asks the MPI library whether
  /// it is CUDA-aware (every rank must get the same answer). Throws InputError naming the key on
  /// every rank for a backend this build, memory or MPI cannot serve (backend.hpp).
  Communicator(MPI_Comm world, int dp, int tp, int pp, const CommConfig& comm = {},
               BufferSpace buffers = BufferSpace::host);
  /// \brief The same over a grid with a spatial dimension: dp*tp*pp*sp must equal world's size.
  Communicator(MPI_Comm world, GridShape grid, const CommConfig& comm = {},
               BufferSpace buffers = BufferSpace::host);
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank(Group g = Group::world) const;
  int size(Group g = Group::world) const;
  MPI_Comm handle(Group g = Group::world) const;
  bool is_root() const { return world_rank_ == 0; }
  GridCoord coord() const { return coord_; }
  int dp() const { return dp_; }
  int tp() const { return tp_; }
  int pp() const { return pp_; }
  int sp() const { return sp_; }

  /// Number of world ranks on this rank's node (shared-memory domain).
  int ranks_on_node() const { return node_size_; }
  /// True where every node holds the same number of ranks of each replica group (the
  /// replica_node groups are all of one size), so that replica_cross pairs them all up.
  bool replica_nodes_even() const { return replica_nodes_even_; }
  /// World rank of grid coordinate (d, t, p, s).
  int world_rank_of(int d, int t, int p, int s = 0) const { return s + sp_ * (t + tp_ * (d + dp_ * p)); }
  /// World rank of rank `r` of this rank's group g.
  int world_rank_in(Group g, int r) const;
  /// World ranks of this rank's group g, in group-rank order.
  std::vector<int> members(Group g) const;
  /// "dp=2,tp=1,pp=1" (",sp=S" where sp > 1) plus the ZeRO stage, as stored in checkpoints.
  std::string layout(int zero) const;

  /// \brief Picks the algorithm of allreduce_sum from now on; every rank must pick the same.
  /// \param segment_bytes  ring, parameter-server and hierarchical: bytes per point-to-point
  ///                       message (of the wire type)
  void set_allreduce(AllreduceAlgorithm algorithm, std::size_t segment_bytes);
  AllreduceAlgorithm allreduce_algorithm() const { return algorithm_; }
  /// The deck's comm.reduce_dtype, for the gradient exchange to pass to the calls below.
  ReduceDtype reduce_dtype() const { return reduce_dtype_; }

  /// \brief Sums `n` values in place over group g with the chosen algorithm (set_allreduce)
  /// and backend (backend()). Must be called on every rank of the group with the same n, on
  /// buffers in the same kind of memory. `data` may be host or device memory; work that writes
  /// it must be finished (fence the execution space first); it is written when the call returns.
  /// Every algorithm leaves bitwise the same values on every rank; they differ from each other
  /// only by the order of the sums; staging changes nothing in the sums.
  /// \param wire  ReduceDtype::bf16: the values travel as bf16 (rounded to nearest even), every
  ///              addition is an fp32 addition of the partial sums, the bf16 result is written
  ///              back as fp32 (mpi: MPI's allreduce with Tessera's bf16 MPI_Op, comm/mpi_bf16.hpp;
  ///              ring, parameter-server, hierarchical: bf16 in their own messages). Not on
  ///              device buffers with the nccl or cuda-aware-mpi backend (std::runtime_error).
  void allreduce_sum(float* data, std::size_t n, Group g, ReduceDtype wire = ReduceDtype::fp32) const;
  void allreduce_sum(double* data, std::size_t n, Group g) const;
  /// \brief MPI_Alltoall of floats in host memory: per_rank elements of send to each rank of g
  /// (rank order), recv the same from each. A transformer's context parallelism regroups its
  /// attention's operands with it.
  void all_to_all(const float* send, float* recv, std::size_t per_rank, Group g) const;
  /// \brief Reduce-scatter of a sum (MPI's own algorithm): send holds chunk * size(g) values,
  /// recv gets this rank's chunk of the sum (the rank(g)-th). Collective over the group. Host
  /// memory with `wire` = bf16 (as allreduce_sum; send is left untouched).
  void reduce_scatter_sum(const float* send, float* recv, std::size_t chunk, Group g,
                          ReduceDtype wire = ReduceDtype::fp32) const;
  /// \brief Allgather: recv (chunk * size(g)) gets every rank's chunk in rank order; send may
  /// be recv + rank(g) * chunk (in place). Collective over the group.
  void allgather(const float* send, float* recv, std::size_t chunk, Group g) const;
  /// \brief Nonblocking forms of allreduce_sum (always MPI's own algorithm), reduce_scatter_sum and
  /// allgather. Every rank of the group must start the same operations in the same order.
  /// With `wire` = bf16 (host memory) the op owns the bf16 scratch and writes data / recv when
  /// it completes (wait(), test()); until then they hold what they held.
  PendingOp iallreduce_sum(float* data, std::size_t n, Group g, ReduceDtype wire = ReduceDtype::fp32) const;
  PendingOp ireduce_scatter_sum(const float* send, float* recv, std::size_t chunk, Group g,
                                ReduceDtype wire = ReduceDtype::fp32) const;
  PendingOp iallgather(const float* send, float* recv, std::size_t chunk, Group g) const;

  /// \brief The bytes this rank handed to each group's collectives and sends (CommBytes says
  /// exactly what counts) since construction or the last reset_counters(). Thread-safe.
  CommCounters counters() const;
  void reset_counters() const;

  /// \brief Group g seen as nodes (comm/node_split.hpp): which node each rank of g is on, how
  /// many of g's ranks each node holds, and two communicators owned by this Communicator:
  /// node_comm, this rank's node's part of g (e.g. shard a model within a node), and cross_comm,
  /// the ranks of g with this rank's local index, one per node (replicate across nodes). Nodes
  /// are the shared-memory domains (or TESSERA_TEST_NODE_OF_RANK's fake ones). Collective over g
  /// on the first call for g (the hierarchical allreduce makes that call itself); cached after.
  /// The two handles are raw MPI communicators: what runs on them directly is neither in the
  /// flight recorder (so not under the watchdog) nor in counters(); give them a Group of their
  /// own before the exchange uses them for collectives.
  const comm::NodeSplit& node_split(Group g) const;
  /// Node id (its lowest world rank) of world rank r, as node_split() sees nodes.
  int node_id_of_world_rank(int r) const { return world_node_[static_cast<std::size_t>(r)]; }

  /// \brief Point-to-point within group g (pipeline stages pass activations and gradients,
  /// spatial neighbours their halos): nonblocking sends and receives and a blocking receive of n
  /// values, matched by tag. A nonblocking receive's buffer is written once it completes.
  PendingOp isend(const float* data, std::size_t n, int dest, int tag, Group g) const;
  PendingOp isend(const double* data, std::size_t n, int dest, int tag, Group g) const;
  PendingOp irecv(float* data, std::size_t n, int source, int tag, Group g) const;
  PendingOp irecv(double* data, std::size_t n, int source, int tag, Group g) const;
  void recv(float* data, std::size_t n, int source, int tag, Group g) const;

  /// \brief Maximum over group g, in place, host memory. Collective over the group.
  void allreduce_max(double* data, std::size_t n, Group g) const;
  /// \brief Broadcasts a string from `root` of group g. Collective over the group.
  void broadcast(std::string& s, int root, Group g) const;
  /// \brief Every rank's string in group-rank order, on every rank. Collective over the group.
  std::vector<std::string> allgather_strings(const std::string& s, Group g) const;
  /// \brief Every rank's `mine` (the same length on each), one after another in group-rank order.
  std::vector<std::uint64_t> allgather_u64(const std::vector<std::uint64_t>& mine, Group g) const;
  void barrier(Group g = Group::world) const;

  /// \brief Records a blocking collective section over group g that is not one of the calls
  /// above (a collective file read or write, agree() on the group's handle): the watchdog ends
  /// the run when it lasts longer than comm.timeout_s. Every rank of g must run it, in the same
  /// order as g's collectives. `op` must be a string literal.
  comm::WatchedOp watch(const char* op, Group g, std::size_t bytes = 0) const;

  /// \brief The resolved comm.backend: which backend host and device buffers take, and why.
  const BackendPlan& backend() const { return plan_; }
  /// What the MPI library said about CUDA when this communicator was built.
  const MpiCudaSupport& mpi_cuda_support() const { return mpi_cuda_; }
  /// \brief One log line: the backend the run's buffers take and why, the algorithm, the staging
  /// buffer, and the MPI library's CUDA answer.
  std::string describe_backend() const;

  /// \brief The NCCL communicator of group g, created on the first call (ncclGetUniqueId on the
  /// group's rank 0, broadcast over the group's MPI communicator), for NCCL collectives on device
  /// buffers (reduce_scatter_sum, allgather, ...). Collective over the group on the first call
  /// for g. Throws std::runtime_error on every rank of the group where NCCL is not built or a
  /// rank sees no CUDA device.
  comm::NcclComm& nccl(Group g) const;

 private:
  int world_rank_ = 0, world_size_ = 1, node_size_ = 1;
  int dp_ = 1, tp_ = 1, pp_ = 1, sp_ = 1;
  GridCoord coord_;
  AllreduceAlgorithm algorithm_ = AllreduceAlgorithm::mpi;
  std::size_t segment_bytes_ = 1 << 20;
  // Scratch of the point-to-point algorithms: grown to the largest need, then reused, so a call
  // allocates nothing once the buffer has been seen.
  mutable std::vector<float> scratch_float_;
  mutable std::vector<double> scratch_double_;
  mutable std::vector<std::uint16_t> scratch_bf16_;  ///< bf16 wire: our algorithms' and MPI's
  ReduceDtype reduce_dtype_ = ReduceDtype::fp32;
  std::unique_ptr<comm::MpiBf16> bf16_;  ///< the bf16 datatype and sum of MPI's collectives
  std::vector<int> world_node_;          ///< node id of every world rank (comm/node_split.hpp)
  mutable std::array<std::unique_ptr<comm::NodeSplit>, 8> splits_;  ///< by Group, on first use
  /// CommBytes of every group, field by field (calls, collective, point_to_point, to_other_nodes).
  mutable std::array<std::array<std::atomic<std::uint64_t>, 4>, 8> counts_{};
  /// Adds one call's bytes to group g's counters.
  void count(Group g, std::uint64_t collective, std::uint64_t point_to_point, std::uint64_t to_other_nodes) const;
  /// True where rank r of group g is on another node than this rank.
  bool on_other_node(Group g, int r) const;
  BackendPlan plan_;
  MpiCudaSupport mpi_cuda_;
  bool device_pointers_possible_ = false;  ///< a CUDA device is visible: classify each buffer
  mutable comm::StagingBuffer staging_;
  mutable std::array<std::unique_ptr<comm::NcclComm>, 8> nccl_;  ///< by Group, on first use
  test_hooks::CommFault fault_;  ///< TESSERA_TEST_COMM_FAULT (core/test_hooks.hpp, comm/fault_hook.hpp)
  mutable bool fault_fired_ = false;
  /// The flight recorder's side of collective `op` on g (and the test hook): the operation's id,
  /// or 0 when the test hook skips it (the caller then returns without calling MPI). blocking:
  /// the calling thread waits in it until the id ends.
  std::uint64_t enter(const char* op, Group g, std::size_t bytes, bool blocking, int root = -1) const;
  /// True when the test hook names this rank and g's next operation.
  bool fault_at(Group g) const;
  template <class T>
  void allreduce_sum_impl(T* data, std::size_t n, Group g, ReduceDtype wire, std::vector<T>& scratch) const;
  template <class T>
  void allreduce_sum_host(T* data, std::size_t n, Group g, ReduceDtype wire, std::vector<T>& scratch) const;
  /// Our own algorithms (ring, parameter-server, hierarchical) with wire type W; counts the bytes.
  template <class T, class W>
  void allreduce_sum_own(T* data, std::size_t n, Group g, std::vector<W>& scratch) const;
  /// MPI's allreduce of bf16 values with the bf16 MPI_Op.
  void allreduce_sum_mpi_bf16(float* data, std::size_t n, Group g) const;
  template <class T>
  void allreduce_sum_staged(T* data, std::size_t n, Group g, ReduceDtype wire, bool on_device,
                            std::vector<T>& scratch) const;
  template <class T>
  PendingOp isend_impl(const T* data, std::size_t n, int dest, int tag, Group g) const;
  template <class T>
  PendingOp irecv_impl(T* data, std::size_t n, int source, int tag, Group g) const;
  MPI_Comm world_ = MPI_COMM_NULL, data_ = MPI_COMM_NULL, tensor_ = MPI_COMM_NULL,
           pipeline_ = MPI_COMM_NULL, spatial_ = MPI_COMM_NULL,
           replica_ = MPI_COMM_NULL,  ///< MPI_COMM_NULL where sp = 1 (the data group serves)
           replica_node_ = MPI_COMM_NULL, replica_cross_ = MPI_COMM_NULL;
  bool replica_nodes_even_ = true;
  std::vector<int> replica_node_members_, replica_cross_members_;  ///< world ranks, group-rank order
  int replica_node_rank_ = 0, replica_node_size_ = 1, replica_cross_rank_ = 0, replica_cross_size_ = 1;
  /// The replica group's node split as Groups replica_node and replica_cross (the handles are
  /// node_split(Group::replica)'s). Collective over world.
  void split_replica_by_node();
};

}  // namespace tessera
