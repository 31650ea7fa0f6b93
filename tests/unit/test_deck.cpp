// The input deck: the shipped decks parse, defaults come from Config, overrides of every type,
// one-line errors that name file, line, key and what is allowed, to_toml round trip, layout
// resolution, and docs/deck.md documenting every key.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <sstream>
#include <string>

#include "core/build_features.hpp"
#include "core/deck.hpp"
#include "core/error.hpp"

namespace fs = std::filesystem;
using tessera::Config;
using tessera::InputError;
using tessera::load_deck;

namespace {

const fs::path kRepo = fs::path(__FILE__).parent_path().parent_path().parent_path();

/// A scratch directory for decks written by the tests, unique per process, removed at exit.
fs::path scratch() {
  struct Dir {
    fs::path path = fs::temp_directory_path() / ("tessera_test_deck_" + std::to_string(getpid()));
    Dir() { fs::create_directories(path); }
    ~Dir() {
      std::error_code ec;
      fs::remove_all(path, ec);
    }
  };
  static const Dir dir;
  return dir.path;
}

std::string write_deck(const std::string& name, const std::string& text) {
  const fs::path p = scratch() / name;
  std::ofstream(p) << text;
  return p.string();
}

/// Config without the two bookkeeping fields, for comparing what the keys set.
Config keys_only(Config c) {
  c.deck_path.clear();
  c.resolved_toml.clear();
  return c;
}

/// Runs `f`, expects an InputError whose one-line message contains every piece.
std::string expect_input_error(const std::function<void()>& f, std::initializer_list<std::string> pieces) {
  try {
    f();
  } catch (const InputError& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    EXPECT_EQ(msg.find("tessera: error"), std::string::npos) << msg;
    for (const auto& p : pieces) EXPECT_NE(msg.find(p), std::string::npos) << "missing '" << p << "' in: " << msg;
    return msg;
  }
  ADD_FAILURE() << "no InputError thrown";
  return {};
}

/// Loads `text` (written to bad.toml) and expects an error mentioning "bad.toml:<line>" and `pieces`.
std::string expect_deck_error(const std::string& text, int line, std::initializer_list<std::string> pieces) {
  const std::string path = write_deck("bad.toml", text);
  const std::string msg = expect_input_error([&] { load_deck(path, {}); }, pieces);
  EXPECT_NE(msg.find("bad.toml:" + std::to_string(line) + ":"), std::string::npos) << msg;
  return msg;
}

}  // namespace

// --- Shipped decks and defaults -------------------------------------------------------------

TEST(Deck, DefaultDeckParses) {
  const std::string path = (kRepo / "inputs/fashion_mnist_mlp.toml").string();
  const Config c = load_deck(path, {});
  EXPECT_EQ(c.deck_path, path);
  EXPECT_EQ(c.model.hidden, (std::vector<int>{512, 512}));
  EXPECT_EQ(c.model.activation, tessera::Activation::relu);
  EXPECT_EQ(c.optimizer.kind, tessera::OptimizerKind::sgd);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 0.05);
  EXPECT_DOUBLE_EQ(c.optimizer.momentum, 0.9);
  EXPECT_EQ(c.schedule.kind, tessera::ScheduleKind::cosine);
  EXPECT_EQ(c.train.global_batch, 128);
  EXPECT_EQ(c.train.epochs, 10);
  EXPECT_EQ(c.train.steps, 0);
  EXPECT_EQ(c.train.log_every, 50);
  EXPECT_TRUE(c.eval.every_epoch);
  EXPECT_EQ(c.checkpoint.every_steps, 1000);
  EXPECT_EQ(c.checkpoint.keep, 3);
  EXPECT_EQ(c.run.output_dir, "runs/fashion_mnist_mlp");
  EXPECT_EQ(c.data.path, "data/fashion-mnist.h5");
  EXPECT_EQ(c.resolved_toml, tessera::to_toml(c));
}

TEST(Deck, CiDeckParses) {
  const Config c = load_deck((kRepo / "inputs/fashion_mnist_mlp-ci.toml").string(), {});
  EXPECT_EQ(c.train.steps, 40);
  EXPECT_EQ(c.model.hidden, (std::vector<int>{64, 64}));
  EXPECT_EQ(c.train.log_every, 5);
  EXPECT_EQ(c.checkpoint.every_steps, 20);
  EXPECT_EQ(c.eval.every_steps, 20);
  EXPECT_EQ(c.run.output_dir, "runs/fashion_mnist_mlp-ci");
  // Same run otherwise.
  const Config full = load_deck((kRepo / "inputs/fashion_mnist_mlp.toml").string(), {});
  EXPECT_EQ(c.optimizer, full.optimizer);
  EXPECT_EQ(c.data, full.data);
  EXPECT_EQ(c.train.global_batch, full.train.global_batch);
}

TEST(Deck, EmptyDeckGivesDefaults) {
  const std::string path = write_deck("empty.toml", "# nothing\n");
  const Config c = load_deck(path, {});
  EXPECT_EQ(keys_only(c), Config{});
  EXPECT_EQ(c.resolved_toml, tessera::to_toml(Config{}));
}

TEST(Deck, SectionsAndDottedKeys) {
  const std::string path = write_deck("dotted.toml", "optimizer.lr = 0.2\n[train]\nsteps = 7\n");
  const Config c = load_deck(path, {});
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 0.2);
  EXPECT_EQ(c.train.steps, 7);
}

