// What a training loop reports after each step, the same for every model: the progress line on
// rank 0 (loss, lr, grad norm, throughput, MFU, peak memory, step time, skipped steps, validation)
// and one JSON line per step and rank in training.metrics_file ("{rank}" is replaced by the rank;
// without it, ranks other than 0 append ".<rank>"), and with csv_monitor DeepSpeed's CSV files.
#pragma once
#include <cstdint>
#include <fstream>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/device.h"
#include "runtime/csv_monitor.h"

namespace zp::runtime {

class StepReporter {
 public:
  // `unit` names what a step processes ("tok" or "samples"); `flops_per_item` is one item's training
  // FLOPs, for MFU against the device's dense bf16 peak (none on the CPU). `append` continues an
  // existing metrics file (a resumed run).
  StepReporter(const std::string& metrics_file, int rank, int world, Device dev, const std::string& unit,
               int64_t items_per_step, double flops_per_item, int64_t max_steps, int64_t print_every, bool append);

  // A pipeline stage's step (issue 12), for the next report(): its busy, idle and link-wait time,
  // its bubble (idle share of the step window: the longest stage span), the mean bubble over all
  // stages (rank 0's progress line shows it) and the theory's; the device's idle time between passes
  // before those that consumed a receive and before the others (StageTimes::recv_gaps, other_gaps).
  struct PipelineTimes {
    int stage = 0;
    double busy_ms = 0, window_ms = 0, wait_ms = 0, bubble = 0, mean_bubble = 0, theory = 0;
    double recv_gap_ms = 0, other_gap_ms = 0;
  };
  void set_pipeline(const PipelineTimes& t) { pipeline_ = t; }
  // csv_monitor (rank 0 only): DeepSpeed's Train/Samples/train_loss and lr after every step, and
  // loss_scale with fp16 loss scaling; `samples_per_step` is the global batch.
  void set_csv_monitor(const std::string& dir, int64_t samples_per_step, bool loss_scaling);

  // Where the step's time went on this rank, for the next report(): the host's reading of batches,
  // the forward-and-backward phase and the update phase (on the compute stream on a GPU, waits for
  // communication included; on the host clock on a CPU), and the busy time of the communication
  // (mostly hidden behind compute when it overlaps). `show` puts it in rank 0's progress line
  // (wall_clock_breakdown); the metrics JSONL always has it.
  // The forward-and-backward phase splits into forward_ms (the training micro-batches' forwards and
  // objectives, TrainingTask::take_forward_ms) and backward_ms, the rest of the phase, so the two add
  // up to it; NaN where not measured (a pipeline stage's schedule). The communication's busy time
  // splits by kind (comm_busy_by_kind_ms, adding up to comm_busy_ms): the collectives, and in a
  // pipelined run the stage link's point-to-point traffic, "send_recv" (comm::StageLink::take_busy_ms).
  // exposed_comm_ms is how long compute waited for the collectives (parallel::CommTimes says how it
  // is measured); a stage's waits for the link are the pipeline's recv_wait_ms and bubble instead.
  struct Breakdown {
    double data_ms = 0, forward_backward_ms = 0, optimizer_ms = 0, comm_busy_ms = 0;
    double forward_ms = std::numeric_limits<double>::quiet_NaN(), backward_ms = std::numeric_limits<double>::quiet_NaN();
    double exposed_comm_ms = 0;
    std::vector<std::pair<std::string, double>> comm_busy_by_kind_ms;  // ("all_reduce", ms), ...
  };
  void set_breakdown(const Breakdown& b) { breakdown_ = b; }
  // The items the next step really processes when some of its items_per_step are padding
  // (instruction rows' padding tokens): its throughput, MFU and the summary count these, and the
  // metrics keep the padded count beside them ("padded_tokens", "padded_tokens_per_s"). Until
  // called, every item is real.
  void set_step_items(int64_t items) { step_items_ = items; }
  void show_breakdown(bool on) { show_breakdown_ = on; }
  // Event lines in the metrics JSONL, for `zeropipe report`: the run's start (its configuration, the
  // start-up banner's lines and the world size) and every checkpoint saved (seconds, bytes, GB/s).
  // `rank_line` is this rank's start line (rank_start_line).
  void start_event(const nlohmann::json& config, const std::vector<std::string>& banner,
                   const std::string& rank_line = "");
  void checkpoint_event(int64_t step, const std::string& path, double seconds, int64_t bytes);
  // The resumed checkpoint's load ("checkpoint_load": the step it resumes at, seconds, bytes, GB/s).
  void checkpoint_load_event(int64_t step, const std::string& path, double seconds, int64_t bytes);

  // step is 1-based; val is NaN when no validation ran this step.
  void report(int64_t step, double loss, double lr, double grad_norm, double secs, bool skipped, float loss_scale,
              double val);
  // The run's end, from what report() saw: steps, items processed, `wall_s` (the whole run, start-up
  // included), the mean throughput over the steps' own time, the best validation loss and its step,
  // and `last_checkpoint` ("" when none was written). Rank 0 logs the line returned; every rank's
  // metrics file gets a `summary` event.
  std::string summary(double wall_s, const std::string& last_checkpoint);

 private:
  std::ofstream metrics_;
  int rank_, world_;
  Device dev_;
  std::string unit_, rate_key_;  // "tok" -> "tokens_per_s", "samples" -> "samples_per_s"
  std::string items_key() const { return unit_ == "tok" ? "tokens" : unit_; }  // metrics' name of the items
  int64_t items_per_step_, max_steps_, print_every_;
  double flops_per_item_, peak_tflops_;
  std::optional<PipelineTimes> pipeline_;
  std::optional<Breakdown> breakdown_;
  bool show_breakdown_ = false;
  // For summary(): the steps reported this run, their seconds, the best validation loss.
  int64_t steps_ = 0, first_step_ = 0, last_step_ = 0, best_val_step_ = 0;
  double steps_s_ = 0, best_val_ = std::numeric_limits<double>::quiet_NaN();
  std::optional<int64_t> step_items_;   // set_step_items
  double items_ = 0, padded_items_ = 0;  // over the steps reported
  std::optional<CsvMonitor> csv_;
  int64_t csv_samples_per_step_ = 0;
  bool csv_loss_scale_ = false;
};

// One line per rank when a run starts: where it runs and what it holds,
// "rank 1/2: host n1, cuda:1 (NVIDIA H100 80GB HBM3), NUMA node 0 | per rank: device 12.30 GB, host
// 4.50 GB, NVMe 0.00 GB" (the memory plan's bytes per tier; NUMA node -1: unknown).
std::string rank_start_line(int rank, int world, const std::string& host, const std::string& device, int numa_node,
                            double device_bytes, double host_bytes, double nvme_bytes);

}  // namespace zp::runtime
