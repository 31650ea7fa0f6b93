#pragma once
// Where a rank's rows of a sequence sit in it under context parallelism (parallel.spatial):
// one block of positions [first, first + T/C) (the all-to-all and a window's halo), or, under the
// ring's causal load balancing, two chunks of c = T/(2C): the head chunk at `first` and the tail
// chunk at `second` (rank r: chunks r and 2C-1-r of the 2C). Without context parallelism, the
// whole sequence from 0.
#include "kernels/views.hpp"

namespace tessera::kernels {

struct Positions {
  Index first = 0;                   ///< position of local row 0
  Index split = Index(1) << 62;      ///< local rows from here on are the tail chunk
  Index second = 0;                  ///< position of local row `split`
  Positions() = default;
  Positions(Index p0) : first(p0) {}  // NOLINT(google-explicit-constructor): one block from p0
  Positions(Index p0, Index rows, Index p1) : first(p0), split(rows), second(p1) {}
  /// The position of local row t (0 <= t < the rank's positions).
  KOKKOS_INLINE_FUNCTION Index operator()(Index t) const { return t < split ? first + t : second + (t - split); }
  /// One past the largest position of `seq` local rows.
  Index end(Index seq) const {
    if (seq <= split) return first + seq;
    const Index head = first + split, tail = second + seq - split;
    return head > tail ? head : tail;
  }
};

}  // namespace tessera::kernels