// --- Overrides ------------------------------------------------------------------------------

TEST(Deck, OverridesOfEveryType) {
  const std::string path = write_deck("ov.toml", "[optimizer]\nlr = 0.5\n");
  const Config c = load_deck(path, {
                                       "optimizer.lr=0.01",              // float
                                       "optimizer.weight_decay=1",       // integer for a float
                                       "train.global_batch=256",         // integer
                                       "run.seed = 42",                  // spaces around '='
                                       "optimizer.nesterov=true",        // boolean
                                       "run.output_dir=runs/x y",        // bare string
                                       "data.path=\"data/a=b.h5\"",      // quoted TOML string, '=' inside
                                       "data.train_split=2020",          // string key, digits kept as text
                                       "model.hidden=[32, 16, 8]",       // array
                                       "optimizer.kind=adamw",           // enum
                                       "parallel.schedule=\"gpipe\"",    // quoted enum
                                       "train.global_batch=64",          // later wins
                                   });
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 0.01);
  EXPECT_DOUBLE_EQ(c.optimizer.weight_decay, 1.0);
  EXPECT_EQ(c.train.global_batch, 64);
  EXPECT_EQ(c.run.seed, 42u);
  EXPECT_TRUE(c.optimizer.nesterov);
  EXPECT_EQ(c.run.output_dir, "runs/x y");
  EXPECT_EQ(c.data.path, "data/a=b.h5");
  EXPECT_EQ(c.data.train_split, "2020");
  EXPECT_EQ(c.model.hidden, (std::vector<int>{32, 16, 8}));
  EXPECT_EQ(c.optimizer.kind, tessera::OptimizerKind::adamw);
  EXPECT_EQ(c.parallel.schedule, tessera::PipelineSchedule::gpipe);
  EXPECT_EQ(tessera::to_string(c.parallel.schedule), "gpipe");
  EXPECT_EQ(tessera::to_string(tessera::PipelineSchedule::one_f_one_b), "1f1b");
  EXPECT_NE(c.resolved_toml.find("lr = 0.01\n"), std::string::npos) << c.resolved_toml;
}

TEST(Deck, OverrideErrors) {
  const std::string path = write_deck("ov_err.toml", "");
  const auto load = [&](std::string o) { return [path, o] { load_deck(path, {o}); }; };
  std::string msg = expect_input_error(load("optimizer.lr=abc"),
                                       {"expected a float, got a string \"abc\"", "a float > 0"});
  EXPECT_EQ(msg.rfind("--set optimizer.lr=abc: ", 0), 0u) << msg;
  msg = expect_input_error(load("optimizer.lr"), {"section.key=value"});
  EXPECT_EQ(msg.rfind("--set optimizer.lr: ", 0), 0u) << msg;
  msg = expect_input_error(load("optimizer.lrr=0.1"), {"unknown key", "did you mean 'optimizer.lr'?"});
  EXPECT_EQ(msg.rfind("--set optimizer.lrr=0.1: ", 0), 0u) << msg;
  expect_input_error(load("optimiser.lr=0.1"), {"--set optimiser.lr=0.1: ", "unknown section", "[optimizer]"});
  expect_input_error(load("seed=3"), {"--set seed=3: ", "did you mean 'run.seed'?"});
  expect_input_error(load("optimizer.momentum=1.0"), {"--set optimizer.momentum=1.0: ", "in [0, 1)"});
  expect_input_error(load("optimizer.kind=adam"), {"--set optimizer.kind=adam: ", "\"sgd\", \"adamw\""});
  expect_input_error(load("run.output_dir="), {"--set run.output_dir=: ", "must not be empty"});
}

// --- Errors in the deck file ----------------------------------------------------------------

TEST(DeckErrors, MissingFile) {
  const std::string path = (scratch() / "no_such_deck.toml").string();
  expect_input_error([&] { load_deck(path, {}); }, {path + ": cannot open deck file"});
}

TEST(DeckErrors, TomlSyntax) {
  const std::string msg = expect_deck_error("[run]\nseed = 1\noutput_dir = \"unterminated\n", 3, {"invalid TOML"});
  EXPECT_NE(msg.find("bad.toml:3:"), std::string::npos) << msg;  // line and column
}

TEST(DeckErrors, UnknownSectionAndKey) {
  expect_deck_error("# deck\n[optimiser]\nlr = 0.1\n", 2, {"optimiser: unknown section", "did you mean [optimizer]?"});
  expect_deck_error("[run]\n[frobnicate]\nx = 1\n", 2, {"unknown section", "sections: [run], [data]", "[comm]"});
  expect_deck_error("[optimizer]\nkind = \"sgd\"\nlrr = 0.1\n", 3,
                    {"optimizer.lrr: unknown key", "did you mean 'optimizer.lr'?"});
  expect_deck_error("[schedule]\nwarmup = 10\n", 2, {"schedule.warmup", "did you mean 'schedule.warmup_steps'?"});
  expect_deck_error("[train]\nlr = 0.1\n", 2, {"train.lr: unknown key", "did you mean 'optimizer.lr'?"});
  expect_deck_error("[optimizer]\nzzzzzz = 1\n", 2, {"optimizer.zzzzzz: unknown key", "keys of [optimizer]: kind, lr, momentum"});
  expect_deck_error("seed = 1\n", 1, {"seed", "did you mean 'run.seed'?"});
  expect_deck_error("[optimizer.adam]\nbeta = 1\n", 1, {"optimizer.adam: unknown key"});
  expect_deck_error("run = 3\n", 1, {"run: expected a table [run], got an integer 3"});
}

