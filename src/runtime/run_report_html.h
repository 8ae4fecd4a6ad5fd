// The run report as one self-contained HTML page: a summary per file, then charts drawn as inline SVG
// (runtime/svg_chart.h) and the run's config and banner. No script, font, image or stylesheet is
// fetched, so the file opens in any browser, offline, and can be attached to an issue.
#pragma once
#include <string>

#include "runtime/run_report.h"

namespace zp::runtime {

// The ids of the charts the page can hold, in page order; a chart whose data no file has is replaced
// by a line saying so.
//   loss-step, loss-items    loss and validation loss against the step and the tokens (samples) seen
//   lr, grad-norm            learning rate, gradient norm
//   throughput, mfu          tokens (samples) per second, model FLOPs utilisation
//   step-time, memory        step time per file; peak memory per rank (per file where no per_rank)
//   breakdown                where the step time goes, stacked bars over the run (first file with it):
//                            forward and backward apart where the files have the split, else "compute"
//   comm-per-rank            communication busy time and the rest of the step, per rank (stragglers)
//   comm-exposed             per file, communication busy time: the part compute waited for, the rest
//   comm-kinds               per file, communication busy time per kind (all_gather, ..., send_recv)
//   bubble                   the pipeline bubble per stage's file, with the theory's
std::string run_report_html(const RunReport& report);

}  // namespace zp::runtime
