// `tessera prepare text --tokenizer`: the ids in the file are Hugging Face tokenizers' (the
// fixtures of tests/data/bpe, made by tools/make_bpe_fixtures.py), read back through h5py, on 1
// and 2 ranks; a pre-tokenizer that joins lines falls back to whole files and still gives the
// 1-rank file; bad input exits 2 with one error line naming the file, leaving no file behind;
// generate encodes and decodes with the tokenizer the dataset stores.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "run_helpers.hpp"

namespace tessera::test {
namespace {

namespace fs = std::filesystem;

const std::string kData = std::string(TESSERA_SOURCE_DIR) + "/tests/data/bpe";

// Checks each (out, expected ids files, tokenizer files...) group: train + val is the
// concatenation of the ids, val the last round(0.3 T), uint16, the attributes and the stored
// tokenizer files, byte for byte, with their SHA-256.
const char* const kCheckScript = R"(import h5py, hashlib, sys, numpy as np
for group in sys.argv[1:]:
    out, ids, files = group.split('|')
    expected = np.concatenate([np.loadtxt(p, dtype=np.int64, ndmin=1) for p in ids.split(',')])
    T = len(expected); V = min(max(round(0.3 * T), 1), T - 1)
    with h5py.File(out, 'r') as f:
        train, val = f['train/tokens'], f['val/tokens']
        assert train.dtype == 'uint16' and val.dtype == 'uint16', (train.dtype, val.dtype)
        got = np.concatenate([train[()], val[()]]).astype(np.int64)
        assert val.shape == (V,) and np.array_equal(got, expected), (out, T, V, len(got), np.nonzero(got[:T] != expected[:len(got)])[0][:5])
        a = f.attrs
        assert a['tokenizer'] == 'bpe' and a['vocab_size'] == max(expected.max() + 1, a['vocab_size']) and a['format'] == 'tessera-dataset'
        for i, path in enumerate(files.split(',')):
            key = 'tokenizer_merges' if path.endswith('merges.txt') else 'tokenizer_source'
            data = open(path, 'rb').read()
            name = path.split('/')[-1]
            assert f['tokenizer/' + name][()].tobytes() == data, name
            assert a[key] == path and a[key + '_sha256'] == hashlib.sha256(data).hexdigest(), key
        assert f['val'].attrs['start'] == T - V
    print('ok', out, T)
)";

struct Variant {
  std::string name, options, ids_suffix, files;
};

std::vector<Variant> variants() {
  return {{"gpt2", fmt::format("--tokenizer {}/gpt2/tokenizer.json", kData), "", kData + "/gpt2/tokenizer.json"},
          {"gpt2-files", fmt::format("--tokenizer {0}/gpt2/vocab.json --merges {0}/gpt2/merges.txt", kData), "_files",
           fmt::format("{0}/gpt2/vocab.json,{0}/gpt2/merges.txt", kData)},
          {"llama3", fmt::format("--tokenizer {}/llama3/tokenizer.json", kData), "", kData + "/llama3/tokenizer.json"},
          {"qwen2", fmt::format("--tokenizer {}/qwen2/tokenizer.json", kData), "", kData + "/qwen2/tokenizer.json"}};
}

TEST(PrepareTokens, IdsAreHuggingFacesOnOneAndTwoRanks) {
  const std::string dir = fresh_dir("tokens_hf");
  const std::string inputs = fmt::format("{0}/kjv_slice.txt {0}/nonascii.txt {0}/invalid.bin", kData);
  std::string groups;
  for (const Variant& v : variants()) {
    const std::string folder = v.name.substr(0, v.name.find('-'));
    const std::string ids = fmt::format("{0}/{1}/kjv_slice{2}.ids,{0}/{1}/nonascii{2}.ids,{0}/{1}/invalid{2}.ids",
                                        kData, folder, v.ids_suffix);
    for (const int ranks : {1, 2}) {
      if (ranks == 2 && v.name != "gpt2" && v.name != "qwen2") continue;
      const std::string out = fmt::format("{}/{}_{}.h5", dir, v.name, ranks);
      const RunResult r = tessera(ranks, fmt::format("prepare text --out {} --val-fraction 0.3 --invalid-utf8 replace "
                                                     "{} {}", out, v.options, inputs));
      ASSERT_EQ(r.exit_code, 0) << r.output;
      EXPECT_NE(r.output.find(fmt::format("on {} rank", ranks)), std::string::npos) << r.output;
      groups += fmt::format(" '{}|{}|{}'", out, ids, v.files);
    }
  }
  std::ofstream(dir + "/check.py") << kCheckScript;
  const RunResult c = shell(fmt::format("{} {}/check.py{}", TESSERA_TOOLS_PYTHON, dir, groups));
  EXPECT_EQ(c.exit_code, 0) << c.output;
  EXPECT_EQ(count(c.output, "ok "), 6) << c.output;
}

// A Split expression that makes the whole text one pre-token crosses every line cut: 2 ranks
// must notice, encode whole files instead, and write the 1-rank file.
TEST(PrepareTokens, APreTokenizerThatJoinsLinesFallsBackToWholeFiles) {
  const std::string dir = fresh_dir("tokens_fallback");
  std::string json = read_file(kData + "/gpt2/tokenizer.json");
  const std::string from = R"("pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true})";
  const auto at = json.find(from);
  ASSERT_NE(at, std::string::npos);
  json.replace(at, from.size(), R"("pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": "(?s).{1,400}"}, "behavior": "Isolated", "invert": false}, {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}]})");
  std::ofstream(dir + "/joined.json") << json;
  std::string h5[2];
  for (const int ranks : {1, 2}) {
    const std::string out = fmt::format("{}/out_{}.h5", dir, ranks);
    const RunResult r = tessera(ranks, fmt::format("prepare text --out {} --tokenizer {}/joined.json {}/kjv_slice.txt",
                                                   out, dir, kData));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    h5[ranks - 1] = out;
  }
  const RunResult d = shell(fmt::format("h5diff -c {} {} /train/tokens && h5diff -c {} {} /val/tokens && echo same",
                                        h5[0], h5[1], h5[0], h5[1]));
  EXPECT_NE(d.output.find("same"), std::string::npos) << d.output;
}

