// tessera: start MPI, hold Kokkos, dispatch the subcommand (src/cli/).
#include <malloc.h>
#include <mpi.h>
#include <stdlib.h>

#include <Kokkos_Core.hpp>
#include <string_view>
#include <vector>

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
  // Kokkos sees only its own arguments (--kokkos-*): given the whole command line it would print
  // its own help for --help (and for every subcommand's), ahead of Tessera's. --kokkos-help
  // prints Kokkos's help alone.
  std::vector<char*> kokkos_args{argv[0]}, args{argv[0]};
  bool kokkos_help = false;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    kokkos_help = kokkos_help || arg == "--kokkos-help";
    (arg.starts_with("--kokkos-") ? kokkos_args : args).push_back(argv[i]);
  }
  int kokkos_argc = static_cast<int>(kokkos_args.size()), tessera_argc = static_cast<int>(args.size());
  kokkos_args.push_back(nullptr);
  args.push_back(nullptr);
  int code = 0;
  {
    Kokkos::ScopeGuard kokkos(kokkos_argc, kokkos_args.data());
    tessera::mem::install_tracking();
    if (!kokkos_help || tessera_argc > 1) code = tessera::cli::run(tessera_argc, args.data());
  }
  MPI_Finalize();
  return code;
}
