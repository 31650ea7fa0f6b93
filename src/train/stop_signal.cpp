#include "train/stop_signal.hpp"

#include <csignal>

namespace tessera {

namespace {
volatile std::sig_atomic_t received = 0;

extern "C" void record_stop_signal(int sig) { received = sig; }
}  // namespace

void install_stop_handlers() {
  struct sigaction action {};
  action.sa_handler = record_stop_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // a signal must not fail an MPI or file call half-way
  sigaction(SIGUSR1, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
  // Ctrl-C reaching a rank directly asks for the same stop; a second one ends it at once.
  action.sa_flags |= SA_RESETHAND;
  sigaction(SIGINT, &action, nullptr);
}

int stop_signal() { return received; }

}  // namespace tessera
