#pragma once
// What an export carries besides the model's tensors: the safetensors __metadata__ (the
// checkpoint, its step and deck, and with --optimizer the optimizer's kind and step and the /train
// state) and the optimizer-state tensors `optimizer/<name>/<state>`; read back by import.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "cli/tensor_map.hpp"
#include "core/config.hpp"
#include "io/attr.hpp"
#include "io/checkpoint_file.hpp"

namespace tessera::cli {

inline constexpr const char* kMetaStep = "tessera.step";
/// Prefixes of the /optimizer and /train attributes in the metadata ("tessera.train.epoch").
inline constexpr const char* kMetaOptimizer = "tessera.optimizer.";
inline constexpr const char* kMetaTrain = "tessera.train.";

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
