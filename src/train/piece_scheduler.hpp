#pragma once
// The order and pacing of comm.priority's gradient exchange (priority_exchange.hpp): each bucket's
// exchange in pieces of at most piece_elements, queued by priority (the bucket holding the
// earliest layers first: the next forward needs it first), started while the pieces in flight
// hold at most inflight_elements (one piece always may be in flight).
//
// Every rank must start its collectives in the same order, so the schedule depends only on what
// happens on every rank alike: buckets added, and pieces retired oldest first where the caller
// waited for them. A piece that MPI already finished stays counted in flight until retired.
#include <cstddef>
#include <deque>
#include <set>
#include <tuple>
#include <vector>

namespace tessera {

class PieceScheduler {
 public:
  /// Elements [offset, offset + length) of bucket `bucket`.
  struct Piece {
    std::size_t bucket = 0;
    std::size_t offset = 0, length = 0;
    bool operator==(const Piece&) const = default;
  };

  /// \brief Both bounds in elements, at least 1.
  PieceScheduler(std::size_t piece_elements, std::size_t inflight_elements);

  /// \brief Queues bucket `bucket` (`length` elements) in pieces; lower `priority` goes first.
  /// Returns the number of pieces.
  std::size_t add(std::size_t bucket, std::size_t priority, std::size_t length);
  /// \brief The pieces that may start now, in the order to start them; they count as in flight.
  std::vector<Piece> startable();
  /// \brief The oldest piece in flight, which the caller has waited for, leaves the count.
  Piece retire_oldest();

  bool queued() const { return !queue_.empty(); }
  bool in_flight() const { return !flight_.empty(); }
  std::size_t in_flight_elements() const { return flight_elements_; }
  /// Pieces of `bucket` queued or in flight (not yet retired).
  std::size_t unretired(std::size_t bucket) const;

 private:
  std::size_t piece_, bound_;
  std::set<std::tuple<std::size_t, std::size_t, std::size_t, std::size_t>> queue_;  // priority, bucket, offset, length
  std::deque<Piece> flight_;
  std::size_t flight_elements_ = 0;
  std::vector<std::size_t> unretired_;
};

}  // namespace tessera
