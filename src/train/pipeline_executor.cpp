#include "train/pipeline_executor.hpp"

#include <algorithm>
#include <limits>
#include <utility>

namespace tessera {

namespace {

// Message tags on the pipeline communicator: a training step's micro-batch m sends its
// activation with 2m and its gradient with 2m + 1; evaluation's forwards use one tag of their own.
int forward_tag(int m) { return 2 * m; }
int backward_tag(int m) { return 2 * m + 1; }
constexpr int kEvalTag = 1 << 20;

}  // namespace

PipelineExecutor::PipelineExecutor(const Config& cfg, const Communicator& comm, Model& model,
                                   StepTimer& timer, double* tensor_seconds)
    : cfg_(cfg), comm_(comm), model_(model), timer_(timer), tensor_seconds_(tensor_seconds),
      stage_(comm.rank(Group::pipeline)) {}

void PipelineExecutor::train(const ExecSpace& exec, DataParallel& dp, const MicroBatches& batches) {
  const auto ops = pipeline_schedule(cfg_.parallel.schedule, comm_.size(Group::pipeline), stage_, batches.count);
  const int bound = peak_in_flight(ops);
  std::vector<InFlight> flight(static_cast<std::size_t>(batches.count));
  int backwards = 0;
  for (const PipelineOp& op : ops) {
    InFlight& f = flight[static_cast<std::size_t>(op.micro)];
    if (op.kind == PipelineOp::Kind::forward) {
      forward(exec, batches, op.micro, forward_tag(op.micro), bound, f);
      move_comm(Phase::forward, dp);
    } else {
      backward(exec, dp, op.micro, backwards++, f);
    }
  }
  auto t = timer_.time(Phase::pipeline, exec);
  retire_slots(true);
}

void PipelineExecutor::forward_only(const ExecSpace& exec, const MicroBatches& batches) {
  for (int m = 0; m < batches.count; ++m) {
    InFlight f;
    forward(exec, batches, m, kEvalTag, std::numeric_limits<int>::max(), f);
    f.send.wait();
    model_.release(f.slot);
  }
}

MicroBatch PipelineExecutor::read(const ExecSpace& exec, const MicroBatches& batches,
                                  std::span<const std::int64_t> samples) {
  // The first stage takes the inputs, the last the labels; a stage between reads nothing.
  if (!model_.first_stage() && !model_.last_stage()) return {};
  auto t = timer_.time(Phase::data, exec);
  const auto watch = comm_.watch("dataset read", Group::data);
  return batches.read(samples);
}

void PipelineExecutor::forward(const ExecSpace& exec, const MicroBatches& batches, int m, int tag,
                               int bound, InFlight& f) {
  const auto samples = batches.samples(m);
  const MicroBatch data = read(exec, batches, samples);
  f.rows = static_cast<int>(samples.size());
  make_room(exec, bound);
  f.slot = model_.acquire(f.rows);
  // Receive the input: the data on the first stage, the previous stage's output elsewhere.
  const MatrixU<float> in = model_.input(f.slot);
  if (model_.first_stage()) {
    Kokkos::deep_copy(exec, in, data.x);
  } else {
    auto t = timer_.time(Phase::pipeline, exec);
    comm_.recv(in.data(), in.size(), stage_ - 1, tag, Group::pipeline);
  }
  {
    auto t = timer_.time(Phase::forward, exec);
    if (f.rows == 0) model_.idle_forward();  // still take part in what the layers exchange
    else model_.forward(exec, f.slot);
    if (model_.last_stage() && f.rows > 0) batches.loss(f.slot, f.rows, data);
  }
  // Send the output on.
  if (!model_.last_stage())
    f.send = comm_.isend(model_.output(f.slot).data(), model_.output(f.slot).size(), stage_ + 1, tag,
                         Group::pipeline);
}

void PipelineExecutor::backward(const ExecSpace& exec, DataParallel& dp, int m, int backwards, InFlight& f) {
  // Receive the output's gradient from the next stage (the last stage's loss wrote its own).
  if (!model_.last_stage()) {
    auto t = timer_.time(Phase::pipeline, exec);
    const MatrixU<float> g = model_.grad_output(f.slot);
    comm_.recv(g.data(), g.size(), stage_ + 1, backward_tag(m), Group::pipeline);
  }
  dp.begin_backward(exec, backwards, cfg_.parallel.micro_batches);
  {
    auto t = timer_.time(Phase::backward, exec);
    if (f.rows == 0) model_.idle_backward();
    else model_.backward(exec, f.slot);
  }
  move_comm(Phase::backward, dp);
  {
    auto t = timer_.time(Phase::allreduce, exec);
    dp.end_backward(exec);
  }
  // The slot is done once its sends are: it retires, and is released when they complete. Its
  // activation went to the next stage before that stage sent the gradient back: done.
  f.send.wait();
  Retiring r;
  r.slot = f.slot;
  if (!model_.first_stage()) {
    const MatrixU<float> g = model_.grad_input(f.slot);
    r.sends.push_back(comm_.isend(g.data(), g.size(), stage_ - 1, backward_tag(m), Group::pipeline));
  }
  retiring_.push_back(std::move(r));
}

void PipelineExecutor::make_room(const ExecSpace& exec, int bound) {
  // Keep to the schedule's bound on live activations: wait for a retired slot's sends only when
  // the new micro-batch would exceed it.
  auto t = timer_.time(Phase::pipeline, exec);
  retire_slots(false);
  while (model_.live_slots() >= bound && !retiring_.empty()) {
    for (auto& send : retiring_.front().sends) send.wait();
    retire_slots(false);
  }
}

void PipelineExecutor::retire_slots(bool wait) {
  std::erase_if(retiring_, [&](Retiring& r) {
    bool done = true;
    for (auto& send : r.sends) {
      if (wait) send.wait();
      done = send.test() && done;
    }
    if (done) model_.release(r.slot);
    return done;
  });
}

void PipelineExecutor::move_comm(Phase from, DataParallel& dp) {
  timer_.move(from, Phase::allreduce, dp.take_hook_comm_seconds());
  if (!tensor_seconds_) return;
  timer_.move(from, Phase::tensor, *tensor_seconds_);
  *tensor_seconds_ = 0.0;
}

}  // namespace tessera
