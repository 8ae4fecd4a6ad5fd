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
//   ZB-H1        (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, the schedule with 1F1B's
//                peak activation memory) splits each backward into B, the input gradient (on the
//                critical path: the stage before waits for it), and W, the weight gradients (which
//                nothing waits for). Stage s runs 1F1B's warm-up forwards and then alternates F and
//                B, but keeps up to s W passes pending and runs each W once more than s are pending:
//                the last stage lets P - 1 pile up and runs them after its last B, where 1F1B idles
//                waiting for the backwards to travel down; stage 0 runs each W right after its B.
//                In flight on stage s: at most P - s micro-batches between F and B (as 1F1B) plus s
//                between B and W (each holding only what W needs): every stage P, as the paper asks,
//                so none holds more than stage 0 of 1F1B does. The paper's bubble is
//                (P - 1)(T_F + T_B - T_W) per stage, its "bubble rate" (over the compute) (P - 1) / 3M
//                with T_F = T_B = T_W, against 1F1B's (P - 1) / M; as a fraction of the step, as here,
//                (P - 1) / (3 M + P - 1) against (P - 1) / (M + P - 1). Needs M >= P and one chunk
//                per stage.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace zp::parallel {

enum class PipelineScheduleKind { OneFOneB, Interleaved, ZeroBubbleH1 };

// "1f1b" | "interleaved" | "zb-h1"; throws zp::Error naming the key for another name.
PipelineScheduleKind schedule_kind_from(const std::string& name, const std::string& key);
const char* schedule_name(PipelineScheduleKind k);

// Backward is the whole backward of a (micro, chunk) in 1F1B and interleaved, and only its input
// gradient (B) in ZB-H1, whose BackwardWeight pass (W) then computes the deferred weight gradients.
enum class PipeOp : uint8_t { Forward, Backward, BackwardWeight };

// Whether a schedule's lists carry BackwardWeight passes (the model splits its backward).
bool splits_backward(PipelineScheduleKind k);

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
// backward, the backward after the forward; ZB-H1 also once BackwardWeight, after the backward.
std::vector<PipeAction> stage_schedule(PipelineScheduleKind kind, const PipelineShape& shape, int stage);

// The forward-only order (evaluation): micro-batches in order through every local chunk.
std::vector<PipeAction> forward_schedule(const PipelineShape& shape);

// The most activation bytes a stage's list holds at once: a (micro, chunk) holds chunk_bytes[chunk]
// from its Forward until its last pass (its Backward, or with ZB-H1 its BackwardWeight: what W
// needs, each linear's input and output gradient, is counted as the whole, a bound). 1F1B: P - s
// micro-batches on stage s; ZB-H1: P on every stage; interleaved: its longer warm-up's chunks.
double peak_in_flight_bytes(const std::vector<PipeAction>& list, const std::vector<double>& chunk_bytes);

// The fraction of a step's time a stage idles, in theory, with a backward costing twice a forward
// (ZB-H1: B and W each as much as F) and every chunk equal: (P - 1) / (V * M + P - 1), ZB-H1
// (P - 1) / (3 M + P - 1).
double theoretical_bubble(PipelineScheduleKind kind, const PipelineShape& shape);

// Runs the stages' lists against each other with per-pass costs (transfers are free) and returns
// the makespan and the bubble (1 - busy / makespan, averaged over the stages); `deadlocked` when
// the lists cannot all finish. A forward of one chunk costs `forward`; in lists without
// BackwardWeight passes a Backward is the whole backward (backward_input + backward_weight), in
// lists with them it is B alone and each BackwardWeight costs backward_weight.
struct PassCosts {
  double forward = 1, backward_input = 1, backward_weight = 1;  // the ZB paper's F = B = W
};
struct ScheduleSimulation {
  bool deadlocked = false;
  double makespan = 0, bubble = 0;
  std::string why;  // for a deadlock: each stage's next pass and what it waits for
};
ScheduleSimulation simulate(const std::vector<std::vector<PipeAction>>& per_stage, const PipelineShape& shape,
                            const PassCosts& costs);
// The whole backward costing `backward`, split evenly between B and W where the lists split it.
ScheduleSimulation simulate(const std::vector<std::vector<PipeAction>>& per_stage, const PipelineShape& shape,
                            double forward = 1.0, double backward = 2.0);

}  // namespace zp::parallel
