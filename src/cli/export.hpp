#pragma once
// `tessera export CHECKPOINT --format safetensors|torch [--out PATH] [--hf-gpt2|--hf-llama] [--optimizer]`
// and `tessera import FILE --deck DECK --out CHECKPOINT`: a checkpoint's model to PyTorch or
// Hugging Face, and back (docs/models.md "Export and import").
#include <string>

#include "cli/commands.hpp"

namespace tessera::cli {

struct ExportArgs {
  std::string checkpoint;
  std::string format = "safetensors";  ///< "safetensors" or "torch"
  std::string out;                     ///< "": beside the checkpoint (see export_checkpoint)
  bool hf_gpt2 = false;                ///< Hugging Face GPT2LMHeadModel names, a directory
  bool hf_llama = false;               ///< Hugging Face LlamaForCausalLM names, a directory
  bool optimizer = false;              ///< also the optimizer state and where training stands
};

/// \brief Writes the checkpoint's model as safetensors (F32, PyTorch's names and layouts) or as
/// a torch.save state_dict, plus a JSON of the model's configuration; with hf_gpt2 (a gpt) or
/// hf_llama (a llama) a directory with model.safetensors (or pytorch_model.bin), Hugging Face's
/// config.json and tessera.json.
/// Default out: the checkpoint's path with .safetensors / .pt (-hf for a directory). The
/// checkpoint is checked as every reader checks it (checksums, NaN, its deck's model). Must be
/// called on every rank of MPI_COMM_WORLD; rank 0 reads and writes. InputError, nothing written,
/// for a damaged checkpoint, a model kind without the requested naming, an unwritable output.
int export_checkpoint(const ExportArgs& args);

struct ImportArgs {
  std::string file;  ///< safetensors, a model.safetensors.index.json (shards), or a directory with either
  DeckArgs deck;
  std::string out;   ///< the checkpoint to write (must not exist)
};

/// \brief Writes a checkpoint of the deck's model (shapes from the deck and its data, as train
/// builds it) from a safetensors file, or the shards a Hugging Face index names, with the names
/// and shapes `export` writes (Tessera's, or Hugging Face's for a gpt or a llama; config.json
/// beside it checked against the deck); F32, F16, BF16 and F64 are converted to float32. With the
/// optimizer state an `export --optimizer` wrote, training continues where it stood; without, the
/// checkpoint is at step 0 with zero optimizer state (fine-tuning: `train --resume PATH`). Must be
/// called on every rank of MPI_COMM_WORLD; each tensor is read and written whole by one rank, the
/// tensors spread over the ranks by size (no rank reads the whole model unless it is alone).
/// InputError naming the first tensor that is missing, of another shape or not part of the model,
/// or what is damaged in the file; nothing is written then.
int import_checkpoint(const ImportArgs& args);

}  // namespace tessera::cli
