// `tessera diff` on checkpoints of real short runs and on copies changed by h5py.
// Oracles: a file against itself or its copy (all zeros), the 1-rank run against the 2-rank run
// (DESIGN.md's 1e-5), a difference put in by hand (its exact value, computed by numpy), the
// same report on 1, 2 and 3 ranks, and the exit codes of DESIGN.md and `--help`.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "run_helpers.hpp"

namespace tessera::test {
namespace {

namespace fs = std::filesystem;

const std::string deck = std::string(TESSERA_SOURCE_DIR) + "/tests/integration/mlp_test.toml";

// One row of `tessera diff --csv`.
struct CsvRow {
  std::string shape, max_abs, max_rel, status;
};

// The report alone: from its first line ("A  <path> ..."), without what the runtime may print
// before it on each rank (an OpenMP Kokkos warns about OMP_PROC_BIND and oversubscription).
std::string report_of(const std::string& output) {
  const std::size_t at = output.rfind("\nA  ", output.find("\nB  "));
  return at == std::string::npos ? output : output.substr(at + 1);
}

std::map<std::string, CsvRow> read_csv(const std::string& path) {
  std::map<std::string, CsvRow> rows;
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  EXPECT_EQ(line, "name,shape,max_abs,max_rel,status") << path;
  while (std::getline(in, line)) {
    std::vector<std::string> f;
    std::stringstream ss(line);
    for (std::string cell; std::getline(ss, cell, ',');) f.push_back(cell);
    if (line.back() == ',') f.emplace_back();
    EXPECT_EQ(f.size(), 5u) << line;
    if (f.size() == 5) rows[f[0]] = {f[1], f[2], f[3], f[4]};
  }
  return rows;
}

// Runs python (Debian's, with h5py and numpy) on a script; returns its output.
std::string python(const std::string& dir, const std::string& script, const std::string& args) {
  const std::string file = dir + "/script.py";
  std::ofstream(file) << script;
  const RunResult r = shell(fmt::format("/usr/bin/python3 {} {}", file, args));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return r.output;
}

// Checkpoints of mlp_test.toml at step 30: on 1 rank, on 2 ranks, and of a deeper model.
class Diff : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    for (const auto& [name, ranks, extra] :
         {std::tuple<std::string, int, std::string>{"np1", 1, ""},
          {"np2", 2, ""},
          {"deeper", 1, "--set 'model.hidden=[64,32,16]'"}}) {
      const std::string dir = fresh_dir("diff_" + name);
      const RunResult r = tessera(ranks, fmt::format("train {} --set data.path={} --set run.output_dir={} {}", deck,
                                                     fashion_mnist(), dir, extra));
      ASSERT_EQ(r.exit_code, 0) << r.output;
      checkpoints()[name] = dir + "/checkpoints/step_00000030.h5";
    }
  }
  static std::map<std::string, std::string>& checkpoints() {
    static std::map<std::string, std::string> paths;
    return paths;
  }
  static const std::string& ckpt(const std::string& name) { return checkpoints().at(name); }
};

TEST_F(Diff, CheckpointAgainstItselfAndItsCopyIsAllZeros) {
  const std::string dir = fresh_dir("diff_same");
  fs::copy_file(ckpt("np1"), dir + "/copy.h5");
  for (const std::string& other : {ckpt("np1"), dir + "/copy.h5"}) {
    const RunResult r = tessera(1, fmt::format("diff {} {} --tolerance 0 --csv {}/d.csv", ckpt("np1"), other, dir));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("attributes: the same"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("12 tensors: 12 compared, 0 only in A, 0 only in B, 0 with different shapes"),
              std::string::npos)
        << r.output;
    EXPECT_NE(r.output.find("tolerance 0: passed"), std::string::npos) << r.output;
    const auto rows = read_csv(dir + "/d.csv");
    ASSERT_EQ(rows.size(), 12u);
    for (const auto& [name, row] : rows) {
      EXPECT_EQ(row.status, "equal") << name;
      EXPECT_EQ(row.max_abs, "0") << name;
      EXPECT_EQ(row.max_rel, "0") << name;
    }
    EXPECT_EQ(rows.at("model/layers.0.weight").shape, "64x784");
    EXPECT_EQ(rows.at("optimizer/layers.2.bias/momentum").shape, "10");
  }
}

