// What a new user sees first: `tessera --help`, every subcommand's --help (found in the help
// itself, nested ones too) and a bad command line print Tessera's own text, never Kokkos's
// argument banner (Kokkos sees only --kokkos-* arguments, src/main.cpp); each help ends with one
// example command line; `tessera --kokkos-help` prints Kokkos's options. The binary runs as a new
// user types it, without mpiexec (a singleton MPI process; a failing run under mpiexec also waits
// seconds for mpiexec to end the job).
#include <gtest/gtest.h>

#include <algorithm>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "run_helpers.hpp"

namespace tessera::test {
namespace {

// Kokkos's help: its banner, or an option listed as "--kokkos-NAME[=ARG]   : what it does".
bool shows_kokkos_help(const std::string& out) {
  static const std::regex option(R"(--kokkos-[a-z-]+(=\S+)? +: )");
  return out.find("Kokkos command line arguments") != std::string::npos || std::regex_search(out, option);
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::stringstream in(text);
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  return lines;
}

// The subcommands a help lists under "Subcommands:" (CLI11: two spaces, the name, its description).
std::vector<std::string> subcommands_of(const std::string& help) {
  std::vector<std::string> names;
  bool in_list = false;
  for (const std::string& l : lines_of(help)) {
    if (l == "Subcommands:") {
      in_list = true;
    } else if (in_list && l.starts_with("  ") && l.size() > 2 && l[2] != ' ') {
      names.push_back(l.substr(2, l.find(' ', 2) - 2));
    } else if (in_list && !l.starts_with("  ")) {
      in_list = false;
    }
  }
  return names;
}

// A help: exit 0, no Kokkos text, and exactly one "Example: tessera ..." (or tools/mpirun.sh ...
// tessera ...) line, the last one, naming the command. Returns the help.
std::string expect_help(const std::string& command) {
  SCOPED_TRACE("tessera " + command + " --help");
  const RunResult r = tessera_alone(command + " --help");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_FALSE(shows_kokkos_help(r.output)) << r.output;
  std::vector<std::string> lines = lines_of(r.output);
  while (!lines.empty() && lines.back().empty()) lines.pop_back();
  EXPECT_EQ(count(r.output, "Example: "), 1) << r.output;
  EXPECT_TRUE(!lines.empty() && lines.back().starts_with("Example: ")) << r.output;
  EXPECT_TRUE(!lines.empty() && lines.back().find("tessera " + command) != std::string::npos) << r.output;
  return r.output;
}

TEST(Help, EveryCommandsHelpIsTesserasOwnAndEndsWithAnExample) {
  const RunResult top = tessera_alone("--help");
  ASSERT_EQ(top.exit_code, 0) << top.output;
  EXPECT_FALSE(shows_kokkos_help(top.output)) << top.output;
  EXPECT_NE(top.output.find("tessera --kokkos-help"), std::string::npos) << "says how to reach Kokkos's arguments";
  std::vector<std::string> lines = lines_of(top.output);
  while (!lines.empty() && lines.back().empty()) lines.pop_back();
  ASSERT_FALSE(lines.empty());
  EXPECT_TRUE(lines.back().starts_with("Example: ")) << top.output;
  EXPECT_EQ(count(top.output, "Example: "), 1) << top.output;

  // Every subcommand the help lists, and theirs (prepare fashion-mnist, bench comm, ...).
  std::vector<std::string> commands = subcommands_of(top.output), seen;
  for (const char* name : {"train", "check", "eval", "prepare", "inspect", "diff", "export", "import", "doctor", "bench"})
    EXPECT_NE(std::find(commands.begin(), commands.end(), name), commands.end()) << name << "\n" << top.output;
  while (!commands.empty()) {
    const std::string command = commands.front();
    commands.erase(commands.begin());
    seen.push_back(command);
    for (const std::string& sub : subcommands_of(expect_help(command))) commands.push_back(command + " " + sub);
  }
  EXPECT_NE(std::find(seen.begin(), seen.end(), "prepare fashion-mnist"), seen.end());
  EXPECT_NE(std::find(seen.begin(), seen.end(), "bench comm"), seen.end());
}

TEST(Help, ABadCommandLineIsOneTesseraErrorLine) {
  for (const char* args : {"", "frobnicate", "--frobnicate", "train", "train deck.toml --frobnicate", "prepare"}) {
    SCOPED_TRACE(std::string("tessera ") + args);
    const RunResult r = tessera_alone(args);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_EQ(count(r.output, "tessera: error:"), 1) << r.output;
    EXPECT_NE(r.output.find("tessera --help"), std::string::npos) << r.output;
    EXPECT_FALSE(shows_kokkos_help(r.output)) << r.output;
  }
}

TEST(Help, KokkosHelpPrintsKokkossOptionsAlone) {
  const RunResult r = tessera_alone("--kokkos-help");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(shows_kokkos_help(r.output)) << r.output;
  EXPECT_NE(r.output.find("--kokkos-help"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("Subcommands:"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace tessera::test
