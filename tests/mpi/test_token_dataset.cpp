// TokenSplit and open_split on 1, 2 and 4 ranks. Oracles: the closed form each token was written
// from (window s of context T is tokens [s*T, s*T + T), its labels tokens [s*T + 1, s*T + T + 1)),
// the cached and the streaming paths returning the same bytes, and the bytes of a text that
// `tessera prepare text` tokenized; malformed files fail on every rank with the file and dataset
// named.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "io/dataset.hpp"
#include "io/dataset_writer.hpp"
#include "io/prepare_text.hpp"
#include "io/token_dataset.hpp"
#include "dataset_test_util.hpp"
#include "mpi_test_util.hpp"

namespace io = tessera::io;

using tessera::test::expect_input_error;
using tessera::test::DatasetFileTest;
using tessera::test::world_rank;
using tessera::test::world_size;

namespace {

constexpr std::int64_t kTokens = 103;  // 12 windows of 8, 6 tokens left over
constexpr std::int64_t kContext = 8;
constexpr int kTrials = 30;

// Token k of a split: every value below vocab reached, neighbours unrelated.
std::int64_t token_of(std::int64_t k, std::int64_t vocab) { return (k * 7919 + k / 3) % vocab; }

template <class T>
void write_tokens(io::DatasetWriter& out, const std::string& split, std::int64_t n, std::int64_t vocab) {
  std::vector<T> tokens;
  for (std::int64_t k = 0; k < n; ++k) tokens.push_back(static_cast<T>(token_of(k, vocab)));
  out.write("/" + split + "/tokens", {std::uint64_t(n)}, std::span<const T>(tokens));
}

// Index sets that differ per rank and per trial: some empty, duplicates, unordered, runs of
// neighbouring windows (which share a token), the first and the last window.
std::vector<std::int64_t> indices_for(int rank, int trial, std::int64_t samples) {
  if ((rank + trial) % 3 == 2) return {};
  if (trial == 0) {
    std::vector<std::int64_t> out;
    for (std::int64_t s : {5, 6, 7, 7, 0, -1, 6, 3}) out.push_back(s < 0 ? samples - 1 : s % samples);
    return out;
  }
  std::mt19937 rng(static_cast<unsigned>(rank * 1000 + trial));
  std::vector<std::int64_t> out(rng() % 20 + 1);
  for (auto& index : out) index = static_cast<std::int64_t>(rng() % static_cast<unsigned>(samples));
  return out;
}

struct Rows {
  std::vector<float> x;
  std::vector<std::int32_t> y;
};

// Reads kTrials index sets (collective) and counts the values that differ from the closed form.
int wrong_values(io::Split& split, std::int64_t vocab, std::vector<Rows>* reads = nullptr) {
  const io::SplitInfo& info = split.info();
  const std::int64_t T = info.features;
  int wrong = 0;
  for (int trial = 0; trial < kTrials; ++trial) {
    const std::vector<std::int64_t> idx = indices_for(world_rank(), trial, info.samples);
    Rows r{std::vector<float>(idx.size() * T, -1.0f), std::vector<std::int32_t>(idx.size() * T, -1)};
    split.read(idx, r.x.data(), r.y.data(), nullptr);
    for (std::size_t i = 0; i < idx.size(); ++i) {
      for (std::int64_t j = 0; j < T; ++j) {
        wrong += r.x[i * T + j] != static_cast<float>(token_of(idx[i] * T + j, vocab));
        wrong += r.y[i * T + j] != token_of(idx[i] * T + j + 1, vocab);
      }
    }
    if (reads) reads->push_back(std::move(r));
  }
  return wrong;
}

// Every test writes into a directory of its own, removed after it on every rank.
class TokenDataset : public DatasetFileTest {
 protected:
  // A split /train of n tokens token_of(k, vocab), with vocab_size and tokenizer. Collective.
  template <class T>
  std::string token_file(const std::string& name, std::int64_t vocab, std::int64_t n = kTokens) {
    return make_file(name, [&](io::DatasetWriter& out) {
      write_tokens<T>(out, "train", n, vocab);
      out.write_attr("/", "vocab_size", vocab);
      out.write_attr("/", "tokenizer", std::string("test"));
    });
  }

