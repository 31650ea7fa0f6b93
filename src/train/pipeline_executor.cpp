#include "train/pipeline_executor.hpp"

#include <algorithm>
#include <limits>
#include <utility>

namespace tessera {

namespace {

constexpr int kEvalTag = 1 << 20;

}  // namespace

PipelineExecutor::PipelineExecutor(const Config& cfg, const Communicator& comm, Model& model,
                                   StepTimer& timer, double* tensor_seconds)
    : cfg_(cfg), comm_(comm), model_(model), timer_(timer), tensor_seconds_(tensor_seconds),
      stage_(comm.rank(Group::pipeline)), stages_(comm.size(Group::pipeline)) {}

int PipelineExecutor::tag(const PipelineOp& op, bool into_chunk, bool gradient) const {
  // Name a message by its micro-batch and the chunk of the stage nearer the model's input: the
  // activation out of chunk c of a stage and the gradient back into it carry
  // 2 (m v + c) and 2 (m v + c) + 1 (v = 1: 2m and 2m + 1); evaluation's activations kEvalTag + c.
  // A chunk's input comes from chunk c of the stage before, or on the first stage from chunk
  // c - 1 of the last.
  const int c = into_chunk && stage_ == 0 ? op.chunk - 1 : op.chunk;
  if (op.micro < 0) return kEvalTag + c;
  return 2 * (op.micro * model_.chunks() + c) + (gradient ? 1 : 0);
}

void PipelineExecutor::train(const ExecSpace& exec, GradientExchange& exchange, const MicroBatches& batches) {
  const int chunks = model_.chunks();
  const auto ops = pipeline_schedule(cfg_.parallel.schedule, stages_, stage_, batches.count, chunks);
  const int bound = slot_bound(ops, chunks);
  std::vector<InFlight> flight(static_cast<std::size_t>(batches.count * chunks));
  std::vector<int> backwards(static_cast<std::size_t>(chunks), 0);  // per chunk, so far this step
  for (const PipelineOp& op : ops) {
    InFlight& f = flight[static_cast<std::size_t>(op.micro * chunks + op.chunk)];
    if (op.kind == PipelineOp::Kind::forward) {
      forward(exec, batches, op, bound, f);
      move_comm(Phase::forward, exchange);
    } else {
      backward(exec, exchange, op, backwards[static_cast<std::size_t>(op.chunk)]++, batches.count, f);
    }
  }
  auto t = timer_.time(Phase::pipeline, exec);
  retire_slots(true);
}

void PipelineExecutor::forward_only(const ExecSpace& exec, const MicroBatches& batches) {
  for (int m = 0; m < batches.count; ++m)
    for (int c = 0; c < model_.chunks(); ++c) {
      InFlight f;
      forward(exec, batches, {PipelineOp::Kind::forward, m, c}, std::numeric_limits<int>::max(), f, true);
      f.send.wait();
      model_.release(c, f.slot);
    }
}

MicroBatch PipelineExecutor::read(const ExecSpace& exec, const MicroBatches& batches, int chunk,
                                  std::span<const std::int64_t> samples) {
  // The model's first chunk takes the inputs, its last the labels; the others read nothing.
  if (!model_.first_chunk(chunk) && !model_.last_chunk(chunk)) return {};
  auto t = timer_.time(Phase::data, exec);
  const auto watch = comm_.watch("dataset read", Group::data);
  return batches.read(samples);
}

void PipelineExecutor::forward(const ExecSpace& exec, const MicroBatches& batches, const PipelineOp& op,
                               int bound, InFlight& f, bool eval) {
  const int c = op.chunk;
  const PipelineOp named{op.kind, eval ? -1 : op.micro, c};
  const auto samples = batches.samples(op.micro);
  const MicroBatch data = read(exec, batches, c, samples);
  f.rows = static_cast<int>(samples.size());
  make_room(exec, bound);
  f.slot = model_.acquire(c, f.rows);
  // Receive the input: the data on the model's first chunk, the previous chunk's output elsewhere.
  const MatrixU<float> in = model_.input(c, f.slot);
  if (model_.first_chunk(c)) {
    Kokkos::deep_copy(exec, in, data.x);
  } else {
    auto t = timer_.time(Phase::pipeline, exec);
    comm_.recv(in.data(), in.size(), previous_stage(), tag(named, true, false), Group::pipeline);
  }
  {
    auto t = timer_.time(Phase::forward, exec);
    if (f.rows == 0) model_.idle_forward(c);  // still take part in what the layers exchange
    else model_.forward(exec, c, f.slot);
    if (model_.last_chunk(c) && f.rows > 0) batches.loss(f.slot, f.rows, data);
  }
  // Send the output on.
  if (!model_.last_chunk(c)) {
    const MatrixU<float> out = model_.output(c, f.slot);
    f.send = comm_.isend(out.data(), out.size(), next_stage(), tag(named, false, false), Group::pipeline);
  }
}

void PipelineExecutor::backward(const ExecSpace& exec, GradientExchange& exchange, const PipelineOp& op, int k, int count,
                                InFlight& f) {
  const int c = op.chunk;
  // Receive the output's gradient from the next chunk (the model's last chunk: its loss wrote it).
  if (!model_.last_chunk(c)) {
    auto t = timer_.time(Phase::pipeline, exec);
    const MatrixU<float> g = model_.grad_output(c, f.slot);
    comm_.recv(g.data(), g.size(), next_stage(), tag(op, false, true), Group::pipeline);
  }
  // The chunk's k-th backward of count: its last completes the gradients of its own buckets.
  exchange.begin_backward(exec, k, count);
  {
    auto t = timer_.time(Phase::backward, exec);
    if (f.rows == 0) model_.idle_backward(c);
    else model_.backward(exec, c, f.slot);
  }
  move_comm(Phase::backward, exchange);
  {
    auto t = timer_.time(Phase::allreduce, exec);
    exchange.end_backward(exec);
  }
  // The slot is done once its sends are: it retires, and is released when they complete. Its
  // activation went to the next chunk before that chunk sent the gradient back: done.
  f.send.wait();
  Retiring r;
  r.chunk = c;
  r.slot = f.slot;
  if (!model_.first_chunk(c)) {
    const MatrixU<float> g = model_.grad_input(c, f.slot);
    r.sends.push_back(comm_.isend(g.data(), g.size(), previous_stage(), tag(op, true, true), Group::pipeline));
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
    if (done) model_.release(r.chunk, r.slot);
    return done;
  });
}

void PipelineExecutor::move_comm(Phase from, GradientExchange& exchange) {
  timer_.move(from, Phase::allreduce, exchange.take_hook_comm_seconds());
  if (!tensor_seconds_) return;
  timer_.move(from, Phase::tensor, *tensor_seconds_);
  *tensor_seconds_ = 0.0;
}

}  // namespace tessera