TEST(PrepareTokens, BadInputExitsTwoWithOneLineNamingTheFileAndLeavesNoFile) {
  const std::string dir = fresh_dir("tokens_errors");
  const std::string good = read_file(kData + "/gpt2/tokenizer.json");
  const auto write = [&](const std::string& name, const std::string& from, const std::string& to) {
    std::string s = good;
    s.replace(s.find(from), from.size(), to);
    std::ofstream(dir + "/" + name) << s;
  };
  write("wordpiece.json", "\"type\": \"BPE\"", "\"type\": \"WordPiece\"");
  write("unigram.json", "\"type\": \"BPE\"", "\"type\": \"Unigram\"");
  write("nobyte.json", "\"!\": ", "\"not-a-byte\": ");
  std::ofstream(dir + "/bad_merges.txt") << "#version: 0.2\nt h\nth e x\n";
  // Valid text, then a byte that is not UTF-8 near the end: on 2 ranks only rank 1 sees it.
  std::string text = read_file(kData + "/kjv_slice.txt");
  const std::size_t bad_at = text.size() - 100;
  text[bad_at] = '\xff';
  std::ofstream(dir + "/bad.txt", std::ios::binary) << text;
  const std::string kjv = kData + "/kjv_slice.txt", out = dir + "/out.h5";
  const std::pair<std::string, std::string> cases[] = {
      {fmt::format("--tokenizer {}/wordpiece.json {}", dir, kjv),
       fmt::format("{}/wordpiece.json: model type \"WordPiece\" is not supported", dir)},
      {fmt::format("--tokenizer {}/unigram.json {}", dir, kjv), fmt::format("{}/unigram.json: model type \"Unigram\"", dir)},
      {fmt::format("--tokenizer {}/nobyte.json {}", dir, kjv), fmt::format("{}/nobyte.json: model.vocab: no token for byte 0x21", dir)},
      {fmt::format("--tokenizer {}/gpt2/vocab.json --merges {}/bad_merges.txt {}", kData, dir, kjv),
       fmt::format("{}/bad_merges.txt: line 3: \"th e x\" is not a merge", dir)},
      {fmt::format("--tokenizer {}/missing.json {}", dir, kjv), fmt::format("{}/missing.json: cannot read the tokenizer", dir)},
      {fmt::format("--tokenizer {}/gpt2/tokenizer.json {}/bad.txt", kData, dir),
       fmt::format("{}/bad.txt: byte {} (0xff) is not UTF-8", dir, bad_at)},
      {fmt::format("--tokenizer {}/gpt2/tokenizer.json --invalid-utf8 skip {}", kData, kjv), "--invalid-utf8 skip: expected error or replace"},
      {fmt::format("--merges {}/gpt2/merges.txt {}", kData, kjv), "--merges and --invalid-utf8 go with --tokenizer"},
  };
  for (std::size_t i = 0; i < std::size(cases) + 2; ++i) {
    // Every case on 1 rank; the bad byte and WordPiece also on 2.
    // (1 rank as a login node runs it, without mpirun, whose abort after an exit code 2 takes
    // about 2 s a run.)
    const int ranks = i < std::size(cases) ? 1 : 2;
    const auto& [args, needle] = cases[i < std::size(cases) ? i : (i == std::size(cases) ? 5 : 0)];
    const std::string command = fmt::format("prepare text --out {} {}", out, args);
    const RunResult r = ranks == 1 ? shell(std::string(TESSERA_BINARY) + " " + command) : tessera(ranks, command);
    EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.output;
    EXPECT_EQ(count(r.output, "tessera: error:"), 1) << r.output;
    EXPECT_NE(r.output.find(needle), std::string::npos) << r.output;
    EXPECT_FALSE(fs::exists(out)) << args;
    EXPECT_FALSE(fs::exists(out + ".tmp")) << args;
  }
}

