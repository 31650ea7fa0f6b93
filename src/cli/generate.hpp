#pragma once
// tessera generate DECK --checkpoint PATH --prompt TEXT --tokens N [--temperature T --top-k K --seed S]
#include <cstdint>
#include <string>
#include <vector>

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

/// \brief Prints the prompt and `tokens` sampled continuations; InputError on bad arguments, a
/// deck that is not a gpt, or a checkpoint that does not fit the deck's model.
int generate(const GenerateArgs& args);

}  // namespace tessera::cli
