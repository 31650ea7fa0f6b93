#pragma once
// data.normalize: the per-channel mean and standard deviation of a field dataset's inputs and
// targets over its training split, which the U-Net standardises its fields with
// (nn::FieldNorm, docs/data.md "Normalisation"), and how a checkpoint stores them (the group
// /normalization, docs/design.md "Checkpoints").
#include <array>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "core/config.hpp"
#include "io/checkpoint_file.hpp"
#include "io/dataset.hpp"
#include "nn/unet.hpp"

namespace tessera {

/// \brief Whether this deck standardises its fields: data.normalize = "channel", or "auto" with
/// model.kind = "unet".
bool normalizes_fields(const Config& cfg);

/// \brief The statistics of `train` (a split of fields [N, C, H, W]: inputs as read, after
/// x*scale + offset, and targets), per channel over every sample and grid point: the mean, and
/// the population standard deviation (two passes, in double; a constant channel gets 1), each
/// rounded to float32 (the precision the network applies them in and a checkpoint stores them
/// in, so a resumed run and `tessera eval` use exactly the values training used). Each data rank
/// reads its contiguous part of the samples and each spatial rank its block of rows; the sums go
/// over the replica group, so every rank gets the same values whatever the layout (to double
/// rounding). Collective over the split's communicator and the replica group.
nn::FieldNorm field_norm(const Communicator& comm, io::Split& train);

/// The checkpoint group that holds them, and what its attribute `rule` says.
inline constexpr const char* kFieldNormGroup = "normalization";
inline constexpr const char* kFieldNormRule =
    "per channel c: x_std = (x - input_mean[c]) / input_std[c] enters the network; its output y_std stands for "
    "(u - target_mean[c]) / target_std[c], so prediction = y_std * target_std[c] + target_mean[c]";

/// \brief The attributes of the group: {"rule": kFieldNormRule}.
std::map<std::string, io::Attr> field_norm_attrs();

/// The four tensors a checkpoint stores them as, float32, in this order:
/// normalization/input_mean and input_std [C_in], normalization/target_mean and target_std [C_out].
inline constexpr std::array<const char*, 4> kFieldNormTensors = {
    "normalization/input_mean", "normalization/input_std", "normalization/target_mean", "normalization/target_std"};

/// The statistics as float32 vectors, in kFieldNormTensors' order, and back.
using FieldNormValues = std::array<std::vector<float>, 4>;
FieldNormValues field_norm_values(const nn::FieldNorm& norm);
nn::FieldNorm field_norm_of(const FieldNormValues& values);

/// \brief This rank's slabs of the four tensors: whole where `writes` (one rank of the writers),
/// empty elsewhere; their data point into `values`, which must outlive the write.
std::vector<io::TensorSlab> field_norm_slabs(const FieldNormValues& values, bool writes);

/// \brief InputError naming `where` unless the statistics fit in_channels and out_channels and
/// every std is finite and > 0 (every mean finite).
void check_field_norm(const nn::FieldNorm& norm, int in_channels, int out_channels, const std::string& where);

/// \brief The statistics a checkpoint stores, read by every rank, or nullopt where it holds none
/// (written before they were stored, or by a run without data.normalize). InputError on every rank
/// naming the file and the tensor where only some of the four are there, one has another shape
/// than [in_channels] or [out_channels], does not match its checksum, or holds a std <= 0.
/// Collective over the file's communicator.
std::optional<nn::FieldNorm> stored_field_norm(const io::CheckpointFile& file, int in_channels, int out_channels);

/// \brief The statistics a run (resuming `checkpoint`) or an evaluation (of `checkpoint`)
/// standardises with: those the checkpoint stores, else (no checkpoint, or one that stores none)
/// field_norm() of the training split `train()` opens. `*note` says which, for the log.
/// Collective over world.
nn::FieldNorm choose_field_norm(const Config& cfg, const Communicator& comm, const std::string& checkpoint,
                                int in_channels, int out_channels, const std::function<io::Split&()>& train,
                                std::string* note);

}  // namespace tessera
