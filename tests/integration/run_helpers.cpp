#include "run_helpers.hpp"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <sstream>
#include <string_view>

namespace tessera::test {

namespace fs = std::filesystem;

RunResult shell(const std::string& command) {
  RunResult r;
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (!pipe) return r;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, pipe)) r.output += buf;
  const int status = pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

// Root is allowed (CI runs as root); waiting ranks yield the core on an oversubscribed node.
const std::string kRunEnv =
    "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1 "
    "OPENBLAS_NUM_THREADS=1 ";

std::string tessera_command(int ranks, const std::string& args) {
  return kRunEnv + TESSERA_MPIEXEC + " -n " + std::to_string(ranks) + " --oversubscribe --bind-to none " +
         TESSERA_BINARY + " " + args;
}

RunResult tessera(int ranks, const std::string& args) { return shell(tessera_command(ranks, args)); }

RunResult tessera_alone(const std::string& args) {
  return shell(kRunEnv + TESSERA_BINARY + " " + args);
}

// Each test program works in its own directory, so programs that ctest runs at once never share one.
fs::path work_dir() { return fs::path(TESSERA_TEST_WORK_DIR) / program_invocation_short_name; }

std::string fresh_dir(const std::string& name) {
  const fs::path p = work_dir() / name;
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

const std::string& fashion_mnist() {
  static const std::string path = [] {
    const fs::path p = work_dir() / "fashion-mnist.h5";
    if (!fs::exists(p)) {
      fs::create_directories(p.parent_path());
      const RunResult r = tessera(1, "prepare fashion-mnist --out " + p.string());
      if (r.exit_code != 0) ADD_FAILURE() << "prepare failed: " << r.output;
    }
    return p.string();
  }();
  return path;
}

std::vector<MetricsRow> read_metrics(const std::string& run_dir) {
  std::vector<MetricsRow> rows;
  std::ifstream in(fs::path(run_dir) / "metrics.csv");
  std::string line;
  const auto split = [](const std::string& text) {
    std::vector<std::string> cells;
    std::stringstream ss(text);
    for (std::string cell; std::getline(ss, cell, ',');) cells.push_back(cell);
    return cells;
  };
  std::getline(in, line);
  const std::vector<std::string> header = split(line);
  while (std::getline(in, line)) {
    std::vector<std::string> f = split(line);
    f.resize(header.size());  // a trailing empty cell is not read
    const auto cell = [&](const char* name) {
      const auto it = std::find(header.begin(), header.end(), name);
      return it == header.end() ? std::string() : f[static_cast<std::size_t>(it - header.begin())];
    };
    const auto number = [&](const char* name) {
      const std::string c = cell(name);
      return c.empty() ? std::nullopt : std::optional<double>(std::stod(c));
    };
    MetricsRow r;
    r.kind = cell("kind");
    r.step = std::stoll(cell("step"));
    r.loss = std::stod(cell("loss"));
    r.accuracy = number("accuracy").value_or(-1.0);
    r.rel_l2 = number("rel_l2").value_or(-1.0);
    r.samples_per_s = number("samples_per_s");
    r.tokens_per_s = number("tokens_per_s");
    rows.push_back(r);
  }
  return rows;
}

std::map<std::int64_t, double> train_losses(const std::string& run_dir) {
  std::map<std::int64_t, double> m;
  for (const auto& r : read_metrics(run_dir))
    if (r.kind == "train") m[r.step] = r.loss;
  return m;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

double max_relative_difference(const std::map<std::int64_t, double>& a,
                               const std::map<std::int64_t, double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0.0;
  for (const auto& [step, va] : a) {
    const auto it = b.find(step);
    if (it == b.end()) {
      ADD_FAILURE() << "step " << step << " missing";
      return INFINITY;
    }
    const double vb = it->second;
    worst = std::max(worst, std::abs(va - vb) / std::max({std::abs(va), std::abs(vb), 1e-30}));
  }
  return worst;
}

const std::string& test_deck() {
  static const std::string deck = std::string(TESSERA_SOURCE_DIR) + "/tests/integration/mlp_test.toml";
  return deck;
}

std::string corpus_files(int n) {
  static const char* const files[] = {"readme.txt", "design.txt", "deck.txt", "performance.txt"};
  if (n < 1 || n > 4) throw std::invalid_argument("corpus_files: 1 to 4 files");
  std::string out;
  for (int i = 0; i < n; ++i)
    out += std::string(i > 0 ? " " : "") + TESSERA_SOURCE_DIR + "/tests/data/corpus/" + files[i];
  return out;
}

std::string train_args(const std::string& out, const std::string& extra) {
  return "train " + test_deck() + " --set data.path=" + fashion_mnist() + " --set run.output_dir=" +
         out + " " + extra;
}

std::map<std::int64_t, double> eval_losses(const std::string& dir, bool accuracy) {
  std::map<std::int64_t, double> m;
  for (const auto& r : read_metrics(dir))
    if (r.kind == "eval") m[r.step] = accuracy ? r.accuracy : r.loss;
  return m;
}

const std::string& shared_run(int ranks, const std::string& extra) {
  // The test hooks in the environment (TESSERA_TEST_*, inherited by the run) are part of the run.
  std::string hooks;
  for (char** e = environ; *e != nullptr; ++e)
    if (std::string_view(*e).starts_with("TESSERA_TEST_")) hooks += std::string(*e) + "\n";
  static std::map<std::pair<int, std::string>, std::string> runs;
  const auto key = std::pair{ranks, extra + "\n" + hooks};
  if (const auto it = runs.find(key); it != runs.end()) return it->second;
  const std::string dir = fresh_dir("shared_run_" + std::to_string(runs.size()));
  const RunResult r = tessera(ranks, train_args(dir, extra));
  if (r.exit_code != 0) ADD_FAILURE() << "the shared run on " << ranks << " rank(s) with '" << extra << "' failed:\n" << r.output;
  return runs.emplace(key, dir).first->second;
}

void expect_layout_invariant(const std::string& name, const std::string& extra,
                             const std::vector<std::pair<int, std::string>>& layouts) {
  const std::string& ref = shared_run(1, extra);
  const auto ref_losses = train_losses(ref);
  ASSERT_EQ(ref_losses.size(), 30u);
  for (const auto& [ranks, layout] : layouts) {
    const std::string& dir = shared_run(ranks, extra.empty() || layout.empty() ? extra + layout : extra + " " + layout);
    ASSERT_EQ(train_losses(dir).size(), 30u) << name << ": " << ranks << " ranks " << layout;
    EXPECT_LE(max_relative_difference(ref_losses, train_losses(dir)), 1e-5)
        << ranks << " ranks " << layout;
    EXPECT_LE(max_relative_difference(eval_losses(ref), eval_losses(dir)), 1e-5) << layout;
    EXPECT_LE(max_relative_difference(eval_losses(ref, true), eval_losses(dir, true)), 1e-4) << layout;
  }
}

bool shows_non_finite(const std::string& inspect_output) {
  for (const char* word : {"nan", "inf", "-nan", "-inf"})
    for (const char* after : {" ", "\n", ","})
      if (inspect_output.find(std::string(" ") + word + after) != std::string::npos) return true;
  return false;
}

int count(const std::string& text, const std::string& what) {
  int n = 0;
  for (std::size_t p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
  return n;
}

void expect_input_error(const RunResult& r, const std::string& needle) {
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_EQ(count(r.output, "tessera: error:"), 1) << r.output;
  EXPECT_NE(r.output.find(needle), std::string::npos) << "missing '" << needle << "' in:\n" << r.output;
  EXPECT_EQ(count(r.output, "internal error"), 0) << r.output;
}

}  // namespace tessera::test
