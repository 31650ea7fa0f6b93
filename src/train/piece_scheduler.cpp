#include "train/piece_scheduler.hpp"

#include <algorithm>
#include <stdexcept>

namespace tessera {

PieceScheduler::PieceScheduler(std::size_t piece_elements, std::size_t inflight_elements)
    : piece_(std::max<std::size_t>(1, piece_elements)), bound_(std::max<std::size_t>(1, inflight_elements)) {}

std::size_t PieceScheduler::add(std::size_t bucket, std::size_t priority, std::size_t length) {
  if (unretired_.size() <= bucket) unretired_.resize(bucket + 1, 0);
  std::size_t count = 0;
  for (std::size_t offset = 0; offset < length; offset += piece_, ++count)
    queue_.emplace(priority, bucket, offset, std::min(piece_, length - offset));
  unretired_[bucket] += count;
  return count;
}

std::vector<PieceScheduler::Piece> PieceScheduler::startable() {
  std::vector<Piece> out;
  while (!queue_.empty()) {
    const auto [priority, bucket, offset, length] = *queue_.begin();
    if (!flight_.empty() && flight_elements_ + length > bound_) break;
    queue_.erase(queue_.begin());
    flight_.push_back({bucket, offset, length});
    flight_elements_ += length;
    out.push_back(flight_.back());
  }
  return out;
}

PieceScheduler::Piece PieceScheduler::retire_oldest() {
  if (flight_.empty()) throw std::logic_error("tessera::PieceScheduler::retire_oldest: nothing in flight");
  const Piece p = flight_.front();
  flight_.pop_front();
  flight_elements_ -= p.length;
  --unretired_[p.bucket];
  return p;
}

std::size_t PieceScheduler::unretired(std::size_t bucket) const {
  return bucket < unretired_.size() ? unretired_[bucket] : 0;
}

}  // namespace tessera
