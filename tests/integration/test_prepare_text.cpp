// `tessera prepare text` and tools/prepare_corpus.sh. Oracles: the bytes of the input files
// (read back through h5py, an independent reader), the split sizes from the fraction, and the
// exit codes and single error line of DESIGN.md, with no output file left behind.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "run_helpers.hpp"

namespace tessera::test {
namespace {

namespace fs = std::filesystem;

// Checks a prepared file against its inputs with h5py: train + val tokens are the inputs' bytes
// in order, val is the last round(fraction * T) (at least 1, at most T - 1), and the attributes.
const char* const kCheckScript = R"(import h5py, json, sys
out, fraction, inputs = sys.argv[1], float(sys.argv[2]), sys.argv[3:]
data = b''.join(open(p, 'rb').read() for p in inputs)
T = len(data)
V = min(max(round(fraction * T), 1), T - 1)
with h5py.File(out, 'r') as f:
    train, val = f['train/tokens'], f['val/tokens']
    assert train.dtype == 'uint8' and val.dtype == 'uint8', (train.dtype, val.dtype)
    assert train.shape == (T - V,) and val.shape == (V,), (train.shape, val.shape, T, V)
    assert train[()].tobytes() + val[()].tobytes() == data
    a = f.attrs
    assert a['vocab_size'] == 256 and a['tokenizer'] == 'bytes', dict(a)
    assert a['format'] == 'tessera-dataset' and abs(a['val_fraction'] - fraction) < 1e-15
    assert a['source_count'] == len(inputs)
    for i, p in enumerate(inputs):
        assert a[f'source_{i}_path'] == p and a[f'source_{i}_bytes'] == len(open(p, 'rb').read())
    assert f['train'].attrs['start'] == 0 and f['val'].attrs['start'] == T - V
    assert sorted(f.keys()) == ['train', 'val'], list(f.keys())
print('ok', T - V, V)
)";

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

RunResult check_file(const std::string& dir, const std::string& out, const std::string& fraction,
                     const std::string& inputs) {
  std::ofstream(dir + "/check.py") << kCheckScript;
  return shell(fmt::format("/usr/bin/python3 {}/check.py {} {} {}", dir, out, fraction, inputs));
}

TEST(PrepareText, TokensAreTheBytesOfTheInputsInOrderWithTheTailHeldOut) {
  const std::string dir = fresh_dir("text_roundtrip");
  // Every byte value, including 0 and 255, and random bytes in a second file.
  std::string all(256, '\0');
  for (int i = 0; i < 256; ++i) all[static_cast<std::size_t>(i)] = static_cast<char>(i);
  std::mt19937 rng(5);
  std::string noise(3001, '\0');
  for (char& c : noise) c = static_cast<char>(rng() & 0xff);
  write_bytes(dir + "/a.txt", "First file.\n" + all);
  write_bytes(dir + "/b.bin", noise);
  write_bytes(dir + "/c.txt", "xy");
  const std::string abc = fmt::format("{0}/a.txt {0}/b.bin {0}/c.txt", dir);

  for (const auto& [ranks, fraction] : std::vector<std::pair<int, std::string>>{{1, "0.25"}, {2, "0.003"}, {1, ""}}) {
    const std::string out = fmt::format("{}/sub/out_{}_{}.h5", dir, ranks, fraction);
    const std::string option = fraction.empty() ? "" : "--val-fraction " + fraction;
    const RunResult r = tessera(ranks, fmt::format("prepare text --out {} {} {}", out, option, abc));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_FALSE(fs::exists(out + ".tmp"));
    const RunResult c = check_file(dir, out, fraction.empty() ? "0.1" : fraction, abc);  // 0.1: the default
    EXPECT_EQ(c.exit_code, 0) << c.output;
    EXPECT_NE(c.output.find("ok"), std::string::npos) << c.output;
  }
  // The split sizes in numbers: 12 + 256 + 3001 + 2 = 3271 bytes; 0.25 of it is 817.75 -> 818.
  EXPECT_NE(tessera(1, fmt::format("prepare text --out {}/q.h5 --val-fraction 0.25 {}", dir, abc)).output.find(
                "2453 train and 818 val byte tokens from 3 files"),
            std::string::npos);
  // Two bytes are the least there is: one each, whatever the fraction.
  for (const char* fraction : {"0.01", "0.99"}) {
    const RunResult r = tessera(1, fmt::format("prepare text --out {0}/two.h5 --val-fraction {1} {0}/c.txt", dir, fraction));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("1 train and 1 val"), std::string::npos) << r.output;
    EXPECT_EQ(check_file(dir, dir + "/two.h5", fraction, dir + "/c.txt").exit_code, 0);
  }
}

