#pragma once
// A test hook: TESSERA_TEST_COMM_FAULT="ACTION:RANK:GROUP:SEQ" makes world rank RANK misbehave at
// the SEQ-th collective of its GROUP communicator (world, data, tensor, pipeline; numbered as the
// flight recorder numbers them):
//   stall  the rank prints one line and sleeps there (an hour, whatever signal arrives), before it
//          enters the collective (or the collective file operation the trainer marks: a dataset
//          read, a checkpoint write): a rank that hangs without dying;
//   skip   the rank prints one line and does not call the collective at all (it leaves its buffer
//          as it is) and goes on: ranks that call collectives in different orders.
// For tests/integration/test_watchdog.cpp. Unset, a collective pays one branch.
#include <cstdint>
#include <string>

namespace tessera::comm {

struct CommFault {
  enum class Action { none, stall, skip } action = Action::none;
  int rank = -1;
  std::string group;
  std::uint64_t seq = 0;
};

/// \brief The fault the environment asks for (Action::none when TESSERA_TEST_COMM_FAULT is
/// unset). Throws InputError naming the variable for a malformed value.
CommFault comm_fault_from_environment();

/// \brief Prints the stall line and sleeps for an hour.
void stall(int rank, const char* op, const char* group, std::uint64_t seq);

}  // namespace tessera::comm
