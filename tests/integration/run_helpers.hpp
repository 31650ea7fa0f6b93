#pragma once
// Running the tessera binary from tests and reading what it wrote.
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace tessera::test {

struct RunResult {
  int exit_code = -1;
  std::string output;  ///< stdout and stderr together
};

/// Runs a shell command, capturing its output and exit code.
RunResult shell(const std::string& command);
/// The shell command that runs `tessera ARGS` under mpiexec with `ranks` ranks.
std::string tessera_command(int ranks, const std::string& args);
/// Runs `tessera ARGS` under mpiexec with `ranks` ranks.
RunResult tessera(int ranks, const std::string& args);
/// \brief Runs `tessera ARGS` as one process without mpiexec (MPI's singleton start), for the
/// 1-rank commands that are refused: mpiexec adds a second or two to every non-zero exit.
RunResult tessera_alone(const std::string& args);
/// A fresh, empty directory under the test work dir.
std::string fresh_dir(const std::string& name);
/// The prepared Fashion-MNIST file (made once per test run).
const std::string& fashion_mnist();

struct MetricsRow {
  std::string kind;
  std::int64_t step = 0;
  double loss = 0.0, accuracy = -1.0;
  double rel_l2 = -1.0;  ///< eval rows of a field model: the relative L2 error; -1: empty
  std::optional<double> samples_per_s, tokens_per_s;  ///< empty cells are nullopt
};
/// The rows of run_dir/metrics.csv, its cells found by the header's column names.
std::vector<MetricsRow> read_metrics(const std::string& run_dir);
/// Train-row losses by step.
std::map<std::int64_t, double> train_losses(const std::string& run_dir);
std::string read_file(const std::string& path);
/// How often what occurs in text.
int count(const std::string& text, const std::string& what);
/// \brief True where `tessera inspect`'s output shows a value printed as nan or inf (a word of
/// its own: the resolved deck's "inflight_mb" is none).
bool shows_non_finite(const std::string& inspect_output);
/// A run refused as bad input: exit 2, exactly one `tessera: error:` line, needle in the output,
/// no internal error.
void expect_input_error(const RunResult& r, const std::string& needle);

/// Largest relative difference |a-b| / max(|a|,|b|, tiny) over the steps both have; fails if the
/// step sets differ.
double max_relative_difference(const std::map<std::int64_t, double>& a,
                               const std::map<std::int64_t, double>& b);

/// The end-to-end test deck, tests/integration/mlp_test.toml (30 steps, logged every step).
const std::string& test_deck();
/// `train DECK` on the prepared data into `out`, plus `extra` arguments.
std::string train_args(const std::string& out, const std::string& extra = "");
/// \brief The first `n` (1 to 4) files of the text corpus the transformer tests train on, as
/// `prepare text` arguments: tests/data/corpus/, frozen copies of the README and three docs pages,
/// so that editing the docs changes no test's data (and no tolerance it was set by).
std::string corpus_files(int n);
/// \brief The directory of `tessera(ranks, train_args(DIR, extra))`, trained once per test program
/// and shared by every case that compares with that same run under the same test hooks (the
/// TESSERA_TEST_* variables of the environment). Callers read it and never write into it: copy it
/// to resume from it.
const std::string& shared_run(int ranks, const std::string& extra = "");
/// Eval-row losses (or accuracies) by step.
std::map<std::int64_t, double> eval_losses(const std::string& dir, bool accuracy = false);

/// \brief Trains `extra` on 1 rank and on each (ranks, arguments) layout; every run's losses and
/// evaluations must equal the 1-rank run's within 1e-5 relative (gtest expectations). Every run
/// is a shared_run: the 1-rank one shared_run(1, extra), a layout's shared_run(ranks, "EXTRA LAYOUT").
void expect_layout_invariant(const std::string& name, const std::string& extra,
                             const std::vector<std::pair<int, std::string>>& layouts);

}  // namespace tessera::test
