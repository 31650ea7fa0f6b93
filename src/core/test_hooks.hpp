#pragma once
// The test hooks: environment variables TESSERA_TEST_* that make a run misbehave on purpose
// (fail, die, stall, pause, perturb) at a chosen point, so that the tests can check how Tessera
// copes. This module is the only place that reads them; production code asks it (hook X is
// test_hooks::X(), or names_step(StepHook::x, ...) for the hooks that name checkpoint steps) and
// acts where the table says. Only tests and benchmarks set them; docs/robustness.md ("Test
// hooks") has the same table for users.
//
// Every hook: the variable and its value; what it does, and where; the tests that set it.
//   TESSERA_TEST_PACK_BF16=<anything>
//       bf16 matmuls keep their operands fp32, converted at each product (the path before bf16
//       operands): blas::bf16_operands(p) is false. integration/test_training, test_gpt_runs,
//       bench/gpt_bf16_ab.sh (A/B of the two paths).
//   TESSERA_TEST_FAIL_IN_CHECKPOINT=<steps>
//       rank 1 (rank 0 when alone) fails its write of those steps' checkpoints, the others write
//       on (io/checkpoint_file.cpp; the background write, train/checkpointer.cpp).
//       integration/test_robustness, test_training.
//   TESSERA_TEST_KILL_IN_CHECKPOINT=<steps>
//       rank 1 (rank 0 when alone) raises SIGKILL half-way through those checkpoints' writes,
//       before the rename (both write paths, as above). integration/test_crash, test_training.
//   TESSERA_TEST_SIGNAL_IN_CHECKPOINT=<steps>
//       every rank raises SIGUSR1 inside those checkpoints' writes (io/checkpoint_file.cpp).
//       integration/test_crash.
//   TESSERA_TEST_PAUSE_IN_CHECKPOINT=<steps>
//       every rank prints "tessera: rank R: TESSERA_TEST_PAUSE_IN_CHECKPOINT: waiting for a
//       signal" and sleeps inside those checkpoints' writes until a signal arrives, at most 180 s
//       (io/checkpoint_file.cpp). integration/test_robustness, tests/slurm, tests/cluster.
//   TESSERA_TEST_FAIL_IN_READ=K
//       rank 1 (rank 0 when alone) fails the K-th checkpoint tensor read of its process
//       (io/checkpoint_file.cpp). integration/test_robustness.
//   TESSERA_TEST_FAIL_OFFLOAD_WRITE=K
//       world rank 1 fails the K-th write to its optimizer.offload file (EIO) (optim/state_file.cpp).
//       integration/test_offload.
//   TESSERA_TEST_FAIL_OFFLOAD_READ=K
//       world rank 1 fails the K-th read of each of its optimizer.offload files (EIO): a gather's
//       read of the values or an update's (optim/state_file.cpp). integration/test_offload.
//   TESSERA_TEST_KILL_IN_OFFLOAD_WRITE=K
//       world rank 1 raises SIGKILL at the K-th write to its optimizer.offload file, in the middle
//       of an update (optim/state_file.cpp). integration/test_offload.
//   TESSERA_TEST_STAGE_OFFLOAD=1
//       optimizer.offload = "host" or "disk" streams the parameters and gradients through host
//       staging tiles even where they are in host memory already, as a GPU build does (the
//       update's copies up and down, run on a CPU build) (optim/optimizer.cpp). integration/test_offload.
//   TESSERA_TEST_PERTURB_REPLICA=STEP
//       replica rank 1 of each replica group adds 1e-3 to its first parameter value just before
//       the replica check after STEP (train/replica_check.cpp). integration/test_training.
//   TESSERA_TEST_COMM_FAULT=ACTION:RANK:GROUP:SEQ
//       world rank RANK stalls before (ACTION stall) or skips (skip) the first collective of its
//       GROUP communicator (world, data, tensor, pipeline) numbered SEQ or later, once
//       (comm/fault_hook.hpp, the Communicator). integration/test_watchdog, unit/test_test_hooks.
//   TESSERA_TEST_NODE_OF_RANK=K
//       world rank r is on fake node r / K (K ranks per node) instead of its shared-memory domain
//       (comm/node_split.cpp). mpi/test_hierarchical, integration/test_sharding.
//
// "steps" is a comma-separated list of checkpoint steps; a step is named when one item equals its
// decimal text exactly. A malformed TESSERA_TEST_COMM_FAULT or TESSERA_TEST_NODE_OF_RANK is an
// InputError (exit code 2) on every rank; the numeric ones take what std::atol/atoll make of them.
// Each accessor reads the environment at each call (tests set some hooks in their own process
// between runs), except pack_bf16(), read once: it sits on every matrix product.
// TESSERA_PROBE_SECONDS (io/h5_probe.hpp) is not a test hook but a setting, and stays there.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace tessera::test_hooks {

/// The hooks that name checkpoint steps.
enum class StepHook { fail_in_checkpoint, kill_in_checkpoint, signal_in_checkpoint, pause_in_checkpoint };

/// \brief TESSERA_TEST_PACK_BF16 is set (to anything): bf16 matmuls keep their operands fp32,
/// converted at each product. Read once per process.
bool pack_bf16();

/// \brief The hook's list of steps (TESSERA_TEST_FAIL_IN_CHECKPOINT, ...) holds `step`, the
/// checkpoint's step as decimal text ("20"). False where the variable is unset.
bool names_step(StepHook hook, std::string_view step);

/// \brief K of TESSERA_TEST_FAIL_IN_READ=K (std::atol of the value: 0 for a non-number), the
/// checkpoint tensor read of the process that fails on rank 1; nullopt where unset.
std::optional<long> fail_in_read();

/// \brief K of TESSERA_TEST_FAIL_OFFLOAD_WRITE=K (std::atol of the value), the write to the
/// optimizer.offload file of world rank 1 that fails; nullopt where unset.
std::optional<long> fail_offload_write();

/// \brief K of TESSERA_TEST_FAIL_OFFLOAD_READ=K (std::atol of the value), the read of each
/// optimizer.offload file of world rank 1 that fails; nullopt where unset.
std::optional<long> fail_offload_read();

/// \brief K of TESSERA_TEST_KILL_IN_OFFLOAD_WRITE=K (std::atol of the value), the write to the
/// optimizer.offload file at which world rank 1 kills itself; nullopt where unset.
std::optional<long> kill_in_offload_write();
/// TESSERA_TEST_STAGE_OFFLOAD is set to 1.
bool stage_offload();

/// \brief STEP of TESSERA_TEST_PERTURB_REPLICA=STEP (std::atoll of the value), the step after
/// which replica rank 1 perturbs its parameters; nullopt where unset.
std::optional<long long> perturb_replica();

/// \brief What TESSERA_TEST_COMM_FAULT asks of the Communicator (comm/fault_hook.hpp).
struct CommFault {
  enum class Action { none, stall, skip } action = Action::none;
  int rank = -1;      ///< the world rank that misbehaves
  std::string group;  ///< world, data, tensor or pipeline
  std::uint64_t seq = 0;  ///< the first operation number, as the flight recorder numbers them
};

/// \brief The fault TESSERA_TEST_COMM_FAULT asks for (Action::none when unset or empty). Throws
/// InputError naming the variable and the expected form for a malformed value.
CommFault comm_fault();

/// \brief K of TESSERA_TEST_NODE_OF_RANK=K, the ranks per fake node (world rank r on node r / K);
/// 0 where unset or empty. Throws InputError naming the variable for a value that is not a
/// positive integer.
int node_of_rank();

}  // namespace tessera::test_hooks
