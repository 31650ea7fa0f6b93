#include "train/field_norm.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

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
  for (std::size_t c = 0; c < n; ++c) {
    sd[c] = std::sqrt(sd[c] / count(c));
    if (!(sd[c] > 0.0)) sd[c] = 1.0;
  }
  nn::FieldNorm r;
  r.in_mean.assign(mean.begin(), mean.begin() + in);
  r.in_std.assign(sd.begin(), sd.begin() + in);
  r.out_mean.assign(mean.begin() + in, mean.end());
  r.out_std.assign(sd.begin() + in, sd.end());
  return r;
}

}  // namespace tessera
