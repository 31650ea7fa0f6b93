// optimizer.offload = "disk": the optimizer state in a scratch file per rank, streamed through a
// small buffer (0.05 MB here: tiles of 2048 or 4096 floats, so every update goes through many tiles, read
// ahead and written behind by the I/O thread, and ZeRO's chunks start mid-tile). The parameters and the state after every step are those of the in-memory run, bit for
// bit (`tessera diff --tolerance 0` on the checkpoints, the losses equal); checkpoints move between
// offloaded and in-memory runs; a bad offload path stops the run before its first step; a write
// failing mid-run stops every rank with the newest checkpoint intact and resumable. With "host"
// (a GPU build's state in host memory) the same, the GPU build's staging run on this CPU. With
// optimizer.offload_values (ZeRO 3) the parameter values live in a second scratch file too, read
// before every gather and streamed by the update: the same bits again.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "run_helpers.hpp"

namespace tessera::test {
namespace {

namespace fs = std::filesystem;

const std::string disk = " --set optimizer.offload=disk --set optimizer.offload_buffer_mb=0.05";
const std::string adamw = " --set optimizer.kind=adamw --set optimizer.lr=0.002";
const std::string values = disk + " --set optimizer.offload_values=true";

// Nothing of a run is left in the offload directory: its scratch files (the state's, the values')
// are gone.
void expect_no_scratch_left() {
  for (const auto& e : fs::directory_iterator(fs::temp_directory_path()))
    EXPECT_EQ(e.path().filename().string().find("tessera-optimizer-"), std::string::npos) << e.path();
}

std::string ckpt(const std::string& dir, int step) {
  return fmt::format("{}/checkpoints/step_{:08}.h5", dir, step);
}

// The two checkpoints hold the same bits in every tensor, the optimizer state included.
void expect_same_bits(const std::string& a, const std::string& b) {
  const RunResult d = tessera(1, fmt::format("diff {} {} --tolerance 0", a, b));
  EXPECT_EQ(d.exit_code, 0) << d.output;
  EXPECT_NE(d.output.find("tolerance 0: passed"), std::string::npos) << d.output;
}

// The in-memory run of a deck (`args_of_dir` without offload arguments), trained once for every
// case that compares with it: its directory.
std::string memory_run(const std::string& name, int ranks, const std::string& args_of_dir) {
  static std::map<std::pair<int, std::string>, std::string> runs;
  const auto key = std::pair{ranks, args_of_dir};
  if (const auto it = runs.find(key); it != runs.end()) return it->second;
  const std::string mem = fresh_dir(name + "_mem");
  const RunResult a = tessera(ranks, fmt::format(fmt::runtime(args_of_dir), mem, ""));
  if (a.exit_code != 0) {
    ADD_FAILURE() << a.output;
    return "";
  }
  return runs.emplace(key, mem).first->second;
}

// The same deck in memory and offloaded (`offload`: the deck's settings; `env`: before the
// command), its log saying `says`.
void expect_offload_equals_memory(const std::string& name, int ranks, const std::string& args_of_dir,
                                  const std::string& offload = disk, const std::string& says = "disk",
                                  const std::string& env = "") {
  const std::string mem = memory_run(name, ranks, args_of_dir), off = fresh_dir(name + "_off");
  ASSERT_FALSE(mem.empty());
  const RunResult b = shell(env + tessera_command(ranks, fmt::format(fmt::runtime(args_of_dir), off, offload)));
  ASSERT_EQ(b.exit_code, 0) << b.output;
  EXPECT_NE(b.output.find("optimizer state (rank 0): " + says), std::string::npos) << b.output;
  EXPECT_EQ(train_losses(mem), train_losses(off));
  for (int step : {10, 30}) expect_same_bits(ckpt(mem, step), ckpt(off, step));
  // summary.json: what the updates moved per step; on disk each step reads and writes every
  // state's blocks once (the rank's state, padded to 4 KiB blocks, per state buffer).
  const auto summary = nlohmann::json::parse(read_file(off + "/summary.json"))["optimizer_offload"];
  EXPECT_EQ(summary["kind"], offload.find("offload=host") != std::string::npos ? "host" : "disk") << summary;
  EXPECT_EQ(summary["staged"], !env.empty()) << summary;
  if (says.starts_with("disk")) {
    EXPECT_GT(summary["update_bytes_written_per_step"].get<double>(), 0.0) << summary;
    EXPECT_EQ(summary["update_bytes_read_per_step"], summary["update_bytes_written_per_step"]) << summary;
    EXPECT_GT(summary["update_gb_per_s_per_rank"].get<double>(), 0.0) << summary;
  } else {
    EXPECT_EQ(summary["update_bytes_written_per_step"], 0.0) << summary;
  }
  // The values on disk: read before every gather, and said so in the log.
  const bool on_disk = offload.find("offload_values=true") != std::string::npos;
  EXPECT_EQ(summary["values_on_disk"], on_disk) << summary;
  EXPECT_EQ(summary["gather_bytes_read_per_step"].get<double>() > 0.0, on_disk) << summary;
  EXPECT_EQ(b.output.find("parameter values (rank 0): disk") != std::string::npos, on_disk) << b.output;
  expect_no_scratch_left();
}

void expect_disk_equals_memory(const std::string& name, int ranks, const std::string& args_of_dir) {
  expect_offload_equals_memory(name, ranks, args_of_dir);
}

std::string mlp(const std::string& extra) {
  // {} the output directory, {} the offload arguments.
  return train_args("{}", extra + " --set checkpoint.keep=0 {}");
}

TEST(Offload, DiskGivesTheBitsOfMemoryOnEveryLayout) {
  expect_disk_equals_memory("adamw_np1", 1, mlp(adamw));
  expect_disk_equals_memory("sgd_zero3", 2, mlp("--set parallel.zero=3 --set comm.bucket_mb=0.005"));
  expect_disk_equals_memory("adamw_zero1_clip_micro", 2,
                            mlp(adamw + " --set optimizer.clip_grad_norm=0.5 --set parallel.zero=1 "
                                        "--set parallel.micro_batches=2 --set comm.bucket_mb=0.005"));
  expect_disk_equals_memory("adamw_bf16", 2, mlp(adamw + " --set train.precision=bf16"));
  // Tensor and pipeline stages (each rank offloads its block's state), fp16's loss scale, and
  // checkpoints written in the background (their staging reads the state from the file).
  expect_disk_equals_memory("adamw_tp2", 2, mlp(adamw + " --set parallel.tensor=2"));
  expect_disk_equals_memory("sgd_pp2_async", 2,
                            mlp("--set parallel.pipeline=2 --set parallel.micro_batches=2 --set checkpoint.async=true"));
  expect_disk_equals_memory("adamw_fp16", 2, mlp(adamw + " --set train.precision=fp16"));
  // One tile at a time, no I/O beside the update.
  expect_disk_equals_memory("adamw_no_overlap", 2, mlp(adamw + " --set optimizer.offload_overlap=false"));
}

TEST(Offload, GptAndUnetGiveTheBitsOfMemory) {
  const std::string dir = fresh_dir("corpus");
  const std::string src = TESSERA_SOURCE_DIR, corpus = dir + "/docs.h5";
  const RunResult p = tessera(1, fmt::format("prepare text --out {} {}", corpus, corpus_files(2)));
  ASSERT_EQ(p.exit_code, 0) << p.output;
  const std::string gpt = fmt::format(
      "train {}/tests/integration/gpt_test.toml --set data.path={} --set run.output_dir={{}} "
      "--set train.precision=bf16 --set parallel.zero=3 --set train.steps=30 "
      "--set checkpoint.every_steps=10 --set checkpoint.keep=0 {{}}",
      src, corpus);
  expect_disk_equals_memory("gpt_bf16_zero3", 2, gpt);
  // The values on disk too (small buckets: many gathers, chunks that start inside a block).
  expect_offload_equals_memory("gpt_bf16_zero3_values", 2, gpt, values + " --set comm.bucket_mb=0.05",
                               "disk, 2 state buffer(s)");
  // The U-Net on 32 x 32 Darcy fields, split over 2 spatial ranks, AdamW at ZeRO 1.
  const std::string darcy = dir + "/darcy32.h5";
  const RunResult d = tessera(2, "prepare darcy --out " + darcy + " --size 32 --train 48 --test 16 --seed 3");
  ASSERT_EQ(d.exit_code, 0) << d.output;
  expect_disk_equals_memory("unet_spatial_zero1", 2,
                            mlp(adamw + " --set data.path=" + darcy +
                                " --set model.kind=unet --set model.channels=[4,8] --set train.global_batch=8"
                                " --set eval.batch=8 --set parallel.spatial=2 --set parallel.zero=1"));
}

// optimizer.offload = "host" keeps a GPU build's state in host memory and runs the update there,
// the parameters and gradients copied down and up in tiles. On this CPU build the key changes
// nothing (and says so); TESSERA_TEST_STAGE_OFFLOAD=1 makes the CPU build stage them as a GPU
// build does, so the tile loop, its copies and the bf16 copies' staging run here.
TEST(Offload, HostGivesTheBitsOfMemoryStagedAsOnAGpu) {
  const std::string host = " --set optimizer.offload=host --set optimizer.offload_buffer_mb=0.05";
  const std::string staged = "TESSERA_TEST_STAGE_OFFLOAD=1 ";
  expect_offload_equals_memory("host_cpu", 1, mlp(adamw), host, "host: this build keeps the parameters in host memory");
  expect_offload_equals_memory("host_staged_bf16", 2, mlp(adamw + " --set train.precision=bf16"), host,
                               "host, 2 state buffer(s)", staged);
  expect_offload_equals_memory("host_staged_sgd_zero3_micro", 2,
                               mlp("--set parallel.zero=3 --set parallel.micro_batches=2 --set comm.bucket_mb=0.005"),
                               host + " --set optimizer.offload_overlap=false", "host, 1 state buffer(s)", staged);
  // A GPU build's disk offload: the state from the file, the parameters staged.
  expect_offload_equals_memory("disk_staged", 2, mlp(adamw + " --set optimizer.clip_grad_norm=0.5"), disk,
                               "disk, 2 state buffer(s)", staged);
  // Four ranks: data 2 x tensor 2, ZeRO 3, bf16, the state on disk.
  expect_offload_equals_memory("disk_dp2_tp2_zero3_bf16", 4,
                               mlp(adamw + " --set parallel.tensor=2 --set parallel.zero=3 --set train.precision=bf16 "
                                           "--set comm.bucket_mb=0.005"));
}

// optimizer.offload_values: the parameter values in a scratch file too (ZeRO 3), on 1, 2 and 4
// ranks, SGD without state (only the values stream), with momentum and micro-batches, AdamW with
// clipping in bf16, one tile at a time, the GPU build's staging, the U-Net split over 2 ranks.
TEST(Offload, ValuesOnDiskGiveTheBitsOfMemory) {
  const std::string zero3 = " --set parallel.zero=3 --set comm.bucket_mb=0.005";
  expect_offload_equals_memory("values_adamw_np1", 1, mlp(adamw + zero3), values, "disk, 2 state buffer(s)");
  expect_offload_equals_memory("values_sgd_micro", 2, mlp(zero3 + " --set parallel.micro_batches=2"), values,
                               "disk, 1 state buffer(s)");
  expect_offload_equals_memory("values_plain_sgd", 2, mlp(zero3 + " --set optimizer.momentum=0"), values,
                               "disk, 0 state buffer(s)");
  expect_offload_equals_memory("values_bf16_clip_serial", 2,
                               mlp(adamw + zero3 + " --set train.precision=bf16 --set optimizer.clip_grad_norm=0.5"),
                               values + " --set optimizer.offload_overlap=false", "disk, 2 state buffer(s)");
  expect_offload_equals_memory("values_staged", 2, mlp(adamw + zero3), values, "disk, 2 state buffer(s)",
                               "TESSERA_TEST_STAGE_OFFLOAD=1 ");
  expect_offload_equals_memory("values_dp2_tp2_bf16", 4,
                               mlp(adamw + " --set parallel.tensor=2 --set parallel.zero=3 --set train.precision=bf16 "
                                           "--set comm.bucket_mb=0.005"),
                               values, "disk, 2 state buffer(s)");
  const std::string darcy = fresh_dir("values_darcy") + "/darcy32.h5";
  const RunResult d = tessera(2, "prepare darcy --out " + darcy + " --size 32 --train 48 --test 16 --seed 3");
  ASSERT_EQ(d.exit_code, 0) << d.output;
  expect_offload_equals_memory("values_unet_spatial", 2,
                               mlp(adamw + zero3 + " --set data.path=" + darcy +
                                   " --set model.kind=unet --set model.channels=[4,8] --set train.global_batch=8"
                                   " --set eval.batch=8 --set parallel.spatial=2"),
                               values, "disk, 2 state buffer(s)");
}

TEST(Offload, CheckpointsMoveBetweenDiskAndMemory) {
  // The uninterrupted AdamW run on 2 ranks, trained once for this case and the killed update's.
  const std::string& whole = shared_run(2, adamw);
  // 20 steps one way, the last 10 the other: the uninterrupted run's bits; the values on disk (at
  // ZeRO 3) resume from ZeRO 0 in memory and the reverse.
  const std::string values3 = values + " --set parallel.zero=3";
  for (const auto& [first, second] : {std::pair{disk, std::string()}, std::pair{std::string(), disk},
                                      std::pair{values3, std::string()}, std::pair{std::string(), values3}}) {
    const std::string dir = fresh_dir(first.empty() ? "memory_then_disk" : "disk_then_memory");
    SCOPED_TRACE(first + " then" + second);
    ASSERT_EQ(tessera(2, train_args(dir, adamw + first + " --set train.steps=20")).exit_code, 0);
    const RunResult r = tessera(2, train_args(dir, adamw + second + " --resume auto"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    expect_same_bits(ckpt(whole, 30), ckpt(dir, 30));
  }
}

TEST(Offload, AnUnusableOffloadPathStopsTheRunBeforeItsFirstStep) {
  const std::string file = fresh_dir("offload_file") + "/plain";
  std::ofstream(file) << "x";
  for (const std::string& path : {std::string("/nonexistent/scratch"), file}) {
    SCOPED_TRACE(path);
    const std::string dir = fresh_dir("bad_offload_path");
    const RunResult r = tessera(2, train_args(dir, disk + " --set optimizer.offload_path=" + path));
    expect_input_error(r, "optimizer.offload_path: cannot create " + path);
    EXPECT_FALSE(fs::exists(dir + "/log.txt"));
    EXPECT_FALSE(fs::exists(dir + "/metrics.csv"));
  }
  // A disk too small for the state: a 0.6 MB file system (in a mount namespace of its own) for two
  // ranks' 0.43 MB each; the space is reserved when the optimizer is built, so one rank's
  // reservation fails there, before the first step.
  const std::string small = fresh_dir("small_disk"), full = fresh_dir("full_offload");
  const RunResult r = shell(fmt::format("unshare -m sh -c 'mount -t tmpfs -o size=600k tessera-test {} && {}'", small,
                                        tessera_command(2, train_args(full, adamw + disk + " --set optimizer.offload_path=" + small))));
  expect_input_error(r, "optimizer.offload_path: cannot reserve 0.4 MB");
  EXPECT_NE(r.output.find("No space left on device"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(full + "/log.txt"));
  // comm.priority updates inside the next forward, which the offload does not stream.
  expect_input_error(tessera_alone(train_args(fresh_dir("offload_priority"), disk + " --set comm.priority=true")),
                     "optimizer.offload");
}

TEST(Offload, AMemoryRefusalNamesTheOffloadThatWouldFit) {
  // AdamW's 0.42 MB of state puts the estimate (3.4 MB: 2.2 MB of it the activations of the
  // eval batch of 500, 0.2 MB a save's buffer) over a 3.2 MB limit; on disk it is 3.1 MB.
  const std::string deck = fmt::format("check {} --set data.path={} --set optimizer.kind=adamw --set run.memory_limit_mb=3.2 "
                                       "--set optimizer.offload_buffer_mb=0.05", test_deck(), fashion_mnist());
  expect_input_error(tessera_alone(deck), "more than the limit; set optimizer.offload = \"disk\" (about 3.1 MB per rank then");
  const RunResult fits = tessera(1, deck + " --set optimizer.offload=disk");
  EXPECT_EQ(fits.exit_code, 0) << fits.output;
  EXPECT_NE(fits.output.find("optimizer state on disk per rank"), std::string::npos) << fits.output;
  // A GPT of 25.5M parameters (two blocks of width 1024) under 230 MB: 474 MB in memory, 274 MB
  // with the state on disk; the values on disk too (ZeRO 3) need 276 MB while the next block is
  // gathered ahead and 224 MB without, and the refusal says so. (Each figure holds a save's buffer,
  // the largest tensor's 16.8 MB.) Then 2 steps under that limit: the measured peak fits.
  const std::string corpus = fresh_dir("hint_corpus") + "/docs.h5";
  ASSERT_EQ(tessera(1, fmt::format("prepare text --out {} {}", corpus, corpus_files(2))).exit_code, 0);
  const std::string gpt =
      fmt::format("{}/tests/integration/gpt_test.toml --set data.path={} --set model.width=1024 --set comm.bucket_mb=2 "
                  "--set optimizer.offload_buffer_mb=4 --set eval.batch=8 --set run.memory_limit_mb=230",
                  TESSERA_SOURCE_DIR, corpus);
  expect_input_error(tessera_alone("check " + gpt),
                     "more than the limit; set optimizer.offload = \"disk\", optimizer.offload_values = true, "
                     "parallel.zero = 3 and parallel.zero_prefetch = false (about 224.4 MB per rank then");
  const std::string ahead = " --set optimizer.offload=disk --set optimizer.offload_values=true --set parallel.zero=3";
  expect_input_error(tessera_alone("check " + gpt + ahead),
                     "more than the limit; set parallel.zero_prefetch = false (about 224.4 MB per rank then; gathering "
                     "the next bucket while one computes holds one more, 51.4 MB)");
  const std::string on_disk = ahead + " --set parallel.zero_prefetch=false";
  const RunResult check = tessera(1, "check " + gpt + on_disk);
  EXPECT_NE(check.output.find("optimizer state and parameter values on disk per rank"), std::string::npos) << check.output;
  const std::string dir = fresh_dir("values_under_limit");
  const RunResult run = tessera(1, fmt::format("train {}{} --set train.steps=2 --set eval.every_steps=0 --set eval.at_end=false "
                                               "--set checkpoint.at_end=false --set run.output_dir={}",
                                               gpt, on_disk, dir));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const nlohmann::json summary = nlohmann::json::parse(read_file(dir + "/summary.json"));
  EXPECT_LE(summary["memory"]["peak_total_bytes"].get<double>(), 230e6);
}

TEST(Offload, AnOffloadFileFailingMidRunStopsEveryRankAndTheCheckpointResumes) {
  const std::string whole = fresh_dir("fail_whole");
  ASSERT_EQ(tessera(2, train_args(whole)).exit_code, 0);
  // SGD's one state of 52650 floats in one tile (a 1 MB buffer): one write per step on each rank;
  // the 15th is in step 15, after the checkpoint of step 10.
  const std::string one_tile = " --set optimizer.offload=disk --set optimizer.offload_buffer_mb=1";
  const std::string dir = fresh_dir("fail_write");
  const RunResult r = shell("TESSERA_TEST_FAIL_OFFLOAD_WRITE=15 " + tessera_command(2, train_args(dir, one_tile)));
  expect_input_error(r, "on rank 1 failed: Input/output error (TESSERA_TEST_FAIL_OFFLOAD_WRITE)");
  EXPECT_EQ(read_file(dir + "/checkpoints/latest"), "step_00000010.h5\n");
  const RunResult resumed = tessera(2, train_args(dir, one_tile + " --resume auto"));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  expect_same_bits(ckpt(whole, 30), ckpt(dir, 30));
  // The values' file alone (SGD without momentum keeps no state): its one write at the start and
  // one per step; the 15th is step 14's update.
  const std::string plain = " --set optimizer.momentum=0 --set parallel.zero=3";
  const std::string plain_whole = fresh_dir("fail_values_whole");
  ASSERT_EQ(tessera(2, train_args(plain_whole, plain)).exit_code, 0);
  const std::string vdir = fresh_dir("fail_values_write");
  const std::string on_disk = one_tile + " --set optimizer.offload_values=true" + plain;
  const RunResult v = shell("TESSERA_TEST_FAIL_OFFLOAD_WRITE=15 " + tessera_command(2, train_args(vdir, on_disk)));
  expect_input_error(v, "tessera-optimizer-values");
  EXPECT_NE(v.output.find("on rank 1 failed: Input/output error"), std::string::npos) << v.output;
  EXPECT_EQ(read_file(vdir + "/checkpoints/latest"), "step_00000010.h5\n");
  const RunResult v_resumed = tessera(2, train_args(vdir, on_disk + " --resume auto"));
  ASSERT_EQ(v_resumed.exit_code, 0) << v_resumed.output;
  expect_same_bits(ckpt(plain_whole, 30), ckpt(vdir, 30));
  // A read of the values failing on rank 1. Each step reads them three times (the gathers of
  // forward and backward, the update), a checkpoint once per tensor it writes from them (they
  // stream from the file a tensor at a time). The 47th read is the step-10 checkpoint's last:
  // every rank stops with the line (no MPI_ABORT), no checkpoint named.
  const std::string cdir = fresh_dir("fail_values_read_in_checkpoint");
  const RunResult cd = shell("TESSERA_TEST_FAIL_OFFLOAD_READ=47 " + tessera_command(2, train_args(cdir, on_disk)));
  expect_input_error(cd, "tessera-optimizer-values");
  EXPECT_EQ(cd.output.find("MPI_ABORT was invoked"), std::string::npos) << cd.output;
  EXPECT_FALSE(fs::exists(cdir + "/checkpoints/latest"));
  // The 48th is step 11's first gather: both ranks of the ZeRO group stop there with the line,
  // agreed before the allgather.
  const std::string rdir = fresh_dir("fail_values_read");
  const RunResult rd = shell("TESSERA_TEST_FAIL_OFFLOAD_READ=48 " + tessera_command(2, train_args(rdir, on_disk)));
  expect_input_error(rd, "tessera-optimizer-values");
  EXPECT_NE(rd.output.find("on rank 1 failed: Input/output error (TESSERA_TEST_FAIL_OFFLOAD_READ)"), std::string::npos)
      << rd.output;
  EXPECT_EQ(rd.output.find("MPI_ABORT was invoked"), std::string::npos) << rd.output;  // agreed, not aborted alone
  EXPECT_EQ(read_file(rdir + "/checkpoints/latest"), "step_00000010.h5\n");
  const RunResult r_resumed = tessera(2, train_args(rdir, on_disk + " --resume auto"));
  ASSERT_EQ(r_resumed.exit_code, 0) << r_resumed.output;
  expect_same_bits(ckpt(plain_whole, 30), ckpt(rdir, 30));
  expect_no_scratch_left();
}

// Slurm's wall-time warning (SIGUSR1 through tools/mpirun.sh) arriving while the step-10
// checkpoint is written: every rank stops after step 11 with its offloaded state in the step-11
// checkpoint, exit 4, the scratch files gone; --resume auto continues to the uninterrupted bits.
TEST(Offload, AStopSignalCheckpointsTheStateOnDiskAndResumesToTheUninterruptedBits) {
  const std::string whole = fresh_dir("signal_whole");
  ASSERT_EQ(tessera(2, train_args(whole, adamw + disk)).exit_code, 0);
  const std::string dir = fresh_dir("signal_stop");
  const RunResult r = shell("TESSERA_TEST_SIGNAL_IN_CHECKPOINT=10 " + tessera_command(2, train_args(dir, adamw + disk)));
  ASSERT_EQ(r.exit_code, 4) << r.output;
  EXPECT_EQ(read_file(dir + "/checkpoints/latest"), "step_00000011.h5\n");
  expect_no_scratch_left();
  const RunResult resumed = tessera(2, train_args(dir, adamw + disk + " --resume auto"));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("at step 11"), std::string::npos) << resumed.output;
  expect_same_bits(ckpt(whole, 30), ckpt(dir, 30));
}

TEST(Offload, ARankKilledInTheMiddleOfAnUpdateResumesToTheUninterruptedBits) {
  const std::string& whole = shared_run(2, adamw);
  // AdamW's two states of 53248 floats (padded) in tiles of 2048 (a 0.05 MB buffer holds 3 of each):
  // 52 writes per step on each rank; the 806th is half-way through step 16's update (after the
  // checkpoint of step 10).
  const std::string dir = fresh_dir("kill_update");
  const RunResult r = shell("TESSERA_TEST_KILL_IN_OFFLOAD_WRITE=806 " + tessera_command(2, train_args(dir, adamw + disk)));
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_EQ(read_file(dir + "/checkpoints/latest"), "step_00000010.h5\n");
  const RunResult resumed = tessera(2, train_args(dir, adamw + disk + " --resume auto"));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  expect_same_bits(ckpt(whole, 30), ckpt(dir, 30));
}

}  // namespace
}  // namespace tessera::test
