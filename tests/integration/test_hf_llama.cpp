// Hugging Face's LlamaForCausalLM in and out, through the real binary. Oracles: an export imports
// back bit for bit (`tessera diff --tolerance 0`) with `tessera eval`'s loss unchanged, from one
// file, from shards through an index and on 2 ranks alike; config.json says what the deck says;
// tiny models that transformers itself made and evaluated (tests/data/llama, made by
// tools/make_llama_fixtures.py: Llamas, and a Mistral whose sliding window is part of the model)
// import to transformers' loss within 1e-5 and its greedy continuation byte for byte; every bad
// input is exit 2 with one line and no file. No Python runs here.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "io/safetensors.hpp"
#include "run_helpers.hpp"

namespace tessera::test {
namespace {

namespace fs = std::filesystem;

const std::string kSource = TESSERA_SOURCE_DIR;
const std::string kFixtures = kSource + "/tests/data/llama";

std::string ckpt(const std::string& run, int step) { return fmt::format("{}/checkpoints/step_{:08}.h5", run, step); }

// One rank without mpiexec: an error exit costs no MPI teardown.
RunResult direct(const std::string& args) {
  return shell(fmt::format("OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1 {} {}",
                           TESSERA_BINARY, args));
}

std::string prepared(const std::string& name, const std::string& files) {
  const std::string out = fresh_dir(name) + "/data.h5";
  const RunResult r = direct(fmt::format("prepare text --out {} {}", out, files));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return out;
}

// The GPT tests' corpus (test_export.cpp's): the README and two docs pages as bytes.
const std::string& corpus() {
  static const std::string path =
      prepared("corpus", corpus_files(3));
  return path;
}

// A llama with 4 query heads on 2 key/value heads and an untied head, on the corpus.
std::string llama_deck() {
  return fmt::format("{}/tests/integration/gpt_test.toml --set data.path={} --set model.kind=llama "
                     "--set model.layers=2 --set model.width=32 --set model.heads=4 --set model.kv_heads=2 "
                     "--set model.ffn_width=48 --set model.rope_theta=500 --set model.norm_eps=1e-6 "
                     "--set model.tie_embeddings=false",
                     kSource, corpus());
}

std::string trained(const std::string& name, const std::string& deck, int steps = 10) {
  const std::string dir = fresh_dir(name);
  const RunResult r = direct(fmt::format("train {} --set run.output_dir={} --set train.steps={} --set "
                                         "eval.every_steps=0 --set eval.at_end=false",
                                         deck, dir, steps));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return dir;
}

const std::string& llama_run() {  // 10 steps, a checkpoint at the end
  static const std::string dir = trained("llama_run", llama_deck());
  return dir;
}

// `tessera export --hf-llama` of llama_run's checkpoint, once.
const std::string& hf_export() {
  static const std::string dir = [] {
    const std::string out = fresh_dir("hf_export") + "/llama-hf";
    const RunResult r = direct(fmt::format("export {} --hf-llama --out {}", ckpt(llama_run(), 10), out));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return out;
  }();
  return dir;
}

// The loss `tessera eval` prints, as text (9 significant digits).
std::string eval_loss(const std::string& deck, const std::string& checkpoint) {
  const RunResult r = direct(fmt::format("eval {} --checkpoint {}", deck, checkpoint));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  std::smatch m;
  EXPECT_TRUE(std::regex_search(r.output, m, std::regex(R"(test loss ([0-9.eE+-]+))"))) << r.output;
  return m.size() > 1 ? m[1].str() : std::string("nan");
}

void expect_same_model(const std::string& a, const std::string& b) {
  const RunResult d = direct(fmt::format("diff {} {} --model-only --tolerance 0", a, b));
  EXPECT_EQ(d.exit_code, 0) << d.output;
}

std::vector<io::NamedTensor> read_all(const std::string& path) {
  const io::SafetensorsFile f(path);
  std::vector<io::NamedTensor> out;
  for (const auto& e : f.entries()) out.push_back({e.name, e.shape, f.read(e)});
  return out;
}

// Splits a safetensors file into `shards` files of dir named as save_pretrained names them, with
// model.safetensors.index.json (tensor i goes to shard i % shards); config.json copied beside.
void write_sharded(const std::string& source_dir, const std::string& dir, int shards) {
  const std::vector<io::NamedTensor> tensors = read_all(source_dir + "/model.safetensors");
  nlohmann::ordered_json index;
  index["metadata"] = {{"total_size", 0}};
  std::uint64_t bytes = 0;
  for (int s = 0; s < shards; ++s) {
    const std::string name = fmt::format("model-{:05}-of-{:05}.safetensors", s + 1, shards);
    std::vector<io::NamedTensor> part;
    for (std::size_t i = s; i < tensors.size(); i += static_cast<std::size_t>(shards)) {
      part.push_back(tensors[i]);
      index["weight_map"][tensors[i].name] = name;
      bytes += tensors[i].values.size() * 4;
    }
    io::write_safetensors(dir + "/" + name, part, {{"format", "pt"}});
  }
  index["metadata"]["total_size"] = bytes;
  std::ofstream(dir + "/model.safetensors.index.json") << index.dump(2);
  fs::copy_file(source_dir + "/config.json", dir + "/config.json", fs::copy_options::overwrite_existing);
}

// --- Export, and back -------------------------------------------------------------------------

TEST(HfLlama, ExportIsLlamaForCausalLMWithItsConfigAndImportsBackBitForBit) {
  const std::string hf = hf_export();
  const auto config = nlohmann::json::parse(read_file(hf + "/config.json"));
  EXPECT_EQ(config["architectures"], nlohmann::json::array({"LlamaForCausalLM"}));
  EXPECT_EQ(config["model_type"], "llama");
  EXPECT_EQ(config["vocab_size"], 256);
  EXPECT_EQ(config["hidden_size"], 32);
  EXPECT_EQ(config["intermediate_size"], 48);
  EXPECT_EQ(config["num_hidden_layers"], 2);
  EXPECT_EQ(config["num_attention_heads"], 4);
  EXPECT_EQ(config["num_key_value_heads"], 2);
  EXPECT_EQ(config["head_dim"], 8);
  EXPECT_EQ(config["max_position_embeddings"], 32);
  EXPECT_DOUBLE_EQ(config["rms_norm_eps"].get<double>(), 1e-6);
  EXPECT_DOUBLE_EQ(config["rope_theta"].get<double>(), 500.0);
  EXPECT_TRUE(config["rope_scaling"].is_null());
  EXPECT_EQ(config["tie_word_embeddings"], false);
  EXPECT_EQ(config["attention_bias"], false);
  EXPECT_EQ(config["mlp_bias"], false);
  EXPECT_EQ(config["hidden_act"], "silu");
  EXPECT_EQ(config["torch_dtype"], "float32");
  EXPECT_TRUE(config["bos_token_id"].is_null() && config["eos_token_id"].is_null());

  // Hugging Face's names, nn.Linear's [out, in] as Tessera's: renamed, not reshaped; the same
  // values as the torch-names export's, tensor by tensor.
  const std::string plain = fresh_dir("plain") + "/model.safetensors";
  ASSERT_EQ(direct(fmt::format("export {} --out {}", ckpt(llama_run(), 10), plain)).exit_code, 0);
  const auto model_json = nlohmann::json::parse(read_file(fs::path(plain).replace_extension(".json").string()));
  EXPECT_EQ(model_json["kind"], "llama");
  EXPECT_EQ(model_json["kv_heads"], 2);
  EXPECT_EQ(model_json["ffn_width"], 48);
  EXPECT_EQ(model_json["tensors"].size(), 21u);
  const io::SafetensorsFile h(hf + "/model.safetensors"), p(plain);
  std::vector<std::pair<std::string, std::string>> names = {{"model.embed_tokens.weight", "wte.weight"},
                                                            {"model.norm.weight", "ln_f.weight"},
                                                            {"lm_head.weight", "lm_head.weight"}};
  for (int i = 0; i < 2; ++i)
    for (const auto& [theirs, ours] : std::vector<std::pair<std::string, std::string>>{
             {"input_layernorm", "ln_1"}, {"self_attn.q_proj", "attn.q"}, {"self_attn.k_proj", "attn.k"},
             {"self_attn.v_proj", "attn.v"}, {"self_attn.o_proj", "attn.proj"},
             {"post_attention_layernorm", "ln_2"}, {"mlp.gate_proj", "mlp.gate"}, {"mlp.up_proj", "mlp.up"},
             {"mlp.down_proj", "mlp.proj"}})
      names.emplace_back(fmt::format("model.layers.{}.{}.weight", i, theirs), fmt::format("blocks.{}.{}.weight", i, ours));
  ASSERT_EQ(h.entries().size(), names.size());
  for (const auto& [theirs, ours] : names) {
    SCOPED_TRACE(theirs);
    const io::SafetensorsEntry* a = h.find(theirs);
    const io::SafetensorsEntry* b = p.find(ours);
    ASSERT_TRUE(a && b);
    EXPECT_EQ(a->shape, b->shape);
    EXPECT_EQ(h.read(*a), p.read(*b));
  }
  EXPECT_EQ(h.find("model.layers.1.self_attn.k_proj.weight")->shape, (std::vector<std::uint64_t>{16, 32}));
  EXPECT_EQ(h.find("model.layers.1.mlp.down_proj.weight")->shape, (std::vector<std::uint64_t>{32, 48}));

  // Back: the directory and the torch-names file: the checkpoint's parameters bit for bit, the
  // same loss (2 ranks, each reading the tensors it writes: the shards' test below).
  const std::string dir = fresh_dir("back");
  const RunResult one = direct(fmt::format("import {} --deck {} --out {}/one.h5", hf, llama_deck(), dir));
  ASSERT_EQ(one.exit_code, 0) << one.output;
  EXPECT_NE(one.output.find("llama 2 blocks x 4 heads (2 key/value)"), std::string::npos) << one.output;
  expect_same_model(ckpt(llama_run(), 10), dir + "/one.h5");
  EXPECT_EQ(eval_loss(llama_deck(), dir + "/one.h5"), eval_loss(llama_deck(), ckpt(llama_run(), 10)));
  ASSERT_EQ(direct(fmt::format("import {} --deck {} --out {}/plain.h5", plain, llama_deck(), dir)).exit_code, 0);
  expect_same_model(ckpt(llama_run(), 10), dir + "/plain.h5");
}

// A sharded copy (save_pretrained's file names and index, written here from the export) imports
// to the single file's checkpoint, through the index, its directory and on 2 ranks; so do
// LlamaModel's names (no `model.` prefix) beside lm_head.weight.
TEST(HfLlama, ShardsAndUnprefixedNamesImportAsTheSingleFile) {
  const std::string hf = hf_export();
  const std::string dir = fresh_dir("sharded");
  write_sharded(hf, dir, 3);
  const std::string out = fresh_dir("sharded_out");
  ASSERT_EQ(direct(fmt::format("import {}/model.safetensors --deck {} --out {}/single.h5", hf, llama_deck(), out)).exit_code, 0);
  const RunResult r = direct(fmt::format("import {}/model.safetensors.index.json --deck {} --out {}/index.h5", dir,
                                         llama_deck(), out));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_same_model(out + "/single.h5", out + "/index.h5");
  const RunResult two = tessera(2, fmt::format("import {} --deck {} --out {}/dir2.h5", dir, llama_deck(), out));
  ASSERT_EQ(two.exit_code, 0) << two.output;
  expect_same_model(out + "/single.h5", out + "/dir2.h5");

  std::vector<io::NamedTensor> bare = read_all(hf + "/model.safetensors");
  for (io::NamedTensor& t : bare)
    if (t.name.starts_with("model.")) t.name = t.name.substr(6);
  const std::string bare_dir = fresh_dir("bare");
  io::write_safetensors(bare_dir + "/model.safetensors", bare, {{"format", "pt"}});
  ASSERT_EQ(direct(fmt::format("import {}/model.safetensors --deck {} --out {}/bare.h5", bare_dir, llama_deck(), out)).exit_code, 0);
  expect_same_model(out + "/single.h5", out + "/bare.h5");
}

// --- Bad inputs -------------------------------------------------------------------------------

TEST(HfLlama, BadFilesConfigsAndNamingsAreOneLineAndWriteNothing) {
  const std::string hf = hf_export();
  const std::string dir = fresh_dir("bad");
  const std::string refused = dir + "/refused.h5";
  for (const char* f : {"model.safetensors", "config.json"}) fs::copy_file(hf + "/" + f, dir + "/" + f);
  const auto import_as = [&](const std::string& deck) {
    return direct(fmt::format("import {}/model.safetensors --deck {} --out {}", dir, deck, refused));
  };
  const nlohmann::json config = nlohmann::json::parse(read_file(hf + "/config.json"));
  const std::string deck_tail = " has model.";

  // config.json against the deck: each setting the deck fixes, named with both values.
  struct DeckCase {
    std::string set, needle;
  };
  for (const DeckCase& c : std::vector<DeckCase>{
           {"model.width=64", "config.json: hidden_size = 32, but the deck"},
           {"model.heads=2", "config.json: num_attention_heads = 4, but the deck"},
           {"model.kv_heads=4", "config.json: num_key_value_heads = 2, but the deck"},
           {"model.ffn_width=64", "config.json: intermediate_size = 48, but the deck"},
           {"model.layers=3", "config.json: num_hidden_layers = 2, but the deck"},
           {"model.norm_eps=1e-5", "config.json: rms_norm_eps = 1e-06, but the deck"},
           {"model.rope_theta=10000", "config.json: rope_theta = 500, but the deck"},
           {"model.context=64", "config.json: max_position_embeddings = 32, but the deck"},
           {"model.tie_embeddings=true", "config.json: tie_word_embeddings = false, but the deck"},
       }) {
    SCOPED_TRACE(c.set);
    const RunResult r = import_as(llama_deck() + " --set " + c.set);
    expect_input_error(r, c.needle);
    EXPECT_NE(r.output.find(deck_tail + c.set.substr(6, c.set.find('=') - 6) + " = "), std::string::npos) << r.output;
  }
  // Settings Tessera's llama does not have, and transformers 5's rope_parameters.
  struct ConfigCase {
    std::string key;
    nlohmann::json value;
    std::string needle;
  };
  for (const ConfigCase& c : std::vector<ConfigCase>{
           {"hidden_act", "gelu", "config.json: hidden_act = \"gelu\""},
           {"attention_bias", true, "config.json: attention_bias = true"},
           {"rope_scaling", {{"rope_type", "linear"}, {"factor", 2.0}}, "config.json: rope_scaling = {"},
           {"rope_parameters", {{"rope_theta", 500.0}, {"rope_type", "llama3"}}, "config.json: rope_parameters.rope_type = \"llama3\""},
           {"rope_parameters", {{"rope_theta", 10000.0}, {"rope_type", "default"}}, "config.json: rope_parameters.rope_theta = 10000, but the deck"},
           {"vocab_size", 512, "config.json: vocab_size = 512, but the deck"},
       }) {
    SCOPED_TRACE(c.key);
    nlohmann::json changed = config;
    changed[c.key] = c.value;
    if (c.key == "rope_parameters") changed.erase("rope_theta");
    std::ofstream(dir + "/config.json") << changed.dump(2);
    expect_input_error(import_as(llama_deck()), c.needle);
  }
  // (transformers 5's rope_parameters that agree: mha_tied below.)
  fs::remove(dir + "/config.json");  // what follows is the tensors' own evidence

  // A missing tensor, named as the file names it; a tied file (no lm_head.weight) into an untied
  // deck; an untied one into a tied deck.
  std::vector<io::NamedTensor> tensors = read_all(hf + "/model.safetensors");
  const auto write = [&](std::vector<io::NamedTensor> t) {
    io::write_safetensors(dir + "/model.safetensors", t, {{"format", "pt"}});
  };
  auto without = [&](const std::string& name) {
    std::vector<io::NamedTensor> t = tensors;
    t.erase(std::find_if(t.begin(), t.end(), [&](const io::NamedTensor& x) { return x.name == name; }));
    return t;
  };
  write(without("model.layers.1.self_attn.v_proj.weight"));
  expect_input_error(import_as(llama_deck()), "tensor model.layers.1.self_attn.v_proj.weight is missing");
  write(without("lm_head.weight"));
  expect_input_error(import_as(llama_deck()), "holds no lm_head.weight: its head is the token embedding "
                                               "model.embed_tokens.weight (tied), but the deck");
  write(tensors);
  const std::string tied = llama_deck() + " --set model.tie_embeddings=true";
  expect_input_error(import_as(tied), "tensor lm_head.weight differs from the token embedding (an untied head), but "
                                      "the deck");
  // ... where a tied file that also stores its head (equal to the embedding) imports.
  std::vector<io::NamedTensor> repeated = tensors;
  for (io::NamedTensor& t : repeated)
    if (t.name == "lm_head.weight")
      t.values = std::find_if(tensors.begin(), tensors.end(), [](const io::NamedTensor& x) {
                   return x.name == "model.embed_tokens.weight";
                 })->values;
  write(repeated);
  EXPECT_EQ(direct(fmt::format("import {}/model.safetensors --deck {} --out {}/tied.h5", dir, tied, dir)).exit_code, 0);

  // Damaged indexes: a shard missing, a tensor mapped to a shard that lacks it, a shard named
  // with a directory.
  const std::string shards = fresh_dir("bad_shards");
  write_sharded(hf, shards, 2);
  const std::string index = shards + "/model.safetensors.index.json";
  const nlohmann::json good = nlohmann::json::parse(read_file(index));
  const auto import_index = [&] {
    return direct(fmt::format("import {} --deck {} --out {}", index, llama_deck(), refused));
  };
  nlohmann::json moved = good;
  moved["weight_map"]["model.norm.weight"] =
      moved["weight_map"]["model.norm.weight"] == "model-00001-of-00002.safetensors" ? "model-00002-of-00002.safetensors"
                                                                                    : "model-00001-of-00002.safetensors";
  std::ofstream(index) << moved.dump();
  expect_input_error(import_index(), "weight_map puts tensor model.norm.weight in");
  nlohmann::json escaped = good;
  escaped["weight_map"]["model.norm.weight"] = "../model-00001-of-00002.safetensors";
  std::ofstream(index) << escaped.dump();
  expect_input_error(import_index(), "a shard is a file beside the index");
  std::ofstream(index) << good.dump();
  fs::remove(shards + "/model-00002-of-00002.safetensors");
  expect_input_error(import_index(), "model-00002-of-00002.safetensors: no such file");
  EXPECT_FALSE(fs::exists(refused));

  // Namings: --hf-gpt2 of a llama, --hf-llama of a gpt, both at once.
  const std::string gpt = trained("gpt_run", fmt::format("{}/tests/integration/gpt_test.toml --set data.path={} "
                                                         "--set model.width=32", kSource, corpus()), 1);
  expect_input_error(direct(fmt::format("export {} --hf-gpt2 --out {}/hf", ckpt(llama_run(), 10), dir)),
                     "--hf-gpt2: the model is a llama; only a gpt maps onto Hugging Face's GPT2LMHeadModel");
  expect_input_error(direct(fmt::format("export {} --hf-llama --out {}/hf", ckpt(gpt, 1), dir)),
                     "--hf-llama: the model is a gpt; only a llama maps onto Hugging Face's LlamaForCausalLM");
  expect_input_error(direct(fmt::format("export {} --hf-llama --hf-gpt2 --out {}/hf", ckpt(llama_run(), 10), dir)),
                     "excludes");
  EXPECT_FALSE(fs::exists(dir + "/hf"));
}

// --- Sliding windows: MistralForCausalLM ----------------------------------------------------------

// The llama of llama_deck() under a sliding window of 4 of its 32 positions, 10 steps, and its
// `export --hf-llama`, once. (Its test loss without the window is 3e-4 higher, relatively.)
std::string window_deck() { return llama_deck() + " --set model.window=4"; }

const std::string& window_run() {
  static const std::string dir = trained("window_run", window_deck());
  return dir;
}

const std::string& window_export() {
  static const std::string dir = [] {
    const std::string out = fresh_dir("window_export") + "/mistral-hf";
    const RunResult r = direct(fmt::format("export {} --hf-llama --out {}", ckpt(window_run(), 10), out));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return out;
  }();
  return dir;
}

// LlamaForCausalLM has no sliding window; MistralForCausalLM is a llama with one (the same tensor
// names): a window llama exports as that, config.json's sliding_window the deck's window, and
// imports back bit for bit. A window deck and a config without that window refuse each other, both
// ways; a gpt with a window has no Hugging Face form (GPT2LMHeadModel attends to every position).
TEST(HfLlama, WindowModelExportsAsMistralAndImportsBackBitForBit) {
  const std::string hf = window_export();
  const auto config = nlohmann::json::parse(read_file(hf + "/config.json"));
  EXPECT_EQ(config["architectures"], nlohmann::json::array({"MistralForCausalLM"}));
  EXPECT_EQ(config["model_type"], "mistral");
  EXPECT_EQ(config["sliding_window"], 4);
  EXPECT_EQ(config["num_key_value_heads"], 2);
  EXPECT_EQ(config["max_position_embeddings"], 32);
  EXPECT_FALSE(config.contains("attention_bias") || config.contains("mlp_bias")) << config.dump();
  const auto json = nlohmann::json::parse(read_file(hf + "/tessera.json"));
  EXPECT_EQ(json["window"], 4);
  EXPECT_EQ(nlohmann::json::parse(read_file(hf_export() + "/tessera.json"))["window"], 0);

  const std::string dir = fresh_dir("window_back");
  const RunResult r = direct(fmt::format("import {} --deck {} --out {}/back.h5", hf, window_deck(), dir));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("context 32 (sliding window 4)"), std::string::npos) << r.output;
  expect_same_model(ckpt(window_run(), 10), dir + "/back.h5");
  const std::string loss = eval_loss(window_deck(), ckpt(window_run(), 10));
  EXPECT_EQ(eval_loss(window_deck(), dir + "/back.h5"), loss);
  EXPECT_NE(eval_loss(llama_deck(), dir + "/back.h5"), loss);  // the window is part of the model

