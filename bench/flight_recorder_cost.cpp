// flight_recorder_cost: what the flight recorder adds to each communication operation, against
// the cheapest MPI collective there is (an 8-byte MPI_Allreduce on one rank), with and without
// the watchdog thread looking at the recorder.
//
// Usage: flight_recorder_cost [--ops N] [--reps R] [--csv PATH]
// Each row: the median over R repetitions of the time per operation of N operations. The CSV has
// columns what,ns_per_op.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "comm/flight_recorder.hpp"
#include "comm/watchdog.hpp"

namespace {

double median_ns_per_op(int reps, long ops, const std::function<void()>& op) {
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    for (long i = 0; i < ops; ++i) op();
    const auto t1 = std::chrono::steady_clock::now();
    t.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count() / static_cast<double>(ops));
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  long ops = 1000000;
  int reps = 7;
  std::string csv;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--ops") == 0) ops = std::atol(argv[i + 1]);
    else if (std::strcmp(argv[i], "--reps") == 0) reps = std::atoi(argv[i + 1]);
    else if (std::strcmp(argv[i], "--csv") == 0) csv = argv[i + 1];
  }
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_Comm_dup(MPI_COMM_SELF, &comm);
  auto& rec = tessera::comm::flight_recorder();
  rec.attach(comm, "world", {0});
  double x = 1.0;
  auto recorded = [&] { rec.end(rec.begin_collective("allreduce", comm, 8, true)); };
  auto allreduce = [&] { MPI_Allreduce(MPI_IN_PLACE, &x, 1, MPI_DOUBLE, MPI_SUM, comm); };
  auto both = [&] {
    const auto id = rec.begin_collective("allreduce", comm, 8, true);
    MPI_Allreduce(MPI_IN_PLACE, &x, 1, MPI_DOUBLE, MPI_SUM, comm);
    rec.end(id);
  };
  std::vector<std::pair<std::string, double>> rows;
  rows.emplace_back("recorder begin+end", median_ns_per_op(reps, ops, recorded));
  rows.emplace_back("MPI_Allreduce 8 bytes, 1 rank", median_ns_per_op(reps, ops, allreduce));
  rows.emplace_back("recorded MPI_Allreduce 8 bytes, 1 rank", median_ns_per_op(reps, ops, both));
  {
    tessera::comm::RecordIdentity who;
    who.run_dir = "/nonexistent";
    who.timeout_s = 600.0;
    const tessera::comm::Watchdog dog({who, {}});
    rows.emplace_back("recorder begin+end, watchdog running", median_ns_per_op(reps, ops, recorded));
    rows.emplace_back("recorded MPI_Allreduce 8 bytes, watchdog running", median_ns_per_op(reps, ops, both));
  }
  std::printf("%-50s %12s\n", "what", "ns/op");
  for (const auto& [what, ns] : rows) std::printf("%-50s %12.1f\n", what.c_str(), ns);
  if (!csv.empty()) {
    std::ofstream out(csv);
    out << "what,ns_per_op\n";
    for (const auto& [what, ns] : rows) out << '"' << what << "\"," << ns << '\n';
  }
  rec.detach(comm);
  MPI_Comm_free(&comm);
  MPI_Finalize();
  return 0;
}
