#pragma once
// MPI's side of bf16 sums (comm.reduce_dtype = "bf16" with MPI's own collectives): a datatype of
// one bf16 (16 bits, comm/bf16.hpp) and a commutative MPI_Op that adds two bf16 values in fp32 and
// rounds the sum to bf16 (ties to even). Every addition of MPI's reduction is therefore an fp32
// addition of two bf16 operands; partial sums travel as bf16.
#include <mpi.h>

namespace tessera::comm {

/// \brief Owns the datatype and the operation. Create after MPI_Init, free before MPI_Finalize.
class MpiBf16 {
 public:
  MpiBf16();
  ~MpiBf16();
  MpiBf16(const MpiBf16&) = delete;
  MpiBf16& operator=(const MpiBf16&) = delete;

  MPI_Datatype type() const { return type_; }
  MPI_Op sum() const { return sum_; }

 private:
  MPI_Datatype type_ = MPI_DATATYPE_NULL;
  MPI_Op sum_ = MPI_OP_NULL;
};

}  // namespace tessera::comm