TEST_F(Diff, TwoRankRunEqualsOneRankRunWithinDesignTolerance) {
  const std::string dir = fresh_dir("diff_layouts");
  const RunResult r = tessera(1, fmt::format("diff {} {} --tolerance 1e-5 --csv {}/d.csv", ckpt("np1"), ckpt("np2"), dir));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("tolerance 1e-05: passed"), std::string::npos) << r.output;
  // The layouts differ, and the report says so.
  EXPECT_NE(r.output.find("layout  A \"dp=1,tp=1,pp=1,zero=0\"  B \"dp=2,tp=1,pp=1,zero=0\""), std::string::npos)
      << r.output;
  const auto rows = read_csv(dir + "/d.csv");
  ASSERT_EQ(rows.size(), 12u);
  for (const auto& [name, row] : rows) {
    EXPECT_TRUE(row.status == "differs" || row.status == "equal") << name << " " << row.status;
    EXPECT_LE(std::stod(row.max_rel), 1e-5) << name;
  }
  // The same report whatever the rank count of diff itself (rows split among ranks, maxima reduced).
  for (int ranks : {2, 3}) {
    const std::string csv = fmt::format("{}/d{}.csv", dir, ranks);
    const RunResult rn = tessera(ranks, fmt::format("diff {} {} --tolerance 1e-5 --csv {}", ckpt("np1"), ckpt("np2"), csv));
    ASSERT_EQ(rn.exit_code, 0) << rn.output;
    EXPECT_EQ(report_of(rn.output), report_of(r.output)) << ranks << " ranks";
    EXPECT_EQ(read_file(csv), read_file(dir + "/d.csv")) << ranks << " ranks";
  }
}

// Python twin of io/tensor_check.hpp's checksum: the sum modulo 2^64 over the elements of a
// 64-bit mix of (row-major index, float32 bits).
constexpr const char* kChecksumPy =
    "import h5py,numpy as np,sys\n"
    "def checksum(a):\n"
    "  x=np.arange(a.size,dtype=np.uint64)*np.uint64(0x9E3779B97F4A7C15)+a.ravel().view(np.uint32).astype(np.uint64)\n"
    "  for s,m in ((30,0xBF58476D1CE4E5B9),(27,0x94D049BB133111EB),(31,None)):\n"
    "    x^=x>>np.uint64(s)\n"
    "    if m: x*=np.uint64(m)\n"
    "  return int(x.sum(dtype=np.uint64))\n";

TEST_F(Diff, OneChangedElementIsReportedWithItsExactDifference) {
  const std::string dir = fresh_dir("diff_changed");
  const std::string changed = dir + "/changed.h5";
  fs::copy_file(ckpt("np1"), changed);
  // Add 0.25 to one weight; print the difference as float32 arithmetic makes it, and the
  // expected max_rel, in full precision.
  // The checksum attribute follows the change (docs/design.md "Checkpoints" gives its formula),
  // as it would in a checkpoint that was written with these values.
  const std::string out = python(dir,
                                 std::string(kChecksumPy) +
                                 "with h5py.File(sys.argv[1],'r+') as f:\n"
                                 "  d=f['model/layers.1.weight']; a=d[()]\n"
                                 "  assert int(d.attrs['checksum'])==checksum(a)\n"
                                 "  b=a.copy(); b[3,5]=np.float32(b[3,5]+np.float32(0.25)); d[...]=b\n"
                                 "  d.attrs['checksum']=np.uint64(checksum(b))\n"
                                 "diff=abs(float(b[3,5])-float(a[3,5]))\n"
                                 "scale=max(np.abs(a).max(),np.abs(b).max())\n"
                                 "print(repr(diff), repr(diff/float(scale)))\n",
                                 changed);
  std::istringstream expected(out);
  double max_abs = 0, max_rel = 0;
  expected >> max_abs >> max_rel;
  ASSERT_GT(max_abs, 0.2) << out;

  const RunResult r = tessera(1, fmt::format("diff {} {} --csv {}/d.csv", ckpt("np1"), changed, dir));
  ASSERT_EQ(r.exit_code, 0) << r.output;  // no tolerance: 0 whatever the differences
  auto rows = read_csv(dir + "/d.csv");
  ASSERT_EQ(rows.size(), 12u);
  for (const auto& [name, row] : rows) {
    if (name == "model/layers.1.weight") continue;
    EXPECT_EQ(row.status, "equal") << name;
  }
  const CsvRow& row = rows.at("model/layers.1.weight");
  EXPECT_EQ(row.status, "differs");
  EXPECT_EQ(std::stod(row.max_abs), max_abs);
  EXPECT_NEAR(std::stod(row.max_rel), max_rel, 1e-15 * max_rel);
  EXPECT_NE(r.output.find(fmt::format("max_abs {:.3e} (model/layers.1.weight)", max_abs)), std::string::npos)
      << r.output;

  // With a tolerance: the tensor is marked and the exit code is 1, with or without the optimizer.
  for (const std::string extra : {"", " --model-only"}) {
    const RunResult t =
        tessera(2, fmt::format("diff {} {} --tolerance 1e-5 --csv {}/t.csv{}", ckpt("np1"), changed, dir, extra));
    EXPECT_EQ(t.exit_code, 1) << t.output;
    EXPECT_NE(t.output.find("tolerance 1e-05: FAILED (1 tensors exceed it"), std::string::npos) << t.output;
    rows = read_csv(dir + "/t.csv");
    EXPECT_EQ(rows.size(), extra.empty() ? 12u : 6u);
    EXPECT_EQ(rows.at("model/layers.1.weight").status, "exceeds");
  }
  // A looser tolerance passes.
  EXPECT_EQ(tessera(1, fmt::format("diff {} {} --tolerance 0.9", ckpt("np1"), changed)).exit_code, 0);
}