// `tessera generate` on a BPE dataset: the prompt encoded and the sample decoded with the
// dataset's tokenizer (a 3001-id vocabulary: byte tokens could not name most of the model's
// outputs); a prompt that is not UTF-8, and a model whose dataset is gone, are one line each.
TEST(PrepareTokens, GenerateEncodesAndDecodesWithTheDatasetsTokenizer) {
  const std::string dir = fresh_dir("tokens_generate"), data = dir + "/kjv.h5";
  ASSERT_EQ(tessera(1, fmt::format("prepare text --out {} --tokenizer {}/gpt2/tokenizer.json {}/kjv_slice.txt", data,
                                   kData, kData)).exit_code, 0);
  const std::string deck = fmt::format("{}/tests/integration/gpt_test.toml --set data.path={} --set model.width=32 "
                                       "--set model.heads=4 --set model.layers=1 --set model.context=16",
                                       TESSERA_SOURCE_DIR, data);
  const RunResult t = tessera(1, fmt::format("train {} --set train.steps=2 --set run.output_dir={}/run --set "
                                             "eval.every_steps=0 --set eval.at_end=false", deck, dir));
  ASSERT_EQ(t.exit_code, 0) << t.output;
  const std::string checkpoint = dir + "/run/checkpoints/step_00000002.h5";
  const auto generate = [&](const std::string& deck_args, const std::string& prompt) {
    return shell(fmt::format("{} generate {} --checkpoint {} --prompt '{}' --tokens 8 --temperature 0", TESSERA_BINARY,
                             deck_args, checkpoint, prompt));
  };
  const RunResult g = generate(deck, "In the beginning God");
  ASSERT_EQ(g.exit_code, 0) << g.output;
  EXPECT_TRUE(g.output.starts_with("In the beginning God")) << g.output;
  const RunResult bad = shell(fmt::format("{} generate {} --checkpoint {} --prompt \"$(printf 'In \\377')\" --tokens 2",
                                          TESSERA_BINARY, deck, checkpoint));
  expect_input_error(bad, "--prompt: byte 3 is not UTF-8, which the tokenizer of " + data + " reads");
  const RunResult gone = generate(deck + " --set data.path=" + dir + "/gone.h5", "In the");
  expect_input_error(gone, dir + "/gone.h5: no such file; data.path names the dataset whose tokenizer encodes the prompt");
}

}  // namespace
}  // namespace tessera::test
