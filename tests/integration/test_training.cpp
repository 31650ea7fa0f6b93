// End-to-end: the tessera binary under mpiexec on the real Fashion-MNIST file.
// Oracles: the 1-rank run (layout invariance), the uninterrupted run (resume), exit codes and the
// single error line of DESIGN.md.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <sstream>
#include <thread>
#include <utility>
#include <fstream>
#include <regex>

#include "core/build_features.hpp"
#include "run_helpers.hpp"

namespace tessera::test {
namespace {

namespace fs = std::filesystem;

const std::string deck = test_deck();

TEST(Training, LossesEqualOneRankOnTwoAndFourRanks) {
  expect_layout_invariant("sgd", "", {{2, ""}, {4, ""}, {2, "--set parallel.micro_batches=4"}});
}

// run.gemm = onednn moves fp32 products to oneDNN, whose blocking may sum a product in another
// order when the per-rank batch changes: the invariant then holds within 1e-5 (docs/design.md).
TEST(Training, OneDnnFp32LossesEqualOneRankWithinTolerance) {
  if (!build::onednn) GTEST_SKIP() << "built without oneDNN";
  expect_layout_invariant("onednn_fp32", "--set run.gemm=onednn", {{2, ""}, {4, ""}});
}

TEST(Training, AdamWCosineClippingEqualAcrossRanks) {
  expect_layout_invariant(
      "adamw",
      "--set optimizer.kind=adamw --set optimizer.lr=0.002 --set optimizer.weight_decay=0.01 "
      "--set optimizer.clip_grad_norm=0.5 --set schedule.kind=cosine --set schedule.warmup_steps=5 "
      "--set model.activation=relu",
      {{4, ""}, {2, "--set parallel.micro_batches=2"}});
}

// Under bf16 the MLP keeps its activations between layers in bf16 (the activation writes its
// output, and in backward dL/dz, rounded to bf16 for the products; nn/mlp.hpp): the same losses,
// bit for bit, as converting the fp32 values at each product (TESSERA_TEST_PACK_BF16, the path
// before). On 1 rank (GELU), with the layers split over 2 tensor ranks (ReLU; the column- and
// row-parallel sums) and over 2 pipeline stages with micro-batches (a stage's output stays fp32).
TEST(Training, MlpBf16ActivationsGiveThePackedBits) {
  for (const auto& [ranks, layout] : {std::pair{1, ""}, std::pair{2, "--set parallel.tensor=2 --set model.activation=relu"},
                                      std::pair{2, "--set parallel.pipeline=2 --set parallel.micro_batches=2"}}) {
    SCOPED_TRACE(layout);
    const std::string args = std::string("--set train.precision=bf16 ") + layout;
    const std::string kept = fresh_dir("mlp_bf16_kept"), packed = fresh_dir("mlp_bf16_packed");
    const RunResult r = tessera(ranks, train_args(kept, args));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    if (r.output.find("matrix products (emulated") != std::string::npos)
      GTEST_SKIP() << "bf16 products are emulated here: no bf16 operands to keep";
    const RunResult p = shell("TESSERA_TEST_PACK_BF16=1 " + tessera_command(ranks, train_args(packed, args)));
    ASSERT_EQ(p.exit_code, 0) << p.output;
    const auto losses = train_losses(kept);
    ASSERT_EQ(losses.size(), 30u);
    EXPECT_EQ(losses, train_losses(packed));
    EXPECT_FALSE(eval_losses(kept).empty());
    EXPECT_EQ(eval_losses(kept), eval_losses(packed));
  }
}

TEST(Training, RingAndParameterServerAllreduceEqualMpi) {
  // The 1-rank reference runs with MPI_Allreduce's layout; the algorithm only changes the order
  // of the sums over ranks. A 4 KiB segment makes the ring pipeline the gradient buffer.
  expect_layout_invariant("allreduce", "",
                          {{2, "--set comm.allreduce=ring"},
                           {4, "--set comm.allreduce=ring --set comm.ring_segment_kb=4"},
                           {2, "--set comm.allreduce=parameter-server"},
                           {4, "--set comm.allreduce=parameter-server"}});
}

// The runs that several cases compare with, each trained once (shared_run): the uninterrupted
// 40 steps, the first 20 of them (copied before they are resumed), and the deck's 30 steps on 2
// ranks.
const std::string kSteps40 = "--set train.steps=40", kSteps20 = "--set train.steps=20";

std::string copy_of(const std::string& run, const std::string& name) {
  const std::string dir = fresh_dir(name);
  fs::copy(run, dir, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
  return dir;
}

TEST(Training, StoppedAndResumedRunEqualsUninterrupted) {
  const std::string& whole = shared_run(2, kSteps40);
  const std::string split = copy_of(shared_run(2, kSteps20), "resume_split");
  // What a crash mid-write leaves behind: a half-written temporary, which resume must ignore.
  const std::string stale = split + "/checkpoints/step_00000025.h5.tmp";
  std::ofstream(stale) << "half a checkpoint";
  const RunResult r = tessera(2, train_args(split, "--set train.steps=40 --resume auto"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("resumed from"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("step_00000020.h5"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(stale));
  const auto a = train_losses(whole), b = train_losses(split);
  ASSERT_EQ(b.size(), 40u);
  EXPECT_LE(max_relative_difference(a, b), 1e-7);  // same layout: the same arithmetic
  EXPECT_LE(max_relative_difference(eval_losses(whole), eval_losses(split)), 1e-7);
}

TEST(Training, CosineRestartsResumeMidCycleExactly) {
  // SGDR cycles of 8, 16, 32 steps after a 3-step warm-up; the split at step 13 falls inside the
  // second cycle (steps 11 to 26).
  const std::string sched = "--set schedule.kind=cosine_restarts --set schedule.restart_steps=8 "
                            "--set schedule.restart_mult=2 --set schedule.warmup_steps=3 --set schedule.min_lr=0.001 ";
  const std::string whole = fresh_dir("sgdr_whole");
  ASSERT_EQ(tessera(2, train_args(whole, sched + "--set train.steps=40")).exit_code, 0);
  const std::string split = fresh_dir("sgdr_split");
  ASSERT_EQ(tessera(2, train_args(split, sched + "--set train.steps=13")).exit_code, 0);
  ASSERT_EQ(tessera(2, train_args(split, sched + "--set train.steps=40 --resume auto")).exit_code, 0);
  EXPECT_LE(max_relative_difference(train_losses(whole), train_losses(split)), 1e-7);
  // The logged learning rates restart at steps 11 and 27 (1-based rows: the rate of step k-1).
  const std::string csv = read_file(split + "/metrics.csv");
  for (const char* row : {"train,12,0,", "train,28,0,"}) {
    const auto at = csv.find(row);
    ASSERT_NE(at, std::string::npos) << row;
    const std::string line = csv.substr(at, csv.find('\n', at) - at);
    EXPECT_NE(line.find(",0.05,"), std::string::npos) << line;  // optimizer.lr of the test deck
  }
}

TEST(Training, AsyncCheckpointsHoldTheSyncTensorsAndResume) {
  // The same run with synchronous and asynchronous checkpoints every 10 steps: the same losses,
  // and checkpoints with the same tensors (bitwise: the same layout and thread counts, 2 ranks
  // each); the asynchronous one resumes to the same end on 1 rank (another layout: 1e-5).
  const std::string sync = fresh_dir("async_sync"), async = fresh_dir("async_async");
  ASSERT_EQ(tessera(2, train_args(sync, "--set checkpoint.keep=0")).exit_code, 0);
  const RunResult r = tessera(2, train_args(async, "--set checkpoint.keep=0 --set checkpoint.async=true"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(read_file(async + "/log.txt").find("written in the background"), std::string::npos);
  EXPECT_EQ(max_relative_difference(train_losses(sync), train_losses(async)), 0.0);
  for (const char* step : {"10", "20", "30"}) {
    const std::string name = std::string("/checkpoints/step_000000") + step + ".h5";
    const RunResult d = tessera(1, "diff " + sync + name + " " + async + name + " --tolerance 0");
    EXPECT_EQ(d.exit_code, 0) << d.output;
  }
  EXPECT_EQ(read_file(async + "/checkpoints/latest"), "step_00000030.h5\n");
  // Resume the asynchronous run from step 20 on 1 rank: the same losses to the end.
  const std::string resumed = fresh_dir("async_resumed");
  const RunResult again = tessera(1, train_args(resumed, "--set checkpoint.async=true --resume " + async +
                                                             "/checkpoints/step_00000020.h5"));
  ASSERT_EQ(again.exit_code, 0) << again.output;
  const auto a = train_losses(async), b = train_losses(resumed);
  for (std::int64_t s = 21; s <= 30; ++s) EXPECT_NEAR(b.at(s), a.at(s), 1e-5 * a.at(s)) << s;
}

// An asynchronous save stages a host copy of the rank's values and optimizer state while its
// writer runs: `tessera check` counts it ("checkpoint staging"), a limit only it exceeds is told to
// turn it off, and the run's counters hold it while it lasts (summary.json's peaks). A synchronous
// save holds one tensor at a time, in a buffer of the largest's size ("checkpoint buffer"), counted
// as well.
TEST(Training, AsyncCheckpointStagingIsEstimatedAndCounted) {
  // AdamW on the test MLP (52,650 parameters): 4 bytes each of values and 8 of state, 631,800 B.
  const std::string base = "--set optimizer.kind=adamw --set train.steps=2 --set checkpoint.every_steps=1 "
                           "--set eval.every_steps=0 --set eval.at_end=false";
  const auto check = [&](const std::string& extra) {
    return tessera_alone("check" + train_args(fresh_dir("staging_check"), base + extra).substr(5));
  };
  const auto megabytes = [](const std::string& out, const std::string& what) {
    std::smatch m;
    EXPECT_TRUE(std::regex_search(out, m, std::regex(what + " ([0-9.]+) MB"))) << out;
    return m.empty() ? 0.0 : std::stod(m[1].str());
  };
  const RunResult sync = check(""), async = check(" --set checkpoint.async=true");
  ASSERT_EQ(sync.exit_code, 0) << sync.output;
  ASSERT_EQ(async.exit_code, 0) << async.output;
  // The largest tensor: the first layer's weight, 784 x 64.
  const double largest = 4.0 * 784 * 64;
  EXPECT_EQ(sync.output.find("checkpoint staging"), std::string::npos) << sync.output;
  EXPECT_DOUBLE_EQ(megabytes(sync.output, "checkpoint buffer"), 0.20);
  EXPECT_DOUBLE_EQ(megabytes(async.output, "checkpoint staging"), 0.63);
  EXPECT_NEAR(megabytes(async.output, "total") - megabytes(sync.output, "total"), 0.63 - 0.20, 0.011);
  const double limit = megabytes(sync.output, "total") + 0.2;
  expect_input_error(check(fmt::format(" --set checkpoint.async=true --set run.memory_limit_mb={}", limit)),
                     "more than the limit; set checkpoint.async = false (about");
  std::map<bool, nlohmann::json> memory;
  for (bool background : {false, true}) {
    const std::string dir = fresh_dir(background ? "staging_async" : "staging_sync");
    const RunResult r = tessera(1, train_args(dir, base + (background ? " --set checkpoint.async=true" : "")));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    memory[background] = nlohmann::json::parse(read_file(dir + "/summary.json"))["memory"];
  }
  const auto more = [&](const char* key) { return memory[true][key].get<double>() - memory[false][key].get<double>(); };
  // (The store and the optimizer pad their buffers to a few elements more.) The synchronous save's
  // buffer counts as parameters.
  EXPECT_NEAR(more("param_peak_bytes"), 4.0 * 52650 - largest, 64.0);
  EXPECT_NEAR(more("optim_peak_bytes"), 8.0 * 52650, 64.0);
  EXPECT_NEAR(more("peak_total_bytes"), 12.0 * 52650 - largest, 128.0);
}

TEST(Training, AsyncCheckpointFailingOrKilledOnOneRankKeepsTheLastOne) {
  // Rank 1's background write fails: every rank exits 2 with one line, latest stays on step 10.
  const std::string failed = fresh_dir("async_fail");
  const RunResult f = shell("TESSERA_TEST_FAIL_IN_CHECKPOINT=20 " +
                            tessera_command(2, train_args(failed, "--set checkpoint.async=true")));
  EXPECT_EQ(f.exit_code, 2) << f.output;
  EXPECT_EQ(count(f.output, "tessera: error:"), 1) << f.output;
  EXPECT_EQ(read_file(failed + "/checkpoints/latest"), "step_00000010.h5\n");
  // Rank 1 killed in the middle of its background write: latest stays on step 10, which resumes.
  const std::string killed = fresh_dir("async_kill");
  const RunResult k = shell("TESSERA_TEST_KILL_IN_CHECKPOINT=20 " +
                            tessera_command(2, train_args(killed, "--set checkpoint.async=true")));
  EXPECT_NE(k.exit_code, 0) << k.output;
  EXPECT_EQ(read_file(killed + "/checkpoints/latest"), "step_00000010.h5\n");
  EXPECT_EQ(tessera(2, train_args(killed, "--set checkpoint.async=true --resume auto")).exit_code, 0);
}

TEST(Training, ReplicaChecksPassAndCatchADivergedReplica) {
  // Checks every 5 steps change nothing (bitwise: the same layout and thread counts, 2 ranks
  // each); a replica perturbed just before the check after step 10 stops the run there, naming
  // the tensor and the ranks, before step 10's checkpoint.
  const std::string& plain = shared_run(2);
  const std::string checked = fresh_dir("replicas_checked");
  ASSERT_EQ(tessera(2, train_args(checked, "--set train.check_replicas_every=5")).exit_code, 0);
  EXPECT_EQ(max_relative_difference(train_losses(plain), train_losses(checked)), 0.0);
  EXPECT_NE(read_file(checked + "/log.txt").find("compare the checksums of their parameters and optimizer state"),
            std::string::npos);
  // The state on disk: the check reads it a parameter at a time from the file, as a save does.
  const std::string on_disk = fresh_dir("replicas_checked_disk");
  ASSERT_EQ(tessera(2, train_args(on_disk, "--set train.check_replicas_every=5 --set optimizer.offload=disk")).exit_code, 0);
  EXPECT_EQ(max_relative_difference(train_losses(plain), train_losses(on_disk)), 0.0);
  for (const char* zero : {"0", "1"}) {
    const std::string bad = fresh_dir(std::string("replicas_bad") + zero);
    const RunResult r = shell("TESSERA_TEST_PERTURB_REPLICA=10 " +
                              tessera_command(2, train_args(bad, std::string("--set train.check_replicas_every=5 ") +
                                                                     "--set parallel.zero=" + zero)));
    EXPECT_EQ(r.exit_code, 3) << r.output;
    EXPECT_EQ(count(r.output, "tessera: error:"), 1) << r.output;
    EXPECT_NE(r.output.find("diverged by step 10: layers.0.weight differs between world rank 0 and world rank(s) 1"),
              std::string::npos) << r.output;
    EXPECT_FALSE(fs::exists(bad + "/checkpoints/step_00000010.h5"));
  }
}

TEST(Training, CheckpointFromTwoRanksResumesOnOneAndFour) {
  const std::string& whole = shared_run(2, kSteps40);
  for (int ranks : {1, 4}) {
    const std::string dir = copy_of(shared_run(2, kSteps20), "reshard_np" + std::to_string(ranks));
    const RunResult r = tessera(ranks, train_args(dir, "--set train.steps=40 --resume auto"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_LE(max_relative_difference(train_losses(whole), train_losses(dir)), 1e-5) << ranks;
  }
}

TEST(Training, CheckpointLayoutOpensInH5py) {
  const std::string& dir = shared_run(2);
  EXPECT_EQ(read_file(dir + "/checkpoints/latest"), "step_00000030.h5\n");
  // keep = 2: steps 20 and 30 remain.
  EXPECT_FALSE(fs::exists(dir + "/checkpoints/step_00000010.h5"));
  EXPECT_TRUE(fs::exists(dir + "/checkpoints/step_00000020.h5"));
  const std::string script =
      "import h5py,sys\n"
      "f=h5py.File(sys.argv[1],'r')\n"
      "a=f.attrs\n"
      "assert a['format']=='tessera-checkpoint', a['format']\n"
      "assert int(a['step'])==30 and a['layout']=='dp=2,tp=1,pp=1,zero=0', (a['step'],a['layout'])\n"
      "assert '[model]' in a['deck'] and 'T' in a['created']\n"
      "for n,s in [('layers.0.weight',(64,784)),('layers.0.bias',(64,)),('layers.1.weight',(32,64)),('layers.2.weight',(10,32))]:\n"
      "  d=f['model/'+n]; assert d.shape==s and d.dtype=='float32', (n,d.shape,d.dtype)\n"
      "  assert f['optimizer/'+n+'/momentum'].shape==s\n"
      "assert f['optimizer'].attrs['kind']=='sgd' and int(f['optimizer'].attrs['step'])==30\n"
      "assert abs(f['model/layers.0.weight'][()]).sum()>0\n"
      "print('h5py ok')\n";
  const std::string py = fresh_dir("layout_check") + "/check.py";
  std::ofstream(py) << script;
  const RunResult r = shell("/usr/bin/python3 " + py + " " + dir + "/checkpoints/step_00000030.h5");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("h5py ok"), std::string::npos);

  const RunResult s = shell("/usr/bin/python3 -c \"import json;d=json.load(open('" + dir + "/summary.json'));"
                            "assert d['status']=='completed' and d['steps']==30 and d['layout']=='dp=2,tp=1,pp=1,zero=0';"
                            "[d[k] for k in ['epochs','final_train_loss','test_loss','test_accuracy','samples_per_s','wall_s']];print('ok')\"");
  EXPECT_EQ(s.exit_code, 0) << s.output;
}

TEST(Training, InspectAndEvalReadTheCheckpoint) {
  const std::string& dir = shared_run(2);
  const std::string ckpt = dir + "/checkpoints/step_00000030.h5";
  const RunResult ins = tessera(1, "inspect " + ckpt);
  ASSERT_EQ(ins.exit_code, 0) << ins.output;
  EXPECT_NE(ins.output.find("model/layers.0.weight"), std::string::npos) << ins.output;
  EXPECT_NE(ins.output.find("[64,784]"), std::string::npos) << ins.output;
  EXPECT_NE(ins.output.find("tessera-checkpoint"), std::string::npos) << ins.output;

  // eval on 4 ranks reproduces the run's own final evaluation.
  const RunResult ev = tessera(4, "eval " + deck + " --set data.path=" + fashion_mnist() +
                                      " --set run.output_dir=" + dir + " --checkpoint " + ckpt);
  ASSERT_EQ(ev.exit_code, 0) << ev.output;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(ev.output, m, std::regex(R"(test loss ([0-9.]+) accuracy ([0-9.]+))"))) << ev.output;
  const double loss = std::stod(m[1]);
  const double last = eval_losses(dir).rbegin()->second;
  EXPECT_NEAR(loss, last, 1e-5 * last);
}

// Bad input: exit code 2, one "tessera: error:" line naming the problem, nothing overwritten.
// Regression: a float32 dataset with `targets` trains with MSE, the same on 1 and 2 ranks,
// and learns (a linear target is easy: the loss must fall by a large factor).
TEST(Training, RegressionTargetsTrainWithMseOnAnyRankCount) {
  const std::string dir = fresh_dir("regression");
  const std::string file = dir + "/linear.h5";
  const std::string script =
      "import h5py,numpy as np,sys\n"
      "r=np.random.default_rng(3)\n"
      "w=r.normal(size=(8,2)).astype(np.float32)\n"
      "with h5py.File(sys.argv[1],'w') as f:\n"
      "  for s,n in (('train',2048),('test',512)):\n"
      "    x=r.normal(size=(n,8)).astype(np.float32)\n"
      "    f[s+'/inputs']=x; f[s+'/targets']=x@w\n";
  std::ofstream(dir + "/make.py") << script;
  const RunResult made = shell("/usr/bin/python3 " + dir + "/make.py " + file);
  ASSERT_EQ(made.exit_code, 0) << made.output;
  const std::string args = "--set 'model.hidden=[16]' --set optimizer.lr=0.02 --set data.path=" + file;
  std::map<std::int64_t, double> losses[2];
  for (int ranks : {1, 2}) {
    const std::string out = dir + "/np" + std::to_string(ranks);
    const RunResult r = tessera(ranks, "train " + deck + " --set run.output_dir=" + out + " " + args);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    losses[ranks - 1] = train_losses(out);
  }
  EXPECT_LE(max_relative_difference(losses[0], losses[1]), 1e-5);
  EXPECT_LT(losses[0].rbegin()->second, 0.2 * losses[0].begin()->second);
  // Classification-only settings are refused for a targets dataset.
  expect_input_error(tessera_alone("train " + deck + " --set run.output_dir=" + dir + "/ce " + args +
                                    " --set model.loss=cross_entropy"),
                     "cross_entropy");
}

// SIGTERM to one rank of a 4-rank run: every rank stops after the same step, one checkpoint is
// written, every rank exits 4; --resume auto then continues with the uninterrupted run's losses.
TEST(Signals, SigtermToOneRankCheckpointsAndExitsFourEverywhere) {
  const std::string dir = fresh_dir("signal");
  const std::string run = dir + "/run";
  const std::string extra = "--set 'model.hidden=[16]' --set eval.every_steps=0 --set eval.at_end=false "
                            "--set checkpoint.every_steps=0 ";
  // Start a run far longer than the test waits, in the background; whatever happens below, it
  // does not outlive the test.
  struct Reaper {
    std::string pattern;
    ~Reaper() { shell(fmt::format("pkill -KILL -f '{}'", pattern)); }
  } reaper{run + " "};
  shell(fmt::format("({} > {}/out.txt 2>&1; echo $? > {}/rc) > /dev/null 2>&1 &",
                    tessera_command(4, train_args(run, extra + "--set train.steps=10000000")), dir, dir));
  // Wait for a few logged steps, then signal one rank (not rank 0's mpiexec: a tessera process).
  // Assumes only that the signal lands within the 10 million steps; the run goes on for any number
  // of steps before the step whose reduction carries the flag, so the stop step is read, not set.
  auto wait_for = [](const std::function<bool()>& done) {
    for (int i = 0; i < 1200 && !done(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    return done();
  };
  ASSERT_TRUE(wait_for([&] { return train_losses(run).size() >= 20; })) << read_file(dir + "/out.txt");
  const RunResult pids = shell(fmt::format("pgrep -f '^{} train .*{}'", TESSERA_BINARY, run));
  std::vector<std::string> ids;
  std::stringstream ss(pids.output);
  for (std::string id; ss >> id;) ids.push_back(id);
  ASSERT_EQ(ids.size(), 4u) << pids.output;
  ASSERT_EQ(shell("kill -TERM " + ids[2]).exit_code, 0);
  ASSERT_TRUE(wait_for([&] { return fs::exists(dir + "/rc") && !read_file(dir + "/rc").empty(); }));
  const std::string out = read_file(dir + "/out.txt");
  EXPECT_EQ(std::stoi(read_file(dir + "/rc")), 4) << out;
  EXPECT_EQ(count(out, "stop requested by signal"), 1) << out;

  // One consistent checkpoint at the step where all stopped.
  const std::string latest = read_file(run + "/checkpoints/latest");
  ASSERT_FALSE(latest.empty());
  const std::int64_t step = std::stoll(latest.substr(5, 8));
  EXPECT_GE(step, 20);
  EXPECT_EQ(train_losses(run).rbegin()->first, step);
  EXPECT_NE(read_file(run + "/summary.json").find("stopped_by_signal"), std::string::npos);

  // Continue to step + 10 and compare with a run that was never interrupted.
  const std::string until = "--set train.steps=" + std::to_string(step + 10) + " ";
  const RunResult resumed = tessera(4, train_args(run, extra + until + "--resume auto"));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  const std::string whole = dir + "/whole";
  ASSERT_EQ(tessera(4, train_args(whole, extra + until)).exit_code, 0);
  const auto a = train_losses(run), b = train_losses(whole);
  ASSERT_EQ(a.size(), static_cast<std::size_t>(step + 10));
  EXPECT_LE(max_relative_difference(a, b), 1e-7);
}

TEST(Errors, BadDeckAndLayoutGiveOneLineAndExitTwo) {
  const std::string dir = fresh_dir("errors_deck");
  expect_input_error(tessera(2, train_args(dir, "--set optimizer.momentun=0.5")), "did you mean 'optimizer.momentum'");
  expect_input_error(tessera(4, train_args(dir, "--set parallel.data=2")), "parallel");
  expect_input_error(tessera(4, train_args(dir, "--set train.global_batch=30")), "global_batch");
  expect_input_error(tessera(2, "train " + deck + " --set data.path=/nonexistent/x.h5 --set run.output_dir=" + dir),
                     "/nonexistent/x.h5");
  EXPECT_FALSE(fs::exists(dir + "/metrics.csv"));
}

TEST(Errors, OutputDirectoryOfAnotherRunIsNotOverwritten) {
  const std::string dir = fresh_dir("errors_outdir");
  ASSERT_EQ(tessera(2, train_args(dir, "--set train.steps=10")).exit_code, 0);
  const std::string before = read_file(dir + "/metrics.csv");
  expect_input_error(tessera(2, train_args(dir, "--set train.steps=10")), "already holds a run");
  EXPECT_EQ(read_file(dir + "/metrics.csv"), before);
  EXPECT_EQ(tessera(2, train_args(dir, "--set train.steps=10 --set run.overwrite=true")).exit_code, 0);
}

TEST(Errors, CheckpointOfAnotherModelIsRefusedNamingTheTensor) {
  const std::string dir = fresh_dir("errors_mismatch");
  ASSERT_EQ(tessera(2, train_args(dir, "--set train.steps=10")).exit_code, 0);
  const std::string before = read_file(dir + "/metrics.csv");
  expect_input_error(tessera(2, train_args(dir, "--set train.steps=20 --set 'model.hidden=[32,32]' --resume auto")),
                     "model/layers.0.weight");
  EXPECT_EQ(read_file(dir + "/metrics.csv"), before);
}

TEST(Errors, NonFiniteLossExitsThreeAndKeepsTheLastCheckpoint) {
  const std::string dir = fresh_dir("errors_nan");
  const RunResult r = tessera(2, train_args(dir, "--set optimizer.lr=1e30 --set checkpoint.every_steps=1"));
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_EQ(count(r.output, "tessera: error:"), 1) << r.output;
  EXPECT_NE(r.output.find("non-finite"), std::string::npos) << r.output;
  const std::string latest = read_file(dir + "/checkpoints/latest");
  ASSERT_FALSE(latest.empty());
  const std::string ckpt = dir + "/checkpoints/" + latest.substr(0, latest.size() - 1);
  const RunResult ins = tessera(1, "inspect " + ckpt);
  EXPECT_EQ(ins.exit_code, 0) << ins.output;
  EXPECT_FALSE(shows_non_finite(ins.output)) << ins.output;
}

}  // namespace
}  // namespace tessera::test
