#pragma once
// data.normalize: the per-channel mean and standard deviation of a field dataset's inputs and
// targets over its training split, which the U-Net standardises its fields with
// (nn::FieldNorm, docs/data.md "Normalisation").
#include "comm/communicator.hpp"
#include "core/config.hpp"
#include "io/dataset.hpp"
#include "nn/unet.hpp"

namespace tessera {

/// \brief Whether this deck standardises its fields: data.normalize = "channel", or "auto" with
/// model.kind = "unet".
bool normalizes_fields(const Config& cfg);

/// \brief The statistics of `train` (a split of fields [N, C, H, W]: inputs as read, after
/// x*scale + offset, and targets), per channel over every sample and grid point: the mean, and
/// the population standard deviation (two passes, in double; a constant channel gets 1). Each
/// data rank reads its contiguous part of the samples and each spatial rank its block of rows;
/// the sums go over the replica group, so every rank gets the same values whatever the layout
/// (to double rounding). Collective over the split's communicator and the replica group.
nn::FieldNorm field_norm(const Communicator& comm, io::Split& train);

}  // namespace tessera
