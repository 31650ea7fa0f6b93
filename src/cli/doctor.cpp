// tessera doctor: the flight records of a run, judged (docs/design.md, "Flight records").
#include "cli/doctor.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <mpi.h>

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <map>
#include <regex>
#include <set>
#include <tuple>

#include "cli/commands.hpp"
#include "comm/agree.hpp"
#include "core/error.hpp"

namespace tessera::cli {

namespace fs = std::filesystem;
using comm::clock_time;
using comm::FlightRecord;
using comm::rank_list;
using comm::RecordedOp;

namespace {

/// One rank of the run as its record shows it.
struct RankView {
  const FlightRecord* rec = nullptr;  ///< nullptr: no record
  const RecordedOp* stuck = nullptr;  ///< the operation it waits in
};

std::string describe(const RecordedOp& o) {
  if (o.p2p)
    return fmt::format("{} #{} {} rank {} in the {} group", o.op, o.seq, o.op == "send" ? "to" : "from",
                       o.peer, o.group);
  return fmt::format("{} #{} of the {} group", o.op, o.seq, o.group);
}

std::string ended(const RecordedOp& o) {
  return o.in_flight() ? std::string("still in flight") : "ended " + clock_time(o.end);
}

std::string ranks_phrase(const std::vector<int>& ranks) {
  return fmt::format("{} {}", ranks.size() == 1 ? "rank" : "ranks", rank_list(ranks));
}

// Where a rank with a record was when it wrote it.
std::string state(const RankView& v) {
  if (v.stuck) return fmt::format("it waits in {} since {}", describe(*v.stuck), clock_time(v.rec->waiting_since));
  std::string why = v.rec->message;
  if (why.size() > 80) why = why.substr(0, 77) + "...";
  return fmt::format("it was in no communication operation when it wrote its record ({}: {})", v.rec->reason, why);
}

// The collective of `group` with sequence number `seq` (seq 0: the newest), or nullptr.
const RecordedOp* collective(const FlightRecord& r, const std::string& group, std::uint64_t seq = 0) {
  const RecordedOp* found = nullptr;
  for (const auto& o : r.ops)
    if (!o.p2p && o.group == group && (seq == 0 ? !found || o.seq > found->seq : o.seq == seq)) found = &o;
  return found;
}

// The send or receive (op) with `peer` in `group`, number `seq` (0: the newest), or nullptr.
const RecordedOp* transfer(const FlightRecord& r, const std::string& group, const std::string& op, int peer,
                           std::uint64_t seq = 0) {
  const RecordedOp* found = nullptr;
  for (const auto& o : r.ops)
    if (o.p2p && o.group == group && o.op == op && o.peer == peer &&
        (seq == 0 ? !found || o.seq > found->seq : o.seq == seq))
      found = &o;
  return found;
}

class Diagnosis {
 public:
  Diagnosis(std::map<int, RankView> ranks, int size) : ranks_(std::move(ranks)), size_(size) {}

  std::vector<std::string> run(std::vector<std::string> lines);

 private:
  void collective_wait(const RecordedOp& op, const std::vector<int>& waiters);
  void transfer_wait(int rank, const RankView& v);
  void absent_from(const RecordedOp& op, int rank, double since, const std::string& where);
  /// What a rank is blamed for, with when the wait it caused began.
  struct Blame {
    double since;
    int rank;
    std::string what;
  };
  void note_blame(double since, int rank, std::string what) { blames_.push_back({since, rank, std::move(what)}); }
  /// The blame of the earliest wait among `ranks`' blames.
  std::string first_blame(const std::vector<int>& ranks) const;
  void blame(int rank, std::string line) {
    culprits_.insert(rank);
    lines_.push_back(std::move(line));
  }
  std::string verdict() const;

