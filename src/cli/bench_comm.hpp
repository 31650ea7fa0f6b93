#pragma once
// `tessera bench comm`: time every allreduce algorithm on every backend this machine can run,
// over a range of message sizes and wire types, with the bytes each call hands to MPI (the
// Communicator's counters).
#include <string>

namespace tessera::cli {

struct BenchCommArgs {
  std::string sizes = "4K..256M";                      ///< LO..HI bytes, powers of 4 between
  std::string algorithms = "mpi,ring,parameter-server";  ///< comma-separated deck names
  std::string reduce_dtypes = "fp32";                    ///< comma-separated: fp32, bf16 (comm.reduce_dtype)
  std::string backends = "all";  ///< "all" or comma-separated: mpi, staged, cuda-aware-mpi, nccl
  int iters = 20;                                        ///< timed iterations per point
  int warmup = 3;                                        ///< untimed iterations per point
  int segment_kb = 1024;                                 ///< as comm.ring_segment_kb
  std::string csv;                                       ///< CSV path; empty: table only
};

/// \brief Runs the benchmark on every rank of MPI_COMM_WORLD; rank 0 prints and writes the CSV.
int bench_comm(const BenchCommArgs& args);

}  // namespace tessera::cli
