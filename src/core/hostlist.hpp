#pragma once
// Slurm's compact host and count lists, as a job's environment gives them:
//   SLURM_JOB_NODELIST     "n[1-3,5],gpu07", "rack[1-2]-n[01-02]" (brackets multiply out,
//                          zero padding kept)
//   SLURM_TASKS_PER_NODE   "2(x3),1" (2 tasks on each of 3 nodes, then 1)
//   SLURM_JOB_CPUS_PER_NODE the same form
// `tessera check` reads them to name the hosts of each group's ranks before the job runs.
#include <string>
#include <vector>

namespace tessera {

/// \brief The host names of a Slurm host list, in Slurm's order. Throws InputError naming
/// `what` (the variable) for a malformed list.
std::vector<std::string> expand_hostlist(const std::string& list, const std::string& what);

/// \brief The counts of a Slurm count list ("2(x3),1" -> 2,2,2,1). Throws InputError naming `what`.
std::vector<int> expand_counts(const std::string& list, const std::string& what);

/// \brief The host of each of `ranks` ranks placed in blocks (Slurm's block distribution):
/// hosts[0] takes the first per_host[0] ranks, and so on. Throws InputError when the hosts hold
/// fewer than `ranks` tasks or the lists differ in length.
std::vector<std::string> block_placement(const std::vector<std::string>& hosts,
                                         const std::vector<int>& per_host, int ranks);

}  // namespace tessera