TEST(DeckErrors, FirstErrorInFileOrder) {
  // toml++ keeps keys sorted; the message must still point at the first bad line of the file.
  expect_deck_error("[train]\nzeta = 1\n[checkpoint]\nalpha = 2\n", 2, {"train.zeta"});
}

TEST(DeckErrors, WrongTypes) {
  expect_deck_error("[train]\nepochs = 3\nglobal_batch = \"128\"\n", 3,
                    {"train.global_batch: expected an integer, got a string \"128\"", "an integer >= 1"});
  expect_deck_error("[train]\nglobal_batch = 128.0\n", 2, {"expected an integer, got a float 128.0"});
  expect_deck_error("[run]\noverwrite = 1\n", 2, {"run.overwrite: expected true or false, got an integer 1"});
  expect_deck_error("[run]\noutput_dir = 5\n", 2, {"run.output_dir: expected a string, got an integer 5"});
  expect_deck_error("[model]\nhidden = 64\n", 2, {"model.hidden: expected an array of integers"});
  expect_deck_error("[model]\nhidden = [\n  64,\n  64.5,\n]\n", 4,
                    {"model.hidden: expected an array of integers, got a float 64.5"});
  expect_deck_error("[model]\nhidden = [64, 0]\n", 2, {"model.hidden: 0 is out of range", "integers in [1, 2^24]"});
  expect_deck_error("[optimizer]\nkind = \"adam\"\n", 2,
                    {"optimizer.kind: unknown value \"adam\"", "one of \"sgd\", \"adamw\"", "did you mean \"adamw\"?"});
  expect_deck_error("[model]\nactivation = \"tanh\"\n", 2, {"model.activation", "\"relu\", \"gelu\""});
  expect_deck_error("[model]\nloss = \"l2\"\n", 2, {"model.loss", "\"auto\", \"cross_entropy\", \"mse\""});
  expect_deck_error("[schedule]\nkind = \"linear\"\n", 2, {"schedule.kind", "\"constant\", \"cosine\", \"step\""});
  expect_deck_error("[parallel]\nschedule = \"zb\"\n", 2, {"parallel.schedule", "\"gpipe\", \"1f1b\""});
  expect_deck_error("[comm]\nallreduce = \"tree\"\n", 2,
                    {"comm.allreduce", "\"mpi\", \"ring\", \"parameter-server\", \"hierarchical\""});
  expect_deck_error("[comm]\nring_segment_kb = 0\n", 2, {"comm.ring_segment_kb: 0 is out of range"});
  expect_deck_error("[model]\nkind = 1\n", 2, {"model.kind: expected a name, got an integer 1", "\"mlp\""});

  // Every allreduce algorithm parses by its name.
  const Config ps = load_deck(write_deck("ps.toml", "[comm]\nallreduce = \"parameter-server\"\nring_segment_kb = 64\n"), {});
  EXPECT_EQ(ps.comm.allreduce, tessera::AllreduceAlgorithm::parameter_server);
  EXPECT_EQ(ps.comm.ring_segment_kb, 64);
  EXPECT_EQ(load_deck(write_deck("ring.toml", "[comm]\nallreduce = \"ring\"\n"), {}).comm.allreduce,
            tessera::AllreduceAlgorithm::ring);
  EXPECT_EQ(load_deck(write_deck("hier.toml", "[comm]\nallreduce = \"hierarchical\"\n"), {}).comm.allreduce,
            tessera::AllreduceAlgorithm::hierarchical);
  // The wire type of the gradient sums.
  EXPECT_EQ(load_deck(write_deck("fp32.toml", ""), {}).comm.reduce_dtype, tessera::ReduceDtype::fp32);
  EXPECT_EQ(load_deck(write_deck("bf16.toml", "[comm]\nreduce_dtype = \"bf16\"\n"), {}).comm.reduce_dtype,
            tessera::ReduceDtype::bf16);
  expect_deck_error("[comm]\nreduce_dtype = \"fp16\"\n", 2,
                    {"comm.reduce_dtype: unknown value \"fp16\"", "one of \"fp32\", \"bf16\""});
  expect_deck_error("[comm]\nreduce_dtype = 16\n", 2, {"comm.reduce_dtype: expected a name"});

  // Floats take integers; empty hidden is a linear model.
  const Config c = load_deck(write_deck("ok.toml", "[optimizer]\nlr = 1\n[model]\nhidden = []\n"), {});
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 1.0);
  EXPECT_TRUE(c.model.hidden.empty());
}

