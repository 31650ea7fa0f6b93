#pragma once
// A sandbox for the first read of a file the user gave. HDF5 1.10.8 trusts a file's metadata: a
// damaged one can crash it (global-heap and attribute code), make it loop for ever, or, opened in
// parallel, fail on rank 0 while the other ranks wait for what rank 0 was to broadcast. So before
// Tessera opens a dataset or checkpoint it lets a child process read all of the file's metadata
// (every object header, link, attribute value and chunk index) with the serial driver. A crash or
// a hang happens there, and the run gets one line and exit code 2 instead. Only the io/ layer
// includes this header.
#include <mpi.h>

#include <optional>
#include <string>

namespace tessera::io::h5 {

/// How long a probe may take (a file's metadata reads in milliseconds; a damaged one can loop);
/// the environment variable TESSERA_PROBE_SECONDS overrides it.
inline constexpr double kProbeSeconds = 30.0;

/// \brief Reads all of path's metadata in a child process (fork, no exec, no MPI in the child).
/// \return why the file cannot be used ("reading its metadata crashed the HDF5 library (signal
///         11)", "... did not finish within N s", or HDF5's own error), or nullopt where the
///         metadata reads cleanly (or no child could be started). A clean answer is reused while
///         the file's device, inode, size and timestamps stay as they were and it last changed more
///         than 2 s before (a run opens its dataset once per split and reader). Local.
std::optional<std::string> probe(const std::string& path);

/// \brief Checks path on every rank of comm before a parallel open: every rank that it exists
/// and is HDF5 (h5::describe_unreadable: a path one node cannot see), rank 0 that its metadata
/// reads (probe()). On a problem every rank throws the same InputError naming the file. Must be
/// called on every rank of comm.
void check_openable(MPI_Comm comm, const std::string& path);

}  // namespace tessera::io::h5
