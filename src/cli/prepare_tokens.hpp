#pragma once
// tessera prepare text --tokenizer PATH [--merges PATH] [--invalid-utf8 error|replace]: text
// files as byte-level BPE tokens, each rank encoding a share, written through parallel HDF5.
#include <string>
#include <vector>

namespace tessera::cli {

struct PrepareTokensArgs {
  std::vector<std::string> inputs;
  std::string out;
  double val_fraction = 0.1;
  std::string tokenizer;     ///< tokenizer.json, or vocab.json with merges
  std::string merges;        ///< GPT-2's merges.txt; empty with a tokenizer.json
  std::string invalid_utf8 = "error";  ///< error | replace
};

/// \brief Writes the language dataset of DESIGN.md from the inputs, each file encoded as one
/// document (Hugging Face's encode(text, add_special_tokens=False)) and the ids concatenated in
/// the order given: /train/tokens and /val/tokens (the last round(F x T) tokens), uint16 when the
/// vocabulary has at most 65536 ids, else int32; the tokenizer's files under /tokenizer and the
/// root attributes of docs/data.md. Must be called on every rank of MPI_COMM_WORLD: each rank
/// encodes a contiguous share of the text; the file is the same on any number of ranks.
/// InputError (on every rank, nothing written) for bad options, inputs or tokenizer files.
int prepare_tokens(const PrepareTokensArgs& args);

}  // namespace tessera::cli