  const std::string refused = dir + "/refused.h5";
  expect_input_error(direct(fmt::format("import {} --deck {} --out {}", hf, llama_deck(), refused)),
                     "config.json: sliding_window = 4, but the deck");
  expect_input_error(direct(fmt::format("import {} --deck {} --out {}", hf_export(), window_deck(), refused)),
                     "config.json: a Llama (no sliding window), but the deck");
  const std::string gpt = trained("gpt_window_run", fmt::format("{}/tests/integration/gpt_test.toml --set data.path={} "
                                                                "--set model.width=32 --set model.window=8",
                                                                kSource, corpus()), 1);
  expect_input_error(direct(fmt::format("export {} --hf-gpt2 --out {}/gpt-hf", ckpt(gpt, 1), dir)),
                     "--hf-gpt2: the model attends through a sliding window of 8 positions");
  EXPECT_FALSE(fs::exists(refused) || fs::exists(dir + "/gpt-hf"));
}

// --- Models transformers made -----------------------------------------------------------------

// tests/data/llama: models saved by transformers' save_pretrained and evaluated by transformers on
// the /val windows of `tessera prepare text tests/data/bpe/kjv_slice.txt` (reference.json).
const nlohmann::json& reference() {
  static const nlohmann::json ref = nlohmann::json::parse(read_file(kFixtures + "/reference.json"));
  return ref;
}

const std::string& kjv() {
  static const std::string path = prepared("kjv", kSource + "/tests/data/bpe/kjv_slice.txt");
  return path;
}

// A deck of reference.json's dimensions `d` (a model's "dims") with sliding window `window`.
std::string fixture_deck(const nlohmann::json& d, int window) {
  return fmt::format(
      "{}/tests/integration/gpt_test.toml --set data.path={} --set data.test_split={} --set model.kind=llama "
      "--set model.layers={} --set model.width={} --set model.heads={} --set model.kv_heads={} "
      "--set model.ffn_width={} --set model.context={} --set model.rope_theta={} --set model.norm_eps={} "
      "--set model.tie_embeddings={} --set model.window={}",
      kSource, kjv(), reference()["data"]["split"].get<std::string>(), d["L"].get<int>(), d["C"].get<int>(),
      d["H"].get<int>(), d["KV"].get<int>(), d["F"].get<int>(), d["T"].get<int>(), d["rope_theta"].get<double>(),
      d["norm_eps"].get<double>(), d["tie_embeddings"].get<bool>(), window);
}

// `tessera eval`'s loss of checkpoint, printed beside transformers' and required within 1e-5 of both
// its float32 and float64 losses (fixture model m); returned.
double expect_transformers_loss(const std::string& deck, const std::string& checkpoint, const nlohmann::json& m,
                                const std::string& label) {
  const double loss = std::stod(eval_loss(deck, checkpoint));
  const double f32 = m["loss_float32"], f64 = m["loss_float64"];
  std::printf("%s: tessera eval %.9g, transformers float32 %.9g, float64 %.9g\n", label.c_str(), loss, f32, f64);
  EXPECT_NEAR(loss, f32, 1e-5 * f32);
  EXPECT_NEAR(loss, f64, 1e-5 * f64);
  return loss;
}

// `tessera generate --temperature 0` continues reference.json's prompt with transformers' greedy
// tokens: the prompt's bytes and the new tokens as bytes, then a newline.
void expect_transformers_greedy(const std::string& deck, const std::string& checkpoint, const nlohmann::json& m) {
  const std::string prompt = reference()["generate"]["prompt"];
  const int new_tokens = reference()["generate"]["new_tokens"];
  std::string expected;
  const std::string hex = m["generate_output_hex"];
  for (std::size_t i = 0; i + 1 < hex.size(); i += 2)
    expected.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  ASSERT_EQ(expected.substr(0, prompt.size()), prompt);
  ASSERT_EQ(expected.size(), prompt.size() + static_cast<std::size_t>(new_tokens));
  const std::string text = checkpoint + ".txt";
  const RunResult g = direct(fmt::format("generate {} --checkpoint {} --prompt '{}' --tokens {} --temperature 0 > {}",
                                         deck, checkpoint, prompt, new_tokens, text));
  ASSERT_EQ(g.exit_code, 0) << g.output;
  EXPECT_EQ(read_file(text), expected + "\n");
}

// LlamaForCausalLM models (one file, the same sharded, a tied one), imported with a deck of the same
// dimensions, give transformers' loss within 1e-5 and its greedy continuation of the prompt byte
// for byte. (The Mistral: its own test below.)
TEST(HfLlama, TransformersModelsGiveTransformersLossAndGreedyText) {
  const std::string out = fresh_dir("fixtures");
  for (const auto& [model, m] : reference()["models"].items()) {
    if (m["dims"]["window"] != 0) continue;
    const std::string deck = fixture_deck(m["dims"], 0);
    std::string first;
    for (const auto& folder : m["folders"]) {
      SCOPED_TRACE(folder.get<std::string>());
      const std::string checkpoint = fmt::format("{}/{}.h5", out, folder.get<std::string>());
      const RunResult r = direct(fmt::format("import {}/{} --deck {} --out {}", kFixtures, folder.get<std::string>(),
                                             deck, checkpoint));
      ASSERT_EQ(r.exit_code, 0) << r.output;
      if (first.empty()) first = checkpoint;
      else expect_same_model(first, checkpoint);  // the shards are the single file's tensors
      expect_transformers_loss(deck, checkpoint, m, folder.get<std::string>());
      expect_transformers_greedy(deck, checkpoint, m);
    }
  }
}

// mistral_window: a MistralForCausalLM with sliding_window 8 over the 32 positions evaluated.
// Imported with the deck's model.window = 8 it gives transformers' loss within 1e-5 and its greedy
// text byte for byte. The window is what makes it so: the same tensors imported as a
// LlamaForCausalLM into a deck without a window give transformers' Llama loss instead, 1e-3 away
// (and windows 7 and 9 would be as far: reference.json). Exported again, it is the file
// transformers wrote (the tensors bit for bit, config.json key for key), so transformers loads
// Tessera's Mistral export as the model whose numbers Tessera just reproduced.
TEST(HfLlama, TransformersMistralGivesTransformersLossAndGreedyTextThroughItsWindow) {
  const nlohmann::json& m = reference()["models"]["mistral_window"];
  const int window = m["dims"]["window"];
  ASSERT_EQ(window, 8);
  ASSERT_LT(window, m["dims"]["T"].get<int>());
  const std::string fixture = kFixtures + "/mistral_window";
  const std::string deck = fixture_deck(m["dims"], window);
  const std::string out = fresh_dir("mistral_fixture");
  const std::string checkpoint = out + "/mistral.h5";
  const RunResult r = direct(fmt::format("import {} --deck {} --out {}", fixture, deck, checkpoint));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("context 32 (sliding window 8)"), std::string::npos) << r.output;
  const double loss = expect_transformers_loss(deck, checkpoint, m, "mistral_window");
  expect_transformers_greedy(deck, checkpoint, m);

