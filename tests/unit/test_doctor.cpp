// tessera doctor's judgement (cli::diagnose) on records built by hand: a rank that never entered a
// collective, a rank with no record, a deadlock of two ranks in different orders, a pipeline
// receive whose send never came, every rank inside the same operation, and records of an older run.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cli/doctor.hpp"

using tessera::cli::diagnose;
using tessera::comm::FlightRecord;
using tessera::comm::RecordedOp;

namespace {

constexpr double t0 = 1.7e9;

FlightRecord record(int rank, int ranks, std::map<std::string, std::vector<int>> groups,
                    const std::string& reason = "timeout", const std::string& run = "2026-11-25T12:00:00.000000Z") {
  FlightRecord r;
  r.who.run = run;
  r.who.run_dir = "runs/x";
  r.who.rank = rank;
  r.who.ranks = ranks;
  r.who.host = "n1";
  r.reason = reason;
  r.message = reason == "signal" ? "stopped by SIGTERM" : "timed out";
  r.groups = std::move(groups);
  return r;
}

// Appends an operation; `in_flight` leaves its end open, `wait` makes it the one the rank waits in.
void op(FlightRecord& r, const std::string& name, const std::string& group, std::uint64_t seq, double start,
        bool in_flight = false, bool wait = false, int peer = -1, bool p2p = false) {
  RecordedOp o;
  o.id = r.ops.size() + 1;
  o.op = name;
  o.group = group;
  o.seq = seq;
  o.start = t0 + start;
  o.end = in_flight ? -1.0 : t0 + start + 0.01;
  o.peer = peer;
  o.p2p = p2p;
  o.bytes = 64;
  r.ops.push_back(o);
  if (wait) {
    r.waiting_on = o.id;
    r.waiting_since = o.start;
  }
}

std::string joined(const std::vector<std::string>& lines) {
  std::string s;
  for (const auto& l : lines) s += l + "\n";
  return s;
}

void expect_has(const std::string& text, const std::string& piece) {
  EXPECT_NE(text.find(piece), std::string::npos) << "missing '" << piece << "' in:\n" << text;
}

}  // namespace

TEST(Doctor, NamesTheRankThatNeverEnteredTheCollective) {
  const std::map<std::string, std::vector<int>> g = {{"data", {0, 1, 2, 3}}, {"world", {0, 1, 2, 3}}};
  std::vector<FlightRecord> recs;
  for (int r = 0; r < 3; ++r) {
    FlightRecord x = record(r, 4, g);
    op(x, "allreduce", "data", 11, 1.0);
    op(x, "allreduce", "data", 12, 2.0 + r, true, true);
    recs.push_back(x);
  }
  FlightRecord stalled = record(3, 4, g, "signal");
  op(stalled, "allreduce", "data", 11, 1.0);
  recs.push_back(stalled);
  const std::string text = joined(diagnose(recs));
  expect_has(text, "flight records of ranks 0-3 (0 timeout, 1 timeout, 2 timeout, 3 signal)");
  expect_has(text, "ranks 0-2 wait in allreduce #12 of the data group (ranks 0-3; 64 bytes) since");
  expect_has(text, "rank 3 never entered allreduce #12 of the data group (ranks 0-2 waited there since");
  expect_has(text, "its last data-group operation is allreduce #11");
  expect_has(text, "it was in no communication operation when it wrote its record (signal: stopped by SIGTERM)");
  expect_has(text, "verdict: rank 3 stopped outside communication and the others wait for it (rank 3 never entered "
                   "allreduce #12 of the data group)");
}

TEST(Doctor, NamesARankWithoutARecord) {
  const std::map<std::string, std::vector<int>> g = {{"world", {0, 1}}};
  FlightRecord r0 = record(0, 2, g);
  op(r0, "allreduce", "world", 20, 1.0, true, true);
  const std::string text = joined(diagnose({r0}));
  expect_has(text, "none from rank 1 (killed, or stopped before it could write one)");
  expect_has(text, "rank 0 waits in allreduce #20 of the world group");
  expect_has(text, "rank 1 left no flight record");
  expect_has(text, "verdict: rank 1 stopped outside communication");
}

TEST(Doctor, CallsTwoRanksWaitingForEachOtherADeadlock) {
  // Rank 1 skipped world #7 and waits in data #4, which rank 0 never reaches.
  const std::map<std::string, std::vector<int>> g = {{"world", {0, 1}}, {"data", {0, 1}}};
  FlightRecord r0 = record(0, 2, g), r1 = record(1, 2, g);
  op(r0, "dataset read", "data", 3, 0.5);
  op(r0, "allreduce", "world", 6, 1.0);
  op(r0, "allreduce", "world", 7, 2.0, true, true);
  op(r1, "dataset read", "data", 3, 0.5);
  op(r1, "allreduce", "world", 6, 1.0);
  op(r1, "dataset read", "data", 4, 2.5, true, true);
  const std::string text = joined(diagnose({r1, r0}));
  expect_has(text, "rank 1 never entered allreduce #7 of the world group");
  expect_has(text, "rank 0 never entered dataset read #4 of the data group");
  expect_has(text, "verdict: a deadlock: ranks 0,1 each wait in an operation another rank never entered");
  expect_has(text, "(the first wait: rank 1 never entered allreduce #7 of the world group)");
}

