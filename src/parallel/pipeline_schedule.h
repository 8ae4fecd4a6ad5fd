// Pipeline schedules: the order in which one pipeline stage runs the forward and backward passes of
// a step's M micro-batches, over P stages (and V model chunks per stage when interleaved).
//
// The trick is that a schedule is only a per-stage list: the data dependencies between stages (a
// chunk's forward of micro-batch m needs the previous chunk's output of m, its backward needs the
// next chunk's input gradient of m) are implied by the list and met by the transport, which posts
// every receive early and sends without waiting. So a schedule is correct when the lists, executed
// with unbounded send buffers and blocking only on a missing input, all finish: simulate() checks
// exactly that, and measures the bubble with given pass costs.
//
// Model chunks: the model's layers are cut into P * V consecutive chunks; chunk c runs on stage
// c % P, as its (c / P)-th local chunk. V = 1 is plain 1F1B: stage s holds chunk s.
//   1F1B         stage s runs min(P - s - 1, M) warm-up forwards, then alternates one forward and
//                one backward, then drains the remaining backwards (PipeDream-Flush / Megatron).
//                Bubble: (P - 1) / (M + P - 1) of the step with equal forward+backward per stage.
//   Interleaved  (Megatron's virtual pipeline) micro-batches go in groups of P through each local
//                chunk in turn; warm-up (P - s - 1) * 2 + (V - 1) * P forwards; bubble shrinks V-fold:
//                (P - 1) / (V * M + P - 1). Needs M a multiple of P.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace zp::parallel {

enum class PipelineScheduleKind { OneFOneB, Interleaved };

// "1f1b" | "interleaved"; throws zp::Error naming the key for another name.
PipelineScheduleKind schedule_kind_from(const std::string& name, const std::string& key);
const char* schedule_name(PipelineScheduleKind k);

enum class PipeOp : uint8_t { Forward, Backward };

struct PipeAction {
  PipeOp op = PipeOp::Forward;
  int micro = 0;  // micro-batch index in the step, 0..M-1
  int chunk = 0;  // local model chunk on this stage, 0..V-1
  bool operator==(const PipeAction&) const = default;
};

struct PipelineShape {
  int stages = 1;          // P
  int micro_batches = 1;   // M
  int virtual_stages = 1;  // V: model chunks per stage
  int chunks() const { return stages * virtual_stages; }
  // Global chunk index of local chunk `local` on stage `stage`.
  int global_chunk(int stage, int local) const { return local * stages + stage; }
};

// Throws zp::Error (naming pipeline.* and gradient_accumulation_steps) when `kind` cannot schedule
// `shape` (1F1B with M < P or V > 1; interleaved with V < 2 or M not a multiple of P).
void check_schedule(PipelineScheduleKind kind, const PipelineShape& shape);

// Stage `stage`'s passes for one step, in order: every (micro, chunk) once forward and once
// backward, the backward after the forward.
std::vector<PipeAction> stage_schedule(PipelineScheduleKind kind, const PipelineShape& shape, int stage);

// The forward-only order (evaluation): micro-batches in order through every local chunk.
std::vector<PipeAction> forward_schedule(const PipelineShape& shape);

// The fraction of a step's time a stage idles, in theory, with a backward costing twice a forward
// and every chunk equal: (P - 1) / (V * M + P - 1).
double theoretical_bubble(PipelineScheduleKind kind, const PipelineShape& shape);

// Runs the stages' lists against each other with per-pass costs (a forward of one chunk costs
// `forward`, a backward `backward`; transfers are free) and returns the makespan and the bubble
// (1 - busy / makespan, averaged over the stages); `deadlocked` when the lists cannot all finish.
struct ScheduleSimulation {
  bool deadlocked = false;
  double makespan = 0, bubble = 0;
  std::string why;  // for a deadlock: each stage's next pass and what it waits for
};
ScheduleSimulation simulate(const std::vector<std::vector<PipeAction>>& per_stage, const PipelineShape& shape,
                            double forward = 1.0, double backward = 2.0);

}  // namespace zp::parallel
