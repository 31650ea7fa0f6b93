#pragma once
// The MPI datatype of a C++ element type, for the algorithms templated on float and double.
#include <mpi.h>

#include <cstdint>

namespace tessera {

template <class T>
MPI_Datatype mpi_type();
template <>
inline MPI_Datatype mpi_type<float>() { return MPI_FLOAT; }
template <>
inline MPI_Datatype mpi_type<double>() { return MPI_DOUBLE; }
/// bf16 bit patterns on the wire (comm/bf16.hpp): moved, never reduced by MPI as integers.
template <>
inline MPI_Datatype mpi_type<std::uint16_t>() { return MPI_UINT16_T; }

}  // namespace tessera
