#include "train/field_norm.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "comm/agree.hpp"
#include "comm/mpi_check.hpp"
#include "core/error.hpp"
#include "io/tensor_check.hpp"
#include "train/sampler.hpp"

namespace tessera {

bool normalizes_fields(const Config& cfg) {
  return cfg.data.normalize == FieldNormalize::channel ||
         (cfg.data.normalize == FieldNormalize::automatic && cfg.model.kind == ModelKind::unet);
}

namespace {

// Sums over this rank's samples of f(value, channel) for inputs (the first in channels) and
// targets (the rest), over every value of each channel's plane. Reads in rounds of `chunk`
// samples, as many rounds on every data rank.
template <class F>
std::vector<double> channel_sums(const Communicator& comm, io::Split& train, int in, int out, F f) {
  const io::SplitInfo& info = train.info();
  std::vector<std::int64_t> all(static_cast<std::size_t>(info.samples));
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = static_cast<std::int64_t>(i);
  const int dp = comm.size(Group::data);
  const auto mine = Sampler::part(all, comm.rank(Group::data), dp);
  const std::size_t largest = (all.size() + static_cast<std::size_t>(dp) - 1) / static_cast<std::size_t>(dp);
  const auto features = static_cast<std::size_t>(info.local_features);
  const auto targets = static_cast<std::size_t>(info.local_target_width);
  const std::size_t chunk = 64;
  std::vector<float> x(chunk * features), t(chunk * targets);
  std::vector<double> sums(static_cast<std::size_t>(in + out), 0.0);
  const std::size_t in_plane = features / static_cast<std::size_t>(in);
  const std::size_t out_plane = targets / static_cast<std::size_t>(out);
  for (std::size_t begin = 0; begin < largest; begin += chunk) {
    const std::size_t b = std::min(begin, mine.size());
    const auto idx = mine.subspan(b, std::min(chunk, mine.size() - b));
    train.read(idx, x.data(), nullptr, t.data());
    for (std::size_t i = 0; i < idx.size(); ++i) {
      for (std::size_t k = 0; k < features; ++k) sums[k / in_plane] += f(x[i * features + k], k / in_plane);
      for (std::size_t k = 0; k < targets; ++k)
        sums[static_cast<std::size_t>(in) + k / out_plane] +=
            f(t[i * targets + k], static_cast<std::size_t>(in) + k / out_plane);
    }
  }
  comm.allreduce_sum(sums.data(), sums.size(), Group::replica);
  return sums;
}

}  // namespace

nn::FieldNorm field_norm(const Communicator& comm, io::Split& train) {
  const io::SplitInfo& info = train.info();
  const int in = static_cast<int>(info.sample_shape.at(0)), out = static_cast<int>(info.target_shape.at(0));
  const auto n = static_cast<std::size_t>(in + out);
  // Values per channel in the whole split: every sample's whole plane.
  const auto plane = [&](const std::vector<std::int64_t>& s) {
    return static_cast<double>(info.samples) * static_cast<double>(s.at(1)) * static_cast<double>(s.at(2));
  };
  const auto count = [&](std::size_t c) { return c < static_cast<std::size_t>(in) ? plane(info.sample_shape) : plane(info.target_shape); };
  std::vector<double> mean = channel_sums(comm, train, in, out, [](float v, std::size_t) { return double(v); });
  for (std::size_t c = 0; c < n; ++c) mean[c] /= count(c);
  std::vector<double> sd = channel_sums(comm, train, in, out, [&](float v, std::size_t c) {
    const double d = double(v) - mean[c];
    return d * d;
  });
  // float32, the precision they are applied and stored in; a constant channel's std is 1.
  for (std::size_t c = 0; c < n; ++c) {
    mean[c] = double(static_cast<float>(mean[c]));
    sd[c] = double(static_cast<float>(std::sqrt(sd[c] / count(c))));
    if (!(sd[c] > 0.0)) sd[c] = 1.0;
  }
  nn::FieldNorm r;
  r.in_mean.assign(mean.begin(), mean.begin() + in);
  r.in_std.assign(sd.begin(), sd.begin() + in);
  r.out_mean.assign(mean.begin() + in, mean.end());
  r.out_std.assign(sd.begin() + in, sd.end());
  return r;
}

std::map<std::string, io::Attr> field_norm_attrs() { return {{"rule", std::string(kFieldNormRule)}}; }

FieldNormValues field_norm_values(const nn::FieldNorm& norm) {
  FieldNormValues v;
  const std::vector<double>* parts[4] = {&norm.in_mean, &norm.in_std, &norm.out_mean, &norm.out_std};
  for (std::size_t i = 0; i < 4; ++i)
    for (double x : *parts[i]) v[i].push_back(static_cast<float>(x));
  return v;
}

nn::FieldNorm field_norm_of(const FieldNormValues& values) {
  nn::FieldNorm n;
  std::vector<double>* parts[4] = {&n.in_mean, &n.in_std, &n.out_mean, &n.out_std};
  for (std::size_t i = 0; i < 4; ++i) parts[i]->assign(values[i].begin(), values[i].end());
  return n;
}

std::vector<io::TensorSlab> field_norm_slabs(const FieldNormValues& values, bool writes) {
  std::vector<io::TensorSlab> out;
  for (std::size_t i = 0; i < 4; ++i) {
    io::TensorSlab slab;
    slab.path = kFieldNormTensors[i];
    slab.shape = {values[i].size()};
    slab.offset = {0};
    slab.count = {writes ? values[i].size() : 0};
    slab.data = writes ? values[i].data() : nullptr;
    out.push_back(std::move(slab));
  }
  return out;
}

void check_field_norm(const nn::FieldNorm& norm, int in_channels, int out_channels, const std::string& where) {
  const FieldNormValues v = field_norm_values(norm);
  for (std::size_t i = 0; i < 4; ++i) {
    const std::size_t want = static_cast<std::size_t>(i < 2 ? in_channels : out_channels);
    const std::string name = std::string(kFieldNormTensors[i]).substr(std::string("normalization/").size());
    if (v[i].size() != want)
      throw InputError(fmt::format("{}: {} holds {} values; the model has {} {} channel(s)", where, name,
                                   v[i].size(), want, i < 2 ? "input" : "target"));
    const bool is_std = i % 2 == 1;
    for (float x : v[i])
      if (!std::isfinite(x) || (is_std && !(x > 0.0f)))
        throw InputError(fmt::format("{}: {} holds {}; expected {}", where, name, x,
                                     is_std ? "standard deviations > 0" : "finite means"));
  }
}

std::optional<nn::FieldNorm> stored_field_norm(const io::CheckpointFile& file, int in_channels, int out_channels) {
  // Which are there, and their shapes: metadata every rank reads alike.
  std::size_t present = 0;
  FieldNormValues values;
  agree(file.comm(), [&] {
    for (const char* path : kFieldNormTensors) present += file.has(path) ? 1 : 0;
    if (present != 0 && present != kFieldNormTensors.size())
      throw InputError(fmt::format("{}: holds {} of the 4 tensors of /normalization ({}); a checkpoint holds all or "
                                   "none", file.path(), present, fmt::join(kFieldNormTensors, ", ")));
    for (std::size_t i = 0; present != 0 && i < 4; ++i) {
      const std::vector<std::uint64_t> shape = file.shape(kFieldNormTensors[i]);
      const auto want = static_cast<std::uint64_t>(i < 2 ? in_channels : out_channels);
      if (shape != std::vector<std::uint64_t>{want})
        throw InputError(fmt::format("{}: tensor {} has shape [{}]; the model's {} channels need [{}]", file.path(),
                                     kFieldNormTensors[i], fmt::join(shape, ","), i < 2 ? "input" : "target", want));
      values[i].resize(want);
    }
  });
  if (present == 0) return std::nullopt;
  // Every rank reads them whole; rank 0's copy is the one checked against the checksums.
  for (std::size_t i = 0; i < 4; ++i) {
    const std::vector<std::uint64_t> offset{0}, count{values[i].size()};
    file.read(kFieldNormTensors[i], offset, count, values[i].data());
  }
  int rank = 0;
  MPI_CHECK(MPI_Comm_rank(file.comm(), &rank));
  std::vector<io::TensorCheck> checks;
  for (const io::TensorSlab& slab : field_norm_slabs(values, rank == 0)) checks.push_back(io::check_of(slab));
  file.verify(checks);
  const nn::FieldNorm norm = field_norm_of(values);
  agree(file.comm(), [&] { check_field_norm(norm, in_channels, out_channels, file.path() + ": /normalization"); });
  return norm;
}

nn::FieldNorm choose_field_norm(const Config& cfg, const Communicator& comm, const std::string& checkpoint,
                                int in_channels, int out_channels, const std::function<io::Split&()>& train,
                                std::string* note) {
  const std::string source = fmt::format("{} /{}", cfg.data.path, cfg.data.train_split);
  if (!checkpoint.empty()) {
    const io::CheckpointFile file(comm.handle(), checkpoint);
    if (std::optional<nn::FieldNorm> stored = stored_field_norm(file, in_channels, out_channels)) {
      *note = fmt::format("normalisation: the statistics stored in {} (/normalization)", checkpoint);
      return *stored;
    }
    *note = fmt::format("normalisation: computed from {} ({} stores none: written before checkpoints held them, "
                        "or by a run without data.normalize)", source, checkpoint);
  } else {
    *note = fmt::format("normalisation: computed from {}", source);
  }
  return field_norm(comm, train());
}

}  // namespace tessera