TEST(DeckErrors, OutOfRange) {
  struct Case {
    std::string section, key, value, allowed;
  };
  const std::vector<Case> cases = {
      {"run", "seed", "-1", "an integer >= 0"},
      {"run", "blas_threads", "-2", "an integer in 0..4096"},
      {"run", "output_dir", "\"\"", "a non-empty string"},
      {"data", "path", "\"\"", "a non-empty string"},
      {"parallel", "data", "-1", "an integer in 0..2^20"},
      {"parallel", "tensor", "0", "an integer in 1..2^20"},
      {"parallel", "tensor", "65536000", "an integer in 1..2^20"},
      {"parallel", "pipeline", "0", "an integer in 1..2^20"},
      {"parallel", "micro_batches", "0", "an integer in 1..2^20"},
      {"parallel", "zero", "4", "an integer in 0..3"},
      {"optimizer", "lr", "0", "a float > 0"},
      {"optimizer", "lr", "nan", "a float > 0"},
      {"optimizer", "lr", "inf", "a float > 0"},
      {"optimizer", "momentum", "1.0", "a float in [0, 1)"},
      {"optimizer", "momentum", "-0.1", "a float in [0, 1)"},
      {"optimizer", "beta1", "1", "a float in [0, 1)"},
      {"optimizer", "beta2", "1.5", "a float in [0, 1)"},
      {"optimizer", "eps", "0.0", "a float > 0"},
      {"optimizer", "weight_decay", "-1e-4", "a float >= 0"},
      {"optimizer", "clip_grad_norm", "-1", "a float >= 0"},
      {"schedule", "warmup_steps", "-1", "an integer in 0..2^48"},
      {"schedule", "min_lr", "-0.5", "a float >= 0"},
      {"schedule", "step_size", "0", "an integer in 1..2^48"},
      {"schedule", "gamma", "0", "a float in (0, 1]"},
      {"schedule", "gamma", "1.5", "a float in (0, 1]"},
      {"train", "epochs", "-1", "an integer >= 0 (>= 1 unless train.steps > 0)"},
      {"train", "steps", "-1", "an integer in 0..2^48"},
      {"train", "steps", "4611686018427387904", "an integer in 0..2^48"},
      {"train", "global_batch", "0", "an integer >= 1"},
      {"train", "global_batch", "3000000000", "an integer >= 1"},  // does not fit an int
      {"train", "log_every", "0", "an integer >= 1"},
      {"eval", "every_steps", "-1", "an integer in 0..2^48"},
      {"eval", "batch", "0", "an integer >= 1"},
      {"checkpoint", "every_steps", "-5", "an integer in 0..2^48"},
      {"model", "width", "2147483647", "an integer in 1..2^24"},
      {"model", "channels", "[16, 2147483647]", "an array of integers in [1, 2^24]"},
      {"comm", "bucket_mb", "1e300", "a float in (0, 2^20]"},
      {"checkpoint", "keep", "-1", "an integer >= 0"},
      {"comm", "timeout_s", "0", "a float > 0"},
      {"comm", "timeout_s", "-5.0", "a float > 0"},
      {"comm", "timeout_s", "inf", "a float > 0"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.section + "." + c.key + " = " + c.value);
    expect_deck_error("# range\n[" + c.section + "]\n" + c.key + " = " + c.value + "\n", 3,
                      {c.section + "." + c.key + ": ", "allowed: " + c.allowed});
  }
}

TEST(DeckErrors, Combinations) {
  expect_deck_error("[optimizer]\nmomentum = 0.0\nnesterov = true\n", 3,
                    {"optimizer.nesterov", "optimizer.momentum = 0"});
  expect_deck_error("[optimizer]\nlr = 0.01\n[schedule]\nkind = \"cosine\"\nmin_lr = 0.1\n", 5,
                    {"schedule.min_lr", "optimizer.lr", "cosine"});
  // A warm-up as long as the run is allowed, with a warning that says what the schedule does.
  const Config warm = load_deck(write_deck("warm.toml", "[schedule]\nkind = \"cosine\"\nwarmup_steps = 40\n"
                                                        "[train]\nsteps = 30\n"), {});
  ASSERT_EQ(warm.warnings.size(), 1u);
  for (const char* part : {"warm.toml:3", "schedule.warmup_steps = 40", "train.steps = 30",
                           "ends at 0.75 of optimizer.lr", "cosine schedule never starts"})
    EXPECT_NE(warm.warnings[0].find(part), std::string::npos) << part << " in " << warm.warnings[0];
  EXPECT_TRUE(load_deck(write_deck("short_warm.toml", "[schedule]\nwarmup_steps = 5\n[train]\nsteps = 30\n"), {})
                  .warnings.empty());
  expect_deck_error("[train]\nepochs = 0\n", 2, {"train.epochs", "train.steps"});
  // Fine: epochs 0 with steps, min_lr above lr without cosine, warm-up with epochs.
  const std::string ok = write_deck("ok_combo.toml",
                                    "[train]\nepochs = 0\nsteps = 10\n[schedule]\nmin_lr = 1.0\nwarmup_steps = 5\n");
  EXPECT_NO_THROW(load_deck(ok, {}));
  // An override that creates the conflict is named in place of a file line.
  const std::string base = write_deck("combo_base.toml", "[optimizer]\nmomentum = 0.0\n");
  expect_input_error([&] { load_deck(base, {"optimizer.nesterov=true"}); },
                     {"--set optimizer.nesterov=true: optimizer.nesterov"});
}

