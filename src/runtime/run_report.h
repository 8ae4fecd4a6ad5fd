// A training run as `zeropipe report` sees it: the metrics JSONL files that `zeropipe train` writes
// (runtime/step_report.h), read back into step records and events. One RunFile per input file (a
// rank's file, or a run's), labelled by its file name. Lines with an "event" key are events (the
// "start" line with the config and banner, "checkpoint" lines), every other line is a step record.
// Fields the reader does not know are ignored and optional ones may be absent, so files written by
// older and newer engines both read; a number written as null (NaN: a diverged loss) reads as NaN.
#pragma once
#include <cmath>
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace zp::runtime {

constexpr double kAbsent = std::numeric_limits<double>::quiet_NaN();

// Where a step's time went on this rank (the "breakdown" object), in milliseconds; the parts add up
// to the step. compute_ms is the forward and backward ("forward_backward_ms" in the engine's files);
// forward_ms and backward_ms split it where the file has the split (NaN otherwise: older files, and
// pipeline stages, whose passes interleave).
struct StepBreakdown {
  double data_ms = 0, compute_ms = 0, optimizer_ms = 0, exposed_comm_ms = 0, other_ms = 0;
  double forward_ms = kAbsent, backward_ms = kAbsent;
  bool has_forward_split() const { return !std::isnan(forward_ms) && !std::isnan(backward_ms); }
};

struct StepRecord {
  int64_t step = 0;
  double loss = kAbsent, val_loss = kAbsent, lr = kAbsent, grad_norm = kAbsent, mfu = kAbsent;
  double items_per_s = kAbsent;  // tokens_per_s or samples_per_s (RunFile::unit says which)
  double peak_mem_gib = kAbsent, step_ms = kAbsent;
  double comm_busy_ms = kAbsent;  // "comm_busy_ms", or the breakdown's
  // The breakdown's exposed_comm_ms as written (the part of comm_busy_ms compute waited for), and its
  // comm_busy_by_kind_ms, one (kind, ms) per kind: ("all_gather", ms), ..., ("send_recv", ms).
  double exposed_comm_ms = kAbsent;
  std::vector<std::pair<std::string, double>> comm_busy_by_kind_ms;
  // Pipeline runs only: this rank's stage's bubble, the mean over all stages, and the theory's.
  double bubble = kAbsent, mean_bubble = kAbsent, theoretical_bubble = kAbsent;
  // This rank's stage: its busy time, the step window, and the device's idle time between passes
  // before receiving passes and before the others (StageTimes).
  double stage_busy_ms = kAbsent, window_ms = kAbsent, recv_gap_ms = kAbsent, other_gap_ms = kAbsent;
  bool skipped = false;
  std::optional<StepBreakdown> breakdown;
  // "per_rank": one value per world rank (empty when absent).
  std::vector<double> rank_step_ms, rank_comm_busy_ms, rank_peak_mem_gib;
};

struct CheckpointEvent {
  int64_t step = 0;
  std::string path;
  double seconds = kAbsent, gb_per_s = kAbsent;
  int64_t bytes = 0;
};

struct RunFile {
  std::string path;   // as given
  std::string label;  // its file name, or the path when two inputs share a file name
  std::string unit = "tokens";  // "tokens" or "samples": what items_per_s counts
  std::vector<StepRecord> steps;
  std::vector<CheckpointEvent> checkpoints;
  // From the "start" event, when present.
  std::optional<nlohmann::json> config;
  std::vector<std::string> banner;
  int world = 0;
};

// Reads one metrics file. Throws zp::Error: "<path>: cannot open ...", "<path>:<line>: not JSON: ...",
// "<path>:<line>: <key> ..." for a field of the wrong type, "<path>: no step records ..." for a file
// without any.
RunFile read_metrics_file(const std::string& path);

struct RunReport {
  std::vector<RunFile> files;
};

// Reads every file (read_metrics_file's errors) and labels them.
RunReport read_run_report(const std::vector<std::string>& paths);

}  // namespace zp::runtime