  // Writes name, then reads its windows streamed and cached: the closed form, and both alike.
  template <class T>
  void check_windows(const std::string& name, std::int64_t vocab) {
    const std::string path = token_file<T>(name, vocab);
    std::vector<Rows> streamed, cached;
    for (bool cache : {false, true}) {
      io::TokenSplit split(MPI_COMM_WORLD, path, "train", kContext, cache);
      const io::SplitInfo& info = split.info();
      EXPECT_EQ(info.file, path);
      EXPECT_EQ(info.split, "train");
      EXPECT_EQ(info.samples, (kTokens - 1) / kContext);
      EXPECT_EQ(info.sample_shape, (std::vector<std::int64_t>{kContext}));
      EXPECT_EQ(info.features, kContext);
      EXPECT_TRUE(info.has_labels);
      EXPECT_EQ(info.classes, vocab);
      EXPECT_EQ(info.label_width, kContext);
      EXPECT_EQ(info.target_width, 0);
      EXPECT_EQ(info.scale, 1.0f);
      EXPECT_EQ(info.offset, 0.0f);
      // No fatal assertion inside the reads: a rank that left early would hang the others.
      EXPECT_EQ(wrong_values(split, vocab, cache ? &cached : &streamed), 0)
          << "rank " << world_rank() << " cache " << cache;
    }
    ASSERT_EQ(streamed.size(), cached.size());
    for (std::size_t k = 0; k < streamed.size(); ++k) {
      EXPECT_EQ(streamed[k].x, cached[k].x) << "trial " << k;
      EXPECT_EQ(streamed[k].y, cached[k].y) << "trial " << k;
    }
  }
};

}  // namespace

TEST_F(TokenDataset, Uint8WindowsAndNextTokenLabels) { check_windows<std::uint8_t>("u8.h5", 256); }
TEST_F(TokenDataset, Uint16WindowsAndNextTokenLabels) { check_windows<std::uint16_t>("u16.h5", 50257); }
TEST_F(TokenDataset, Int32WindowsAndNextTokenLabels) { check_windows<std::int32_t>("i32.h5", 1 << 24); }
TEST_F(TokenDataset, Int64TokensAreAcceptedToo) { check_windows<std::int64_t>("i64.h5", 1000); }

// The edges of the window count: context 1 (windows share every other token), a split of
// exactly context + 1 tokens (one sample), and N - 1 a multiple of the context (no tokens left).
TEST_F(TokenDataset, WindowCountAtTheEdges) {
  const std::string path = token_file<std::uint16_t>("edges.h5", 300);
  struct Case {
    std::int64_t context, samples;
  };
  for (const Case& c : {Case{1, kTokens - 1}, Case{kTokens - 1, 1}, Case{17, 6}, Case{34, 3}}) {
    for (bool cache : {false, true}) {
      io::TokenSplit split(MPI_COMM_WORLD, path, "train", c.context, cache);
      EXPECT_EQ(split.info().samples, c.samples) << "context " << c.context;
      EXPECT_EQ(wrong_values(split, 300), 0)
          << "rank " << world_rank() << " context " << c.context << " cache " << cache;
    }
  }
}

// Context parallelism's blocks of each window (io::RowBlock): one block of T/parts positions, or
// (head_tail, the ring's load balancing) chunks part and 2 parts - 1 - part of T/(2 parts); each
// position's input and label are the window's, streamed and cached.
TEST_F(TokenDataset, BlocksAndHeadTailChunksOfEachWindow) {
  const std::string path = token_file<std::uint8_t>("blocks.h5", 256);
  constexpr std::int64_t context = 16;
  for (bool head_tail : {false, true})
    for (bool cache : {false, true})
      for (int part = 0; part < 4; ++part) {
        io::TokenSplit split(MPI_COMM_WORLD, path, "train", context, cache, io::kNoCacheLimit,
                             io::RowBlock{4, part, head_tail});
        ASSERT_EQ(split.info().label_width, 4);
        const std::vector<std::int64_t> idx{3, 0, 5};
        std::vector<float> x(idx.size() * 4);
        std::vector<std::int32_t> y(idx.size() * 4);
        split.read(idx, x.data(), y.data(), nullptr);
        for (std::size_t i = 0; i < idx.size(); ++i)
          for (std::int64_t j = 0; j < 4; ++j) {
            const std::int64_t at = !head_tail ? part * 4 + j : j < 2 ? part * 2 + j : (7 - part) * 2 + (j - 2);
            EXPECT_EQ(x[i * 4 + std::size_t(j)], static_cast<float>(token_of(idx[i] * context + at, 256)))
                << "part " << part << " head_tail " << head_tail << " position " << at;
            EXPECT_EQ(y[i * 4 + std::size_t(j)], token_of(idx[i] * context + at + 1, 256));
          }
      }
}