TEST(DeckErrors, CommBackend) {
  EXPECT_EQ(load_deck(write_deck("staged.toml", "[comm]\nbackend = \"staged\"\n"), {}).comm.backend,
            tessera::CommBackend::staged);
  EXPECT_EQ(load_deck(write_deck("auto.toml", ""), {}).comm.backend, tessera::CommBackend::automatic);
  expect_deck_error("[comm]\nbackend = \"ncl\"\n", 2,
                    {"comm.backend: unknown value \"ncl\"", "\"auto\", \"mpi\", \"cuda-aware-mpi\", \"staged\", \"nccl\"",
                     "did you mean \"nccl\"?"});
  expect_deck_error("[comm]\nbackend = \"cuda-aware\"\n", 2, {"did you mean \"cuda-aware-mpi\"?"});
  // nccl is a deck error where the build has no NCCL, fine where it has (with NCCL's own
  // allreduce).
  const std::string nccl = write_deck("nccl.toml", "# nccl\n[comm]\nbackend = \"nccl\"\n");
  if (tessera::build::nccl) {
    EXPECT_EQ(load_deck(nccl, {}).comm.backend, tessera::CommBackend::nccl);
    expect_deck_error("[comm]\nallreduce = \"ring\"\nbackend = \"nccl\"\n", 2,
                      {"comm.allreduce", "\"ring\" with comm.backend = \"nccl\""});
    expect_deck_error("[comm]\nreduce_dtype = \"bf16\"\nbackend = \"nccl\"\n", 2,
                      {"comm.reduce_dtype", "\"bf16\" with comm.backend = \"nccl\""});
  } else {
    expect_input_error([&] { load_deck(nccl, {}); },
                       {"nccl.toml:3: comm.backend: \"nccl\" needs a build with NCCL", "-DTESSERA_ENABLE_CUDA=ON"});
    expect_input_error([&] { load_deck(write_deck("plain.toml", ""), {"comm.backend=nccl"}); },
                       {"--set comm.backend=nccl: comm.backend"});
  }
}

TEST(DeckErrors, WatchdogAndPlacementKeys) {
  const Config defaults = load_deck(write_deck("empty_wd.toml", ""), {});
  EXPECT_EQ(defaults.comm.timeout_s, 600.0);
  EXPECT_FALSE(defaults.parallel.tensor_within_node);
  const Config set = load_deck(write_deck("wd.toml", "[comm]\ntimeout_s = 2.5\n[parallel]\ntensor_within_node = true\n"), {});
  EXPECT_EQ(set.comm.timeout_s, 2.5);
  EXPECT_TRUE(set.parallel.tensor_within_node);
  EXPECT_EQ(load_deck(write_deck("wd_int.toml", "[comm]\ntimeout_s = 3\n"), {}).comm.timeout_s, 3.0);
  expect_deck_error("[comm]\ntimeout_s = \"10\"\n", 2, {"comm.timeout_s", "a float"});
  expect_deck_error("[parallel]\ntensor_within_node = 1\n", 2, {"parallel.tensor_within_node", "true or false"});
  expect_input_error([&] { load_deck(write_deck("wd_plain.toml", ""), {"comm.timeout_s=0"}); },
                     {"--set comm.timeout_s=0: comm.timeout_s", "a float > 0"});
}

// --- Round trip -----------------------------------------------------------------------------

TEST(Deck, ToTomlRoundTrip) {
  const Config a = load_deck((kRepo / "inputs/fashion_mnist_mlp-ci.toml").string(),
                             {"optimizer.kind=adamw", "optimizer.eps=1e-12", "optimizer.lr=0.1234567890123",
                              "model.hidden=[]", "run.output_dir=runs/\"quoted\" \\ dir", "schedule.gamma=1",
                              "model.activation=gelu", "parallel.schedule=gpipe", "train.drop_last=false"});
  const std::string text = tessera::to_toml(a);
  const Config b = load_deck(write_deck("round.toml", text), {});
  EXPECT_EQ(keys_only(a), keys_only(b)) << text;
  EXPECT_EQ(tessera::to_toml(b), text);
  // Sections in DESIGN.md order, floats stay floats.
  const std::vector<std::string> order = {"[run]", "[data]", "[model]", "[parallel]", "[optimizer]",
                                          "[schedule]", "[train]", "[eval]", "[checkpoint]", "[comm]"};
  std::size_t pos = 0;
  for (const auto& s : order) {
    const std::size_t at = text.find(s);
    ASSERT_NE(at, std::string::npos) << s;
    EXPECT_GE(at, pos) << s;
    pos = at;
  }
  EXPECT_NE(text.find("gamma = 1.0\n"), std::string::npos) << text;
}

// --- Layout ---------------------------------------------------------------------------------

TEST(Layout, ResolvesDataFromWorld) {
  Config c = load_deck(write_deck("layout.toml", "[train]\nglobal_batch = 128\n"), {});
  tessera::resolve_layout(c, 4);
  EXPECT_EQ(c.parallel.data, 4);
  EXPECT_NE(c.resolved_toml.find("[parallel]\ndata = 4\n"), std::string::npos) << c.resolved_toml;
}

TEST(Layout, RefusesWrongRankCount) {
  Config c = load_deck(write_deck("layout2.toml", "[parallel]\ndata = 2\n"), {});
  expect_input_error([&] { tessera::resolve_layout(c, 4); },
                     {"parallel: data=2 x tensor=1 x pipeline=1 = 2 ranks, but mpirun started 4; "
                      "set parallel.data = 4 or run on 2 ranks"});
  Config ok = c;
  EXPECT_NO_THROW(tessera::resolve_layout(ok, 2));
}

