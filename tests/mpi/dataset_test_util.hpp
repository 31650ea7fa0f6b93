#pragma once
// The fixture of the multi-rank tests that read datasets which the test itself writes.
#include <mpi.h>

#include <functional>
#include <string>

#include "io/dataset_writer.hpp"
#include "mpi_test_util.hpp"

namespace tessera::test {

/// \brief A SharedTempDirTest whose tests write their datasets with io::DatasetWriter.
class DatasetFileTest : public SharedTempDirTest {
 protected:
  /// \brief Rank 0 writes dir()/name with write(); every rank returns after it is complete.
  /// Collective.
  std::string make_file(const std::string& name, const std::function<void(io::DatasetWriter&)>& write) {
    const std::string path = dir() + "/" + name;
    if (world_rank() == 0) {
      io::DatasetWriter out(path);
      write(out);
      out.close();
    }
    MPI_Barrier(MPI_COMM_WORLD);
    return path;
  }
};

}  // namespace tessera::test
