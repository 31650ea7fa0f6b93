// Where every rank runs, end to end: the rank table in log.txt and summary.json; a tensor group
// across hosts (each rank in its own UTS namespace with its own host name, `unshare --uts`, as the
// simulated nodes of tests/cluster/ have) is a warning, or with parallel.tensor_within_node an
// error before the model exists; ranks with different BLAS thread counts (an MPMD launch) are a
// warning; and `tessera check` names the hosts of every group from the ranks running it, from
// Slurm's environment or from --ranks-per-node.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "run_helpers.hpp"

namespace tessera::test {
namespace {

const std::string kEnv =
    "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1 OPENBLAS_NUM_THREADS=1 ";
const std::string kShort = "--set train.steps=3 --set eval.every_steps=0 --set checkpoint.every_steps=0 ";

std::string this_host() {
  char name[256] = {};
  gethostname(name, sizeof name - 1);
  return name;
}

// `tessera ARGS` on 2 ranks, rank r with host name h<r> in a UTS namespace of its own.
RunResult two_hosts(const std::string& args) {
  return shell(kEnv + TESSERA_MPIEXEC + " -n 2 --oversubscribe --bind-to none unshare --uts /bin/sh -c "
               "'hostname h$OMPI_COMM_WORLD_RANK && exec " + std::string(TESSERA_BINARY) + " " + args + "'");
}

TEST(Placement, LogAndSummaryHoldTheRankTable) {
  const std::string dir = fresh_dir("table");
  const RunResult r = tessera(2, train_args(dir, kShort + "--set run.blas_threads=1"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string log = read_file(dir + "/log.txt");
  const std::string host = this_host();
  EXPECT_NE(log.find(fmt::format("ranks: 2 on 1 host: {} [0,1]", host)), std::string::npos) << log;
  EXPECT_NE(log.find(fmt::format("  rank 1 host {} data 1 tensor 0 pipeline 0 blas_threads 1 kokkos_threads", host)),
            std::string::npos) << log;
  EXPECT_NE(log.find(fmt::format("  data group (t=0,p=0): ranks [0,1] on hosts [{},{}]", host, host)),
            std::string::npos) << log;
  EXPECT_EQ(log.find("warning:"), std::string::npos) << log;
  const auto summary = nlohmann::json::parse(read_file(dir + "/summary.json"));
  ASSERT_EQ(summary["placement"].size(), 2u);
  EXPECT_EQ(summary["placement"][1]["rank"], 1);
  EXPECT_EQ(summary["placement"][1]["host"], host);
  EXPECT_EQ(summary["placement"][1]["data"], 1);
  EXPECT_EQ(summary["placement"][1]["blas_threads"], 1);
  EXPECT_GE(summary["placement"][1]["kokkos_threads"].get<int>(), 1);
}

TEST(Placement, TensorGroupAcrossHostsWarnsOrFails) {
  const std::string dir = fresh_dir("across");
  const RunResult r = two_hosts(train_args(dir, kShort + "--set parallel.tensor=2"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string log = read_file(dir + "/log.txt");
  EXPECT_NE(log.find("ranks: 2 on 2 hosts: h0 [0], h1 [1]"), std::string::npos) << log;
  EXPECT_NE(log.find("warning: tensor group (d=0,p=0) (ranks [0,1]) spans hosts h0, h1"), std::string::npos) << log;

  const std::string strict = fresh_dir("across_strict");
  const RunResult e = two_hosts(train_args(strict, kShort + "--set parallel.tensor=2 --set parallel.tensor_within_node=true"));
  EXPECT_EQ(e.exit_code, 2) << e.output;
  EXPECT_EQ(count(e.output, "tessera: error:"), 1) << e.output;
  EXPECT_NE(e.output.find("tessera: error: parallel.tensor_within_node = true, but the tensor group (d=0,p=0) "
                          "(ranks [0,1]) spans hosts h0, h1"), std::string::npos) << e.output;
  EXPECT_FALSE(std::filesystem::exists(strict + "/log.txt"));  // stopped before the run began
  // Data parallel across the two hosts is fine.
  const std::string data = fresh_dir("across_data");
  const RunResult d = two_hosts(train_args(data, kShort + "--set parallel.tensor_within_node=true"));
  EXPECT_EQ(d.exit_code, 0) << d.output;
}

TEST(Placement, DifferentBlasThreadCountsWarn) {
  const std::string dir = fresh_dir("blas");
  const std::string cmd = kEnv + TESSERA_MPIEXEC + " --oversubscribe --bind-to none -n 1 " + TESSERA_BINARY + " " +
                          train_args(dir, kShort + "--set run.blas_threads=1") + " : -n 1 " + TESSERA_BINARY + " " +
                          train_args(dir, kShort + "--set run.blas_threads=2");
  const RunResult r = shell(cmd);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string log = read_file(dir + "/log.txt");
  EXPECT_NE(log.find("warning: ranks have different BLAS thread counts (1 on rank 0, 2 on rank 1): bitwise equality "
                     "across layouts needs the same BLAS thread count per rank"), std::string::npos) << log;
}

TEST(Placement, CheckNamesTheHostsOfEveryGroup) {
  const std::string deck = test_deck() + " --set data.path=" + fashion_mnist();
  // From Slurm's environment, block distribution.
  const RunResult s = shell("SLURM_JOB_NODELIST='n[1-2]' SLURM_TASKS_PER_NODE='2(x2)' " +
                            tessera_command(1, "check " + deck + " --ranks 4 --set parallel.tensor=2"));
  ASSERT_EQ(s.exit_code, 0) << s.output;
  EXPECT_NE(s.output.find("  tensor group (d=1,p=0): ranks [2,3] on hosts [n2,n2]"), std::string::npos) << s.output;
  EXPECT_NE(s.output.find("  data group (t=0,p=0): ranks [0,2] on hosts [n1,n2]"), std::string::npos) << s.output;
  EXPECT_NE(s.output.find("placement from Slurm: SLURM_JOB_NODELIST=n[1-2] SLURM_TASKS_PER_NODE=2(x2)"),
            std::string::npos) << s.output;
  EXPECT_EQ(s.output.find("warning:"), std::string::npos) << s.output;

  // Uneven: 3 + 1 tasks, so a tensor group spans the nodes and the lone rank gets more BLAS threads.
  const RunResult u = shell("SLURM_JOB_NODELIST='n[1-2]' SLURM_TASKS_PER_NODE='3,1' SLURM_JOB_CPUS_PER_NODE='4(x2)' " +
                            tessera_command(1, "check " + deck + " --ranks 4 --set parallel.tensor=2"));
  ASSERT_EQ(u.exit_code, 0) << u.output;
  EXPECT_NE(u.output.find("warning: tensor group (d=1,p=0) (ranks [2,3]) spans hosts n1, n2"), std::string::npos)
      << u.output;
  EXPECT_NE(u.output.find("warning: ranks have different BLAS thread counts (1 on ranks 0-2, 4 on rank 3)"),
            std::string::npos) << u.output;
  const RunResult strict = shell("SLURM_JOB_NODELIST='n[1-2]' SLURM_TASKS_PER_NODE='3,1' " +
                                 tessera_command(1, "check " + deck + " --ranks 4 --set parallel.tensor=2 "
                                                    "--set parallel.tensor_within_node=true"));
  EXPECT_EQ(strict.exit_code, 2) << strict.output;
  EXPECT_NE(strict.output.find("tessera: error: parallel.tensor_within_node = true, but the tensor group (d=1,p=0)"),
            std::string::npos) << strict.output;
  const RunResult bad = shell("SLURM_JOB_NODELIST='n[1-' SLURM_TASKS_PER_NODE='2' " +
                              tessera_command(1, "check " + deck + " --ranks 2"));
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_NE(bad.output.find("tessera: error: SLURM_JOB_NODELIST = \"n[1-\""), std::string::npos) << bad.output;

  // --ranks-per-node wins over Slurm's environment.
  const RunResult k = shell("SLURM_JOB_NODELIST='n[1-2]' SLURM_TASKS_PER_NODE='2(x2)' " +
                            tessera_command(1, "check " + deck + " --ranks 4 --ranks-per-node 3"));
  ASSERT_EQ(k.exit_code, 0) << k.output;
  EXPECT_NE(k.output.find("  data group (t=0,p=0): ranks [0,1,2,3] on hosts [node0,node0,node0,node1]"),
            std::string::npos) << k.output;

  // Under the job's own ranks: their real hosts.
  const RunResult live = two_hosts("check " + deck);
  ASSERT_EQ(live.exit_code, 0) << live.output;
  EXPECT_NE(live.output.find("  data group (t=0,p=0): ranks [0,1] on hosts [h0,h1]"), std::string::npos) << live.output;
  EXPECT_NE(live.output.find("placement from the ranks running this check: 2 on 2 hosts: h0 [0], h1 [1]"),
            std::string::npos) << live.output;

  // Nothing to go by.
  const RunResult none = shell("env -u SLURM_JOB_NODELIST -u SLURM_TASKS_PER_NODE " +
                               tessera_command(1, "check " + deck + " --ranks 4"));
  ASSERT_EQ(none.exit_code, 0) << none.output;
  EXPECT_NE(none.output.find("placement: unknown"), std::string::npos) << none.output;
}

}  // namespace
}  // namespace tessera::test
