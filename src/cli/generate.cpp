// tessera generate: text from a trained GPT checkpoint. Every rank loads the whole model on its
// own (layout 1 x 1 x 1, whatever layout wrote the checkpoint) and samples the same tokens;
// rank 0 prints them. Sampling is a pure function of (--seed, step): the same command prints
// the same text.
#include "cli/generate.hpp"

#include <fmt/format.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <optional>
#include <iostream>
#include <numeric>
#include <vector>

#include "cli/commands.hpp"
#include "comm/agree.hpp"
#include "comm/communicator.hpp"
#include "core/deck.hpp"
#include "core/deck_checks.hpp"
#include "core/error.hpp"
#include "io/checkpoint_file.hpp"
#include "io/text_tokenizer.hpp"
#include "io/utf8.hpp"
#include "kernels/random.hpp"
#include "nn/gpt.hpp"
#include "train/checkpointer.hpp"
#include "train/model.hpp"

namespace tessera::cli {

std::size_t sample_token(std::vector<double> logits, double temperature, int top_k, std::uint64_t seed,
                         std::uint64_t step) {
  const std::size_t n = logits.size();
  if (temperature <= 0.0)
    return static_cast<std::size_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  // The k largest logits (ties: the lower token first) stay; the others get probability 0.
  std::vector<std::size_t> order(n);
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return logits[a] > logits[b]; });
  const std::size_t keep = top_k > 0 ? std::min<std::size_t>(std::size_t(top_k), n) : n;
  const double top = logits[order[0]];
  std::vector<double> p(n, 0.0);
  double sum = 0.0;
  for (std::size_t j = 0; j < keep; ++j) sum += p[order[j]] = std::exp((logits[order[j]] - top) / temperature);
  const double u = kernels::uniform01(seed, kernels::hash_name("tessera::generate"), step) * sum;
  double acc = 0.0;
  for (std::size_t j = 0; j < keep; ++j) {
    acc += p[order[j]];
    if (u < acc) return order[j];
  }
  return order[keep - 1];
}

std::optional<io::BpeTokenizer> dataset_tokenizer(const std::string& dataset, std::int64_t vocab) {
  std::error_code ec;
  if (!std::filesystem::exists(dataset, ec)) {
    // Without the dataset only byte tokens can be read back.
    if (vocab <= 256) return std::nullopt;
    throw InputError(fmt::format("{}: no such file; data.path names the dataset whose tokenizer encodes the prompt "
                                 "and decodes the {} token ids of this model", dataset, vocab));
  }
  std::optional<io::BpeTokenizer> t = io::dataset_tokenizer(dataset);
  const std::int64_t ids = t ? t->vocab_size() : 256;
  if (ids > vocab)
    throw InputError(fmt::format("{}: its tokenizer has {} ids, the checkpoint's model {}: not the dataset it was "
                                 "trained on", dataset, ids, vocab));
  return t;
}