  // What a missing or wrong window would cost, as transformers measured it: far beyond 1e-5, and
  // other greedy text.
  const double f64 = m["loss_float64"];
  const auto& wrong = m["loss_float64_if_wrong"];
  for (const char* mistake : {"no sliding window (LlamaForCausalLM)", "sliding_window 7", "sliding_window 9"}) {
    SCOPED_TRACE(mistake);
    EXPECT_GT(std::abs(wrong[mistake].get<double>() - f64), 1e-4 * f64);
  }
  EXPECT_NE(m["generate_float64_new_ids_if_no_window"], m["generate_float64_new_ids"]);

  // The same tensors as a Llama (config.json without the window): transformers' Llama loss.
  const std::string llama = fresh_dir("mistral_as_llama");
  fs::copy_file(fixture + "/model.safetensors", llama + "/model.safetensors");
  auto config = nlohmann::json::parse(read_file(fixture + "/config.json"));
  config["architectures"] = {"LlamaForCausalLM"};
  config["model_type"] = "llama";
  config.erase("sliding_window");
  std::ofstream(llama + "/config.json") << config.dump(2);
  const std::string no_window = fixture_deck(m["dims"], 0);
  ASSERT_EQ(direct(fmt::format("import {} --deck {} --out {}/llama.h5", llama, no_window, out)).exit_code, 0);
  const double as_llama = std::stod(eval_loss(no_window, out + "/llama.h5"));
  const double llama_f64 = wrong["no sliding window (LlamaForCausalLM)"];
  std::printf("mistral_window as a llama: tessera eval %.9g, transformers' Llama float64 %.9g\n", as_llama, llama_f64);
  EXPECT_NEAR(as_llama, llama_f64, 1e-5 * llama_f64);
  EXPECT_GT(std::abs(as_llama - loss), 1e-4 * loss);