TEST(Layout, ModelSplitsThatCannotWorkAreRefused) {
  Config tp = load_deck(write_deck("tp.toml", "[model]\nhidden = [64, 30]\n[parallel]\ntensor = 4\n"), {});
  expect_input_error([&] { tessera::resolve_layout(tp, 4); },
                     {"parallel.tensor", "do not divide model.hidden[1] = 30"});
  Config pp = load_deck(write_deck("pp.toml", "[model]\nhidden = [64]\n[parallel]\npipeline = 3\n"), {});
  expect_input_error([&] { tessera::resolve_layout(pp, 3); },
                     {"parallel.pipeline", "3 stages for a model of 2 layers"});
  Config st = load_deck(write_deck("st.toml", "[model]\nhidden = [64, 64]\n[parallel]\npipeline = 2\nstages = [1, 1]\n"), {});
  expect_input_error([&] { tessera::resolve_layout(st, 2); },
                     {"parallel.stages", "of 2 layers in all", "the model's 3 layers"});
  Config ok = load_deck(write_deck("ok.toml", "[model]\nhidden = [64, 32]\n[parallel]\ntensor = 2\npipeline = 2\nstages = [2, 1]\n"), {});
  EXPECT_NO_THROW(tessera::resolve_layout(ok, 8));
  EXPECT_EQ(ok.parallel.data, 2);
}

TEST(Layout, LlamaSplitsThatCannotWorkAreRefused) {
  const auto deck = [](const std::string& name, const std::string& model, const std::string& parallel = "") {
    return load_deck(write_deck(name, "[model]\nkind = \"llama\"\nheads = 8\nwidth = 64\n" + model +
                                          "[parallel]\n" + parallel),
                     {});
  };
  Config kv = deck("kv.toml", "kv_heads = 3\n");
  expect_input_error([&] { tessera::resolve_layout(kv, 1); },
                     {"model.kv_heads", "3 key/value heads do not divide the 8 attention heads"});
  Config tp = deck("kv_tp.toml", "kv_heads = 2\n", "tensor = 4\n");
  expect_input_error([&] { tessera::resolve_layout(tp, 4); },
                     {"parallel.tensor", "4 tensor ranks do not divide the 2 key/value heads"});
  Config ffn = deck("ffn.toml", "kv_heads = 4\nffn_width = 30\n", "tensor = 4\n");
  expect_input_error([&] { tessera::resolve_layout(ffn, 4); },
                     {"parallel.tensor", "do not divide the MLP's hidden width 30"});
  Config odd = load_deck(write_deck("odd.toml", "[model]\nkind = \"llama\"\nheads = 4\nwidth = 12\n"), {});
  expect_input_error([&] { tessera::resolve_layout(odd, 1); }, {"model.heads", "heads of width 3", "pairs"});
  Config ok = deck("llama_ok.toml", "kv_heads = 4\n", "tensor = 4\n");
  EXPECT_NO_THROW(tessera::resolve_layout(ok, 8));
  EXPECT_EQ(ok.model.ffn_width_or_default(), 256);  // 8/3 of 64 = 171, up to a multiple of 256
  // The Llama family's keys on another kind change nothing, so they are refused.
  Config gpt = load_deck(write_deck("gpt_kv.toml", "[model]\nkind = \"gpt\"\nheads = 8\nwidth = 64\nkv_heads = 2\n"), {});
  expect_input_error([&] { tessera::resolve_layout(gpt, 1); }, {"model.kv_heads", "model.kind = \"gpt\""});
  Config tied = load_deck(write_deck("gpt_tie.toml", "[model]\nkind = \"gpt\"\ntie_embeddings = false\n"), {});
  expect_input_error([&] { tessera::resolve_layout(tied, 1); }, {"model.tie_embeddings", "always the token embedding"});
  Config theta = load_deck(write_deck("mlp_theta.toml", "[model]\nrope_theta = 500000.0\n"), {});
  expect_input_error([&] { tessera::resolve_layout(theta, 1); }, {"model.rope_theta", "model.kind = \"mlp\""});
  Config tanh = deck("llama_tanh.toml", "gelu_approximate = \"tanh\"\n");
  expect_input_error([&] { tessera::resolve_layout(tanh, 1); }, {"model.gelu_approximate"});
}

