#include "comm/agree.hpp"

#include <exception>
#include <stdexcept>
#include <string>

#include "comm/flight_recorder.hpp"
#include "comm/mpi_check.hpp"
#include "core/error.hpp"

namespace tessera {

namespace {

enum class Failure : int { none = 0, input = 1, other = 2 };

}  // namespace

void agree(MPI_Comm comm, const std::function<void()>& body) {
  Failure failure = Failure::none;
  std::string message;
  try {
    body();
  } catch (const InputError& e) {
    failure = Failure::input;
    message = e.what();
  } catch (const std::exception& e) {
    failure = Failure::other;
    message = e.what();
  }

  // Find the lowest failing rank (a rank whose body never ends leaves the others waiting here:
  // the watchdog names it "agree").
  const comm::WatchedOp watched = comm::watch("agree", comm);
  int rank = 0, size = 1;
  MPI_CHECK(MPI_Comm_rank(comm, &rank));
  MPI_CHECK(MPI_Comm_size(comm, &size));
  int mine = failure == Failure::none ? size : rank;
  int first = size;
  MPI_CHECK(MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, comm));
  if (first == size) return;

  // Broadcast its kind and message.
  int header[2] = {static_cast<int>(failure), static_cast<int>(message.size())};
  MPI_CHECK(MPI_Bcast(header, 2, MPI_INT, first, comm));
  message.resize(static_cast<std::size_t>(header[1]));
  MPI_CHECK(MPI_Bcast(message.data(), header[1], MPI_CHAR, first, comm));
  if (static_cast<Failure>(header[0]) == Failure::input) throw InputError(message);
  throw std::runtime_error(message);
}

}  // namespace tessera
