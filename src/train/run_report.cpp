#include "train/run_report.hpp"

#include <algorithm>
#include <string>
#include <vector>

#include "core/deck.hpp"

namespace tessera {

RunReport::RunReport() : run_start_(StepTimer::now()) {}

void RunReport::begin_loop(std::int64_t step) {
  last_logged_step_ = loop_start_step_ = step;
  loop_start_ = StepTimer::now();
}

RunReport::StepMark RunReport::begin_step(const Communicator& comm,
                                          const std::optional<nn::HaloStats>& neighbours) const {
  StepMark mark;
  mark.start = StepTimer::now();
  if (neighbours) mark.halo = *neighbours;
  mark.comm = comm.counters();
  return mark;
}

void RunReport::end_step(const StepMark& mark, const Communicator& comm,
                         const std::optional<nn::HaloStats>& neighbours, std::int64_t samples) {
  const CommCounters after = comm.counters();
  for (std::size_t g = 0; g < after.groups.size(); ++g) {
    comm_bytes_[g][0] += static_cast<double>(after.groups[g].total() - mark.comm.groups[g].total());
    comm_bytes_[g][1] += static_cast<double>(after.groups[g].to_other_nodes - mark.comm.groups[g].to_other_nodes);
  }
  ++comm_steps_;
  const double dt = StepTimer::now() - mark.start;
  if (neighbours) {
    halo_ += *neighbours - mark.halo;
    ++halo_steps_;
  }
  step_seconds_ += dt;
  interval_step_seconds_ += dt;
  interval_samples_ += samples;
  samples_timed_ += samples;
}

RunReport::Interval RunReport::take_interval(std::int64_t step, std::int64_t total_steps) {
  const double now = StepTimer::now();
  Interval out;
  out.samples_per_s = static_cast<double>(interval_samples_) / std::max(1e-12, interval_step_seconds_);
  // The ETA counts the time between steps too (evaluations, checkpoints), spread over the steps.
  out.eta_s = eta_seconds({.step = step,
                           .total_steps = total_steps,
                           .last_logged_step = last_logged_step_,
                           .loop_start_step = loop_start_step_,
                           .interval_step_s = interval_step_seconds_,
                           .loop_s = now - loop_start_,
                           .loop_step_s = step_seconds_});
  MetricsRow& row = out.row;
  row.samples_per_s = out.samples_per_s;
  row.wall_s = now - run_start_;
  const double n = static_cast<double>(std::max<std::int64_t>(1, step - last_logged_step_));
  row.t_data = timer_.seconds(Phase::data) / n;
  row.t_forward = timer_.seconds(Phase::forward) / n;
  row.t_backward = timer_.seconds(Phase::backward) / n;
  row.t_allreduce = timer_.seconds(Phase::allreduce) / n;
  row.t_optimizer = timer_.seconds(Phase::optimizer) / n;
  row.t_tensor = timer_.seconds(Phase::tensor) / n;
  row.t_pipeline = timer_.seconds(Phase::pipeline) / n;
  pipeline_seconds_ += timer_.seconds(Phase::pipeline);
  timer_.reset();
  interval_samples_ = 0;
  interval_step_seconds_ = 0.0;
  last_logged_step_ = step;
  return out;
}

double RunReport::wall_seconds() const { return StepTimer::now() - run_start_; }

void RunReport::add_to_summary(nlohmann::json& j, const Config& cfg, const Communicator& comm,
                               const char* neighbours, std::int64_t tokens_per_sample) const {
  if (neighbours != nullptr && halo_steps_ > 0) {
    // Per training step of this run (evaluation's forwards excluded), this rank's view. A ring's
    // exchanges are its messages sent.
    const auto per_step = [&](double v) { return v / static_cast<double>(halo_steps_); };
    nlohmann::json& n = j[neighbours];
    n = {{"exchanges_per_step", per_step(static_cast<double>(halo_.exchanges))},
         {"bytes_per_step", per_step(static_cast<double>(halo_.bytes_sent))},
         {"wait_s_per_step", per_step(halo_.wait_seconds)},
         {"rank", comm.rank()}};
    if (std::string(neighbours) == "halo") n["overlap"] = cfg.parallel.halo_overlap;
    else n["form"] = cfg.model.window > 0 ? "window halo" : "ring";
  }
  {
    // The bytes every rank handed to each group's communication per training step of this run
    // (the communicator's counters, comm/communicator.hpp CommBytes), summed over the ranks, and
    // the part the senders know went to another node (our own algorithms and sends only).
    std::vector<double> bytes;
    for (const auto& g : comm_bytes_) bytes.insert(bytes.end(), g.begin(), g.end());
    comm.allreduce_sum(bytes.data(), bytes.size(), Group::world);
    const double steps = std::max<double>(1.0, static_cast<double>(comm_steps_));
    nlohmann::json by_group, total = 0.0, other = 0.0;
    for (std::size_t g = 0; g < comm_bytes_.size(); ++g) {
      if (bytes[2 * g] == 0.0) continue;
      by_group[group_name(static_cast<Group>(g))] = bytes[2 * g] / steps;
      total = total.get<double>() + bytes[2 * g] / steps;
      other = other.get<double>() + bytes[2 * g + 1] / steps;
    }
    j["comm"] = {{"bytes_per_step", total}, {"bytes_per_step_by_group", by_group},
                 {"bytes_to_other_nodes_per_step", other},
                 {"allreduce", std::string(to_string(cfg.comm.allreduce))},
                 {"reduce_dtype", std::string(to_string(cfg.comm.reduce_dtype))}};
  }
  j["samples_per_s"] = step_seconds_ > 0 ? static_cast<double>(samples_timed_) / step_seconds_ : 0.0;
  if (tokens_per_sample > 0)
    j["tokens_per_s"] = j["samples_per_s"].get<double>() * static_cast<double>(tokens_per_sample);
  j["wall_s"] = wall_seconds();
  // Each stage's bubble: the share of its training steps it spent waiting in pipeline receives
  // and sends (Phase::pipeline), the most of its ranks.
  std::vector<double> bubble(static_cast<std::size_t>(comm.pp()), 0.0);
  bubble[static_cast<std::size_t>(comm.coord().pipeline)] = step_seconds_ > 0 ? pipeline_seconds_ / step_seconds_ : 0.0;
  comm.allreduce_max(bubble.data(), bubble.size(), Group::world);
  j["bubble_by_stage"] = bubble;
}

}  // namespace tessera
