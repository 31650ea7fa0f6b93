// The watchdog end to end, real ranks: the test hook TESSERA_TEST_COMM_FAULT (comm/fault_hook.hpp)
// makes one rank stall before, or skip, one collective; the run must end by itself (the test only
// waits: ctest's TIMEOUT is the safety net) with exit code 5, one line per timed-out rank naming
// the operation, its group and sequence number, a flight record from each such rank, and
// `tessera doctor` naming the rank that stopped and the operation.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>

#include "comm/flight_record.hpp"
#include "run_helpers.hpp"

namespace tessera::test {
namespace {

namespace fs = std::filesystem;

// Eight-second timeouts (no healthy wait comes near, also under sanitizers on a loaded machine);
// no evaluation or checkpoint in the way, so every step is the same few operations. What the
// cases may assume: a rank times out 8 s after it entered the operation it is stuck in; what they
// tolerate: mpirun ending the other ranks at any moment after the first exit 5, so a peer's record
// may be its half-way one, a SIGTERM one or missing (the doctor is asked only what holds in each).
const std::string kTimeout = "8";
const std::string kExtra = "--set comm.timeout_s=" + kTimeout + " --set eval.every_steps=0 "
                           "--set checkpoint.every_steps=0 --set checkpoint.at_end=false --set eval.at_end=false ";

struct Faulted {
  RunResult run;
  std::string dir;
  std::string op;  ///< what the hook stalled before or skipped, "allreduce #10 of the world group"
};

Faulted run_with_fault(const std::string& name, int ranks, const std::string& fault, const std::string& extra = "") {
  Faulted f;
  f.dir = fresh_dir(name);
  f.run = shell("TESSERA_TEST_COMM_FAULT=" + fault + " " + tessera_command(ranks, train_args(f.dir, kExtra + extra)));
  std::smatch m;
  const std::regex hook(R"(TESSERA_TEST_COMM_FAULT: (?:stalling before|skipping) (.+ #\d+ of the \w+ group))");
  if (std::regex_search(f.run.output, m, hook)) f.op = m[1];
  return f;
}

// Every "tessera: error: rank N: ... did not complete" line's rank; each left a timeout record.
std::vector<int> timed_out_ranks(const Faulted& f) {
  std::vector<int> ranks;
  const std::regex line(R"(tessera: error: rank (\d+): (.+) did not complete within comm\.timeout_s = )" + kTimeout +
                        " s");
  const std::string& out = f.run.output;
  for (auto it = std::sregex_iterator(out.begin(), out.end(), line); it != std::sregex_iterator(); ++it) {
    const int rank = std::stoi((*it)[1]);
    ranks.push_back(rank);
    const std::string path = comm::record_path(f.dir, rank);
    EXPECT_TRUE(fs::exists(path)) << path;
    if (!fs::exists(path)) continue;
    const comm::FlightRecord r = comm::read_record(path);  // throws if it does not parse
    EXPECT_EQ(r.reason, "timeout");
    EXPECT_EQ(r.who.rank, rank);
    EXPECT_NE(r.waiting_on, 0u);
    const comm::RecordedOp* waited = r.find(r.waiting_on);
    EXPECT_NE(waited, nullptr);
    EXPECT_TRUE(waited == nullptr || waited->in_flight());
    EXPECT_NE(r.message.find("did not complete within comm.timeout_s = " + kTimeout + " s"), std::string::npos)
        << r.message;
  }
  return ranks;
}

// One process without mpiexec: the refusals below would wait on mpiexec's reaping of a failed job.
RunResult doctor(const std::string& dir) { return tessera_alone("doctor " + dir); }

// The doctor names `rank` and where it stopped: it never entered `op`, or left no record while the
// others waited in `op`.
void expect_doctor_names(const std::string& text, int rank, const std::string& op) {
  const bool entered = text.find(fmt::format("rank {} never entered {}", rank, op)) != std::string::npos;
  const bool silent = text.find(fmt::format("rank {} left no flight record", rank)) != std::string::npos &&
                      text.find(op) != std::string::npos;
  EXPECT_TRUE(entered || silent) << "rank " << rank << " and " << op << " not named:\n" << text;
}

TEST(Watchdog, TwoRanksOneStallsInTheWorldGroup) {
  const Faulted f = run_with_fault("stall_np2", 2, "stall:1:world:10");
  ASSERT_EQ(f.op, "allreduce #10 of the world group") << f.run.output;
  EXPECT_EQ(f.run.exit_code, 5) << f.run.output;
  // Rank 0 waits in the allreduce rank 1 never reaches; the line says what and that the missing
  // rank is rank 1 or unknown.
  EXPECT_NE(f.run.output.find("tessera: error: rank 0: allreduce #10 of the world group (ranks 0,1; 32 bytes) did "
                              "not complete within comm.timeout_s = " + kTimeout + " s"),
            std::string::npos) << f.run.output;
  EXPECT_NE(f.run.output.find("which of ranks 1 did not arrive is unknown here"), std::string::npos);
  EXPECT_EQ(timed_out_ranks(f), std::vector<int>{0});
  const RunResult d = doctor(f.dir);
  EXPECT_EQ(d.exit_code, 0) << d.output;
  EXPECT_NE(d.output.find("rank 0 waits in allreduce #10 of the world group"), std::string::npos) << d.output;
  expect_doctor_names(d.output, 1, f.op);
  EXPECT_NE(d.output.find("verdict: rank 1 stopped outside communication"), std::string::npos) << d.output;
}

TEST(Watchdog, TwoRanksOneSkipsACollective) {
  const Faulted f = run_with_fault("skip_np2", 2, "skip:1:world:10");
  ASSERT_EQ(f.op, "allreduce #10 of the world group") << f.run.output;
  EXPECT_EQ(f.run.exit_code, 5) << f.run.output;
  const auto ranks = timed_out_ranks(f);
  EXPECT_FALSE(ranks.empty()) << f.run.output;
  // Rank 1 went on to the next step's operations, which rank 0 never reaches: both wait.
  const RunResult d = doctor(f.dir);
  EXPECT_EQ(d.exit_code, 0) << d.output;
  expect_doctor_names(d.output, 1, f.op);
}

TEST(Watchdog, FourRanksOneStallsInADataGroup) {
  // dp 2 x tp 2: rank 3's data group is {1,3}, its tensor group {2,3}.
  const Faulted f = run_with_fault("stall_np4", 4, "stall:3:data:6", "--set parallel.tensor=2");
  ASSERT_NE(f.op, "") << f.run.output;
  EXPECT_EQ(f.run.exit_code, 5) << f.run.output;
  const auto ranks = timed_out_ranks(f);
  EXPECT_FALSE(ranks.empty()) << f.run.output;
  for (int r : ranks) EXPECT_NE(r, 3);
  // Ranks 0-2 wait (rank 1 for rank 3, ranks 0 and 2 for rank 1 or 3): each wrote its record, at
  // its own timeout or half-way there, whatever mpirun killed first. Assumes they entered their
  // waits within 4 s of each other (a fraction of a step after rank 3 stalled).
  for (int r : {0, 1, 2}) {
    const std::string path = comm::record_path(f.dir, r);
    ASSERT_TRUE(fs::exists(path)) << path << "\n" << f.run.output;
    EXPECT_NE(comm::read_record(path).waiting_on, 0u) << path;
  }
  // The op stalled before is a dataset read (a section) or a collective; rank 1, rank 3's data
  // partner, waits there or in the agreement inside that read.
  const RunResult d = doctor(f.dir);
  EXPECT_EQ(d.exit_code, 0) << d.output;
  // Under rank 1's wait the doctor names rank 3: "never entered" from rank 3's record, or "left no
  // flight record" where mpirun killed it first. The verdict quotes the earliest wait rank 3 caused:
  // rank 1's in the data group or rank 2's in the tensor group, which begin within milliseconds of
  // each other (either may be first on a loaded machine).
  EXPECT_TRUE(std::regex_search(
      d.output, std::regex(R"(rank 1 waits in \w+ #\d+ of the data group[^\n]*\n  rank 3 (never entered \w+ #\d+ of the data group|left no flight record))")))
      << d.output;
  EXPECT_TRUE(std::regex_search(
      d.output, std::regex(R"(verdict: rank 3 stopped outside communication and the others wait for it \(rank 3 never (entered|arrived in) \w+ #\d+ of the (data|tensor) group\))")))
      << d.output;
}

// The state and the parameter values on disk (ZeRO 3), their I/O threads beside the step: rank 1
// stalls before the second step's dataset read (the data group's 15th operation; the hook acts
// on the communicator's operations and marked sections, not on the agreements or the ZeRO
// gathers' allgathers). Rank 0 times out; the run ends by itself with exit 5, the scratch files
// gone.
TEST(Watchdog, AnOffloadedRunWithTheValuesOnDiskEndsByItself) {
  const Faulted f = run_with_fault("stall_offload", 2, "stall:1:data:15",
                                   "--set optimizer.kind=adamw --set parallel.zero=3 --set optimizer.offload=disk "
                                   "--set optimizer.offload_values=true --set optimizer.offload_buffer_mb=0.05");
  ASSERT_EQ(f.op, "dataset read #15 of the data group") << f.run.output;
  EXPECT_EQ(f.run.exit_code, 5) << f.run.output;
  EXPECT_EQ(timed_out_ranks(f), std::vector<int>{0});
  const RunResult d = doctor(f.dir);
  EXPECT_EQ(d.exit_code, 0) << d.output;
  EXPECT_NE(d.output.find("verdict: rank 1 stopped outside communication"), std::string::npos) << d.output;
  for (const auto& e : fs::directory_iterator(fs::temp_directory_path()))
    EXPECT_EQ(e.path().filename().string().find("tessera-optimizer-"), std::string::npos) << e.path();
}

TEST(Watchdog, PipelineReceiveFromAStalledStage) {
  // pp 2: rank 1 (the last stage) stalls before a dataset read (its data group has only itself:
  // after the opening, every data-group operation is a read); rank 0 sent its activations and
  // waits for the gradient rank 1 never sends.
  const Faulted f = run_with_fault("stall_pipeline", 2, "stall:1:data:8", "--set parallel.pipeline=2");
  ASSERT_TRUE(std::regex_match(f.op, std::regex(R"(dataset read #\d+ of the data group)"))) << f.run.output;
  EXPECT_EQ(f.run.exit_code, 5) << f.run.output;
  const std::regex line(R"(tessera: error: rank 0: recv #(\d+) from rank 1 in the pipeline group \(\S+ \S+\) did not )"
                        R"(complete within comm\.timeout_s = )" + kTimeout + R"( s .*rank 1 did not send it)");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(f.run.output, m, line)) << f.run.output;
  EXPECT_EQ(timed_out_ranks(f), std::vector<int>{0});
  const RunResult d = doctor(f.dir);
  EXPECT_EQ(d.exit_code, 0) << d.output;
  EXPECT_NE(d.output.find(fmt::format("rank 0 waits in recv #{} from rank 1 in the pipeline group", m[1].str())),
            std::string::npos) << d.output;
  const bool named = d.output.find(fmt::format("rank 1 never sent #{} to rank 0", m[1].str())) != std::string::npos ||
                     d.output.find("rank 1 left no flight record") != std::string::npos;
  EXPECT_TRUE(named) << d.output;
  EXPECT_NE(d.output.find("verdict: rank 1 stopped outside communication"), std::string::npos) << d.output;
}

TEST(Watchdog, DoctorRefusesARunWithoutRecords) {
  const std::string dir = fresh_dir("no_records");
  const RunResult d = doctor(dir);
  EXPECT_EQ(d.exit_code, 2) << d.output;
  EXPECT_NE(d.output.find("tessera: error: doctor: " + dir + "/flight holds no flight records"), std::string::npos)
      << d.output;
  const RunResult missing = doctor(dir + "/nowhere");
  EXPECT_EQ(missing.exit_code, 2) << missing.output;
  EXPECT_NE(missing.output.find("is not a directory"), std::string::npos) << missing.output;
  fs::create_directories(dir + "/flight");
  std::ofstream(dir + "/flight/rank_0.json") << "{\"format\": 3}";
  const RunResult bad = doctor(dir);
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_NE(bad.output.find("rank_0.json: not a flight record"), std::string::npos) << bad.output;
}

TEST(Watchdog, MalformedHookIsBadInput) {
  const std::string dir = fresh_dir("bad_hook");
  const RunResult r = shell("TESSERA_TEST_COMM_FAULT=stall:x " + tessera_command(2, train_args(dir, kExtra)));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("tessera: error: TESSERA_TEST_COMM_FAULT = \"stall:x\""), std::string::npos) << r.output;
}

}  // namespace
}  // namespace tessera::test