  std::map<int, RankView> ranks_;
  int size_;
  std::vector<std::string> lines_;
  std::set<int> culprits_, mentioned_;
  std::vector<Blame> blames_;
};

std::string Diagnosis::first_blame(const std::vector<int>& ranks) const {
  const Blame* first = nullptr;
  for (const auto& b : blames_)
    if (std::find(ranks.begin(), ranks.end(), b.rank) != ranks.end() && (!first || b.since < first->since)) first = &b;
  return first ? first->what : std::string();
}

void Diagnosis::absent_from(const RecordedOp& op, int rank, double since, const std::string& where) {
  mentioned_.insert(rank);
  const auto it = ranks_.find(rank);
  if (it == ranks_.end() || !it->second.rec) {
    note_blame(since, rank, fmt::format("rank {} never arrived in {}", rank, describe(op)));
    blame(rank, fmt::format("  rank {} left no flight record (killed, or stopped before it could write one)", rank));
    return;
  }
  const RankView& v = it->second;
  const RecordedOp* same = collective(*v.rec, op.group, op.seq);
  const RecordedOp* last = collective(*v.rec, op.group);
  auto blame_first = [&](const std::string& what) { note_blame(since, rank, fmt::format("rank {} {}", rank, what)); };
  if (!same && (!last || last->seq < op.seq)) {
    blame_first(fmt::format("never entered {}", describe(op)));
    blame(rank, fmt::format("  rank {} never entered {} ({}){}; {}", rank, describe(op), where,
                            last ? fmt::format(": its last {}-group operation is {} #{}, {}", op.group,
                                               last->op, last->seq, ended(*last))
                                 : std::string(),
                            state(v)));
  } else if (!same) {
    const bool evicted = std::none_of(v.rec->ops.begin(), v.rec->ops.end(), [&](const RecordedOp& o) {
      return !o.p2p && o.group == op.group && o.seq < op.seq;
    });
    if (evicted) {
      lines_.push_back(fmt::format("  rank {} is past it (at #{}); its record no longer holds #{}; {}", rank,
                                   last->seq, op.seq, state(v)));
    } else {
      blame_first(fmt::format("skipped {}", describe(op)));
      blame(rank, fmt::format("  rank {} skipped {} (its record goes on to #{}); {}", rank, describe(op),
                              last->seq, state(v)));
    }
  } else if (same->op != op.op) {
    blame_first(fmt::format("called {} where the others called {}", same->op, describe(op)));
    blame(rank, fmt::format("  rank {}'s #{} of the {} group is {}, not {}: the ranks called collectives in "
                            "different orders; {}", rank, op.seq, op.group, same->op, op.op, state(v)));
  } else if (same->in_flight()) {
    blame_first(fmt::format("started {} without waiting for it", describe(op)));
    blame(rank, fmt::format("  rank {} started {} (nonblocking) and has not waited for it; {}", rank,
                            describe(op), state(v)));
  } else {
    lines_.push_back(fmt::format("  rank {} completed it at {}: the ranks disagree on what it is (sizes?); {}",
                                 rank, clock_time(same->end), state(v)));
  }
}

void Diagnosis::collective_wait(const RecordedOp& op, const std::vector<int>& waiters) {
  const FlightRecord& any = *ranks_.at(waiters.front()).rec;
  double since = any.waiting_since;
  for (int r : waiters) since = std::min(since, ranks_.at(r).rec->waiting_since);
  const auto group = any.groups.find(op.group);
  std::vector<int> members = group != any.groups.end() ? group->second : waiters;
  lines_.push_back(fmt::format("{} {} in {} (ranks {}; {}) since {}", ranks_phrase(waiters),
                               waiters.size() == 1 ? "waits" : "wait", describe(op), rank_list(members),
                               comm::format_bytes(op.bytes), clock_time(since)));
  for (int r : waiters) mentioned_.insert(r);
  std::vector<int> absent;
  for (int m : members)
    if (std::find(waiters.begin(), waiters.end(), m) == waiters.end()) absent.push_back(m);
  const std::string where = fmt::format("{} waited there since {}", ranks_phrase(waiters), clock_time(since));
  for (int r : absent) absent_from(op, r, since, where);
  if (absent.empty() && waiters.size() > 1) {
    // Everyone is inside: who came last?
    auto start = [&](int r) { return ranks_.at(r).stuck->start; };
    const auto [first, last] = std::minmax_element(waiters.begin(), waiters.end(),
                                                   [&](int a, int b) { return start(a) < start(b); });
    lines_.push_back(fmt::format("  every rank of the group is in it and none completed it: a rank stopped "
                                 "inside it, or the network failed; rank {} entered it last, {:.3f} s after rank {}",
                                 *last, start(*last) - start(*first), *first));
  }
}

void Diagnosis::transfer_wait(int rank, const RankView& v) {
  const RecordedOp& op = *v.stuck;
  mentioned_.insert(rank);
  lines_.push_back(fmt::format("rank {} waits in {} ({}) since {}", rank, describe(op),
                               comm::format_bytes(op.bytes), clock_time(v.rec->waiting_since)));
  const bool recv = op.op == "recv";
  const std::string other_op = recv ? "send" : "recv";
  mentioned_.insert(op.peer);
  const auto it = ranks_.find(op.peer);
  if (it == ranks_.end() || !it->second.rec) {
    note_blame(v.rec->waiting_since, op.peer, fmt::format("rank {} never arrived for {}", op.peer, describe(op)));
    blame(op.peer, fmt::format("  rank {} left no flight record (killed, or stopped before it could write one)", op.peer));
    return;
  }
  const RankView& p = it->second;
  const RecordedOp* match = transfer(*p.rec, op.group, other_op, rank, op.seq);
  const RecordedOp* last = transfer(*p.rec, op.group, other_op, rank);
  if (!match && (!last || last->seq < op.seq)) {
    const std::string what = fmt::format("never {} #{} {} rank {}", recv ? "sent" : "received", op.seq,
                                         recv ? "to" : "from", rank);
    note_blame(v.rec->waiting_since, op.peer, fmt::format("rank {} {} in the {} group", op.peer, what, op.group));
    blame(op.peer, fmt::format("  rank {} {}{}; {}", op.peer, what,
                               last ? fmt::format(" (its last was #{}, {})", last->seq, ended(*last)) : std::string(),
                               state(p)));
  } else if (!match) {
    lines_.push_back(fmt::format("  rank {}'s record no longer holds its {} #{}; {}", op.peer, other_op, op.seq, state(p)));
  } else if (match->in_flight()) {
    lines_.push_back(fmt::format("  rank {}'s {} #{} is in flight too: a transport failure, or rank {} stopped "
                                 "inside MPI; {}", op.peer, other_op, op.seq, op.peer, state(p)));
  } else {
    lines_.push_back(fmt::format("  rank {} completed its {} #{} at {}; {}", op.peer, other_op, op.seq,
                                 clock_time(match->end), state(p)));
  }
}

std::string Diagnosis::verdict() const {
  std::vector<int> roots, stuck;
  for (int r : culprits_) {
    const auto it = ranks_.find(r);
    if (it == ranks_.end() || !it->second.rec || !it->second.stuck) roots.push_back(r);
    else stuck.push_back(r);
  }
  if (!roots.empty())
    return fmt::format("verdict: {} stopped outside communication and the others wait for {} ({})",
                       ranks_phrase(roots), roots.size() == 1 ? "it" : "them", first_blame(roots));
  if (!stuck.empty())
    return fmt::format("verdict: a deadlock: {} each wait in an operation another rank never entered: the "
                       "ranks called operations in different orders (the first wait: {})", ranks_phrase(stuck),
                       first_blame(stuck));
  bool anyone_waits = false;
  for (const auto& [r, v] : ranks_) anyone_waits = anyone_waits || v.stuck;
  if (anyone_waits)
    return "verdict: every rank the waiting ranks need is inside the same operation: a rank stopped inside MPI, "
           "or the network between them failed";
  return "verdict: no rank was blocked in a communication operation when it wrote its record";
}

std::vector<std::string> Diagnosis::run(std::vector<std::string> lines) {
  lines_ = std::move(lines);
  // Ranks waiting in the same collective (the same group, by its members, number and operation)
  // are judged together.
  std::map<std::tuple<std::string, std::string, std::uint64_t, std::string>, std::vector<int>> waits;
  for (const auto& [r, v] : ranks_) {
    if (!v.stuck || v.stuck->p2p) continue;
    const auto members = v.rec->groups.find(v.stuck->group);
    const std::string instance = members == v.rec->groups.end() ? std::to_string(r) : rank_list(members->second);
    waits[{v.stuck->group, instance, v.stuck->seq, v.stuck->op}].push_back(r);
  }
  for (const auto& [key, waiters] : waits) collective_wait(*ranks_.at(waiters.front()).stuck, waiters);
  for (const auto& [r, v] : ranks_)
    if (v.stuck && v.stuck->p2p) transfer_wait(r, v);
  for (const auto& [r, v] : ranks_) {
    if (mentioned_.count(r) || !v.rec) continue;
    const RecordedOp* last = v.rec->ops.empty() ? nullptr : &v.rec->ops.back();
    lines_.push_back(fmt::format("rank {}: {}{}", r, state(v).substr(3),
                                 last ? fmt::format("; its last operation: {}, {}", describe(*last), ended(*last))
                                      : std::string()));
  }
  lines_.push_back(verdict());
  return lines_;
}

}  // namespace

std::vector<std::string> diagnose(const std::vector<FlightRecord>& records) {
  if (records.empty()) return {};
  // The newest run only: `run` is an ISO 8601 time, so the largest is the newest.
  std::string run;
  for (const auto& r : records) run = std::max(run, r.who.run);
  std::map<int, RankView> ranks;
  int size = 0, older = 0;
  for (const auto& r : records) {
    if (r.who.run != run) {
      ++older;
      continue;
    }
    size = std::max(size, r.who.ranks);
    ranks[r.who.rank] = {&r, r.waiting_on ? r.find(r.waiting_on) : nullptr};
  }
  std::vector<int> with, without;
  std::vector<std::string> reasons;
  for (int r = 0; r < size; ++r) {
    const auto it = ranks.find(r);
    if (it == ranks.end()) {
      without.push_back(r);
    } else {
      with.push_back(r);
      reasons.push_back(fmt::format("{} {}", r, it->second.rec->reason));
    }
  }
  std::string header = fmt::format("run of {} (started {} on rank 0, {} ranks): flight records of {} ({})",
                                    ranks.begin()->second.rec->who.run_dir, run, size, ranks_phrase(with),
                                    fmt::join(reasons, ", "));
  if (!without.empty())
    header += fmt::format("; none from {} (killed, or stopped before it could write one)", ranks_phrase(without));
  if (older > 0) header += fmt::format("; {} record(s) of an earlier run left out", older);
  return Diagnosis(std::move(ranks), size).run({header});
}

int doctor(const std::string& run_dir) {
  agree(MPI_COMM_WORLD, [&] {
    if (world_rank() != 0) return;
    const fs::path dir = fs::path(run_dir) / "flight";
    if (!fs::is_directory(run_dir))
      throw InputError(fmt::format("doctor: '{}' is not a directory (give a run's run.output_dir)", run_dir));
    std::vector<FlightRecord> records;
    const std::regex name(R"(rank_[0-9]+\.json)");
    std::error_code ec;
    if (fs::is_directory(dir, ec))
      for (const auto& e : fs::directory_iterator(dir, ec))
        if (std::regex_match(e.path().filename().string(), name)) records.push_back(comm::read_record(e.path().string()));
    if (records.empty())
      throw InputError(fmt::format("doctor: {} holds no flight records (rank_<N>.json); a run writes them when "
                                   "an operation times out (comm.timeout_s), on an internal error or a stop signal",
                                   dir.string()));
    for (const auto& line : diagnose(records)) std::cout << line << '\n';
    std::cout.flush();
  });
  return 0;
}

}  // namespace tessera::cli
