// A unet's normalisation statistics in a checkpoint (/normalization, src/train/field_norm.hpp) on
// 1, 2 and 4 ranks: rank 0 writes them, every rank reads the same float32 values back; a
// checkpoint without them reads as none; another channel count, three of the four tensors and a
// std of 0 are InputErrors on every rank.
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "io/checkpoint_file.hpp"
#include "mpi_test_util.hpp"
#include "train/field_norm.hpp"

namespace tessera {
namespace {

using test::expect_input_error;
using test::world_rank;

std::string checkpoint_path(const std::string& name) {
  long pid = getpid();
  MPI_Bcast(&pid, 1, MPI_LONG, 0, MPI_COMM_WORLD);
  return "/tmp/tessera-field-norm-" + std::to_string(pid) + "/" + name + ".h5";
}

// Two input channels, one target channel; values that float32 rounds.
nn::FieldNorm statistics(double target_std = 0.0035187897) {
  nn::FieldNorm n;
  n.in_mean = {0.1, -2.5};
  n.in_std = {1.0 / 3.0, 7.0};
  n.out_mean = {0.006389651};
  n.out_std = {target_std};
  return n;
}

// A checkpoint holding a model tensor and, unless `norm` is empty, the statistics (all but the
// tensor named `drop`).
std::string write(const std::string& name, const nn::FieldNorm& norm, const std::string& drop = "") {
  const std::string path = checkpoint_path(name);
  io::CheckpointContent c;
  c.root_attrs = {{"step", std::int64_t{1}}};
  const std::vector<float> weight = {1.0f, 2.0f};
  io::TensorSlab w;
  w.path = "model/head.weight";
  w.shape = {2};
  w.offset = {0};
  w.count = {world_rank() == 0 ? 2u : 0u};
  w.data = weight.data();
  c.tensors.push_back(w);
  const FieldNormValues values = field_norm_values(norm);
  if (!norm.empty()) {
    c.group_attrs[kFieldNormGroup] = field_norm_attrs();
    for (io::TensorSlab& slab : field_norm_slabs(values, world_rank() == 0))
      if (slab.path != drop) c.tensors.push_back(slab);
  }
  io::write_checkpoint(MPI_COMM_WORLD, path, c);
  return path;
}

// Removes this run's files once every rank is done with them.
void clean_up() {
  const std::filesystem::path dir = std::filesystem::path(checkpoint_path("x")).parent_path();  // collective
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) std::filesystem::remove_all(dir);
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST(FieldNormCheckpoint, RankZeroWritesEveryRankReadsTheFloat32Values) {
  {
    const nn::FieldNorm n = statistics();
    const io::CheckpointFile file(MPI_COMM_WORLD, write("stored", n));
    const std::optional<nn::FieldNorm> back = stored_field_norm(file, 2, 1);
    ASSERT_TRUE(back.has_value());
    const FieldNormValues want = field_norm_values(n), got = field_norm_values(*back);
    EXPECT_EQ(got, want);
    EXPECT_EQ(back->in_std[0], double(static_cast<float>(1.0 / 3.0)));
    EXPECT_EQ(std::get<std::string>(file.group_attrs(kFieldNormGroup).at("rule")), kFieldNormRule);

    const io::CheckpointFile none(MPI_COMM_WORLD, write("none", nn::FieldNorm{}));
    EXPECT_FALSE(stored_field_norm(none, 2, 1).has_value());
  }
  clean_up();
}

TEST(FieldNormCheckpoint, OtherChannelsPartsAndZeroStdAreInputErrors) {
  {
    const io::CheckpointFile file(MPI_COMM_WORLD, write("channels", statistics()));
    expect_input_error([&] { stored_field_norm(file, 3, 1); },
                       {"normalization/input_mean has shape [2]; the model's input channels need [3]"});
    const io::CheckpointFile partial(MPI_COMM_WORLD, write("partial", statistics(), "normalization/target_std"));
    expect_input_error([&] { stored_field_norm(partial, 2, 1); }, {"holds 3 of the 4 tensors of /normalization"});
    const io::CheckpointFile zero(MPI_COMM_WORLD, write("zero", statistics(0.0)));
    expect_input_error([&] { stored_field_norm(zero, 2, 1); }, {"target_std holds 0; expected standard deviations > 0"});
  }
  clean_up();
}

}  // namespace
}  // namespace tessera
