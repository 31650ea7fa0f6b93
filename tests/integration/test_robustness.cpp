// No input reaches an internal error, a crash, a hang or a lost checkpoint: the cases of the issue
// of that name, each on 2 ranks through the real binary. Oracles: exit code 2 with exactly one
// `tessera: error:` line naming what is wrong, and the run directory byte for byte as it was; or,
// where the input is usable (a `latest` that cannot be read but complete checkpoints), the
// uninterrupted run's losses.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <hdf5.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <vector>

#include "run_helpers.hpp"

namespace tessera::test {
namespace {

namespace fs = std::filesystem;

const std::string deck = std::string(TESSERA_SOURCE_DIR) + "/tests/integration/mlp_test.toml";

// Every file under dir with its bytes: "nothing written, deleted or overwritten" is equality.
std::map<std::string, std::string> snapshot(const std::string& dir) {
  std::map<std::string, std::string> files;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    files[e.path().string()] = e.is_regular_file() ? read_file(e.path().string()) : std::string("<dir>");
  return files;
}

std::string copy_run(const std::string& from, const std::string& name) {
  const std::string to = fresh_dir(name);
  fs::copy(from, to, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
  return to;
}

std::string args(const std::string& dir, const std::string& more = "") {
  return fmt::format("train {} --set data.path={} --set run.output_dir={} --set checkpoint.keep=0 {}", deck,
                     fashion_mnist(), dir, more);
}

// 20 steps, checkpoints at 10 and 20 (the fixture every damage starts from), made once.
const std::string& run20() {
  static const std::string dir = [] {
    const std::string d = fresh_dir("robust_run20");
    const RunResult r = tessera(2, args(d, "--set train.steps=20"));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return d;
  }();
  return dir;
}

// The uninterrupted 30-step run's losses. Every run compared with them here runs on 2 ranks too:
// the same layout and thread counts, so a resumed run gives them bitwise (EXPECT_EQ).
const std::map<std::int64_t, double>& losses30() {
  static const std::map<std::int64_t, double> losses = [] {
    const std::string d = fresh_dir("robust_run30");
    const RunResult r = tessera(2, args(d));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return train_losses(d);
  }();
  return losses;
}

std::string ckpt(const std::string& run, int step) {
  return fmt::format("{}/checkpoints/step_{:08}.h5", run, step);
}

// --- Small HDF5 edits of the kind a damaged or hand-made file has -----------------------------

struct H5File {
  hid_t id;
  explicit H5File(const std::string& path, bool create = false)
      : id(create ? H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT)
                  : H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT)) {
    EXPECT_GE(id, 0) << path;
  }
  ~H5File() { H5Fclose(id); }
};

void set_int_attr(const std::string& path, const std::string& object, const std::string& name,
                  std::int64_t value, hid_t type = H5T_STD_I64LE) {
  H5File f(path);
  const hid_t obj = H5Oopen(f.id, object.c_str(), H5P_DEFAULT);
  if (H5Aexists(obj, name.c_str()) > 0) H5Adelete(obj, name.c_str());
  const hid_t space = H5Screate(H5S_SCALAR);
  const hid_t attr = H5Acreate2(obj, name.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT);
  EXPECT_GE(H5Awrite(attr, H5T_NATIVE_INT64, &value), 0);
  H5Aclose(attr);
  H5Sclose(space);
  H5Oclose(obj);
}

void poke_float(const std::string& path, const std::string& dataset, hsize_t index, float value) {
  H5File f(path);
  const hid_t d = H5Dopen2(f.id, dataset.c_str(), H5P_DEFAULT);
  const hid_t space = H5Dget_space(d);
  const int rank = H5Sget_simple_extent_ndims(space);
  std::vector<hsize_t> dims(static_cast<std::size_t>(rank)), at(dims.size(), 0);
  H5Sget_simple_extent_dims(space, dims.data(), nullptr);
  for (int k = rank - 1; k >= 0; --k) {
    at[static_cast<std::size_t>(k)] = index % dims[static_cast<std::size_t>(k)];
    index /= dims[static_cast<std::size_t>(k)];
  }
  H5Sselect_elements(space, H5S_SELECT_SET, 1, at.data());
  hsize_t one = 1;
  const hid_t mem = H5Screate_simple(1, &one, nullptr);
  EXPECT_GE(H5Dwrite(d, H5T_NATIVE_FLOAT, mem, space, H5P_DEFAULT, &value), 0);
  H5Sclose(mem);
  H5Sclose(space);
  H5Dclose(d);
}

void replace_dataset(const std::string& path, const std::string& dataset, std::vector<hsize_t> dims) {
  H5File f(path);
  EXPECT_GE(H5Ldelete(f.id, dataset.c_str(), H5P_DEFAULT), 0);
  const hid_t space = H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr);
  const hid_t d = H5Dcreate2(f.id, dataset.c_str(), H5T_IEEE_F32LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  std::size_t n = 1;
  for (hsize_t x : dims) n *= x;
  std::vector<float> zeros(n, 0.0f);
  EXPECT_GE(H5Dwrite(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, zeros.data()), 0);
  H5Dclose(d);
  H5Sclose(space);
}

// A small supervised file: /train and /test, inputs [n, 4] float32 (or uint8), labels [n]
// int64 in 0..2; `edit` changes it before it is closed.
template <class Edit>
std::string small_dataset(const std::string& name, Edit edit, bool chunked = false) {
  const std::string path = fresh_dir("robust_data_" + name) + "/data.h5";
  H5File f(path, true);
  for (const char* split : {"train", "test"}) {
    const hsize_t n = 96;
    const hid_t g = H5Gcreate2(f.id, split, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    std::vector<float> x(n * 4);
    std::vector<std::int64_t> y(n);
    for (hsize_t i = 0; i < n; ++i) {
      y[i] = static_cast<std::int64_t>(i % 3);
      for (hsize_t j = 0; j < 4; ++j) x[i * 4 + j] = static_cast<float>((i * 7 + j * 3) % 11) / 11.0f;
    }
    hsize_t xd[2] = {n, 4}, chunk[2] = {16, 4};
    const hid_t xs = H5Screate_simple(2, xd, nullptr), ys = H5Screate_simple(1, xd, nullptr);
    const hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    if (chunked) {
      H5Pset_chunk(dcpl, 2, chunk);
      H5Pset_deflate(dcpl, 6);
    }
    const hid_t xi = H5Dcreate2(g, "inputs", H5T_IEEE_F32LE, xs, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    const hid_t yi = H5Dcreate2(g, "labels", H5T_STD_I64LE, ys, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    H5Dwrite(xi, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, x.data());
    H5Dwrite(yi, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, y.data());
    edit(g, xi, yi);
    for (hid_t h : {xi, yi}) H5Dclose(h);
    for (hid_t h : {xs, ys}) H5Sclose(h);
    H5Pclose(dcpl);
    H5Gclose(g);
  }
  return path;
}

std::string data_args(const std::string& data, const std::string& dir, const std::string& more = "") {
  return fmt::format("train {} --set data.path={} --set run.output_dir={} --set 'model.hidden=[8]' "
                     "--set train.global_batch=16 --set train.steps=4 --set eval.every_steps=2 {}",
                     deck, data, dir, more);
}

// --- Checkpoints and `latest` --------------------------------------------------------------------

TEST(Robustness, UnreadableLatestResumesFromTheNewestCompleteCheckpoint) {
  const std::vector<std::pair<std::string, std::string>> damages = {
      {"empty", ""}, {"blank", "\n"}, {"garbage", "step_xyz\n"}, {"missing", "<rm>"}};
  for (const auto& [name, content] : damages) {
    SCOPED_TRACE(name);
    const std::string run = copy_run(run20(), "robust_latest_" + name);
    const std::string latest = run + "/checkpoints/latest";
    fs::remove(latest);
    if (content != "<rm>") std::ofstream(latest) << content;
    const RunResult r = tessera(2, args(run, "--resume auto"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(read_file(run + "/log.txt").find("resuming from the newest complete checkpoint"), std::string::npos);
    EXPECT_TRUE(fs::exists(ckpt(run, 10)) && fs::exists(ckpt(run, 20)) && fs::exists(ckpt(run, 30)));
    const auto got = train_losses(run);
    for (std::int64_t s = 21; s <= 30; ++s) EXPECT_EQ(got.at(s), losses30().at(s)) << "step " << s;
  }
}

TEST(Robustness, DamagedNewestCheckpointIsRefusedAndNothingChanges) {
  // `latest` unreadable and the newest step file truncated; `latest` naming a file whose values
  // were changed; a NaN in the weights; the optimizer state of another shape.
  const std::string truncated = copy_run(run20(), "robust_truncated");
  std::ofstream(truncated + "/checkpoints/latest", std::ios::trunc);
  fs::resize_file(ckpt(truncated, 20), fs::file_size(ckpt(truncated, 20)) / 2);
  const std::string flipped = copy_run(run20(), "robust_flipped");
  poke_float(ckpt(flipped, 20), "model/layers.1.weight", 5, 0.125f);
  const std::string nan = copy_run(run20(), "robust_nan");
  poke_float(ckpt(nan, 20), "model/layers.0.weight", 7, std::numeric_limits<float>::quiet_NaN());
  const std::string shape = copy_run(run20(), "robust_shape");
  replace_dataset(ckpt(shape, 20), "optimizer/layers.0.weight/momentum", {65, 784});
  // `latest` a directory: no checkpoint of the run could be recorded, so it does not start.
  const std::string directory = copy_run(run20(), "robust_latest_dir");
  fs::remove(directory + "/checkpoints/latest");
  fs::create_directory(directory + "/checkpoints/latest");
  for (const auto& [run, needle] : std::vector<std::pair<std::string, std::string>>{
           {truncated, "step_00000020.h5"}, {flipped, "does not match its checksum"},
           {nan, "NaN or infinite"}, {shape, "optimizer/layers.0.weight/momentum has shape [65,784]"},
           {directory, "latest is a directory"}}) {
    SCOPED_TRACE(run);
    const auto before = snapshot(run);
    expect_input_error(tessera(2, args(run, "--resume auto")), needle);
    EXPECT_EQ(snapshot(run), before);
  }
}

TEST(Robustness, TrainStateOutOfRangeIsRefusedBeforeAnythingIsWritten) {
  const std::int64_t big = std::int64_t{1} << 62;
  for (const auto& [object, name, value] : std::vector<std::tuple<std::string, std::string, std::int64_t>>{
           {"train", "epoch", -1}, {"train", "step", -5}, {"train", "step", big},
           {"train", "batch_in_epoch", 1000000}, {"train", "samples_seen", -1}, {"optimizer", "step", 999}}) {
    SCOPED_TRACE(name + " = " + std::to_string(value));
    const std::string run = copy_run(run20(), "robust_state");
    set_int_attr(ckpt(run, 20), object, name, value);
    const auto before = snapshot(run);
    expect_input_error(tessera(2, args(run, "--resume " + ckpt(run, 20))), name);
    EXPECT_EQ(snapshot(run), before);
  }
}

TEST(Robustness, OneRankFailingInTheSaveOrInAReadFailsEveryRank) {
  // A write that fails on rank 1 alone (a full disk), mid-file: every rank exits 2, `latest`
  // still names the previous checkpoint.
  const std::string save = fresh_dir("robust_fail_save");
  expect_input_error(shell("TESSERA_TEST_FAIL_IN_CHECKPOINT=20 " + tessera_command(2, args(save))),
                     "TESSERA_TEST_FAIL_IN_CHECKPOINT");
  EXPECT_EQ(read_file(save + "/checkpoints/latest"), "step_00000010.h5\n");
  // A read that fails on rank 1 alone (a damaged block): the resume fails on every rank.
  const std::string read = copy_run(run20(), "robust_fail_read");
  const auto before = snapshot(read);
  expect_input_error(shell("TESSERA_TEST_FAIL_IN_READ=3 " + tessera_command(2, args(read, "--resume auto"))),
                     "TESSERA_TEST_FAIL_IN_READ");
  EXPECT_EQ(snapshot(read), before);
}

TEST(Robustness, PathsTheSavesWouldWriteAreCheckedBeforeTheFirstStep) {
  // A directory where a later save writes a file (`latest`, `latest.tmp`, a checkpoint of a later
  // step or its temporary): the resumed run stops before its first step, exit 2 on every rank with
  // the path named, and the run directory (log, metrics, checkpoints) is byte for byte as it was.
  // Before, it trained to its first save (step 30) and only then failed, having appended to
  // log.txt and the metrics.
  for (const std::string entry : {"latest.tmp", "step_00000030.h5", "step_00000030.h5.tmp", "step_00000021.h5.tmp"}) {
    SCOPED_TRACE(entry);
    const std::string run = copy_run(run20(), "robust_blocked_path");
    fs::create_directories(run + "/checkpoints/" + entry);
    const auto before = snapshot(run);
    const RunResult r = tessera(2, args(run, "--resume " + ckpt(run, 20)));
    expect_input_error(r, "checkpoints/" + entry + ": the run writes a file here");
    EXPECT_EQ(r.output.find("step 21"), std::string::npos) << r.output;
    EXPECT_EQ(snapshot(run), before);
  }
  // `latest` a directory under --resume PATH (--resume auto refuses it when it looks for it).
  const std::string run = copy_run(run20(), "robust_blocked_latest");
  fs::remove(run + "/checkpoints/latest");
  fs::create_directories(run + "/checkpoints/latest");
  const auto before = snapshot(run);
  expect_input_error(tessera(2, args(run, "--resume " + ckpt(run, 20))), "checkpoints/latest: the run writes");
  EXPECT_EQ(snapshot(run), before);
  // An older step's name is no obstacle: the run never writes it again.
  const std::string older = copy_run(run20(), "robust_older_dir");
  fs::create_directories(older + "/checkpoints/step_00000005.h5.tmp");
  EXPECT_EQ(tessera(2, args(older, "--resume " + ckpt(older, 20) + " --set train.steps=21")).exit_code, 0);
}

// --- Datasets -------------------------------------------------------------------------------------

TEST(Robustness, BadDatasetsAreInputErrors) {
  const auto none = [](hid_t, hid_t, hid_t) {};
  const std::string good = small_dataset("good", none);
  ASSERT_EQ(tessera(2, data_args(good, fresh_dir("robust_good"))).exit_code, 0);
  struct Case {
    std::string name, data, more, needle;
  };
  std::vector<Case> cases = {
      {"classes 2^32+2", small_dataset("classes", [](hid_t, hid_t, hid_t y) {
         const std::int64_t v = (std::int64_t{1} << 32) + 2;
         const hid_t s = H5Screate(H5S_SCALAR);
         const hid_t a = H5Acreate2(y, "classes", H5T_STD_I64LE, s, H5P_DEFAULT, H5P_DEFAULT);
         H5Awrite(a, H5T_NATIVE_INT64, &v);
         H5Aclose(a);
         H5Sclose(s);
       }), "", "attribute classes is 4294967298"},
      {"label 2^62", small_dataset("label", [](hid_t, hid_t, hid_t y) {
         const std::int64_t v = std::int64_t{1} << 62;
         hsize_t at = 5, one = 1;
         const hid_t fs_ = H5Dget_space(y), ms = H5Screate_simple(1, &one, nullptr);
         H5Sselect_elements(fs_, H5S_SELECT_SET, 1, &at);
         H5Dwrite(y, H5T_NATIVE_INT64, ms, fs_, H5P_DEFAULT, &v);
         H5Sclose(ms);
         H5Sclose(fs_);
       }), "", "the largest label is 4611686018427387904"},
      {"scale not a scalar", small_dataset("scale", [](hid_t, hid_t x, hid_t) {
         const double v[2] = {1.0, 2.0};
         hsize_t two = 2;
         const hid_t s = H5Screate_simple(1, &two, nullptr);
         const hid_t a = H5Acreate2(x, "scale", H5T_IEEE_F64LE, s, H5P_DEFAULT, H5P_DEFAULT);
         H5Awrite(a, H5T_NATIVE_DOUBLE, v);
         H5Aclose(a);
         H5Sclose(s);
       }), "", "attribute scale holds 2 values"},
      {"dangling link", small_dataset("dangling", [](hid_t g, hid_t, hid_t) {
         H5Lcreate_soft("/nowhere/targets", g, "targets", H5P_DEFAULT, H5P_DEFAULT);
       }), "", "dangling"},
      {"NaN input", small_dataset("nan", [](hid_t, hid_t x, hid_t) {
         const float v = std::numeric_limits<float>::quiet_NaN();
         hsize_t at[2] = {3, 1}, one = 1;
         const hid_t fs_ = H5Dget_space(x), ms = H5Screate_simple(1, &one, nullptr);
         H5Sselect_elements(fs_, H5S_SELECT_SET, 1, at);
         H5Dwrite(x, H5T_NATIVE_FLOAT, ms, fs_, H5P_DEFAULT, &v);
         H5Sclose(ms);
         H5Sclose(fs_);
       }), "--set data.cache=true", "holds nan"},
      {"a split naming a dataset", good, "--set data.train_split=train/inputs", "train/inputs"},
  };
  // NaN read uncached, mid-run, by whichever rank's batch holds it.
  cases.push_back({"NaN input, uncached", cases[4].data, "--set data.cache=false", "holds nan"});
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    expect_input_error(tessera(2, data_args(c.data, fresh_dir("robust_bad_data"), c.more)), c.needle);
  }
}

TEST(Robustness, DamagedCompressedChunkMidRunIsAnInputError) {
  // A chunk of deflated inputs overwritten on disk: found by the rank whose batch reads it, in the
  // middle of training (uncached); every rank stops with exit 2.
  const std::string data = small_dataset("chunk", [](hid_t, hid_t, hid_t) {}, true);
  haddr_t address = 0;
  hsize_t size = 0;
  {
    H5File f(data);
    const hid_t d = H5Dopen2(f.id, "/train/inputs", H5P_DEFAULT);
    unsigned mask = 0;
    hsize_t at[2] = {32, 0};
    ASSERT_GE(H5Dget_chunk_info_by_coord(d, at, &mask, &address, &size), 0);
    H5Dclose(d);
  }
  {
    std::fstream f(data, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(address + size / 2));
    const std::string junk(std::max<hsize_t>(4, size / 4), '\x5a');
    f.write(junk.data(), static_cast<std::streamsize>(junk.size()));
  }
  expect_input_error(tessera(2, data_args(data, fresh_dir("robust_chunk"), "--set data.cache=false --set train.steps=12")),
                     "/train/inputs");
}

// --- Decks --------------------------------------------------------------------------------------

TEST(Robustness, ExtremeDeckValuesAreDeckErrorsOrFitTheData) {
  const std::string dir = fresh_dir("robust_deck");
  // Sizes the node cannot hold are refused before anything is allocated, naming the memory.
  expect_input_error(tessera(2, args(dir, "--set 'model.hidden=[1000000,1000000]'")), "GB");
  // Batches larger than the data hold are sized by the data.
  EXPECT_EQ(tessera(2, args(fresh_dir("robust_eval_batch"), "--set eval.batch=2147483647 --set train.steps=2")).exit_code, 0);
  EXPECT_EQ(tessera(2, args(fresh_dir("robust_global"), "--set train.global_batch=1000000 --set train.drop_last=false "
                                                        "--set train.steps=1 --set eval.every_steps=0")).exit_code, 0);
  // Grid products in 64 bits; a value with a newline is echoed on one line.
  expect_input_error(tessera_alone(fmt::format("check {} --set parallel.tensor=1048576 --set parallel.pipeline=1048576 "
                                            "--set data.path={}", deck, fashion_mnist())),
                     "parallel.tensor");
  expect_input_error(tessera(2, args(dir, "--set \"$(printf 'model.activation=re\\nlu')\"")), "re\\nlu");
}

// --- Ctrl-C ---------------------------------------------------------------------------------------

TEST(Robustness, CtrlCToTheLauncherStopsWithACheckpointThatResumes) {
  // The ranks pause inside the checkpoint at step 10 until a signal comes; Ctrl-C (SIGINT) to
  // tools/mpirun.sh then reaches them as a stop request: they finish, exit 4, and the run resumes
  // to the uninterrupted losses.
  // Assumes: Ctrl-C is sent only once both ranks have printed that they pause (they reach the
  // pause seconds apart under load; a rank signalled before its pause would sleep the pause's
  // whole length), and a loaded sanitizer build reaches step 10 within 300 s.
  const std::string dir = fresh_dir("robust_ctrl_c"), out = dir + ".out";
  const std::string script = fmt::format(
      // bash with job control: a background job of a plain sh ignores SIGINT from the start.
      "cd {src} && bash -c 'set -m; TESSERA_TEST_PAUSE_IN_CHECKPOINT=10 tools/mpirun.sh -n 2 {bin} {a} >{out} 2>&1 & "
      "pid=$!; for i in $(seq 3000); do [ \"$(grep -c \"waiting for a signal\" {out} 2>/dev/null)\" -ge 2 ] && break; sleep 0.1; done; "
      "kill -INT $pid; wait $pid; echo exit=$?'",
      fmt::arg("src", TESSERA_SOURCE_DIR), fmt::arg("bin", TESSERA_BINARY), fmt::arg("a", args(dir)),
      fmt::arg("out", out));
  const RunResult r = shell(script);
  EXPECT_NE(r.output.find("exit=4"), std::string::npos) << r.output << read_file(out);
  EXPECT_NE(read_file(out).find("stop requested by signal"), std::string::npos) << read_file(out);
  const std::string latest = read_file(dir + "/checkpoints/latest");
  EXPECT_TRUE(latest == "step_00000010.h5\n" || latest == "step_00000011.h5\n") << latest;
  ASSERT_EQ(tessera(2, args(dir, "--resume auto")).exit_code, 0);
  const auto got = train_losses(dir);
  for (std::int64_t s = 1; s <= 30; ++s) EXPECT_EQ(got.at(s), losses30().at(s)) << "step " << s;
}

}  // namespace
}  // namespace tessera::test