TEST(Doctor, TellsGroupsOfTheSameKindApart) {
  // dp 2 x tp 2, rank 3 stalled: rank 1 waits in its data group {1,3}; ranks 0 and 2 wait in the
  // first allreduce of their tensor groups {0,1} and {2,3}: two operations, not one.
  std::vector<FlightRecord> recs;
  for (int r : {0, 1, 2}) {
    FlightRecord x = record(r, 4, {{"data", {r % 2, r % 2 + 2}}, {"tensor", {r / 2 * 2, r / 2 * 2 + 1}}});
    op(x, "dataset read", "data", 5, 0.5);
    if (r == 1) op(x, "dataset read", "data", 6, 1.0, true, true);
    else op(x, "allreduce", "tensor", 1, 1.2, true, true);
    recs.push_back(x);
  }
  const std::string text = joined(diagnose(recs));
  expect_has(text, "rank 1 waits in dataset read #6 of the data group (ranks 1,3;");
  expect_has(text, "rank 0 waits in allreduce #1 of the tensor group (ranks 0,1;");
  expect_has(text, "rank 2 waits in allreduce #1 of the tensor group (ranks 2,3;");
  expect_has(text, "rank 1 never entered allreduce #1 of the tensor group (rank 0 waited there");
  expect_has(text, "verdict: rank 3 stopped outside communication and the others wait for it (rank 3 never arrived "
                   "in dataset read #6 of the data group)");
}

TEST(Doctor, FindsTheSendThatNeverCame) {
  const std::map<std::string, std::vector<int>> g = {{"pipeline", {0, 1}}};
  FlightRecord r0 = record(0, 2, g), r1 = record(1, 2, g, "signal");
  op(r0, "send", "pipeline", 3, 1.0, false, false, 1, true);
  op(r0, "recv", "pipeline", 3, 1.5, true, true, 1, true);
  op(r1, "recv", "pipeline", 3, 1.0, false, false, 0, true);
  op(r1, "send", "pipeline", 2, 0.5, false, false, 0, true);
  const std::string text = joined(diagnose({r0, r1}));
  expect_has(text, "rank 0 waits in recv #3 from rank 1 in the pipeline group (64 bytes)");
  expect_has(text, "rank 1 never sent #3 to rank 0 (its last was #2");
  expect_has(text, "verdict: rank 1 stopped outside communication");
}

TEST(Doctor, SaysWhenEveryRankIsInside) {
  const std::map<std::string, std::vector<int>> g = {{"world", {0, 1}}};
  FlightRecord r0 = record(0, 2, g), r1 = record(1, 2, g, "signal");
  op(r0, "allreduce", "world", 9, 1.0, true, true);
  op(r1, "allreduce", "world", 9, 6.25, true, true);
  const std::string text = joined(diagnose({r0, r1}));
  expect_has(text, "ranks 0,1 wait in allreduce #9 of the world group");
  expect_has(text, "every rank of the group is in it and none completed it");
  expect_has(text, "rank 1 entered it last, 5.250 s after rank 0");
  expect_has(text, "verdict: every rank the waiting ranks need is inside the same operation");
}

TEST(Doctor, LeavesOutRecordsOfAnOlderRun) {
  const std::map<std::string, std::vector<int>> g = {{"world", {0, 1}}};
  FlightRecord old1 = record(1, 2, g, "signal", "2026-11-24T08:00:00.000000Z");
  FlightRecord new0 = record(0, 2, g);
  op(new0, "allreduce", "world", 4, 1.0, true, true);
  const std::string text = joined(diagnose({old1, new0}));
  expect_has(text, "started 2026-11-25T12:00:00.000000Z");
  expect_has(text, "1 record(s) of an earlier run left out");
  expect_has(text, "rank 1 left no flight record");
}

TEST(Doctor, ReportsRanksThatWereNotWaiting) {
  const std::map<std::string, std::vector<int>> g = {{"world", {0}}};
  FlightRecord r0 = record(0, 1, g, "internal_error");
  op(r0, "allreduce", "world", 4, 1.0);
  const std::string text = joined(diagnose({r0}));
  expect_has(text, "rank 0: was in no communication operation when it wrote its record (internal_error");
  expect_has(text, "its last operation: allreduce #4 of the world group, ended");
  expect_has(text, "verdict: no rank was blocked in a communication operation");
}
