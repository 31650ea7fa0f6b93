#include "sci/darcy_solver.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "comm/halo_exchange.hpp"
#include "core/error.hpp"
#include "kernels/darcy.hpp"

namespace tessera::sci {

FieldBlock block_of(int height, int width, int part, int parts) {
  if (parts < 1 || parts > height || part < 0 || part >= parts)
    throw std::invalid_argument(fmt::format("sci::block_of: block {} of {} of {} rows", part, parts, height));
  const int base = height / parts, extra = height % parts;
  return {height, width, part * base + std::min(part, extra), base + (part < extra ? 1 : 0)};
}

namespace {

using View1 = Kokkos::View<double*, MemSpace>;

View1 to_view(const std::string& label, const std::vector<double>& h) {
  View1 v(label, h.size());
  Kokkos::deep_copy(v, Kokkos::View<const double*, HostSpace, Kokkos::MemoryUnmanaged>(h.data(), h.size()));
  return v;
}

// out = A p, where pbuf (rows+2, W) holds p in rows 1..rows: first fills rows 0 and rows+1 from
// the neighbours (zeros at the field's edges stay zeros), staging the rows through host memory.
class Operator {
 public:
  Operator(const Communicator& comm, Group g, const FieldBlock& b, const DarcyBlock& p)
      : exchange_(comm, g), b_(b), ax_(to_view("tessera::sci::darcy::ax", p.ax)),
        ay_(to_view("tessera::sci::darcy::ay", p.ay)), send_(2 * std::size_t(b.width)),
        recv_(2 * std::size_t(b.width), 0.0) {
    const double hx = 1.0 / (b.width + 1), hy = 1.0 / (b.height + 1);
    sx_ = 1.0 / (hx * hx);
    sy_ = 1.0 / (hy * hy);
  }
  void apply(const ExecSpace& exec, const View1& pbuf, const View1& out) {
    const std::size_t W = std::size_t(b_.width), R = std::size_t(b_.rows);
    if (exchange_.size() > 1) {
      using Host = Kokkos::View<double*, HostSpace, Kokkos::MemoryUnmanaged>;
      exec.fence();
      Kokkos::deep_copy(Host(send_.data(), W), Kokkos::subview(pbuf, std::make_pair(W, 2 * W)));
      Kokkos::deep_copy(Host(send_.data() + W, W), Kokkos::subview(pbuf, std::make_pair(R * W, (R + 1) * W)));
      exchange_.start(send_.data(), send_.data() + W, recv_.data(), recv_.data() + W, W);
      exchange_.finish();
      if (exchange_.has_up()) Kokkos::deep_copy(Kokkos::subview(pbuf, std::make_pair(std::size_t(0), W)), Host(recv_.data(), W));
      if (exchange_.has_down())
        Kokkos::deep_copy(Kokkos::subview(pbuf, std::make_pair((R + 1) * W, (R + 2) * W)), Host(recv_.data() + W, W));
    }
    kernels::darcy_apply(exec, Index(R), Index(W), static_cast<const double*>(pbuf.data()),
                         static_cast<const double*>(ax_.data()), static_cast<const double*>(ay_.data()), sx_, sy_,
                         out.data());
  }
  void diagonal(const ExecSpace& exec, const View1& d) const {
    kernels::darcy_diagonal(exec, Index(b_.rows), Index(b_.width), static_cast<const double*>(ax_.data()),
                            static_cast<const double*>(ay_.data()), sx_, sy_, d.data());
  }

 private:
  HaloExchange exchange_;
  FieldBlock b_;
  View1 ax_, ay_;
  double sx_ = 0, sy_ = 0;
  std::vector<double> send_, recv_;
};

void check_block(const FieldBlock& b, const DarcyBlock& p) {
  const auto W = std::size_t(b.width), R = std::size_t(b.rows);
  if (p.ax.size() != R * (W + 1) || p.ay.size() != (R + 1) * W || p.f.size() != R * W)
    throw std::invalid_argument("sci::solve_darcy: coefficient arrays do not match the block");
  for (const auto* v : {&p.ax, &p.ay})
    for (double a : *v)
      if (!(a > 0.0) || !std::isfinite(a)) throw std::invalid_argument("sci::solve_darcy: a coefficient <= 0");
}

}  // namespace

CgReport solve_darcy(const Communicator& comm, Group g, const FieldBlock& b, const DarcyBlock& problem,
                     double tolerance, int max_iterations, std::vector<double>& u) {
  check_block(b, problem);
  const ExecSpace exec;
  const Index n = Index(b.rows) * b.width, W = b.width;
  Operator A(comm, g, b, problem);
  View1 x("tessera::sci::darcy::u", std::size_t(n)), r = to_view("tessera::sci::darcy::r", problem.f);
  View1 d("tessera::sci::darcy::diag", std::size_t(n)), z("tessera::sci::darcy::z", std::size_t(n));
  View1 q("tessera::sci::darcy::q", std::size_t(n)), pbuf("tessera::sci::darcy::p", std::size_t(n + 2 * W));
  const auto p = Kokkos::subview(pbuf, std::make_pair(std::size_t(W), std::size_t(n + W)));
  A.diagonal(exec, d);
  // u0 = 0: r = f, z = r / d, p = z.
  kernels::divide(exec, static_cast<const double*>(r.data()), static_cast<const double*>(d.data()), z.data(), n);
  Kokkos::deep_copy(exec, p, z);
  double sums[2] = {kernels::dot(exec, r.data(), r.data(), n), kernels::dot(exec, r.data(), z.data(), n)};
  comm.allreduce_sum(sums, 2, g);
  const double norm_f = std::sqrt(sums[0]);
  double rz = sums[1];
  CgReport report;
  double rr = sums[0];
  while (norm_f > 0.0 && std::sqrt(rr) > tolerance * norm_f) {
    if (report.iterations == max_iterations)
      throw NumericError(fmt::format("the Darcy solver (conjugate gradients) did not reach the relative residual {:g} "
                                     "in {} iterations (at {:.3g})", tolerance, max_iterations, std::sqrt(rr) / norm_f));
    A.apply(exec, pbuf, q);
    double pq = kernels::dot(exec, p.data(), q.data(), n);
    comm.allreduce_sum(&pq, 1, g);
    const double alpha = rz / pq;
    kernels::axpby(exec, alpha, static_cast<const double*>(p.data()), 1.0, x.data(), n);
    kernels::axpby(exec, -alpha, static_cast<const double*>(q.data()), 1.0, r.data(), n);
    kernels::divide(exec, static_cast<const double*>(r.data()), static_cast<const double*>(d.data()), z.data(), n);
    sums[0] = kernels::dot(exec, r.data(), r.data(), n);
    sums[1] = kernels::dot(exec, r.data(), z.data(), n);
    comm.allreduce_sum(sums, 2, g);
    rr = sums[0];
    const double beta = sums[1] / rz;
    rz = sums[1];
    kernels::axpby(exec, 1.0, static_cast<const double*>(z.data()), beta, p.data(), n);
    ++report.iterations;
  }
  report.relative_residual = norm_f > 0.0 ? std::sqrt(rr) / norm_f : 0.0;
  u.resize(std::size_t(n));
  Kokkos::deep_copy(exec, Kokkos::View<double*, HostSpace, Kokkos::MemoryUnmanaged>(u.data(), u.size()), x);
  exec.fence();
  return report;
}

}  // namespace tessera::sci
