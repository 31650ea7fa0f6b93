// The test hooks' one reader (core/test_hooks.hpp): each TESSERA_TEST_* variable parsed as its
// table says, malformed values rejected with the variable named, unset ones inert.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "core/error.hpp"
#include "core/test_hooks.hpp"

namespace {

using namespace tessera::test_hooks;

/// The variable set to `value` while it lives, unset afterwards.
struct Set {
  const char* name;
  Set(const char* n, const char* value) : name(n) { setenv(n, value, 1); }
  ~Set() { unsetenv(name); }
};

TEST(TestHooks, PackBf16IsReadOnce) {
  unsetenv("TESSERA_TEST_PACK_BF16");
  EXPECT_FALSE(pack_bf16());
  const Set set("TESSERA_TEST_PACK_BF16", "1");
  EXPECT_FALSE(pack_bf16());
}

TEST(TestHooks, StepListsNameWholeSteps) {
  unsetenv("TESSERA_TEST_KILL_IN_CHECKPOINT");
  EXPECT_FALSE(names_step(StepHook::kill_in_checkpoint, "20"));
  {
    const Set set("TESSERA_TEST_KILL_IN_CHECKPOINT", "20");
    EXPECT_TRUE(names_step(StepHook::kill_in_checkpoint, "20"));
    EXPECT_FALSE(names_step(StepHook::kill_in_checkpoint, "2"));
    EXPECT_FALSE(names_step(StepHook::kill_in_checkpoint, "200"));
    EXPECT_FALSE(names_step(StepHook::fail_in_checkpoint, "20"));  // each hook its own variable
  }
  const Set set("TESSERA_TEST_SIGNAL_IN_CHECKPOINT", "10,11");
  EXPECT_TRUE(names_step(StepHook::signal_in_checkpoint, "10"));
  EXPECT_TRUE(names_step(StepHook::signal_in_checkpoint, "11"));
  EXPECT_FALSE(names_step(StepHook::signal_in_checkpoint, "1"));
  EXPECT_FALSE(names_step(StepHook::signal_in_checkpoint, "10,11"));
  const Set pause("TESSERA_TEST_PAUSE_IN_CHECKPOINT", "");
  EXPECT_FALSE(names_step(StepHook::pause_in_checkpoint, "0"));
}

TEST(TestHooks, NumbersAsAtolReadsThem) {
  unsetenv("TESSERA_TEST_FAIL_IN_READ");
  unsetenv("TESSERA_TEST_PERTURB_REPLICA");
  EXPECT_FALSE(fail_in_read().has_value());
  EXPECT_FALSE(perturb_replica().has_value());
  const Set read("TESSERA_TEST_FAIL_IN_READ", "3");
  const Set perturb("TESSERA_TEST_PERTURB_REPLICA", "x");
  EXPECT_EQ(fail_in_read(), 3L);
  EXPECT_EQ(perturb_replica(), 0LL);  // not a number: step 0, as before
}

TEST(TestHooks, CommFaultParses) {
  unsetenv("TESSERA_TEST_COMM_FAULT");
  EXPECT_EQ(comm_fault().action, CommFault::Action::none);
  {
    const Set empty("TESSERA_TEST_COMM_FAULT", "");
    EXPECT_EQ(comm_fault().action, CommFault::Action::none);
  }
  const Set set("TESSERA_TEST_COMM_FAULT", "skip:3:pipeline:12");
  const CommFault f = comm_fault();
  EXPECT_EQ(f.action, CommFault::Action::skip);
  EXPECT_EQ(f.rank, 3);
  EXPECT_EQ(f.group, "pipeline");
  EXPECT_EQ(f.seq, 12u);
  for (const char* bad : {"stall", "stall:1:data", "hang:1:data:3", "stall:-1:data:3", "stall:1:node:3",
                          "stall:1:data:0", "stall:1:data:-4", "stall:x:data:3", "stall:1:data:3x",
                          "stall:1:data:99999999999999999999999"}) {
    setenv("TESSERA_TEST_COMM_FAULT", bad, 1);
    EXPECT_THROW(comm_fault(), tessera::InputError) << bad;
  }
  setenv("TESSERA_TEST_COMM_FAULT", "stall:x", 1);
  try {
    comm_fault();
    ADD_FAILURE() << "no error";
  } catch (const tessera::InputError& e) {
    EXPECT_STREQ(e.what(), "TESSERA_TEST_COMM_FAULT = \"stall:x\": expected ACTION:RANK:GROUP:SEQ with ACTION "
                           "stall or skip, RANK >= 0, GROUP world, data, tensor or pipeline, SEQ >= 1 "
                           "(e.g. stall:1:data:12)");
  }
}

TEST(TestHooks, NodeOfRankParses) {
  unsetenv("TESSERA_TEST_NODE_OF_RANK");
  EXPECT_EQ(node_of_rank(), 0);
  {
    const Set empty("TESSERA_TEST_NODE_OF_RANK", "");
    EXPECT_EQ(node_of_rank(), 0);
  }
  const Set set("TESSERA_TEST_NODE_OF_RANK", "2");
  EXPECT_EQ(node_of_rank(), 2);
  for (const char* bad : {"0", "-1", "x", "2x", " 2", "1234567890"}) {
    setenv("TESSERA_TEST_NODE_OF_RANK", bad, 1);
    try {
      node_of_rank();
      ADD_FAILURE() << bad;
    } catch (const tessera::InputError& e) {
      EXPECT_EQ(std::string(e.what()), "TESSERA_TEST_NODE_OF_RANK = \"" + std::string(bad) +
                                           "\": expected a positive integer, the ranks per fake node (world "
                                           "rank r is on node r / K)");
    }
  }
}

}  // namespace
