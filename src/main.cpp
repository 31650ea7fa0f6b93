// tessera: start MPI, hold Kokkos, dispatch the subcommand (src/cli/).
#include <malloc.h>
#include <mpi.h>
#include <stdlib.h>

#include <Kokkos_Core.hpp>

#include "cli/cli.hpp"

int main(int argc, char** argv) {
  // Keep large buffers (MPI temporaries, batches) on the heap instead of fresh mmap pages:
  // pages mapped anew on every call fault in slowly and slow big allreduces about tenfold.
  mallopt(M_MMAP_THRESHOLD, 256 << 20);
  mallopt(M_TRIM_THRESHOLD, 512 << 20);
  // Open MPI 4.1's OMPIO returns wrong rows for some scattered collective reads when data
  // sieving is on (open-mpi/ompi#10546; seen here at 4 ranks); off unless the user set it.
  setenv("OMPI_MCA_fbtl_posix_read_datasieving", "0", 0);
  MPI_Init(&argc, &argv);
  int code = 0;
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    code = tessera::cli::run(argc, argv);
  }
  MPI_Finalize();
  return code;
}
