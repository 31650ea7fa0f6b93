#include "core/test_hooks.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <sstream>
#include <stdexcept>
#include <string_view>
#include <vector>

#include "core/error.hpp"

namespace tessera::test_hooks {

namespace {

/// The variable's value, nullptr where unset: the one getenv of every hook.
const char* value_of(const char* variable) { return std::getenv(variable); }

const char* variable_of(StepHook hook) {
  switch (hook) {
    case StepHook::fail_in_checkpoint: return "TESSERA_TEST_FAIL_IN_CHECKPOINT";
    case StepHook::kill_in_checkpoint: return "TESSERA_TEST_KILL_IN_CHECKPOINT";
    case StepHook::signal_in_checkpoint: return "TESSERA_TEST_SIGNAL_IN_CHECKPOINT";
    case StepHook::pause_in_checkpoint: return "TESSERA_TEST_PAUSE_IN_CHECKPOINT";
  }
  throw std::logic_error("test_hooks: unknown StepHook");
}

}  // namespace

bool pack_bf16() {
  static const bool set = value_of("TESSERA_TEST_PACK_BF16") != nullptr;
  return set;
}

bool names_step(StepHook hook, std::string_view step) {
  const char* steps = value_of(variable_of(hook));
  if (steps == nullptr) return false;
  const std::string_view list = steps;
  for (std::size_t begin = 0; begin <= list.size();) {
    const std::size_t end = std::min(list.find(',', begin), list.size());
    if (list.substr(begin, end - begin) == step) return true;
    begin = end + 1;
  }
  return false;
}

std::optional<long> fail_in_read() {
  const char* text = value_of("TESSERA_TEST_FAIL_IN_READ");
  if (text == nullptr) return std::nullopt;
  return std::atol(text);
}

std::optional<long> fail_offload_write() {
  const char* text = value_of("TESSERA_TEST_FAIL_OFFLOAD_WRITE");
  if (text == nullptr) return std::nullopt;
  return std::atol(text);
}

std::optional<long> fail_offload_read() {
  const char* text = value_of("TESSERA_TEST_FAIL_OFFLOAD_READ");
  if (text == nullptr) return std::nullopt;
  return std::atol(text);
}

bool stage_offload() {
  const char* text = value_of("TESSERA_TEST_STAGE_OFFLOAD");
  return text != nullptr && std::string_view(text) == "1";
}

std::optional<long> kill_in_offload_write() {
  const char* text = value_of("TESSERA_TEST_KILL_IN_OFFLOAD_WRITE");
  if (text == nullptr) return std::nullopt;
  return std::atol(text);
}

std::optional<long long> perturb_replica() {
  const char* text = value_of("TESSERA_TEST_PERTURB_REPLICA");
  if (text == nullptr) return std::nullopt;
  return std::atoll(text);
}

CommFault comm_fault() {
  const char* text = value_of("TESSERA_TEST_COMM_FAULT");
  CommFault f;
  if (text == nullptr || *text == '\0') return f;
  std::vector<std::string> parts;
  std::stringstream in(text);
  for (std::string part; std::getline(in, part, ':');) parts.push_back(part);
  auto bad = [&] {
    return InputError(fmt::format("TESSERA_TEST_COMM_FAULT = \"{}\": expected ACTION:RANK:GROUP:SEQ with ACTION "
                                  "stall or skip, RANK >= 0, GROUP world, data, tensor or pipeline, SEQ >= 1 "
                                  "(e.g. stall:1:data:12)", text));
  };
  if (parts.size() != 4) throw bad();
  if (parts[0] == "stall") f.action = CommFault::Action::stall;
  else if (parts[0] == "skip") f.action = CommFault::Action::skip;
  else throw bad();
  if (parts[2] != "world" && parts[2] != "data" && parts[2] != "tensor" && parts[2] != "pipeline") throw bad();
  f.group = parts[2];
  try {
    std::size_t used = 0;
    const long rank = std::stol(parts[1], &used);
    if (used != parts[1].size() || rank < 0 || rank > 1 << 30) throw bad();
    const unsigned long long seq = std::stoull(parts[3], &used);
    if (used != parts[3].size() || seq < 1 || parts[3][0] == '-') throw bad();
    f.rank = static_cast<int>(rank);
    f.seq = seq;
  } catch (const std::logic_error&) {  // stol/stoull: not a number, out of range
    throw bad();
  }
  return f;
}

int node_of_rank() {
  const char* text = value_of("TESSERA_TEST_NODE_OF_RANK");
  if (text == nullptr || *text == '\0') return 0;
  const std::string s(text);
  if (s.size() > 9 || !std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; }) ||
      std::stoi(s) < 1)
    throw InputError(fmt::format("TESSERA_TEST_NODE_OF_RANK = \"{}\": expected a positive integer, the ranks "
                                 "per fake node (world rank r is on node r / K)", s));
  return std::stoi(s);
}

}  // namespace tessera::test_hooks
