// comm.priority's schedule: pieces of bounded size, the bucket of the earliest layers first
// whenever it became ready, and the bound on the elements in flight.
#include <gtest/gtest.h>

#include <stdexcept>
#include <vector>

#include "train/piece_scheduler.hpp"

namespace tessera {
namespace {

using Piece = PieceScheduler::Piece;

TEST(PieceScheduler, SplitsABucketIntoBoundedPieces) {
  PieceScheduler s(4, 100);
  EXPECT_EQ(s.add(0, 0, 10), 3u);
  EXPECT_EQ(s.startable(), (std::vector<Piece>{{0, 0, 4}, {0, 4, 4}, {0, 8, 2}}));
  EXPECT_EQ(s.in_flight_elements(), 10u);
  EXPECT_EQ(s.unretired(0), 3u);
}

TEST(PieceScheduler, EarlierLayersOvertakeABucketReadyBefore) {
  // Backward fills the last layers' bucket (priority 5) first; while its pieces wait for room,
  // the first layers' bucket (priority 0) becomes ready and goes out before them.
  PieceScheduler s(4, 8);
  s.add(3, 5, 16);
  EXPECT_EQ(s.startable(), (std::vector<Piece>{{3, 0, 4}, {3, 4, 4}}));
  s.add(0, 0, 8);
  EXPECT_TRUE(s.startable().empty()) << "the bound is full";
  EXPECT_EQ(s.retire_oldest(), (Piece{3, 0, 4}));
  EXPECT_EQ(s.startable(), (std::vector<Piece>{{0, 0, 4}}));
  EXPECT_EQ(s.retire_oldest(), (Piece{3, 4, 4}));
  EXPECT_EQ(s.startable(), (std::vector<Piece>{{0, 4, 4}}));
  EXPECT_EQ(s.unretired(0), 2u);
  s.retire_oldest();
  s.retire_oldest();
  EXPECT_EQ(s.unretired(0), 0u);
  EXPECT_EQ(s.startable(), (std::vector<Piece>{{3, 8, 4}, {3, 12, 4}}));
}

TEST(PieceScheduler, TheBoundHoldsAndOnePieceAlwaysMayGo) {
  PieceScheduler s(6, 10);
  s.add(1, 1, 30);
  s.add(0, 0, 30);
  std::size_t started = 0;
  while (s.queued() || s.in_flight()) {
    started += s.startable().size();
    EXPECT_LE(s.in_flight_elements(), 10u);
    s.retire_oldest();
  }
  EXPECT_EQ(started, 10u);
  // A piece larger than the bound still goes, alone.
  PieceScheduler big(8, 3);
  big.add(0, 0, 16);
  EXPECT_EQ(big.startable().size(), 1u);
  EXPECT_TRUE(big.startable().empty());
  EXPECT_THROW((PieceScheduler(1, 1).retire_oldest()), std::logic_error);
}

}  // namespace
}  // namespace tessera