// Every rank reads every window at once (the whole split in one union of hyperslabs), then one
// rank reads alone while the others read nothing.
TEST_F(TokenDataset, WholeSplitAndLoneReaders) {
  const std::string path = token_file<std::uint8_t>("whole.h5", 256);
  for (bool cache : {false, true}) {
    io::TokenSplit split(MPI_COMM_WORLD, path, "train", kContext, cache);
    const std::int64_t samples = split.info().samples;
    std::vector<std::int64_t> all;
    for (std::int64_t s = samples - 1; s >= 0; --s) all.push_back(s);
    for (int reader = -1; reader < world_size(); ++reader) {
      const std::vector<std::int64_t> idx =
          reader < 0 || reader == world_rank() ? all : std::vector<std::int64_t>{};
      std::vector<float> x(idx.size() * kContext);
      std::vector<std::int32_t> y(idx.size() * kContext);
      split.read(idx, x.data(), y.data(), nullptr);
      int wrong = 0;
      for (std::size_t i = 0; i < idx.size(); ++i) {
        for (std::int64_t j = 0; j < kContext; ++j) {
          wrong += x[i * kContext + j] != static_cast<float>(token_of(idx[i] * kContext + j, 256));
          wrong += y[i * kContext + j] != token_of(idx[i] * kContext + j + 1, 256);
        }
      }
      EXPECT_EQ(wrong, 0) << "rank " << world_rank() << " reader " << reader << " cache " << cache;
    }
  }
}

// More tokens than one round of the open-time check reads per rank (2^20): a bad token near the
// end is still found when nothing is cached, and windows across the rounds read back right.
TEST_F(TokenDataset, LongSplitIsCheckedInRounds) {
  constexpr std::int64_t n = (std::int64_t{5} << 19) + 3, vocab = 251;
  const std::string good = token_file<std::uint8_t>("long.h5", vocab, n);
  io::TokenSplit split(MPI_COMM_WORLD, good, "train", 1000, false);
  EXPECT_EQ(split.info().samples, (n - 1) / 1000);
  EXPECT_EQ(wrong_values(split, vocab), 0) << "rank " << world_rank();

  const std::string bad = make_file("long_bad.h5", [&](io::DatasetWriter& out) {
    std::vector<std::uint8_t> tokens(static_cast<std::size_t>(n), 1);
    tokens[static_cast<std::size_t>(n - 2)] = 251;
    out.write("/train/tokens", {std::uint64_t(n)}, std::span<const std::uint8_t>(tokens));
    out.write_attr("/", "vocab_size", vocab);
  });
  for (bool cache : {false, true}) {
    expect_input_error([&] { io::TokenSplit(MPI_COMM_WORLD, bad, "train", 1000, cache); },
                       {bad, "/train/tokens", "token 251 at position " + std::to_string(n - 2),
                        "vocab_size = 251"});
  }
}

TEST_F(TokenDataset, OpenSplitPicksTheLayout) {
  const std::string tokens = token_file<std::uint16_t>("pick_tokens.h5", 1000);
  const std::string supervised = make_file("pick_supervised.h5", [](io::DatasetWriter& out) {
    out.write("/train/inputs", {4, 3}, std::span<const float>(std::vector<float>(12, 0.5f)));
    out.write("/train/labels", {4}, std::span<const std::uint8_t>(std::vector<std::uint8_t>{0, 1, 2, 1}));
  });
  for (bool cache : {false, true}) {
    std::unique_ptr<io::Split> t = io::open_split(MPI_COMM_WORLD, tokens, "train", kContext, cache);
    EXPECT_NE(dynamic_cast<io::TokenSplit*>(t.get()), nullptr);
    EXPECT_EQ(t->info().label_width, kContext);
    EXPECT_EQ(wrong_values(*t, 1000), 0) << "rank " << world_rank();
    std::unique_ptr<io::Split> s = io::open_split(MPI_COMM_WORLD, supervised, "train", kContext, cache);
    EXPECT_NE(dynamic_cast<io::SupervisedSplit*>(s.get()), nullptr);
    EXPECT_EQ(s->info().label_width, 1);
    EXPECT_EQ(s->info().features, 3);
  }
  // Neither layout: the message says what each expects.
  expect_input_error([&] { io::open_split(MPI_COMM_WORLD, tokens, "val", kContext, false); },
                     {tokens + ": no group /val", "/val/inputs", "/val/labels", "/val/targets",
                      "/val/tokens"});
  const std::string empty_group = make_file("empty_group.h5", [](io::DatasetWriter& out) {
    out.create_group("/train");
    out.write_attr("/", "vocab_size", std::int64_t{10});
  });
  expect_input_error([&] { io::open_split(MPI_COMM_WORLD, empty_group, "train", kContext, false); },
                     {empty_group, "no dataset inputs or tokens in group /train", "/train/tokens"});
  const std::string missing = dir() + "/absent.h5";
  expect_input_error([&] { io::open_split(MPI_COMM_WORLD, missing, "train", kContext, false); },
                     {missing, "no such file"});
}

