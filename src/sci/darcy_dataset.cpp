#include "sci/darcy_dataset.hpp"

#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <vector>

#include "comm/agree.hpp"
#include "core/error.hpp"
#include "io/field_writer.hpp"
#include "kernels/random.hpp"
#include "sci/darcy_solver.hpp"

namespace tessera::sci {

namespace fs = std::filesystem;

namespace {

constexpr int kModes = 32;
constexpr double kAlpha = 2.0, kTau = 3.0, kHigh = 12.0, kLow = 3.0;
constexpr double kPi = 3.14159265358979323846;
constexpr std::int64_t kChunk = 16;  // samples per collective write

// c (K x K): c[k2][k1] = sqrt(lambda_k) xi_k, lambda_k = (pi^2 |k|^2 + tau^2)^-alpha; no constant mode.
std::vector<double> coefficients(std::uint64_t seed, std::int64_t sample) {
  const std::uint64_t stream = kernels::hash_name("tessera::prepare::darcy") ^ std::uint64_t(sample);
  std::vector<double> c(kModes * kModes);
  for (int k2 = 0; k2 < kModes; ++k2)
    for (int k1 = 0; k1 < kModes; ++k1) {
      if (k1 == 0 && k2 == 0) continue;
      const double lambda = std::pow(kPi * kPi * (k1 * k1 + k2 * k2) + kTau * kTau, -kAlpha);
      c[std::size_t(k2 * kModes + k1)] = std::sqrt(lambda) * kernels::normal(seed, stream, std::uint64_t(k2 * kModes + k1));
    }
  return c;
}

std::vector<double> cosines(const std::vector<double>& points) {
  std::vector<double> m(points.size() * kModes);
  for (std::size_t i = 0; i < points.size(); ++i)
    for (int k = 0; k < kModes; ++k) m[i * kModes + std::size_t(k)] = std::cos(kPi * k * points[i]);
  return m;
}

std::vector<double> points(int first, int count, double offset, double h) {
  std::vector<double> p(static_cast<std::size_t>(count));
  for (int i = 0; i < count; ++i) p[std::size_t(i)] = (first + i + offset) * h;
  return p;
}

std::vector<double> threshold(std::vector<double> g) {
  for (double& v : g) v = v >= 0.0 ? kHigh : kLow;
  return g;
}

// The split's samples [first, first + count) of this rank's block into the file.
void write_split(const Communicator& comm, io::FieldWriter& out, const std::string& split, std::int64_t first,
                 std::int64_t count, const DarcyOptions& o, const FieldBlock& b, DarcySummary& summary) {
  const auto n = std::uint64_t(count), H = std::uint64_t(o.size);
  out.create("/" + split + "/inputs", {n, 1, H, H});
  out.create("/" + split + "/targets", {n, 1, H, H});
  // Readers map the inputs to x * scale + offset: 3 -> -1, 12 -> +1.
  out.write_float_attr("/" + split + "/inputs", "scale", float(2.0 / (kHigh - kLow)));
  out.write_float_attr("/" + split + "/inputs", "offset", float(-(kHigh + kLow) / (kHigh - kLow)));
  const double h = 1.0 / (o.size + 1);
  const auto ys = points(b.row0, b.rows, 1.0, h), xs = points(0, o.size, 1.0, h);
  const auto face_x = points(0, o.size + 1, 0.5, h), face_y = points(b.row0, b.rows + 1, 0.5, h);
  const std::size_t block = std::size_t(b.rows) * std::size_t(o.size);
  std::vector<float> a_out, u_out;
  std::vector<double> u;
  for (std::int64_t s = 0; s < count; ++s) {
    const std::int64_t sample = first + s;
    DarcyBlock p;
    p.ax = threshold(darcy_field(o.seed, sample, ys, face_x));
    p.ay = threshold(darcy_field(o.seed, sample, face_y, xs));
    p.f.assign(block, 1.0);
    const auto a = threshold(darcy_field(o.seed, sample, ys, xs));
    const CgReport r = solve_darcy(comm, Group::spatial, b, p, o.tolerance, 50 * o.size + 1000, u);
    summary.most_iterations = std::max(summary.most_iterations, r.iterations);
    summary.worst_residual = std::max(summary.worst_residual, r.relative_residual);
    a_out.insert(a_out.end(), a.begin(), a.end());
    u_out.insert(u_out.end(), u.begin(), u.end());
    if (s + 1 == count || a_out.size() == std::size_t(kChunk) * block) {
      const auto done = std::uint64_t(a_out.size() / std::max<std::size_t>(block, 1));
      const std::uint64_t from = std::uint64_t(s + 1) - done;
      out.write_rows("/" + split + "/inputs", from, done, std::uint64_t(b.row0), std::uint64_t(b.rows), a_out.data());
      out.write_rows("/" + split + "/targets", from, done, std::uint64_t(b.row0), std::uint64_t(b.rows), u_out.data());
      a_out.clear();
      u_out.clear();
    }
  }
  summary.samples += count;
}

}  // namespace

std::vector<double> darcy_field(std::uint64_t seed, std::int64_t sample, const std::vector<double>& ys,
                                const std::vector<double>& xs) {
  const auto c = coefficients(seed, sample);
  const auto cy = cosines(ys), cx = cosines(xs);
  // t (ny x K) = cy c; g = t cx^T.
  std::vector<double> t(ys.size() * kModes, 0.0), g(ys.size() * xs.size(), 0.0);
  for (std::size_t i = 0; i < ys.size(); ++i)
    for (int k2 = 0; k2 < kModes; ++k2) {
      const double w = cy[i * kModes + std::size_t(k2)];
      for (int k1 = 0; k1 < kModes; ++k1) t[i * kModes + std::size_t(k1)] += w * c[std::size_t(k2 * kModes + k1)];
    }
  for (std::size_t i = 0; i < ys.size(); ++i)
    for (std::size_t j = 0; j < xs.size(); ++j) {
      double v = 0.0;
      for (int k = 0; k < kModes; ++k) v += t[i * kModes + std::size_t(k)] * cx[j * kModes + std::size_t(k)];
      g[i * xs.size() + j] = v;
    }
  return g;
}

void check_darcy_options(const DarcyOptions& o, int ranks) {
  if (o.size < 2 || o.size > (1 << 15))
    throw InputError(fmt::format("prepare darcy: --size {}: the grid's interior nodes per side, in [2, 32768]", o.size));
  if (o.size < ranks)
    throw InputError(fmt::format("prepare darcy: --size {} gives fewer rows than the {} ranks that split them; run on "
                                 "at most {} ranks", o.size, ranks, o.size));
  if (o.train < 1 || o.train > (std::int64_t{1} << 40))
    throw InputError(fmt::format("prepare darcy: --train {}: the training samples, at least 1", o.train));
  if (o.test < 0 || o.test > (std::int64_t{1} << 40))
    throw InputError(fmt::format("prepare darcy: --test {}: the test samples, at least 0", o.test));
  if (!(o.tolerance > 0.0 && o.tolerance < 1.0))
    throw InputError(fmt::format("prepare darcy: --tolerance {}: the solver's relative residual, in (0, 1)", o.tolerance));
}

DarcySummary prepare_darcy(const Communicator& comm, const DarcyOptions& o) {
  check_darcy_options(o, comm.size(Group::spatial));
  const fs::path final_path(o.out);
  agree(comm.handle(Group::world), [&] {
    if (comm.rank() != 0 || !final_path.has_parent_path()) return;
    std::error_code ec;
    fs::create_directories(final_path.parent_path(), ec);
    if (ec)
      throw InputError(fmt::format("{}: cannot create directory: {}", final_path.parent_path().string(), ec.message()));
  });
  const std::string tmp = o.out + ".tmp";
  const FieldBlock b = block_of(o.size, o.size, comm.rank(Group::spatial), comm.size(Group::spatial));
  DarcySummary summary;
  {
    io::FieldWriter out(comm.handle(Group::spatial), tmp);
    write_split(comm, out, "train", 0, o.train, o, b, summary);
    if (o.test > 0) write_split(comm, out, "test", o.train, o.test, o, b, summary);
    out.write_attr("/", "format", std::string("tessera-dataset"));
    out.write_attr("/", "source", std::string("darcy"));
    out.write_attr("/", "seed", static_cast<std::int64_t>(o.seed));
    out.write_attr("/", "tolerance", o.tolerance);
    out.write_attr("/", "permeability", fmt::format("GRF (-Laplacian + {}^2)^-{}, {} cosine modes per side, "
                                                    "thresholded at 0 to {} / {}", kTau, kAlpha, kModes, kHigh, kLow));
    out.write_attr("/", "forcing", 1.0);
    out.close();
  }
  double worst[2] = {double(summary.most_iterations), summary.worst_residual};
  comm.allreduce_max(worst, 2, Group::world);
  summary.most_iterations = int(worst[0]);
  summary.worst_residual = worst[1];
  agree(comm.handle(Group::world), [&] {
    if (comm.rank() == 0) fs::rename(tmp, final_path);
  });
  return summary;
}

}  // namespace tessera::sci
