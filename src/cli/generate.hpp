#pragma once
// tessera generate DECK --checkpoint PATH --prompt TEXT --tokens N [--temperature T --top-k K --seed S]
#include <cstdint>
#include <string>
#include <optional>
#include <vector>

#include "io/bpe_tokenizer.hpp"

#include "cli/commands.hpp"

namespace tessera::cli {

struct GenerateArgs {
  DeckArgs deck;
  std::string checkpoint;
  std::string prompt;
  int tokens = 200;
  double temperature = 1.0;  ///< 0: greedy (the most likely token every time)
  int top_k = 0;             ///< 0: the whole vocabulary
  std::uint64_t seed = 1;
};

/// \brief The next token from logits: greedy at temperature 0, else sampled from
/// softmax(logits / temperature) over the top_k largest (0: all), with the uniform number
/// u(seed, step) of the counter-based generator.
std::size_t sample_token(std::vector<double> logits, double temperature, int top_k, std::uint64_t seed,
                         std::uint64_t step);

/// \brief The tokenizer of the dataset a model was trained on (data.path): nullopt for byte
/// tokens, which is also what a missing dataset means for a vocabulary of at most 256. InputError
/// when the dataset is missing for a larger vocabulary, unreadable, or has more ids than vocab.
std::optional<io::BpeTokenizer> dataset_tokenizer(const std::string& dataset, std::int64_t vocab);

/// \brief Prints the prompt and `tokens` sampled continuations; InputError on bad arguments, a
/// deck that is not a gpt, or a checkpoint that does not fit the deck's model.
int generate(const GenerateArgs& args);

}  // namespace tessera::cli
