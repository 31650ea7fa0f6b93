#include "comm/fault_hook.hpp"

#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <sstream>
#include <vector>

#include "core/error.hpp"

namespace tessera::comm {

CommFault comm_fault_from_environment() {
  const char* text = std::getenv("TESSERA_TEST_COMM_FAULT");
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

void stall(int rank, const char* op, const char* group, std::uint64_t seq) {
  std::fprintf(stderr, "tessera: rank %d: TESSERA_TEST_COMM_FAULT: stalling before %s #%llu of the %s group\n",
               rank, op, static_cast<unsigned long long>(seq), group);
  std::fflush(stderr);
  // A signal ends nanosleep early (EINTR): sleep on, as a hung rank would.
  const std::time_t until = std::time(nullptr) + 3600;
  for (std::time_t now = std::time(nullptr); now < until; now = std::time(nullptr)) {
    timespec left{until - now, 0};
    nanosleep(&left, nullptr);
  }
}

}  // namespace tessera::comm
