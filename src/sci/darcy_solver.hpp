#pragma once
// The Darcy problem of the FNO papers' benchmark, -div(a grad u) = f on the unit square with
// u = 0 on the boundary, solved by Jacobi-preconditioned conjugate gradients on a uniform grid of
// H x W interior nodes (kernels/darcy.hpp: the five-point finite-volume stencil, a sampled at
// the faces, second order for smooth a), in double precision.
//
// Domain decomposition (the same as parallel.spatial's): the ranks of a group hold consecutive
// blocks of rows of every field; each matrix-vector product exchanges one halo row with each
// neighbour (comm/halo_exchange.hpp), and the inner products are summed over the group, so every
// rank count solves the same system (to the tolerance).
#include <cstdint>
#include <vector>

#include "comm/communicator.hpp"

namespace tessera::sci {

/// A rank's block of an H x W grid: rows [row0, row0 + rows).
struct FieldBlock {
  int height = 1, width = 1;
  int row0 = 0, rows = 1;
};

/// \brief Block `part` of `parts` of H rows: H / parts rows each, the first H % parts blocks one
/// more. Needs parts <= H.
FieldBlock block_of(int height, int width, int part, int parts);

/// The discrete problem on one block: node (i, j) of the grid lies at x = (j+1)/(W+1),
/// y = (i+1)/(H+1); ax (rows, W+1): a at the face left of each node and right of the last,
/// ay (rows+1, W): a at the face above each node (between rows i-1 and i) and below the last;
/// f (rows, W) at the nodes. Row-major, this block's rows only.
struct DarcyBlock {
  std::vector<double> ax, ay, f;
};

struct CgReport {
  int iterations = 0;
  double relative_residual = 0.0;  ///< ||f - A u|| / ||f|| at the end (2-norms over the whole grid)
};

/// \brief u (rows, W) solves A u = f to ||f - A u|| <= tolerance ||f|| (u = 0 where f = 0).
/// Collective over group g of comm, whose ranks hold the blocks in order (rank r: block_of(H, W,
/// r, size)). NumericError where max_iterations do not reach the tolerance (a coefficient <= 0 or
/// not finite is the caller's bug: std::invalid_argument).
CgReport solve_darcy(const Communicator& comm, Group g, const FieldBlock& block, const DarcyBlock& problem,
                     double tolerance, int max_iterations, std::vector<double>& u);

}  // namespace tessera::sci