TEST_F(Diff, LargeTensorsAreComparedInBlocksOnAnyRankCount) {
  // Hand-made checkpoints (format_version 1: no checksums): a 1500x1000 tensor (more than one
  // read block of 2^20 elements) that differs only at its last element; and one with a NaN, which
  // no checkpoint holds: that file is refused as damaged, on any rank count.
  const std::string dir = fresh_dir("diff_large");
  python(dir,
         "import h5py,numpy as np,sys\n"
         "a=np.random.default_rng(1).normal(size=(1500,1000)).astype(np.float32)\n"
         "b=a.copy(); b[-1,-1]=np.float32(b[-1,-1]+np.float32(3.0))\n"
         "m=np.arange(6,dtype=np.float32); n=m.copy(); n[2]=np.nan\n"
         "for path,x,y in ((sys.argv[1],a,m),(sys.argv[2],b,m),(sys.argv[4],a,n)):\n"
         "  with h5py.File(path,'w') as f:\n"
         "    f.attrs['format']='tessera-checkpoint'; f.attrs['format_version']=np.int64(1)\n"
         "    f['model/big']=x; f['optimizer/small/momentum']=y\n"
         "d=abs(float(b[-1,-1])-float(a[-1,-1]))\n"
         "open(sys.argv[3],'w').write(repr(d))\n",
         fmt::format("{0}/a.h5 {0}/b.h5 {0}/expected.txt {0}/nan.h5", dir));
  const double expected = std::stod(read_file(dir + "/expected.txt"));
  for (int ranks : {1, 2, 3}) {
    const RunResult r = tessera(ranks, fmt::format("diff {0}/a.h5 {0}/b.h5 --csv {0}/d.csv", dir));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const auto rows = read_csv(dir + "/d.csv");
    EXPECT_EQ(std::stod(rows.at("model/big").max_abs), expected) << ranks << " ranks";
    EXPECT_EQ(rows.at("optimizer/small/momentum").status, "equal") << ranks << " ranks";
    const std::string nan_args = fmt::format("diff {0}/a.h5 {0}/nan.h5", dir);
    const RunResult nan = ranks == 1 ? tessera_alone(nan_args) : tessera(ranks, nan_args);
    EXPECT_EQ(nan.exit_code, 2) << nan.output;
    EXPECT_NE(nan.output.find("nan.h5: dataset optimizer/small/momentum holds a NaN or infinite value at element 2"),
              std::string::npos) << nan.output;
  }
}

