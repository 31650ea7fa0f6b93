// The Darcy solver (sci/darcy_solver.hpp) on 1, 2 and 4 ranks, each holding a block of rows:
// against a manufactured solution, whose error must shrink at second order under refinement; the
// blocks' solution equals one rank's solve of the whole grid; the permeability field does not
// depend on where it is evaluated from.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "comm/communicator.hpp"
#include "mpi_test_util.hpp"
#include "sci/darcy_dataset.hpp"
#include "sci/darcy_solver.hpp"

namespace tessera {
namespace {

using tessera::test::world_size;

constexpr double kPi = 3.14159265358979323846;

// u = sin(pi x) sin(2 pi y) (zero on the boundary), a = 1 + x^2 + 0.5 sin(pi y), f = -div(a grad u).
double exact_u(double x, double y) { return std::sin(kPi * x) * std::sin(2 * kPi * y); }
double coeff(double x, double y) { return 1.0 + x * x + 0.5 * std::sin(kPi * y); }
double forcing(double x, double y) {
  const double ux = kPi * std::cos(kPi * x) * std::sin(2 * kPi * y), uy = 2 * kPi * std::sin(kPi * x) * std::cos(2 * kPi * y);
  const double lap = -(kPi * kPi + 4 * kPi * kPi) * exact_u(x, y);
  const double ax = 2 * x, ay = 0.5 * kPi * std::cos(kPi * y);
  return -(coeff(x, y) * lap + ax * ux + ay * uy);
}

sci::DarcyBlock manufactured(const sci::FieldBlock& b) {
  const int W = b.width;
  const double hx = 1.0 / (W + 1), hy = 1.0 / (b.height + 1);
  sci::DarcyBlock p;
  for (int i = 0; i < b.rows; ++i)
    for (int j = 0; j <= W; ++j) p.ax.push_back(coeff((j + 0.5) * hx, (b.row0 + i + 1) * hy));
  for (int i = 0; i <= b.rows; ++i)
    for (int j = 0; j < W; ++j) p.ay.push_back(coeff((j + 1) * hx, (b.row0 + i + 0.5) * hy));
  for (int i = 0; i < b.rows; ++i)
    for (int j = 0; j < W; ++j) p.f.push_back(forcing((j + 1) * hx, (b.row0 + i + 1) * hy));
  return p;
}

// The largest nodal error of the distributed solve on an n x n grid.
double max_error(const Communicator& comm, int n) {
  const sci::FieldBlock b = sci::block_of(n, n, comm.rank(Group::spatial), comm.size(Group::spatial));
  std::vector<double> u;
  const sci::CgReport r = sci::solve_darcy(comm, Group::spatial, b, manufactured(b), 1e-12, 10000, u);
  EXPECT_LE(r.relative_residual, 1e-12);
  EXPECT_GT(r.iterations, 0);
  const double h = 1.0 / (n + 1);
  double worst = 0.0;
  for (int i = 0; i < b.rows; ++i)
    for (int j = 0; j < n; ++j)
      worst = std::max(worst, std::abs(u[std::size_t(i * n + j)] - exact_u((j + 1) * h, (b.row0 + i + 1) * h)));
  comm.allreduce_max(&worst, 1, Group::spatial);
  return worst;
}

TEST(Darcy, ManufacturedSolutionConvergesAtSecondOrder) {
  const Communicator comm(MPI_COMM_WORLD, GridShape{1, 1, 1, world_size()});
  // Mesh widths 1/8, 1/16, 1/32, 1/64: each halving should divide the error by about 4.
  std::vector<double> errors;
  for (int n : {7, 15, 31, 63}) errors.push_back(max_error(comm, n));
  for (std::size_t k = 1; k < errors.size(); ++k) {
    const double order = std::log2(errors[k - 1] / errors[k]);
    RecordProperty("order_" + std::to_string(k), std::to_string(order));
    EXPECT_GT(order, 1.8) << "errors " << errors[k - 1] << " -> " << errors[k];
    EXPECT_LT(order, 2.3) << "errors " << errors[k - 1] << " -> " << errors[k];
  }
  EXPECT_LT(errors.back(), 2e-3);
}

TEST(Darcy, BlocksSolveTheSameSystemAsOneRank) {
  const Communicator comm(MPI_COMM_WORLD, GridShape{1, 1, 1, world_size()});
  const Communicator alone(MPI_COMM_SELF, GridShape{1, 1, 1, 1});
  const int n = 13;  // 4 ranks: blocks of 4, 3, 3, 3 rows
  const sci::FieldBlock b = sci::block_of(n, n, comm.rank(Group::spatial), comm.size(Group::spatial));
  const sci::FieldBlock whole = sci::block_of(n, n, 0, 1);
  std::vector<double> u, all;
  sci::solve_darcy(comm, Group::spatial, b, manufactured(b), 1e-13, 10000, u);
  sci::solve_darcy(alone, Group::spatial, whole, manufactured(whole), 1e-13, 10000, all);
  for (int i = 0; i < b.rows; ++i)
    for (int j = 0; j < n; ++j)
      EXPECT_NEAR(u[std::size_t(i * n + j)], all[std::size_t((b.row0 + i) * n + j)], 1e-10) << i << "," << j;
}

TEST(Darcy, BlocksOfRowsCoverTheGrid) {
  int next = 0;
  for (int part = 0; part < 4; ++part) {
    const sci::FieldBlock b = sci::block_of(10, 3, part, 4);
    EXPECT_EQ(b.row0, next);
    EXPECT_EQ(b.rows, part < 2 ? 3 : 2);
    next += b.rows;
  }
  EXPECT_EQ(next, 10);
}

TEST(Darcy, PermeabilityIsAPureFunctionOfSeedSampleAndPoint) {
  const std::vector<double> ys = {0.1, 0.5, 0.9}, xs = {0.2, 0.7};
  const auto g = sci::darcy_field(3, 17, ys, xs);
  const auto row = sci::darcy_field(3, 17, {0.5}, {0.7});
  EXPECT_EQ(g[3], row[0]);
  const auto other = sci::darcy_field(3, 18, ys, xs);
  EXPECT_NE(g, other);
  // Both signs occur over a sample's field (the threshold makes two phases).
  std::vector<double> grid;
  for (int i = 0; i < 32; ++i) grid.push_back((i + 0.5) / 32);
  const auto f = sci::darcy_field(3, 17, grid, grid);
  EXPECT_GT(*std::max_element(f.begin(), f.end()), 0.0);
  EXPECT_LT(*std::min_element(f.begin(), f.end()), 0.0);
}

}  // namespace
}  // namespace tessera
