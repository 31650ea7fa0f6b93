#pragma once
// Stop requests by signal (Slurm's warning signal before the time limit, scancel, kill): the
// handler only records the signal; the trainer folds the flag into its per-step reduction so
// every rank stops after the same step, writes one checkpoint and exits with code 4.
namespace tessera {

/// \brief Installs handlers for SIGUSR1, SIGTERM and SIGINT that record the signal (further
/// signals, e.g. during the final checkpoint, are recorded too and change nothing; a second SIGINT
/// takes its default action and ends the process).
void install_stop_handlers();

/// The last stop signal received by this process, or 0.
int stop_signal();

}  // namespace tessera
