// Where ranks run: Slurm's host and count lists, block placement, the BLAS thread rule, the log
// lines, the warnings (tensor groups across hosts, BLAS thread counts that differ) and
// parallel.tensor_within_node.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/hostlist.hpp"
#include "train/placement.hpp"

using namespace tessera;

namespace {

using Hosts = std::vector<std::string>;

std::string joined(const std::vector<std::string>& lines) {
  std::string s;
  for (const auto& l : lines) s += l + "\n";
  return s;
}

Config grid(int dp, int tp, int pp) {
  Config c;
  c.parallel.data = dp;
  c.parallel.tensor = tp;
  c.parallel.pipeline = pp;
  return c;
}

void expect_error(const std::function<void()>& f, const std::string& piece) {
  try {
    f();
    ADD_FAILURE() << "no InputError; expected " << piece;
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(piece), std::string::npos) << e.what();
  }
}

}  // namespace

TEST(Hostlist, ExpandsSlurmLists) {
  EXPECT_EQ(expand_hostlist("n1", "L"), (Hosts{"n1"}));
  EXPECT_EQ(expand_hostlist("n[1-3,5],gpu07", "L"), (Hosts{"n1", "n2", "n3", "n5", "gpu07"}));
  EXPECT_EQ(expand_hostlist("x[08-10]", "L"), (Hosts{"x08", "x09", "x10"}));
  EXPECT_EQ(expand_hostlist("r[1-2]-n[1-2]", "L"), (Hosts{"r1-n1", "r1-n2", "r2-n1", "r2-n2"}));
  EXPECT_EQ(expand_counts("2(x3),1", "C"), (std::vector<int>{2, 2, 2, 1}));
  EXPECT_EQ(expand_counts("4", "C"), (std::vector<int>{4}));
  for (const char* bad : {"", "n[1-", "n]1", "n[3-1]", "n[a-b]", "a,,b", "n[0-999999999]"})
    expect_error([&] { expand_hostlist(bad, "SLURM_JOB_NODELIST"); }, "SLURM_JOB_NODELIST = \"");
  for (const char* bad : {"", "2(x", "2(x0)", "0", "x", "2,,1", "2(3)"})
    expect_error([&] { expand_counts(bad, "SLURM_TASKS_PER_NODE"); }, "SLURM_TASKS_PER_NODE = \"");
}

TEST(Hostlist, PlacesRanksInBlocks) {
  EXPECT_EQ(block_placement({"a", "b"}, {2, 1}, 3), (Hosts{"a", "a", "b"}));
  EXPECT_EQ(block_placement({"a", "b"}, {2, 2}, 3), (Hosts{"a", "a", "b"}));
  expect_error([] { block_placement({"a", "b"}, {1, 1}, 3); }, "fewer than the 3 ranks");
  expect_error([] { block_placement({"a", "b"}, {1}, 1); }, "do not match");
}

TEST(Placement, BlasThreadsRule) {
  Config c;
  EXPECT_EQ(blas_threads_for(c, 8, 2), 4);
  EXPECT_EQ(blas_threads_for(c, 8, 3), 2);
  EXPECT_EQ(blas_threads_for(c, 2, 4), 1);
  EXPECT_EQ(blas_threads_for(c, 8, 2, 3), 3);  // the affinity mask allows 3
  c.run.blas_threads = 5;
  EXPECT_EQ(blas_threads_for(c, 8, 2), 5);
}

TEST(Placement, DescribesEveryRankAndGroup) {
  const Config c = grid(2, 2, 1);
  const auto places = planned_placement(c, {"n1", "n1", "n2", "n2"}, 2, 2, {4, 4, 4, 4});
  ASSERT_EQ(places.size(), 4u);
  EXPECT_EQ(places[3].data, 1);
  EXPECT_EQ(places[3].tensor, 1);
  EXPECT_EQ(places[3].blas_threads, 2);
  const std::string text = joined(describe_placement(places, 2, 2, 1));
  EXPECT_NE(text.find("ranks: 4 on 2 hosts: n1 [0,1], n2 [2,3]"), std::string::npos) << text;
  EXPECT_NE(text.find("  rank 2 host n2 data 1 tensor 0 pipeline 0 blas_threads 2\n"), std::string::npos) << text;
  EXPECT_NE(text.find("  data group (t=0,p=0): ranks [0,2] on hosts [n1,n2]"), std::string::npos) << text;
  EXPECT_NE(text.find("  tensor group (d=1,p=0): ranks [2,3] on hosts [n2,n2]"), std::string::npos) << text;
  EXPECT_TRUE(placement_warnings(places, 2, 2, 1).empty());
  EXPECT_NO_THROW(check_tensor_within_node(c, places));
  const auto j = placement_json(places);
  ASSERT_EQ(j.size(), 4u);
  EXPECT_EQ(j[1]["host"], "n1");
  EXPECT_EQ(j[1]["tensor"], 1);
}

TEST(Placement, WarnsOfTensorGroupsAcrossHostsAndUnevenBlasThreads) {
  Config c = grid(1, 2, 2);
  // Three ranks on n1, one on n2: the second tensor group spans both, and with
  // run.blas_threads = 0 the lone rank on n2 gets all 4 cores, the others 1.
  const auto places = planned_placement(c, {"n1", "n1", "n1", "n2"}, 1, 2, {4, 4, 4, 4});
  const std::string text = joined(placement_warnings(places, 1, 2, 2));
  EXPECT_NE(text.find("warning: tensor group (d=0,p=1) (ranks [2,3]) spans hosts n1, n2"), std::string::npos) << text;
  EXPECT_NE(text.find("warning: ranks have different BLAS thread counts (1 on ranks 0-2, 4 on rank 3)"),
            std::string::npos) << text;
  EXPECT_NE(text.find("bitwise equality across layouts needs the same BLAS thread count per rank"), std::string::npos);
  EXPECT_NO_THROW(check_tensor_within_node(c, places));
  c.parallel.tensor_within_node = true;
  expect_error([&] { check_tensor_within_node(c, places); },
               "parallel.tensor_within_node = true, but the tensor group (d=0,p=1) (ranks [2,3]) spans hosts n1, n2");
  c.run.blas_threads = 1;
  const auto even = planned_placement(c, {"n1", "n1", "n1", "n2"}, 1, 2, {4, 4, 4, 4});
  EXPECT_EQ(joined(placement_warnings(even, 1, 2, 2)).find("BLAS"), std::string::npos);
}
