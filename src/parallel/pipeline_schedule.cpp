#include "parallel/pipeline_schedule.h"

#include <algorithm>
#include <map>

#include "core/error.h"

namespace zp::parallel {

PipelineScheduleKind schedule_kind_from(const std::string& name, const std::string& key) {
  if (name == "1f1b") return PipelineScheduleKind::OneFOneB;
  if (name == "interleaved") return PipelineScheduleKind::Interleaved;
  throw Error(detail::cat(key, " = \"", name, "\": the schedules are \"1f1b\" and \"interleaved\""));
}

const char* schedule_name(PipelineScheduleKind k) {
  return k == PipelineScheduleKind::OneFOneB ? "1f1b" : "interleaved";
}

void check_schedule(PipelineScheduleKind kind, const PipelineShape& sh) {
  ZP_REQUIRE(sh.stages >= 1, "pipeline.stages must be >= 1, got ", sh.stages);
  ZP_REQUIRE(sh.micro_batches >= 1, "gradient_accumulation_steps must be >= 1, got ", sh.micro_batches);
  if (kind == PipelineScheduleKind::OneFOneB) {
    ZP_REQUIRE(sh.virtual_stages == 1, "pipeline.virtual_stages = ", sh.virtual_stages,
               " needs pipeline.schedule = \"interleaved\" (1f1b runs one model chunk per stage)");
    // Fewer micro-batches than stages leaves a stage idle for most of the step: almost surely a mistake.
    ZP_REQUIRE(sh.micro_batches >= sh.stages, "pipeline.schedule = \"1f1b\" needs gradient_accumulation_steps (the "
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

}  // namespace

std::vector<PipeAction> stage_schedule(PipelineScheduleKind kind, const PipelineShape& sh, int stage) {
  check_schedule(kind, sh);
  ZP_CHECK(stage >= 0 && stage < sh.stages, "stage ", stage, " of ", sh.stages);
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

double theoretical_bubble(PipelineScheduleKind, const PipelineShape& sh) {
  const double P = sh.stages, M = sh.micro_batches, V = sh.virtual_stages;
  return (P - 1) / (V * M + P - 1);
}

ScheduleSimulation simulate(const std::vector<std::vector<PipeAction>>& per_stage, const PipelineShape& sh,
                            double forward, double backward) {
  const int P = sh.stages, C = sh.chunks();
  ZP_CHECK(int(per_stage.size()) == P, "simulate: ", per_stage.size(), " lists for ", P, " stages");
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
        } else {
          double own = 0;
          ok = finished(PipeOp::Forward, a.micro, c, own);  // this chunk's forward of the micro-batch
          if (ok && c + 1 < C) ok = finished(PipeOp::Backward, a.micro, c + 1, ready);
          ready = std::max(ready, own);
        }
        if (!ok) break;
        const double cost = a.op == PipeOp::Forward ? forward : backward;
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
      r.why += detail::cat("stage ", s, " waits at its ", a.op == PipeOp::Forward ? "forward" : "backward",
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
