#include "comm/mpi_bf16.hpp"

#include <cstdint>

#include "comm/bf16.hpp"
#include "comm/mpi_check.hpp"

namespace tessera::comm {

namespace {

/// inout[i] = bf16(fp32(in[i]) + fp32(inout[i])); the signature MPI_Op_create wants.
void bf16_sum(void* in, void* inout, int* len, MPI_Datatype* /*type*/) {
  const auto* a = static_cast<const std::uint16_t*>(in);
  auto* b = static_cast<std::uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = to_bf16(from_bf16(a[i]) + from_bf16(b[i]));
}

}  // namespace

MpiBf16::MpiBf16() {
  MPI_CHECK(MPI_Type_contiguous(1, MPI_UINT16_T, &type_));
  MPI_CHECK(MPI_Type_commit(&type_));
  MPI_CHECK(MPI_Op_create(&bf16_sum, 1, &sum_));  // commutative: a + b == b + a, bit for bit
}

MpiBf16::~MpiBf16() {
  if (sum_ != MPI_OP_NULL) MPI_Op_free(&sum_);
  if (type_ != MPI_DATATYPE_NULL) MPI_Type_free(&type_);
}

}  // namespace tessera::comm