TEST_F(TokenDataset, MalformedFilesFailOnEveryRankNamingTheDataset) {
  const std::string good = token_file<std::uint8_t>("good.h5", 256);
  expect_input_error([&] { io::TokenSplit(MPI_COMM_WORLD, good, "val", kContext, false); },
                     {good, "no group /val", "/val/tokens"});

  const std::string no_tokens = make_file("no_tokens.h5", [](io::DatasetWriter& out) {
    out.write("/train/other", {4}, std::span<const std::uint8_t>(std::vector<std::uint8_t>(4)));
    out.write_attr("/", "vocab_size", std::int64_t{256});
  });
  expect_input_error([&] { io::TokenSplit(MPI_COMM_WORLD, no_tokens, "train", kContext, false); },
                     {no_tokens, "no dataset /train/tokens"});

  const std::string two_d = make_file("two_d.h5", [](io::DatasetWriter& out) {
    out.write("/train/tokens", {10, 20}, std::span<const std::uint16_t>(std::vector<std::uint16_t>(200)));
    out.write_attr("/", "vocab_size", std::int64_t{256});
  });
  for (bool cache : {false, true}) {
    expect_input_error([&] { io::TokenSplit(MPI_COMM_WORLD, two_d, "train", kContext, cache); },
                       {two_d + ": dataset /train/tokens has shape [10,20], expected [N]"});
  }

  const std::string floats = make_file("floats.h5", [](io::DatasetWriter& out) {
    out.write("/train/tokens", {200}, std::span<const float>(std::vector<float>(200, 1.0f)));
    out.write_attr("/", "vocab_size", std::int64_t{256});
  });
  expect_input_error([&] { io::open_split(MPI_COMM_WORLD, floats, "train", kContext, false); },
                     {floats + ": dataset /train/tokens has type float32, expected integer"});

  const std::string no_vocab = make_file("no_vocab.h5", [](io::DatasetWriter& out) {
    write_tokens<std::uint8_t>(out, "train", kTokens, 256);
  });
  expect_input_error([&] { io::open_split(MPI_COMM_WORLD, no_vocab, "train", kContext, true); },
                     {no_vocab, "no root attribute vocab_size", "/train/tokens"});

  for (const io::Attr& vocab : {io::Attr{std::string("256")}, io::Attr{std::int64_t{0}},
                                io::Attr{256.0}, io::Attr{(std::int64_t{1} << 24) + 1}}) {
    const std::string bad_vocab = make_file("bad_vocab.h5", [&](io::DatasetWriter& out) {
      write_tokens<std::uint8_t>(out, "train", kTokens, 256);
      out.write_attr("/", "vocab_size", vocab);
    });
    expect_input_error([&] { io::TokenSplit(MPI_COMM_WORLD, bad_vocab, "train", kContext, false); },
                       {bad_vocab, "root attribute vocab_size is " + io::to_string(vocab),
                        "/train/tokens"});
    MPI_Barrier(MPI_COMM_WORLD);  // every rank has closed the file before rank 0 rewrites it
  }

  // Two tokens out of range, in different ranks' shares: every rank names the first.
  const std::string too_big = make_file("too_big.h5", [](io::DatasetWriter& out) {
    std::vector<std::uint16_t> tokens(kTokens, 7);
    tokens[90] = 999;
    tokens[20] = 300;
    out.write("/train/tokens", {kTokens}, std::span<const std::uint16_t>(tokens));
    out.write_attr("/", "vocab_size", std::int64_t{300});
  });
  for (bool cache : {false, true}) {
    expect_input_error([&] { io::TokenSplit(MPI_COMM_WORLD, too_big, "train", kContext, cache); },
                       {too_big + ": dataset /train/tokens has token 300 at position 20",
                        "vocab_size = 300"});
  }
  const std::string negative = make_file("negative.h5", [](io::DatasetWriter& out) {
    std::vector<std::int32_t> tokens(kTokens, 3);
    tokens[kTokens - 1] = -1;  // the last token: a label only, still checked
    out.write("/train/tokens", {kTokens}, std::span<const std::int32_t>(tokens));
    out.write_attr("/", "vocab_size", std::int64_t{5});
  });
  expect_input_error([&] { io::open_split(MPI_COMM_WORLD, negative, "train", kContext, false); },
                     {negative, "/train/tokens has token -1 at position 102"});

  for (bool cache : {false, true}) {
    expect_input_error([&] { io::TokenSplit(MPI_COMM_WORLD, good, "train", kTokens, cache); },
                       {good + ": dataset /train/tokens has 103 tokens, expected at least 104"});
  }
}