TEST(Layout, ContextParallelismNeedsWhatItsFormNeeds) {
  const auto deck = [](const std::string& name, const std::string& more) {
    return load_deck(write_deck(name, "[model]\nkind = \"gpt\"\nheads = 4\nwidth = 32\ncontext = 24\n" + more), {});
  };
  Config ok = deck("cp_ok.toml", "[parallel]\nspatial = 2\ntensor = 2\n");
  EXPECT_NO_THROW(tessera::resolve_layout(ok, 4));
  Config ctx = deck("cp_ctx.toml", "[parallel]\nspatial = 5\n");
  expect_input_error([&] { tessera::resolve_layout(ctx, 5); },
                     {"parallel.spatial", "5 ranks share each sequence of model.context = 24 tokens"});
  Config heads = deck("cp_heads.toml", "[parallel]\nspatial = 4\ntensor = 2\n");
  expect_input_error([&] { tessera::resolve_layout(heads, 8); },
                     {"parallel.spatial", "must divide the 2 heads of each tensor rank"});
  Config bf16 = deck("cp_bf16.toml", "[parallel]\nspatial = 2\n[train]\nprecision = \"bf16\"\n");
  EXPECT_NO_THROW(tessera::resolve_layout(bf16, 2));  // fp32 activations, bf16 products
  Config mlp = load_deck(write_deck("cp_mlp.toml", "[parallel]\nspatial = 2\n"), {});
  expect_input_error([&] { tessera::resolve_layout(mlp, 2); }, {"parallel.spatial", "model.kind = \"mlp\""});
  // The ring needs no heads per rank, but a head and a tail chunk per rank: 2C divides the context.
  Config ring = deck("cp_ring.toml", "[parallel]\nspatial = 4\ntensor = 2\ncontext_comm = \"ring\"\n");
  EXPECT_NO_THROW(tessera::resolve_layout(ring, 8));
  Config chunks = deck("cp_ring_ctx.toml", "[parallel]\nspatial = 8\ncontext_comm = \"ring\"\n");
  expect_input_error([&] { tessera::resolve_layout(chunks, 8); },
                     {"parallel.spatial", "in 16 equal chunks", "a head and a tail chunk per rank", "divisible by 16"});
  Config ring_mlp = load_deck(write_deck("cp_ring_mlp.toml", "[parallel]\ncontext_comm = \"ring\"\n"), {});
  expect_input_error([&] { tessera::resolve_layout(ring_mlp, 1); },
                     {"parallel.context_comm", "model.kind = \"mlp\" has none"});
}

// model.window: a transformer's, at most its context (as long as it: full attention), with the
// all-to-all's context parallelism; the ring's halo is not built yet.
TEST(Layout, SlidingWindowIsATransformersUpToItsContext) {
  const auto deck = [](const std::string& name, const std::string& kind, const std::string& more) {
    return load_deck(write_deck(name, "[model]\nkind = \"" + kind + "\"\nheads = 4\nwidth = 32\ncontext = 24\n" +
                                          more), {});
  };
  for (const std::string kind : {"gpt", "llama"}) {
    SCOPED_TRACE(kind);
    Config ok = deck("w_ok.toml", kind, "window = 8\n[parallel]\nspatial = 2\n");
    EXPECT_NO_THROW(tessera::resolve_layout(ok, 2));
    EXPECT_EQ(ok.model.window, 8);
    Config whole = deck("w_whole.toml", kind, "window = 24\n");
    EXPECT_NO_THROW(tessera::resolve_layout(whole, 1));
    Config longer = deck("w_long.toml", kind, "window = 25\n");
    expect_input_error([&] { tessera::resolve_layout(longer, 1); },
                       {"model.window", "25 positions is more than the model.context of 24"});
    // The ring with a window reads a halo of one block per rank: C divides the context (not 2C).
    Config ring = deck("w_ring.toml", kind, "window = 8\n[parallel]\nspatial = 8\ncontext_comm = \"ring\"\n");
    EXPECT_NO_THROW(tessera::resolve_layout(ring, 8));
    Config causal = deck("w_ring_whole.toml", kind, "window = 24\n[parallel]\nspatial = 8\ncontext_comm = \"ring\"\n");
    expect_input_error([&] { tessera::resolve_layout(causal, 8); },  // a window of the whole context is causal
                       {"parallel.spatial", "in 16 equal chunks", "a head and a tail chunk per rank"});
  }
  Config mlp = load_deck(write_deck("w_mlp.toml", "[model]\nwindow = 4\n"), {});
  expect_input_error([&] { tessera::resolve_layout(mlp, 1); },
                     {"model.window", "model.kind = \"mlp\" has no attention"});
  Config cnn = load_deck(write_deck("w_cnn.toml", "[model]\nkind = \"cnn\"\nwindow = 4\n"), {});
  expect_input_error([&] { tessera::resolve_layout(cnn, 1); }, {"model.window", "model.kind = \"cnn\""});
}

TEST(Layout, VirtualStagesNeedWhatTheInterleavedScheduleNeeds) {
  const std::string mlp = "[model]\nhidden = [64, 64, 64]\n[train]\nglobal_batch = 64\n[parallel]\npipeline = 2\n";
  const auto deck = [&](const std::string& name, const std::string& more) {
    return load_deck(write_deck(name, mlp + more), {});
  };
  Config ok = deck("v_ok.toml", "virtual_stages = 2\nmicro_batches = 4\n");
  EXPECT_NO_THROW(tessera::resolve_layout(ok, 2));
  Config one = load_deck(write_deck("v_pp1.toml", "[parallel]\nvirtual_stages = 2\n"), {});
  expect_input_error([&] { tessera::resolve_layout(one, 1); }, {"parallel.virtual_stages", "parallel.pipeline = 1"});
  Config gpipe = deck("v_gpipe.toml", "virtual_stages = 2\nmicro_batches = 2\nschedule = \"gpipe\"\n");
  expect_input_error([&] { tessera::resolve_layout(gpipe, 2); }, {"parallel.virtual_stages", "\"gpipe\""});
  Config many = deck("v_many.toml", "virtual_stages = 3\nmicro_batches = 2\n");
  expect_input_error([&] { tessera::resolve_layout(many, 2); },
                     {"parallel.virtual_stages", "6 chunks for a model of 4 layers", "virtual_stages <= 2"});
  Config odd = deck("v_odd.toml", "virtual_stages = 2\nmicro_batches = 3\n");
  expect_input_error([&] { tessera::resolve_layout(odd, 2); }, {"parallel.micro_batches", "a multiple of 2"});
  Config sync = deck("v_sync.toml", "virtual_stages = 2\nmicro_batches = 2\n[comm]\nno_sync = false\n");
  expect_input_error([&] { tessera::resolve_layout(sync, 2); }, {"comm.no_sync", "parallel.zero >= 1"});
  Config stages = deck("v_stages.toml", "virtual_stages = 2\nmicro_batches = 2\nstages = [2, 2]\n");
  expect_input_error([&] { tessera::resolve_layout(stages, 2); }, {"parallel.stages", "4 chunks"});
  Config given = deck("v_given.toml", "virtual_stages = 2\nmicro_batches = 2\nstages = [1, 1, 1, 1]\n");
  EXPECT_NO_THROW(tessera::resolve_layout(given, 2));
}

