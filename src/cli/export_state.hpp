#pragma once
// What an export carries besides the model's tensors: the safetensors __metadata__ (the
// checkpoint, its step and deck, and with --optimizer the optimizer's kind and step and the /train
// state) and the optimizer-state tensors `optimizer/<name>/<state>`; read back by import.
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "cli/tensor_map.hpp"
#include "core/config.hpp"
#include "io/attr.hpp"
#include "io/checkpoint_file.hpp"
#include "nn/unet.hpp"

namespace tessera::cli {

inline constexpr const char* kMetaStep = "tessera.step";
/// Prefixes of the /optimizer and /train attributes in the metadata ("tessera.train.epoch").
inline constexpr const char* kMetaOptimizer = "tessera.optimizer.";
inline constexpr const char* kMetaTrain = "tessera.train.";
/// Prefix of a unet's normalisation statistics in the metadata ("tessera.normalization.input_mean":
/// a JSON list of float32 values, one per channel, with 9 significant digits).
inline constexpr const char* kMetaNorm = "tessera.normalization.";

/// \brief format "pt" (what Hugging Face expects), the model kind, the naming, the checkpoint's
/// path, step and deck. Local.
std::map<std::string, std::string> export_metadata(const io::CheckpointFile& file, const Config& cfg,
                                                   Naming naming);

/// \brief The optimizer's state names ({"exp_avg", "exp_avg_sq"}, {"momentum"} or none), after
/// checking that the checkpoint holds each for every parameter in its shape; adds the /optimizer
/// and /train attributes to metadata. Local; InputError naming the checkpoint otherwise.
std::vector<std::string> optimizer_states(const io::CheckpointFile& file, const Config& cfg,
                                          const std::vector<TensorMapping>& map,
                                          std::map<std::string, std::string>& metadata);

/// \brief Adds the statistics (input_mean, input_std, target_mean, target_std) and the rule that
/// applies them (tessera.normalization.rule) to metadata.
void add_norm_metadata(std::map<std::string, std::string>& metadata, const nn::FieldNorm& norm);

/// \brief The statistics in an export's metadata, or nullopt where it has none. InputError naming
/// the file and the key where only some are there, one is no list of numbers, or they do not fit
/// the channels (check_field_norm).
std::optional<nn::FieldNorm> metadata_norm(const std::string& file, const std::map<std::string, std::string>& metadata,
                                           int in_channels, int out_channels);

/// The exported name of a parameter's optimizer state: "optimizer/<exported>/<state>".
std::string optimizer_name(const std::string& exported, const std::string& state);

/// Where training stands, as a checkpoint's /optimizer and /train attributes hold it.
struct StoredState {
  std::map<std::string, io::Attr> optimizer;  ///< kind, step
  std::map<std::string, io::Attr> train;      ///< step, epoch, batch_in_epoch, samples_seen, ...
};

/// \brief The state a fresh run of cfg starts from: step 0, zero optimizer steps, the initial
/// loss scale.
StoredState fresh_state(const Config& cfg);

/// \brief The state in an export's metadata (written with --optimizer), every value parsed and
/// in the range a resume accepts, the optimizer kind the deck's. InputError naming the file and
/// the key otherwise.
StoredState metadata_state(const std::string& file, const std::map<std::string, std::string>& metadata,
                           const Config& cfg);

}  // namespace tessera::cli
