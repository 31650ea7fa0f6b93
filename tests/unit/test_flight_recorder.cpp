// The flight recorder (ring of the last operations, sequence numbers per communicator and per peer,
// nested waits), flight records on disk (round trip, one-line errors for bad files), the
// watchdog's timeout line and its record on a stop signal.
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <thread>

#include "comm/flight_record.hpp"
#include "comm/flight_recorder.hpp"
#include "comm/watchdog.hpp"
#include "core/error.hpp"

namespace fs = std::filesystem;
using namespace tessera::comm;

namespace {

fs::path scratch() {
  const fs::path p = fs::temp_directory_path() / ("tessera_test_flight_" + std::to_string(getpid()));
  fs::create_directories(p);
  return p;
}

/// Two distinct communicator handles to name (they are never communicated on).
struct Comms {
  MPI_Comm a = MPI_COMM_NULL, b = MPI_COMM_NULL;
  Comms() {
    MPI_Comm_dup(MPI_COMM_SELF, &a);
    MPI_Comm_dup(MPI_COMM_SELF, &b);
  }
  ~Comms() {
    MPI_Comm_free(&a);
    MPI_Comm_free(&b);
  }
};

RecordIdentity identity(const fs::path& dir) {
  RecordIdentity w;
  w.run = "2026-11-25T12:00:00.000000Z";
  w.run_dir = dir.string();
  w.rank = 1;
  w.ranks = 4;
  w.host = "n1";
  w.pid = 4242;
  w.data = 0;
  w.tensor = 1;
  w.dp = 2;
  w.tp = 2;
  w.timeout_s = 3.5;
  return w;
}

}  // namespace

TEST(FlightRecorder, NumbersCollectivesPerCommunicatorAndTransfersPerPeer) {
  FlightRecorder rec;
  const Comms c;
  rec.attach(c.a, "data", {1, 3});
  rec.attach(c.b, "pipeline", {0, 1, 2});
  EXPECT_EQ(rec.next_seq(c.a), 1u);
  rec.end(rec.begin_collective("allreduce", c.a, 64, true));
  rec.end(rec.begin_collective("allgather", c.a, 32, true));
  rec.skip_seq(c.a);
  rec.end(rec.begin_collective("barrier", c.b, 0, true));
  const auto s1 = rec.begin_p2p("send", c.b, 2, 2, true, 16, false);
  const auto r1 = rec.begin_p2p("recv", c.b, 0, 0, false, 16, true);
  rec.end(r1);
  const auto r2 = rec.begin_p2p("recv", c.b, 0, 0, false, 16, true);
  const auto s2 = rec.begin_p2p("send", c.b, 2, 2, true, 16, false);
  EXPECT_EQ(rec.next_seq(c.a), 4u);

  const FlightSnapshot s = rec.snapshot();
  ASSERT_EQ(s.ops.size(), 7u);
  EXPECT_STREQ(s.ops[0].op, "allreduce");
  EXPECT_STREQ(s.ops[0].group, "data");
  EXPECT_EQ(s.ops[0].seq, 1u);
  EXPECT_EQ(s.ops[1].seq, 2u);
  EXPECT_STREQ(s.ops[2].group, "pipeline");
  EXPECT_EQ(s.ops[2].seq, 1u);  // its own communicator's count
  EXPECT_TRUE(s.ops[3].p2p);
  EXPECT_EQ(s.ops[3].peer, 2);
  EXPECT_EQ(s.ops[3].seq, 1u);  // send #1 to rank 2
  EXPECT_EQ(s.ops[4].seq, 1u);  // recv #1 from rank 0
  EXPECT_EQ(s.ops[5].seq, 2u);  // recv #2 from rank 0
  EXPECT_EQ(s.ops[6].seq, 2u);  // send #2 to rank 2
  for (std::size_t i = 0; i < 3; ++i) EXPECT_GE(s.ops[i].end, s.ops[i].start);
  EXPECT_LT(s.ops[5].end, 0.0);  // still in flight
  ASSERT_TRUE(s.waiting);
  EXPECT_EQ(s.waiting->id, r2);
  EXPECT_EQ(s.groups.size(), 2u);
  EXPECT_EQ(s.groups[0].members, (std::vector<int>{1, 3}));
  rec.end(r2);
  rec.end(s1);
  rec.end(s2);
  EXPECT_FALSE(rec.snapshot().waiting);
  // An unnamed communicator is recorded as "other", without a number.
  rec.detach(c.a);
  rec.end(rec.begin_collective("allreduce", c.a, 4, true));
  EXPECT_STREQ(rec.snapshot().ops.back().group, "other");
}

TEST(FlightRecorder, KeepsTheNewestOperationsOnly) {
  FlightRecorder rec;
  const Comms c;
  rec.attach(c.a, "world", {0});
  const std::size_t n = FlightRecorder::kCapacity + 44;
  for (std::size_t i = 0; i < n; ++i) rec.end(rec.begin_collective("allreduce", c.a, 8, true));
  const FlightSnapshot s = rec.snapshot();
  ASSERT_EQ(s.ops.size(), FlightRecorder::kCapacity);
  EXPECT_EQ(s.ops.front().seq, 45u);
  EXPECT_EQ(s.ops.back().seq, n);
  for (std::size_t i = 1; i < s.ops.size(); ++i) EXPECT_EQ(s.ops[i].id, s.ops[i - 1].id + 1);
}