int generate(const GenerateArgs& args) {
  if (args.prompt.empty()) throw InputError("--prompt: give at least one character to continue from");
  if (args.tokens < 0) throw InputError(fmt::format("--tokens {}: expected a count >= 0", args.tokens));
  if (args.temperature < 0) throw InputError(fmt::format("--temperature {}: expected >= 0 (0: greedy)", args.temperature));
  Config cfg = load_deck(args.deck.deck, args.deck.overrides);
  if (!is_transformer(cfg.model.kind))
    throw InputError(fmt::format("{}: model.kind: generate needs \"gpt\" or \"llama\", the deck says \"{}\"",
                                 args.deck.deck, to_string(cfg.model.kind)));
  // One whole model per rank, however the checkpoint was written.
  cfg.parallel.data = 1;
  cfg.parallel.tensor = 1;
  cfg.parallel.pipeline = 1;
  cfg.parallel.spatial = 1;
  cfg.parallel.micro_batches = 1;
  cfg.parallel.stages.clear();
  cfg.parallel.zero = 0;
  cfg.train.global_batch = 1;
  resolve_layout(cfg, 1);
  const Communicator comm(MPI_COMM_SELF, 1, 1, 1, cfg.comm, BufferSpace::host);

  // The vocabulary is the checkpoint's: rows of wte.
  std::int64_t vocab = 0;
  {
    const io::CheckpointFile file(MPI_COMM_SELF, args.checkpoint);
    const auto wte = file.shape("model/wte.weight");
    if (wte.size() != 2 || static_cast<int>(wte[1]) != cfg.model.width)
      throw InputError(fmt::format("{}: model/wte.weight is not [vocab, {}] (model.width of {})",
                                   args.checkpoint, cfg.model.width, args.deck.deck));
    vocab = static_cast<std::int64_t>(wte[0]);
  }
  ModelShape shape;
  shape.in_features = cfg.model.context;
  shape.outputs = vocab;
  // Generation multiplies in fp32 whatever train.precision the deck trained with.
  cfg.train.precision = Precision::fp32;
  Model model(cfg, shape, 1);
  Checkpointer(cfg, comm).load_model(args.checkpoint, model);
  auto& gpt = dynamic_cast<nn::Gpt<float>&>(model.network());

  // The dataset's tokenizer encodes the prompt and decodes the sample (bytes when it has none).
  const std::optional<io::BpeTokenizer> tokenizer = dataset_tokenizer(cfg.data.path, vocab);
  std::vector<int> tokens;
  if (tokenizer) {
    if (const auto bad = io::utf8::first_invalid(args.prompt))
      throw InputError(fmt::format("--prompt: byte {} is not UTF-8, which the tokenizer of {} reads", *bad, cfg.data.path));
    std::vector<std::int32_t> ids;
    tokenizer->encode(args.prompt, ids);
    tokens.assign(ids.begin(), ids.end());
  } else {
    for (const unsigned char c : args.prompt) {
      if (c >= vocab)
        throw InputError(fmt::format("--prompt: byte {} is outside the model's vocabulary of {}", int(c), vocab));
      tokens.push_back(c);
    }
  }
  const ExecSpace exec;
  const int T = cfg.model.context;
  const int slot = gpt.acquire(1);
  Matrix<float> logits("tessera::generate::logits", 1, static_cast<std::size_t>(vocab));
  const auto h_logits = Kokkos::create_mirror_view(logits);
  const MatrixU<float> in = gpt.input(slot);
  const auto h_in = Kokkos::create_mirror_view(in);
  std::vector<std::int32_t> sampled;
  for (int step = 0; step < args.tokens; ++step) {
    // The last T tokens at most: the model has positions for T.
    const int n = std::min<int>(T, static_cast<int>(tokens.size()));
    for (int t = 0; t < T; ++t) h_in(0, t) = t < n ? float(tokens[tokens.size() - std::size_t(n) + std::size_t(t)]) : 0.0f;
    Kokkos::deep_copy(in, h_in);
    gpt.next_token_logits(exec, slot, n, logits);
    Kokkos::deep_copy(h_logits, logits);
    std::vector<double> l(static_cast<std::size_t>(vocab));
    for (std::int64_t v = 0; v < vocab; ++v) l[std::size_t(v)] = h_logits(0, v);
    const auto next = sample_token(std::move(l), args.temperature, args.top_k, args.seed, std::uint64_t(step));
    tokens.push_back(static_cast<int>(next));
    sampled.push_back(static_cast<std::int32_t>(next));
  }
  gpt.release(slot);
  std::string text;
  if (tokenizer) text = tokenizer->decode(sampled);
  else for (const std::int32_t t : sampled) text.push_back(static_cast<char>(t));
  if (world_rank() == 0) {
    std::cout << args.prompt << text << '\n';
    std::cout.flush();
  }
  return 0;
}

}  // namespace tessera::cli
