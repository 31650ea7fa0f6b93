#include "comm/fault_hook.hpp"

#include <cstdio>
#include <ctime>

namespace tessera::comm {

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