TEST(FlightRecorder, WaitsNestAndOutliveTheRing) {
  FlightRecorder rec;
  const Comms c;
  rec.attach(c.a, "world", {0, 1});
  const auto outer = rec.begin_collective("checkpoint write", c.a, 0, true);
  for (std::size_t i = 0; i < FlightRecorder::kCapacity + 1; ++i) {
    const auto inner = rec.begin_collective("barrier", c.a, 0, true);
    ASSERT_EQ(rec.waiting()->first.id, inner);
    rec.end(inner);
  }
  // A nonblocking one does not wait until it is waited on.
  const auto nb = rec.begin_collective("iallreduce", c.a, 8, false);
  EXPECT_EQ(rec.waiting()->first.id, outer);
  rec.begin_wait(nb);
  EXPECT_EQ(rec.waiting()->first.id, nb);
  rec.end(nb);
  // The outer wait is still watched after its slot in the ring was reused.
  const auto w = rec.waiting();
  ASSERT_TRUE(w);
  EXPECT_EQ(w->first.id, outer);
  EXPECT_STREQ(w->first.op, "checkpoint write");
  EXPECT_GE(w->second, 0.0);
  const FlightRecord r = make_record(identity(scratch()), rec.snapshot(), "timeout", "line");
  EXPECT_EQ(r.waiting_on, outer);
  ASSERT_NE(r.find(outer), nullptr);  // put back in front of the ring's operations
  EXPECT_EQ(r.ops.front().id, outer);
  rec.end(outer);
  EXPECT_FALSE(rec.waiting());
}

TEST(FlightRecord, RoundTripsThroughJson) {
  FlightRecorder rec;
  const Comms c;
  rec.attach(c.a, "data", {1, 3});
  rec.end(rec.begin_collective("allreduce", c.a, 4096, true));
  rec.begin_collective("broadcast", c.a, 10, true, 3);
  const fs::path dir = scratch() / "roundtrip";
  const FlightRecord r = make_record(identity(dir), rec.snapshot(), "timeout", "the line");
  const std::string path = record_path(dir.string(), 1);
  EXPECT_EQ(path, (dir / "flight" / "rank_1.json").string());
  ASSERT_TRUE(write_record(r, path));
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  const FlightRecord back = read_record(path);
  EXPECT_EQ(back.who.run, r.who.run);
  EXPECT_EQ(back.who.rank, 1);
  EXPECT_EQ(back.who.ranks, 4);
  EXPECT_EQ(back.who.host, "n1");
  EXPECT_EQ(back.who.pid, 4242);
  EXPECT_EQ(back.who.tensor, 1);
  EXPECT_EQ(back.who.tp, 2);
  EXPECT_EQ(back.who.timeout_s, 3.5);
  EXPECT_EQ(back.reason, "timeout");
  EXPECT_EQ(back.message, "the line");
  EXPECT_EQ(back.groups.at("data"), (std::vector<int>{1, 3}));
  ASSERT_EQ(back.ops.size(), 2u);
  EXPECT_EQ(back.ops[0].op, "allreduce");
  EXPECT_EQ(back.ops[0].bytes, 4096u);
  EXPECT_EQ(back.ops[0].start, r.ops[0].start);
  EXPECT_EQ(back.ops[0].end, r.ops[0].end);
  EXPECT_FALSE(back.ops[0].in_flight());
  EXPECT_TRUE(back.ops[1].in_flight());
  EXPECT_EQ(back.ops[1].peer, 3);
  EXPECT_EQ(back.waiting_on, back.ops[1].id);
  EXPECT_NEAR(back.waiting_since, r.waiting_since, 1e-6);
}

