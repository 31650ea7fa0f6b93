#pragma once
// The MPI datatype of a C++ element type, for the algorithms templated on float and double.
#include <mpi.h>

namespace tessera {

template <class T>
MPI_Datatype mpi_type();
template <>
inline MPI_Datatype mpi_type<float>() { return MPI_FLOAT; }
template <>
inline MPI_Datatype mpi_type<double>() { return MPI_DOUBLE; }

}  // namespace tessera
