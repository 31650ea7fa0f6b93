#pragma once
// A test hook: TESSERA_TEST_COMM_FAULT="ACTION:RANK:GROUP:SEQ" (test_hooks::comm_fault() in
// core/test_hooks.hpp reads it) makes world rank RANK misbehave at the first collective of its
// GROUP communicator (world, data, tensor, pipeline) numbered SEQ or later, as the flight recorder
// numbers them (an agree() inside a read holds a number too, and the hook acts on the
// Communicator's operations and marked sections only), once:
//   stall  the rank prints one line and sleeps there (an hour, whatever signal arrives), before it
//          enters the collective (or the collective file operation the trainer marks: a dataset
//          read, a checkpoint write): a rank that hangs without dying;
//   skip   the rank prints one line and does not call the collective at all (it leaves its buffer
//          as it is) and goes on: ranks that call collectives in different orders.
// For tests/integration/test_watchdog.cpp. Unset, a collective pays one branch.
#include <cstdint>

namespace tessera::comm {

/// \brief Prints the stall line and sleeps for an hour.
void stall(int rank, const char* op, const char* group, std::uint64_t seq);

}  // namespace tessera::comm
