#pragma once
// What the GPT and llama end-to-end tests share (test_gpt_runs, test_context_runs): the corpus
// (the repository's docs as byte tokens), the test deck's command lines, the one-rank reference
// run and the comparison of a run with it. Each program makes its own in its own directory.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <string>

#include "run_helpers.hpp"

namespace tessera::test {

inline const std::string& corpus() {
  static const std::string path = [] {
    const std::string dir = fresh_dir("corpus");
    const std::string out = dir + "/docs.h5";
    const RunResult r = tessera(1, fmt::format("prepare text --out {} {}", out, corpus_files(4)));
    if (r.exit_code != 0) ADD_FAILURE() << r.output;
    return out;
  }();
  return path;
}

inline std::string gpt_args(const std::string& out, const std::string& extra = "") {
  return fmt::format("train {}/tests/integration/gpt_test.toml --set data.path={} --set run.output_dir={} {}",
                     TESSERA_SOURCE_DIR, corpus(), out, extra);
}

inline std::string layout(int dp, int tp, int pp) {
  return fmt::format("--set parallel.data={} --set parallel.tensor={} --set parallel.pipeline={}", dp, tp, pp);
}

inline const std::string& reference() {
  static const std::string dir = [] {
    const std::string d = fresh_dir("gpt_ref");
    const RunResult r = tessera(1, gpt_args(d));
    if (r.exit_code != 0) ADD_FAILURE() << r.output;
    return d;
  }();
  return dir;
}

// The run in dir against the one-rank run `ref` (the gpt's reference() unless given).
inline void expect_same_run(const std::string& dir, const std::string& ref_dir = reference()) {
  const auto ref = train_losses(ref_dir);
  ASSERT_EQ(ref.size(), 30u);
  EXPECT_LE(max_relative_difference(ref, train_losses(dir)), 1e-5);
  ASSERT_EQ(eval_losses(dir).size(), 3u);
  EXPECT_LE(max_relative_difference(eval_losses(ref_dir), eval_losses(dir)), 1e-5);
  const std::string ckpt = "/checkpoints/step_00000030.h5";
  // AdamW moves an element whose gradient is near zero by about +-lr whatever its size, so the
  // reassociation of a sum can flip such a step: parameters agree to 5e-3 of each tensor's
  // largest element while the losses agree to 1e-5 (docs/models.md). Measured: up to 1.25e-3 (blocks.1.attn.proj
  // at tensor 2, OpenBLAS's own Zen 4 kernels; below 1e-3 with OPENBLAS_CORETYPE=Haswell), so 5e-3: a wrong
  // layout moves parameters by their own size.
  const RunResult d = tessera(1, "diff " + ref_dir + ckpt + " " + dir + ckpt + " --model-only --tolerance 5e-3");
  EXPECT_EQ(d.exit_code, 0) << d.output;
}

inline std::string llama_args(const std::string& out, const std::string& extra = "") {
  return gpt_args(out, "--set model.kind=llama --set model.layers=4 --set model.width=32 --set model.kv_heads=2 "
                       "--set model.ffn_width=48 --set model.rope_theta=500 --set model.norm_eps=1e-6 "
                       "--set model.tie_embeddings=false " + extra);
}

}  // namespace tessera::test