TEST(PrepareText, BadInputExitsTwoWithOneLineAndLeavesNoFile) {
  const std::string dir = fresh_dir("text_errors");
  write_bytes(dir + "/ok.txt", "some text\n");
  write_bytes(dir + "/empty.txt", "");
  write_bytes(dir + "/one.txt", "x");
  const std::string out = dir + "/out.h5";
  const std::pair<std::string, std::string> cases[] = {
      {fmt::format("{0}/ok.txt {0}/missing.txt", dir), fmt::format("{}/missing.txt: no such file", dir)},
      {fmt::format("{0}/ok.txt {0}/empty.txt", dir), fmt::format("{}/empty.txt: empty file", dir)},
      {fmt::format("{0}/one.txt", dir), "at least 2"},
      {fmt::format("{0}", dir), "is a directory"},
      {fmt::format("--val-fraction 0 {0}/ok.txt", dir), "--val-fraction 0: must be between 0 and 1"},
      {fmt::format("--val-fraction 1 {0}/ok.txt", dir), "--val-fraction 1: must be between 0 and 1"},
      {fmt::format("--val-fraction -0.5 {0}/ok.txt", dir), "--val-fraction -0.5"},
      {fmt::format("--val-fraction 1.5 {0}/ok.txt", dir), "--val-fraction 1.5"},
      {"", "inputs is required"},
  };
  // Every case on 1 rank, the first two also on 2 (an error only rank 0 sees, shared by agree()).
  for (std::size_t i = 0; i < std::size(cases) + 2; ++i) {
    const int ranks = i < std::size(cases) ? 1 : 2;
    const auto& [args, needle] = cases[i % std::size(cases)];
    const std::string command = fmt::format("prepare text --out {} {}", out, args);
    const RunResult r = ranks == 1 ? tessera_alone(command) : tessera(ranks, command);
    EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.output;
    EXPECT_EQ(count(r.output, "tessera: error:"), 1) << r.output;
    EXPECT_NE(r.output.find(needle), std::string::npos) << r.output;
    EXPECT_FALSE(fs::exists(out)) << args;
    EXPECT_FALSE(fs::exists(out + ".tmp")) << args;
  }
  // An output that is one of the inputs is refused, and the input is left as it was.
  const RunResult same = tessera_alone(fmt::format("prepare text --out {0}/ok.txt {0}/ok.txt", dir));
  EXPECT_EQ(same.exit_code, 2) << same.output;
  EXPECT_NE(same.output.find("is also an input"), std::string::npos) << same.output;
  EXPECT_EQ(read_file(dir + "/ok.txt"), "some text\n");
  // An existing output survives a failed run unchanged.
  ASSERT_EQ(tessera(1, fmt::format("prepare text --out {0} {1}/ok.txt", out, dir)).exit_code, 0);
  const std::string before = read_file(out);
  EXPECT_EQ(tessera_alone(fmt::format("prepare text --out {0} {1}/ok.txt {1}/missing.txt", out, dir)).exit_code, 2);
  EXPECT_EQ(read_file(out), before);
  EXPECT_FALSE(fs::exists(out + ".tmp"));
}

// The default corpus: needs Debian's bible-kjv and bible-kjv-text (tools/setup.sh installs
// them); without them this test fails, it does not skip.
TEST(PrepareText, CorpusScriptWritesTheWholeKingJamesBible) {
  const std::string dir = fresh_dir("text_corpus");
  const RunResult r = shell(fmt::format("DATA_DIR={} TESSERA={} {}/tools/prepare_corpus.sh", dir, TESSERA_BINARY,
                                        TESSERA_SOURCE_DIR));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string text = read_file(dir + "/kjv.txt");
  EXPECT_GT(text.size(), 4'300'000u);  // "about 4.4 MB" (bible(1)); 4404412 bytes in bible-kjv 4.38
  EXPECT_LT(text.size(), 4'500'000u);
  EXPECT_EQ(text.rfind("Ge1:1 In the beginning God created the heaven and the earth.\n", 0), 0u);
  EXPECT_NE(text.find("\nRev22:21 The grace of our Lord Jesus Christ be with you all. Amen.\n"), std::string::npos);
  const RunResult c = check_file(dir, dir + "/corpus.h5", "0.1", dir + "/kjv.txt");
  EXPECT_EQ(c.exit_code, 0) << c.output;
}

}  // namespace
}  // namespace tessera::test
