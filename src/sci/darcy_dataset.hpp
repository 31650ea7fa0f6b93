#pragma once
// `tessera prepare darcy`: a dataset of Darcy problems (the FNO papers' benchmark) made by
// Tessera's own solver (sci/darcy_solver.hpp). Sample s: the permeability a is a Gaussian random
// field g with covariance (-Laplacian + tau^2 I)^(-alpha) (alpha = 2, tau = 3; its first K = 32
// cosine modes in each direction, coefficients drawn from (seed, s) alone) thresholded to
// a = 12 where g >= 0 and 3 elsewhere; f = 1; u solves -div(a grad u) = f with u = 0 on the
// boundary of the unit square. Written to /train and /test: inputs (a) and targets (u), float32
// [N, 1, H, W] at the H x W interior nodes. Every rank solves and writes its block of rows of
// every sample (parallel HDF5 hyperslabs), so the file does not depend on the rank count beyond
// the solver's tolerance.
#include <cstdint>
#include <string>

#include "comm/communicator.hpp"

namespace tessera::sci {

struct DarcyOptions {
  std::string out;
  int size = 64;                ///< H = W: interior nodes per side (mesh width 1 / (size + 1))
  std::int64_t train = 1000, test = 100;
  std::uint64_t seed = 0;
  double tolerance = 1e-10;     ///< conjugate gradients stop at ||f - A u|| <= tolerance ||f||
};

struct DarcySummary {
  std::int64_t samples = 0;
  int most_iterations = 0;       ///< conjugate-gradient iterations of the hardest sample
  double worst_residual = 0.0;   ///< the largest relative residual reached
};

/// \brief The options checked (InputError naming the option on every rank alike): size in
/// [2, 2^15] and at least the ranks, train >= 1, test >= 0, tolerance in (0, 1).
void check_darcy_options(const DarcyOptions& o, int ranks);

/// \brief Writes o.out (via o.out + ".tmp", renamed once complete; its directory created).
/// Collective over comm's world, whose ranks split every sample's rows (the spatial group of a
/// GridShape{1, 1, 1, ranks} communicator).
DarcySummary prepare_darcy(const Communicator& comm, const DarcyOptions& o);

/// \brief The permeability field g of sample `sample` (before thresholding) at the points
/// (xs[j], ys[i]), row-major [ys.size(), xs.size()].
std::vector<double> darcy_field(std::uint64_t seed, std::int64_t sample, const std::vector<double>& ys,
                                const std::vector<double>& xs);

}  // namespace tessera::sci