TEST(FlightRecord, BadFilesAreOneLineInputErrors) {
  const fs::path dir = scratch() / "bad";
  fs::create_directories(dir);
  FlightRecorder rec;
  const std::string good = record_path(dir.string(), 0);
  ASSERT_TRUE(write_record(make_record(identity(dir), rec.snapshot(), "signal", "stopped by SIGTERM"), good));
  std::string text;
  {
    std::ifstream in(good);
    text.assign(std::istreambuf_iterator<char>(in), {});
  }
  auto expect_error = [&](const std::string& content, const std::string& piece) {
    const std::string path = (dir / "case.json").string();
    std::ofstream(path) << content;
    try {
      read_record(path);
      ADD_FAILURE() << "no error for " << piece;
    } catch (const tessera::InputError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(path), std::string::npos) << msg;
      EXPECT_NE(msg.find(piece), std::string::npos) << msg;
      EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    }
  };
  auto replaced = [&](const std::string& from, const std::string& to) {
    std::string t = text;
    const auto at = t.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return at == std::string::npos ? t : t.replace(at, from.size(), to);
  };
  expect_error("{\"format\": \"tessera-flight", "not JSON");
  expect_error("[1, 2]", "not a flight record");
  expect_error("{\"format\": \"tessera-checkpoint\"}", "not a flight record");
  expect_error(replaced("\"format_version\": 1", "\"format_version\": 9"), "format_version 9");
  expect_error(replaced("\"rank\": 1", "\"rank\": 2.5"), "\"rank\" must be an integer");
  expect_error(replaced("\"rank\": 1", "\"rank\": 1e30"), "\"rank\" must be an integer");
  expect_error(replaced("\"rank\": 1", "\"rank\": 7"), "rank 7 of 4 ranks");
  expect_error(replaced("\"ranks\": 4", "\"ranks\": 2000000000"), "rank 1 of 2000000000 ranks is impossible");
  expect_error(replaced("\"host\": \"n1\"", "\"host\": 3"), "\"host\" must be a string");
  expect_error(replaced("\"ops\": []", "\"ops\": {}"), "\"ops\" must be an array");
  expect_error(replaced("\"ops\": []", "\"ops\": [{\"id\": 1}]"), "key \"op\" is missing");
  expect_error(replaced("\"groups\": {}", "\"groups\": {\"data\": [-1]}"), "\"groups\" must be");
  EXPECT_THROW(read_record((dir / "missing.json").string()), tessera::InputError);
}

TEST(Watchdog, TimeoutLineNamesTheOperationGroupSequenceBytesAndPeers) {
  FlightRecorder rec;
  const Comms c;
  rec.attach(c.a, "data", {1, 3, 5});
  rec.begin_collective("allreduce", c.a, 2048, true);
  const RecordIdentity who = identity("runs/x");
  const std::string line = Watchdog::timeout_message(who, rec.snapshot(), "runs/x/flight/rank_1.json");
  for (const char* piece : {"rank 1: allreduce #1 of the data group (ranks 1,3,5; 2.0 KiB)",
                            "did not complete within comm.timeout_s = 3.5 s", "which of ranks 3,5 did not arrive is unknown",
                            "runs/x/flight/rank_1.json", "tessera doctor runs/x"})
    EXPECT_NE(line.find(piece), std::string::npos) << piece << " not in: " << line;
  EXPECT_EQ(line.find('\n'), std::string::npos);

  FlightRecorder p2p;
  p2p.attach(c.b, "pipeline", {0, 1});
  p2p.begin_p2p("recv", c.b, 0, 0, false, 100, true);
  const std::string recv = Watchdog::timeout_message(who, p2p.snapshot(), "f");
  EXPECT_NE(recv.find("recv #1 from rank 0 in the pipeline group (100 bytes)"), std::string::npos) << recv;
  EXPECT_NE(recv.find("rank 0 did not send it"), std::string::npos) << recv;
}

TEST(Watchdog, WritesTheRecordOnAStopSignalAndKeepsRunning) {
  const fs::path dir = scratch() / "signal";
  fs::remove_all(dir);
  std::atomic<int> signal{0};
  RecordIdentity who = identity(dir);
  who.rank = 0;
  {
    Watchdog dog({who, [&] { return signal.load(); }});
    const std::string path = record_path(dir.string(), 0);
    EXPECT_FALSE(fs::exists(path));
    signal = 15;
    // The watchdog looks every poll_interval (0.1 s here); the bound is only a safety net.
    for (int i = 0; i < 6000 && !fs::exists(path); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    ASSERT_TRUE(fs::exists(path));
    const FlightRecord r = read_record(path);
    EXPECT_EQ(r.reason, "signal");
    EXPECT_EQ(r.message, "stopped by SIGTERM");
    // And on request (an internal error).
    EXPECT_EQ(dog.write_record("internal_error", "boom"), path);
    EXPECT_EQ(read_record(path).message, "boom");
  }
  EXPECT_DOUBLE_EQ(Watchdog::poll_interval(3.0), 0.1);
  EXPECT_DOUBLE_EQ(Watchdog::poll_interval(0.5), 0.025);
  EXPECT_DOUBLE_EQ(Watchdog::poll_interval(1e-9), 0.001);
}

TEST(FlightRecord, Formats) {
  EXPECT_EQ(rank_list({3, 0, 1, 2, 7, 9, 10}), "0-3,7,9,10");
  EXPECT_EQ(rank_list({}), "");
  EXPECT_EQ(rank_list({5}), "5");
  EXPECT_EQ(format_bytes(1023), "1023 bytes");
  EXPECT_EQ(format_bytes(1536), "1.5 KiB");
  EXPECT_EQ(format_bytes(12u << 20), "12.0 MiB");
  EXPECT_EQ(iso_time(0.25), "1970-01-01T00:00:00.250000Z");
  EXPECT_EQ(clock_time(3723.5).size(), 12u);  // hh:mm:ss.mmm in local time
  // A crafted record's times cannot reach undefined conversions.
  EXPECT_EQ(clock_time(std::nan("")), "?");
  EXPECT_EQ(clock_time(-1.0), "?");
  EXPECT_EQ(iso_time(1e300), "?");
}