  // Back out: transformers' own file. config.json: every key save_pretrained wrote, with its value,
  // but the writer's version, and the forms transformers 5 and 4 give the same settings
  // (rope_parameters {rope_theta, rope_type "default"} as rope_theta with rope_scaling null; dtype
  // as torch_dtype); and no other key.
  const std::string exported = out + "/mistral-hf";
  const RunResult e = direct(fmt::format("export {} --hf-llama --out {}", checkpoint, exported));
  ASSERT_EQ(e.exit_code, 0) << e.output;
  const auto theirs = nlohmann::json::parse(read_file(fixture + "/config.json"));
  const auto ours = nlohmann::json::parse(read_file(exported + "/config.json"));
  const auto our = [&](const std::string& key) { return ours.contains(key) ? ours.at(key) : nlohmann::json("absent"); };
  for (const auto& [key, value] : theirs.items()) {
    SCOPED_TRACE(key);
    if (key == "transformers_version") continue;
    if (key == "rope_parameters") {
      EXPECT_EQ(value, nlohmann::json({{"rope_theta", our("rope_theta")}, {"rope_type", "default"}}));
      EXPECT_TRUE(our("rope_scaling").is_null());
    } else {
      EXPECT_EQ(our(key == "dtype" ? "torch_dtype" : key), value);
    }
  }
  for (const auto& [key, value] : ours.items())
    EXPECT_TRUE(theirs.contains(key) || key == "rope_theta" || key == "rope_scaling" || key == "torch_dtype") << key;
  std::vector<io::NamedTensor> a = read_all(fixture + "/model.safetensors");
  std::vector<io::NamedTensor> b = read_all(exported + "/model.safetensors");
  const auto by_name = [](const io::NamedTensor& x, const io::NamedTensor& y) { return x.name < y.name; };
  std::sort(a.begin(), a.end(), by_name);
  std::sort(b.begin(), b.end(), by_name);
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    SCOPED_TRACE(a[i].name);
    EXPECT_EQ(a[i].name, b[i].name);
    EXPECT_EQ(a[i].shape, b[i].shape);
    EXPECT_EQ(a[i].values, b[i].values);
  }
}

}  // namespace
}  // namespace tessera::test