TEST_F(Diff, DifferentModelShapesAreReported) {
  const std::string dir = fresh_dir("diff_shapes");
  // hidden [64,32] against [64,32,16]: layers.2 changes shape, layers.3 only in B.
  const RunResult r = tessera(1, fmt::format("diff {} {} --csv {}/d.csv", ckpt("np1"), ckpt("deeper"), dir));
  ASSERT_EQ(r.exit_code, 0) << r.output;  // no tolerance: reported, not failed
  auto rows = read_csv(dir + "/d.csv");
  ASSERT_EQ(rows.size(), 16u);
  EXPECT_EQ(rows.at("model/layers.2.weight").status, "shape_differs");
  EXPECT_EQ(rows.at("model/layers.2.weight").shape, "10x32 vs 16x32");
  EXPECT_EQ(rows.at("model/layers.2.weight").max_abs, "");
  EXPECT_EQ(rows.at("optimizer/layers.2.bias/momentum").status, "shape_differs");
  EXPECT_EQ(rows.at("model/layers.3.weight").status, "only_in_b");
  EXPECT_EQ(rows.at("model/layers.3.weight").shape, "10x16");
  EXPECT_EQ(rows.at("optimizer/layers.3.bias/momentum").status, "only_in_b");
  EXPECT_EQ(rows.at("model/layers.0.weight").status, "differs");
  EXPECT_NE(r.output.find("[10,32] vs [16,32]"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("16 tensors: 8 compared, 0 only in A, 4 only in B, 4 with different shapes"),
            std::string::npos)
      << r.output;

  // Swapped, model only, with a tolerance: only in A, and exit 1 even with a huge tolerance.
  const RunResult t =
      tessera(2, fmt::format("diff {} {} --model-only --tolerance 1e9 --csv {}/t.csv", ckpt("deeper"), ckpt("np1"), dir));
  EXPECT_EQ(t.exit_code, 1) << t.output;
  rows = read_csv(dir + "/t.csv");
  EXPECT_EQ(rows.size(), 8u);
  EXPECT_EQ(rows.at("model/layers.3.bias").status, "only_in_a");
  EXPECT_NE(t.output.find("tolerance 1e+09: FAILED (0 tensors exceed it, 2 in one file only, 2 with different shapes)"),
            std::string::npos)
      << t.output;
}

TEST_F(Diff, MissingOrWrongFilesExitTwoWithOneLine) {
  const std::string dir = fresh_dir("diff_errors");
  std::ofstream(dir + "/notes.txt") << "not a checkpoint\n";
  const std::pair<std::string, std::string> cases[] = {
      {fmt::format("diff {} {}/missing.h5", ckpt("np1"), dir), fmt::format("{}/missing.h5: no such file", dir)},
      {fmt::format("diff {}/missing.h5 {}", dir, ckpt("np1")), fmt::format("{}/missing.h5: no such file", dir)},
      {fmt::format("diff {}/notes.txt {}", dir, ckpt("np1")), fmt::format("{}/notes.txt: not an HDF5 file", dir)},
      {fmt::format("diff {} {}", ckpt("np1"), fashion_mnist()), fmt::format("{}: not a Tessera checkpoint", fashion_mnist())},
      {fmt::format("diff {} {} --tolerance -1", ckpt("np1"), ckpt("np2")), "--tolerance -1"},
      {fmt::format("diff {} {} --csv {}/no/such/dir/d.csv", ckpt("np1"), ckpt("np2"), dir), "cannot open for writing"},
  };
  // Every case on 1 rank, the first two also on 2.
  for (std::size_t i = 0; i < std::size(cases) + 2; ++i) {
    const int ranks = i < std::size(cases) ? 1 : 2;
    const auto& [args, needle] = cases[i % std::size(cases)];
    const RunResult r = ranks == 1 ? tessera_alone(args) : tessera(ranks, args);
    EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.output;
    EXPECT_EQ(count(r.output, "tessera: error:"), 1) << r.output;
    EXPECT_NE(r.output.find(needle), std::string::npos) << r.output;
  }
}

TEST_F(Diff, HelpDocumentsTheExitCodes) {
  const RunResult r = tessera(1, "diff --help");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  for (const char* needle : {"--tolerance", "--csv", "--model-only", "Exit codes: 0", "1 with --tolerance", "2 bad input"})
    EXPECT_NE(r.output.find(needle), std::string::npos) << needle << "\n" << r.output;
}

}  // namespace
}  // namespace tessera::test
