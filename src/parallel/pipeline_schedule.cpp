#include "parallel/pipeline_schedule.h"

#include <algorithm>
#include <map>

#include "core/error.h"

namespace zp::parallel {

PipelineScheduleKind schedule_kind_from(const std::string& name, const std::string& key) {
  if (name == "1f1b") return PipelineScheduleKind::OneFOneB;
  if (name == "interleaved") return PipelineScheduleKind::Interleaved;
  if (name == "zb-h1") return PipelineScheduleKind::ZeroBubbleH1;
  throw Error(detail::cat(key, " = \"", name, "\": the schedules are \"1f1b\", \"interleaved\" and \"zb-h1\""));
}

const char* schedule_name(PipelineScheduleKind k) {
  switch (k) {
    case PipelineScheduleKind::OneFOneB: return "1f1b";
    case PipelineScheduleKind::Interleaved: return "interleaved";
    case PipelineScheduleKind::ZeroBubbleH1: return "zb-h1";
  }
  return "?";
}

bool splits_backward(PipelineScheduleKind k) { return k == PipelineScheduleKind::ZeroBubbleH1; }

void check_schedule(PipelineScheduleKind kind, const PipelineShape& sh) {
  ZP_REQUIRE(sh.stages >= 1, "pipeline.stages must be >= 1, got ", sh.stages);
  ZP_REQUIRE(sh.micro_batches >= 1, "gradient_accumulation_steps must be >= 1, got ", sh.micro_batches);
  if (kind != PipelineScheduleKind::Interleaved) {
    const char* name = schedule_name(kind);
    ZP_REQUIRE(sh.virtual_stages == 1, "pipeline.virtual_stages = ", sh.virtual_stages,
               " needs pipeline.schedule = \"interleaved\" (", name, " runs one model chunk per stage)");
    // Fewer micro-batches than stages leaves a stage idle for most of the step: almost surely a mistake.
    ZP_REQUIRE(sh.micro_batches >= sh.stages, "pipeline.schedule = \"", name, "\" needs gradient_accumulation_steps (the "
               "micro-batches per step, ", sh.micro_batches, ") >= pipeline.stages (", sh.stages, ")");
    return;
  }
  ZP_REQUIRE(sh.stages >= 2, "pipeline.schedule = \"interleaved\" needs pipeline.stages >= 2, got ", sh.stages);
  ZP_REQUIRE(sh.virtual_stages >= 2, "pipeline.schedule = \"interleaved\" needs pipeline.virtual_stages >= 2, got ",
             sh.virtual_stages);
  ZP_REQUIRE(sh.micro_batches % sh.stages == 0, "pipeline.schedule = \"interleaved\" sends micro-batches through "
             "the stages in groups of pipeline.stages = ", sh.stages, ": gradient_accumulation_steps (",
             sh.micro_batches, ") must be a multiple of it");
}

namespace {

// The k-th forward (or backward) of an interleaved stage: groups of P micro-batches through each
// local chunk in turn; backwards walk the chunks from the last.
PipeAction interleaved_nth(const PipelineShape& sh, int k, PipeOp op) {
  const int P = sh.stages, V = sh.virtual_stages;
  const int group = k / (P * V), within = k % (P * V);
  int chunk = within / P;
  if (op == PipeOp::Backward) chunk = V - 1 - chunk;
  return {op, group * P + within % P, chunk};
}

// ZB-H1 (see the header): 1F1B's order of F and B; each B may leave its W pending, and a W runs as
// soon as more than `stage` are pending; the rest after the last B.
std::vector<PipeAction> zero_bubble_h1(const PipelineShape& sh, int stage) {
  const int P = sh.stages, M = sh.micro_batches, lag = stage;
  std::vector<PipeAction> out;
  out.reserve(size_t(3 * M));
  int f = 0, b = 0, w = 0;
  auto backward = [&] {
    out.push_back({PipeOp::Backward, b++, 0});
    if (b - w > lag) out.push_back({PipeOp::BackwardWeight, w++, 0});
  };
  for (; f < std::min(P - stage - 1, M); ++f) out.push_back({PipeOp::Forward, f, 0});
  while (f < M) {
    out.push_back({PipeOp::Forward, f++, 0});
    backward();
  }
  while (b < M) backward();
  while (w < M) out.push_back({PipeOp::BackwardWeight, w++, 0});
  return out;
}

}  // namespace

std::vector<PipeAction> stage_schedule(PipelineScheduleKind kind, const PipelineShape& sh, int stage) {
  check_schedule(kind, sh);
  ZP_CHECK(stage >= 0 && stage < sh.stages, "stage ", stage, " of ", sh.stages);
  if (kind == PipelineScheduleKind::ZeroBubbleH1) return zero_bubble_h1(sh, stage);
  const int P = sh.stages, M = sh.micro_batches, V = sh.virtual_stages, total = M * V;
  auto fwd = [&](int k) {
    return kind == PipelineScheduleKind::OneFOneB ? PipeAction{PipeOp::Forward, k, 0}
                                                  : interleaved_nth(sh, k, PipeOp::Forward);
  };
  auto bwd = [&](int k) {
    return kind == PipelineScheduleKind::OneFOneB ? PipeAction{PipeOp::Backward, k, 0}
                                                  : interleaved_nth(sh, k, PipeOp::Backward);
  };
  const int warmup = kind == PipelineScheduleKind::OneFOneB ? std::min(P - stage - 1, M)
                                                            : std::min((P - stage - 1) * 2 + (V - 1) * P, total);
  std::vector<PipeAction> out;
  out.reserve(size_t(2 * total));
  int f = 0, b = 0;
  for (; f < warmup; ++f) out.push_back(fwd(f));
  while (f < total) {
    out.push_back(fwd(f++));
    out.push_back(bwd(b++));
  }
  while (b < total) out.push_back(bwd(b++));
  return out;
}

std::vector<PipeAction> forward_schedule(const PipelineShape& sh) {
  std::vector<PipeAction> out;
  for (int c = 0; c < sh.virtual_stages; ++c)
    for (int m = 0; m < sh.micro_batches; ++m) out.push_back({PipeOp::Forward, m, c});
  return out;
}

double peak_in_flight_bytes(const std::vector<PipeAction>& list, const std::vector<double>& chunk_bytes) {
  // Each (micro, chunk)'s last pass in the list frees its bytes.
  std::map<std::pair<int, int>, size_t> last;
  for (size_t i = 0; i < list.size(); ++i)
    if (list[i].op != PipeOp::Forward) last[{list[i].micro, list[i].chunk}] = i;
  double held = 0, peak = 0;
  for (size_t i = 0; i < list.size(); ++i) {
    const PipeAction& a = list[i];
    ZP_CHECK(a.chunk >= 0 && size_t(a.chunk) < chunk_bytes.size(), "pipeline pass of local chunk ", a.chunk, " of ",
             chunk_bytes.size());
    if (a.op == PipeOp::Forward) peak = std::max(peak, held += chunk_bytes[size_t(a.chunk)]);
    else if (last.at({a.micro, a.chunk}) == i) held -= chunk_bytes[size_t(a.chunk)];
  }
  return peak;
}

double theoretical_bubble(PipelineScheduleKind kind, const PipelineShape& sh) {
  const double P = sh.stages, M = sh.micro_batches, V = sh.virtual_stages;
  // ZB-H1: each stage idles (P - 1)(F + B - W) = P - 1 of its 3 M + P - 1 pass times.
  if (kind == PipelineScheduleKind::ZeroBubbleH1) return (P - 1) / (3 * M + P - 1);
  return (P - 1) / (V * M + P - 1);
}

ScheduleSimulation simulate(const std::vector<std::vector<PipeAction>>& per_stage, const PipelineShape& sh,
                            double forward, double backward) {
  return simulate(per_stage, sh, PassCosts{forward, backward / 2, backward / 2});
}

ScheduleSimulation simulate(const std::vector<std::vector<PipeAction>>& per_stage, const PipelineShape& sh,
                            const PassCosts& costs) {
  const int P = sh.stages, C = sh.chunks();
  ZP_CHECK(int(per_stage.size()) == P, "simulate: ", per_stage.size(), " lists for ", P, " stages");
  bool split = false;
  for (const auto& list : per_stage)
    for (const PipeAction& a : list) split = split || a.op == PipeOp::BackwardWeight;
  const double backward = split ? costs.backward_input : costs.backward_input + costs.backward_weight;
  // Finish time of each pass, keyed (op, micro, global chunk).
  std::map<std::tuple<int, int, int>, double> done;
  std::vector<size_t> next(size_t(P), 0);
  std::vector<double> free_at(size_t(P), 0), busy(size_t(P), 0);
  auto finished = [&](PipeOp op, int m, int c, double& t) {
    auto it = done.find({int(op), m, c});
    if (it == done.end()) return false;
    t = it->second;
    return true;
  };
  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < P; ++s) {
      while (next[size_t(s)] < per_stage[size_t(s)].size()) {
        const PipeAction a = per_stage[size_t(s)][next[size_t(s)]];
        const int c = sh.global_chunk(s, a.chunk);
        double ready = 0;
        bool ok = true;
        if (a.op == PipeOp::Forward) {
          if (c > 0) ok = finished(PipeOp::Forward, a.micro, c - 1, ready);
        } else if (a.op == PipeOp::BackwardWeight) {
          ok = finished(PipeOp::Backward, a.micro, c, ready);  // its own B computed the output gradients
        } else {
          double own = 0;
          ok = finished(PipeOp::Forward, a.micro, c, own);  // this chunk's forward of the micro-batch
          if (ok && c + 1 < C) ok = finished(PipeOp::Backward, a.micro, c + 1, ready);
          ready = std::max(ready, own);
        }
        if (!ok) break;
        const double cost = a.op == PipeOp::Forward          ? costs.forward
                            : a.op == PipeOp::BackwardWeight ? costs.backward_weight
                                                             : backward;
        const double start = std::max(ready, free_at[size_t(s)]);
        free_at[size_t(s)] = start + cost;
        busy[size_t(s)] += cost;
        done[{int(a.op), a.micro, c}] = start + cost;
        ++next[size_t(s)];
        progress = true;
      }
    }
  }
  ScheduleSimulation r;
  for (int s = 0; s < P; ++s) {
    r.makespan = std::max(r.makespan, free_at[size_t(s)]);
    if (next[size_t(s)] < per_stage[size_t(s)].size()) {
      const PipeAction a = per_stage[size_t(s)][next[size_t(s)]];
      r.deadlocked = true;
      const char* pass = a.op == PipeOp::Forward ? "forward" : a.op == PipeOp::Backward ? "backward" : "weight backward";
      r.why += detail::cat("stage ", s, " waits at its ", pass,
                           " of micro-batch ", a.micro, " chunk ", a.chunk, "; ");
    }
  }
  if (r.deadlocked || r.makespan <= 0) return r;
  double idle = 0;
  for (int s = 0; s < P; ++s) idle += 1.0 - busy[size_t(s)] / r.makespan;
  r.bubble = idle / P;
  return r;
}

}  // namespace zp::parallel
