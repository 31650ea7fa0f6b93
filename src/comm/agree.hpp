#pragma once
// Turning a failure that some ranks see into one that every rank throws, so no rank is left
// waiting in a collective while another unwinds.
#include <mpi.h>

#include <functional>

namespace tessera {

/// \brief Runs body on this rank; if body throws on any rank of comm, every rank throws the
/// error of the lowest failing rank (an InputError stays an InputError, a NumericError a
/// NumericError, anything else becomes std::runtime_error with the same message). Must be called on every rank of comm. body must not
/// itself call collectives: a rank that throws early would leave the others waiting.
void agree(MPI_Comm comm, const std::function<void()>& body);

}  // namespace tessera
