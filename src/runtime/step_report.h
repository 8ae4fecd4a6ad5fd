// What a training loop reports after each step, the same for every model: the progress line on
// rank 0 (loss, lr, grad norm, throughput, MFU, peak memory, step time, skipped steps, validation)
// and one JSON line per step and rank in training.metrics_file ("{rank}" is replaced by the rank;
// without it, ranks other than 0 append ".<rank>"), and with csv_monitor DeepSpeed's CSV files.
#pragma once
#include <cstdint>
#include <fstream>
#include <optional>
#include <string>
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
  // its bubble, the mean bubble over all stages (rank 0's progress line shows it) and the theory's.
  struct PipelineTimes {
    int stage = 0;
    double busy_ms = 0, span_ms = 0, wait_ms = 0, bubble = 0, mean_bubble = 0, theory = 0;
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
  struct Breakdown {
    double data_ms = 0, forward_backward_ms = 0, optimizer_ms = 0, comm_busy_ms = 0;
  };
  void set_breakdown(const Breakdown& b) { breakdown_ = b; }
  void show_breakdown(bool on) { show_breakdown_ = on; }
  // Event lines in the metrics JSONL, for `zeropipe report`: the run's start (its configuration, the
  // start-up banner's lines and the world size) and every checkpoint saved (seconds, bytes, GB/s).
  void start_event(const nlohmann::json& config, const std::vector<std::string>& banner);
  void checkpoint_event(int64_t step, const std::string& path, double seconds, int64_t bytes);

  // step is 1-based; val is NaN when no validation ran this step.
  void report(int64_t step, double loss, double lr, double grad_norm, double secs, bool skipped, float loss_scale,
              double val);

 private:
  std::ofstream metrics_;
  int rank_, world_;
  Device dev_;
  std::string unit_, rate_key_;  // "tok" -> "tokens_per_s", "samples" -> "samples_per_s"
  int64_t items_per_step_, max_steps_, print_every_;
  double flops_per_item_, peak_tflops_;
  std::optional<PipelineTimes> pipeline_;
  std::optional<Breakdown> breakdown_;
  bool show_breakdown_ = false;
  std::optional<CsvMonitor> csv_;
  int64_t csv_samples_per_step_ = 0;
  bool csv_loss_scale_ = false;
};

}  // namespace zp::runtime