// A file written by `tessera prepare text`: the windows of both splits are the text's bytes.
TEST_F(TokenDataset, ReadsWhatPrepareTextWrote) {
  const std::string text_path = dir() + "/notes.txt", path = dir() + "/notes.h5";
  std::string text;
  for (int line = 0; line < 60; ++line)
    text += "Line " + std::to_string(line) + ": the quick brown fox \xe2\x9c\x93 jumps.\n";
  if (world_rank() == 0) {
    std::ofstream(text_path, std::ios::binary) << text;
    io::prepare_text({text_path}, path, 0.25);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  const std::int64_t total = static_cast<std::int64_t>(text.size());
  const std::int64_t val = (total + 2) / 4, context = 16;  // round(0.25 * T)
  struct Part {
    std::string split;
    std::int64_t start, tokens;
  };
  for (const Part& p : {Part{"train", 0, total - val}, Part{"val", total - val, val}}) {
    for (bool cache : {false, true}) {
      std::unique_ptr<io::Split> split = io::open_split(MPI_COMM_WORLD, path, p.split, context, cache);
      const io::SplitInfo& info = split->info();
      EXPECT_EQ(info.samples, (p.tokens - 1) / context) << p.split;
      EXPECT_EQ(info.classes, 256);
      std::vector<std::int64_t> idx;
      for (std::int64_t s = world_rank(); s < info.samples; s += world_size()) idx.push_back(s);
      std::vector<float> x(idx.size() * context);
      std::vector<std::int32_t> y(idx.size() * context);
      split->read(idx, x.data(), y.data(), nullptr);
      int wrong = 0;
      for (std::size_t i = 0; i < idx.size(); ++i) {
        for (std::int64_t j = 0; j < context; ++j) {
          const auto at = static_cast<std::size_t>(p.start + idx[i] * context + j);
          wrong += x[i * context + j] != static_cast<float>(static_cast<std::uint8_t>(text[at]));
          wrong += y[i * context + j] != static_cast<std::uint8_t>(text[at + 1]);
        }
      }
      EXPECT_EQ(wrong, 0) << "rank " << world_rank() << " " << p.split << " cache " << cache;
    }
  }
}

// The read of one training step of inputs/kjv_gpt.toml's shape: 64 random windows of 256 byte
// tokens per rank from a 4.4 M-token split. Information, not an assertion; what is asserted is
// that the streamed and the cached reads of the same windows agree.
TEST_F(TokenDataset, ReadOf64RandomWindows) {
  constexpr std::int64_t n = 4'400'000, context = 256, batch = 64;
  const std::string path = token_file<std::uint8_t>("kjv_sized.h5", 256, n);
  std::vector<Rows> last(2);
  std::vector<std::int64_t> idx(batch);
  for (bool cache : {false, true}) {
    io::TokenSplit split(MPI_COMM_WORLD, path, "train", context, cache);
    std::mt19937_64 rng(static_cast<unsigned>(world_rank()));
    Rows& r = last[cache];
    r.x.resize(batch * context);
    r.y.resize(batch * context);
    constexpr int kWarmup = 5, kSteps = 100;
    double start = 0.0;
    for (int step = 0; step < kWarmup + kSteps; ++step) {
      if (step == kWarmup) {
        MPI_Barrier(MPI_COMM_WORLD);
        start = MPI_Wtime();
      }
      for (auto& s : idx) s = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(split.info().samples));
      split.read(idx, r.x.data(), r.y.data(), nullptr);
    }
    double mine = (MPI_Wtime() - start) / kSteps, slowest = 0.0;
    MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (world_rank() == 0) {
      std::printf("[ timing   ] TokenSplit::read, 64 random windows of 256 uint8 tokens per rank, %d "
                  "rank(s), cache %s: %.1f us per call (slowest rank)\n", world_size(),
                  cache ? "on " : "off", slowest * 1e6);
    }
  }
  EXPECT_EQ(last[0].x, last[1].x);
  EXPECT_EQ(last[0].y, last[1].y);
}
