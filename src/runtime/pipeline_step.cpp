#include "runtime/pipeline_step.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"
#include "core/log.h"

namespace zp::runtime {

using comm::PipeChannel;
using parallel::PipeAction;
using parallel::PipeOp;

namespace {

constexpr int kMaxTag = comm::StageLink::kMaxTag;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

Tensor PipelineStageModel::backward_input(int, int, Tensor) {
  throw Error("pipeline.schedule = \"zb-h1\": this model cannot split its backward into input and weight gradients");
}

void PipelineStageModel::backward_weight(int, int) {
  throw Error("pipeline.schedule = \"zb-h1\": this model cannot split its backward into input and weight gradients");
}

PipelineStep::PipelineStep(parallel::PipelineScheduleKind kind, parallel::PipelineShape shape, int stage,
                           comm::StageLink& link, parallel::ZeroEngine& engine, PipelineStageModel& model,
                           StreamHandle s)
    : kind_(kind), shape_(shape), stage_(stage), link_(link), engine_(engine), model_(model), s_(s) {
  ZP_REQUIRE(int64_t(shape.micro_batches) * shape.chunks() < kMaxTag, "gradient_accumulation_steps ",
             shape.micro_batches, " x ", shape.chunks(), " model chunks is too many pipeline messages per step (at most ",
             kMaxTag - 1, ")");
  train_passes_ = parallel::stage_schedule(kind, shape, stage);
  received_.assign(train_passes_.size(), 0);
  if (s_)
    for (size_t i = 0; i < 2 * train_passes_.size(); ++i) pass_events_.push_back(std::make_unique<Event>());
}

StageTimes PipelineStep::last_times() {
  if (timed_) {  // the device's view: busy = the passes' event-timed durations
    pass_events_.back()->synchronize();
    times_.busy = 0;
    times_.recv_gaps = times_.other_gaps = 0;
    for (size_t i = 0; i < pass_events_.size(); i += 2) {
      times_.busy += pass_events_[i + 1]->elapsed_ms_since(*pass_events_[i]) / 1e3;
      if (i == 0) continue;
      const double gap = std::max(0.f, pass_events_[i]->elapsed_ms_since(*pass_events_[i - 1])) / 1e3;
      (received_[i / 2] ? times_.recv_gaps : times_.other_gaps) += gap;
    }
    times_.span = pass_events_.back()->elapsed_ms_since(*pass_events_.front()) / 1e3;
    timed_ = false;
  }
  return times_;
}

double PipelineStep::train(int64_t step, const std::vector<int64_t>& firsts, float loss_scale) {
  ZP_CHECK(int(firsts.size()) == shape_.micro_batches, "PipelineStep::train: ", firsts.size(), " micro-batches for ",
           shape_.micro_batches);
  const double sum = run(train_passes_, step, firsts, true, loss_scale);
  timed_ = s_ != nullptr;
  return sum / double(firsts.size());
}

double PipelineStep::validate(const std::vector<int64_t>& firsts) {
  // Groups of micro-batches small enough that their tags stay in range.
  const size_t group = size_t(std::max(1, (kMaxTag - 1) / shape_.chunks()));
  const StageTimes trained = times_;
  double sum = 0;
  for (size_t b = 0; b < firsts.size(); b += group) {
    const std::vector<int64_t> part(firsts.begin() + long(b), firsts.begin() + long(std::min(firsts.size(), b + group)));
    parallel::PipelineShape sh = shape_;
    sh.micro_batches = int(part.size());
    sum += run(parallel::forward_schedule(sh), 0, part, false, 1.f);
  }
  times_ = trained;  // run() timed the validation; the pass events (GPU) are still the training step's
  return firsts.empty() ? 0.0 : sum / double(firsts.size());
}

double PipelineStep::run(const std::vector<PipeAction>& passes, int64_t step, const std::vector<int64_t>& firsts,
                         bool train, float loss_scale) {
  const int P = shape_.stages, C = shape_.chunks(), M = int(firsts.size());
  const int prev = (stage_ + P - 1) % P, next = (stage_ + 1) % P;
  const bool split = parallel::splits_backward(kind_);
  auto global = [&](const PipeAction& a) { return shape_.global_chunk(stage_, a.chunk); };
  // Posts the receive pass k needs, if any: a forward's input from the previous chunk (the cut before
  // chunk g), a backward's output gradient from the next (the cut before chunk g + 1).
  auto post = [&](size_t k) {
    if (k >= passes.size()) return;
    const PipeAction& a = passes[k];
    const int g = global(a);
    if (a.op == PipeOp::Forward && g > 0)
      link_.post_recv(PipeChannel::Activations, model_.boundary_buffer(g), prev, a.micro * C + g);
    else if (a.op == PipeOp::Backward && g + 1 < C)
      link_.post_recv(PipeChannel::Gradients, model_.boundary_buffer(g + 1), next, a.micro * C + g);
  };
  times_ = StageTimes();
  link_.take_wait_seconds();
  link_.take_busy_ms();
  const bool events = train && s_;  // time the passes on the device
  const auto start = std::chrono::steady_clock::now();
  double busy = 0;
  post(0);
  for (size_t k = 0; k < passes.size(); ++k) {
    post(k + 1);
    const PipeAction& a = passes[k];
    const int g = global(a);
    Tensor in;
    if (a.op == PipeOp::Forward && g > 0) in = link_.wait_recv(PipeChannel::Activations, a.micro * C + g);
    if (a.op == PipeOp::Backward && g + 1 < C) in = link_.wait_recv(PipeChannel::Gradients, a.micro * C + g);
    if (events) received_[k] = in.defined();
    // A chunk's last backward of the step completes its blocks' gradients (stages 0/1 reduce them
    // as each block finishes; the other chunks' blocks go on accumulating). Split (ZB-H1), it is the
    // chunk's last weight pass: the micro-batches' weight passes run in order, and a B leaves most
    // gradients to its W (what B computes into blocks W never touches, the head's and embedding's,
    // is reduced by the engine's finish()).
    if (a.op == PipeOp::Backward) engine_.begin_micro_step(!split && a.micro == M - 1);
    if (a.op == PipeOp::BackwardWeight) engine_.begin_micro_step(a.micro == M - 1);
    if (comm::pipeline_trace_enabled())
      ZP_LOG_INFO_ALL("pipeline trace: step ", step, " pass ", k + 1, "/", passes.size(), ": ",
                      a.op == PipeOp::Forward ? "F" : a.op == PipeOp::BackwardWeight ? "W" : split ? "B (input)" : "B",
                      " of micro-batch ", a.micro, ", chunk ", g);
    if (events) pass_events_[2 * k]->record(s_);
    const auto t0 = std::chrono::steady_clock::now();
    Tensor out;
    if (a.op == PipeOp::Forward)
      out = model_.forward(a.chunk, a.micro, step, firsts[size_t(a.micro)], std::move(in), train, loss_scale);
    else if (a.op == PipeOp::BackwardWeight)
      model_.backward_weight(a.chunk, a.micro);
    else if (split)
      out = model_.backward_input(a.chunk, a.micro, std::move(in));
    else
      out = model_.backward(a.chunk, a.micro, std::move(in));
    busy += seconds_since(t0);
    if (events) pass_events_[2 * k + 1]->record(s_);
    if (a.op == PipeOp::Forward && g + 1 < C)
      link_.send(PipeChannel::Activations, std::move(out), next, a.micro * C + g + 1);
    if (a.op == PipeOp::Backward && g > 0)
      link_.send(PipeChannel::Gradients, std::move(out), prev, a.micro * C + g - 1);
  }
  link_.finish();
  times_.busy = busy;
  times_.span = seconds_since(start);
  times_.waiting = link_.take_wait_seconds();
  times_.link_busy = link_.take_busy_ms() / 1e3;
  double loss = 0;
  if (last_stage())
    for (int m = 0; m < M; ++m) loss += model_.loss(m);
  return loss;
}

}  // namespace zp::runtime