TEST(Layout, BatchMustSplitEvenly) {
  Config c = load_deck(write_deck("split.toml", "[train]\nglobal_batch = 100\n"), {});
  expect_input_error([&] { tessera::resolve_layout(c, 3); },
                     {"train.global_batch: 100", "parallel.data=3 x parallel.micro_batches=1 = 3", "99 or 102"});
  Config m = load_deck(write_deck("split2.toml", "[train]\nglobal_batch = 128\n[parallel]\nmicro_batches = 3\n"), {});
  expect_input_error([&] { tessera::resolve_layout(m, 2); }, {"parallel.micro_batches=3", "a multiple of 6"});
  Config fine = load_deck(write_deck("split3.toml", "[train]\nglobal_batch = 128\n[parallel]\nmicro_batches = 4\n"), {});
  EXPECT_NO_THROW(tessera::resolve_layout(fine, 8));
  EXPECT_EQ(fine.parallel.data, 8);
  Config tiny = load_deck(write_deck("split4.toml", "[train]\nglobal_batch = 2\n"), {});
  expect_input_error([&] { tessera::resolve_layout(tiny, 4); }, {"e.g. 4)"});
}

TEST(Deck, PriorityRefusesWhatNeedsEveryBucketBeforeAnUpdate) {
  const std::string on = "[comm]\npriority = true\n";
  for (const auto& [text, key] : std::vector<std::pair<std::string, std::string>>{
           {"[optimizer]\nclip_grad_norm = 1.0\n" + on, "optimizer.clip_grad_norm"},
           {"[train]\nprecision = \"fp16\"\n" + on, "train.precision"},
           {"[parallel]\nzero = 1\n" + on, "parallel.zero"},
           {"[parallel]\nmicro_batches = 2\n" + on + "no_sync = false\n", "comm.no_sync"},
           {on + "allreduce = \"ring\"\n", "comm.allreduce"}})
    expect_input_error([&] { load_deck(write_deck("prio.toml", text), {}); }, {"prio.toml", "comm.priority", key});
  EXPECT_NO_THROW(load_deck(write_deck("prio_ok.toml", on), {}));
}

TEST(Deck, OffloadValuesNeedsTheStateOnDiskAndZeroThree) {
  const std::string on = "[optimizer]\noffload_values = true\n";
  expect_input_error([&] { load_deck(write_deck("ov_none.toml", on + "[parallel]\nzero = 3\n"), {}); },
                     {"ov_none.toml", "optimizer.offload_values", "optimizer.offload = \"none\"", "\"disk\""});
  expect_input_error([&] { load_deck(write_deck("ov_zero1.toml", on + "offload = \"disk\"\n[parallel]\nzero = 1\n"), {}); },
                     {"ov_zero1.toml", "optimizer.offload_values", "parallel.zero = 1", "parallel.zero = 3"});
  EXPECT_NO_THROW(load_deck(write_deck("ov_ok.toml", on + "offload = \"disk\"\n[parallel]\nzero = 3\n"), {}));
}

// --- Docs -----------------------------------------------------------------------------------

TEST(Deck, DocsDocumentEveryKey) {
  std::ifstream in(kRepo / "docs/deck.md");
  ASSERT_TRUE(in) << (kRepo / "docs/deck.md");
  std::stringstream text;
  text << in.rdbuf();
  const std::string doc = text.str();
  const auto keys = tessera::deck_keys();
  EXPECT_EQ(keys.front(), "run.seed");
  for (const auto& k : keys) EXPECT_NE(doc.find("`" + k + "`"), std::string::npos) << k << " is not in docs/deck.md";

  // Where a key has a table row, the row shows its default as to_toml() writes it.
  std::istringstream defaults(tessera::to_toml(Config{}));
  std::string line, section;
  while (std::getline(defaults, line)) {
    if (line.empty()) continue;
    if (line.front() == '[') {
      section = line.substr(1, line.size() - 2);
      continue;
    }
    const auto eq = line.find(" = ");
    const std::string key = section + "." + line.substr(0, eq);
    const std::size_t row = doc.find("| `" + key + "` |");
    ASSERT_NE(row, std::string::npos) << key << " has no row in docs/deck.md";
    const std::string row_text = doc.substr(row, doc.find('\n', row) - row);
    EXPECT_NE(row_text.find("`" + line.substr(eq + 3) + "`"), std::string::npos)
        << key << ": docs/deck.md does not show the default " << line.substr(eq + 3);
  }
}
