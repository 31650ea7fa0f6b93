// tessera: start MPI, hold Kokkos, dispatch the subcommand (src/cli/).
#include <malloc.h>
#include <mpi.h>
#include <stdlib.h>

#include <Kokkos_Core.hpp>

#include "cli/cli.hpp"
#include "core/memory.hpp"

int main(int argc, char** argv) {
  // Keep large buffers (MPI temporaries, batches) on the heap and keep freed heap memory, instead
  // of mapping fresh pages on every call: those fault in slowly and slow big allreduces (Open MPI
  // allocates its temporaries per call) several times over. glibc refuses an mmap threshold above
  // 32 MB, so mmap is switched off instead.
  mallopt(M_MMAP_MAX, 0);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  // Open MPI 4.1's OMPIO returns wrong rows for some scattered collective reads when data
  // sieving is on (open-mpi/ompi#10546; seen here at 4 ranks); off unless the user set it.
  setenv("OMPI_MCA_fbtl_posix_read_datasieving", "0", 0);
  MPI_Init(&argc, &argv);
  int code = 0;
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    tessera::mem::install_tracking();
    code = tessera::cli::run(argc, argv);
  }
  MPI_Finalize();
  return code;
}
