#include "runtime/run_report_html.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <sstream>

#include "runtime/svg_chart.h"

namespace zp::runtime {

namespace {

using Field = std::function<double(const StepRecord&)>;

constexpr size_t kMaxBars = 60;  // breakdown bars over a run: buckets of steps, each its mean

std::string number(double v, const char* fmt = "%.4g") {
  if (!std::isfinite(v)) return "–";
  char b[48];
  std::snprintf(b, sizeof b, fmt, v);
  return b;
}

// Items (tokens or samples) of the whole job per step: the records give the rate and the step time.
double items_per_step(const RunFile& f) {
  for (const StepRecord& r : f.steps)
    if (std::isfinite(r.items_per_s) && std::isfinite(r.step_ms) && r.items_per_s > 0)
      return std::round(r.items_per_s * r.step_ms / 1e3);
  return kAbsent;
}

ChartSeries series(const std::string& label, const RunFile& f, const Field& x, const Field& y) {
  ChartSeries s{label, {}};
  for (const StepRecord& r : f.steps) s.points.push_back({x(r), y(r)});
  return s;
}

const Field kStep = [](const StepRecord& r) { return double(r.step); };

// One series per file of the field against the step.
LineChart per_file(const RunReport& rep, std::string id, std::string title, std::string y_label, const Field& y,
                   bool from_zero = false) {
  LineChart c{std::move(id), std::move(title), "step", std::move(y_label), {}, from_zero};
  for (const RunFile& f : rep.files) c.series.push_back(series(f.label, f, kStep, y));
  return c;
}

// Loss and validation loss, against `x` (the step, or the items seen).
LineChart loss_chart(const RunReport& rep, bool against_items) {
  const std::string unit = rep.files.front().unit;
  LineChart c{against_items ? "loss-items" : "loss-step",
              against_items ? "Loss against " + unit + " seen" : "Loss against step",
              against_items ? unit : "step", "loss", {}};
  for (const RunFile& f : rep.files) {
    const double per_step = items_per_step(f);
    const Field x = against_items ? Field([per_step](const StepRecord& r) { return double(r.step) * per_step; }) : kStep;
    c.series.push_back(series(f.label, f, x, [](const StepRecord& r) { return r.loss; }));
    ChartSeries val = series(f.label + " validation", f, x, [](const StepRecord& r) { return r.val_loss; });
    if (std::any_of(val.points.begin(), val.points.end(), [](const ChartPoint& p) { return std::isfinite(p.y); }))
      c.series.push_back(std::move(val));
  }
  return c;
}

// Peak memory per rank from the per_rank arrays (the first file holding them), else per file.
LineChart memory_chart(const RunReport& rep) {
  for (const RunFile& f : rep.files) {
    size_t ranks = 0;
    for (const StepRecord& r : f.steps) ranks = std::max(ranks, r.rank_peak_mem_gib.size());
    if (ranks == 0) continue;
    LineChart c{"memory", "Peak memory per rank (" + f.label + ")", "step", "GiB", {}, true};
    for (size_t k = 0; k < ranks; ++k)
      c.series.push_back(series("rank " + std::to_string(k), f, kStep, [k](const StepRecord& r) {
        return k < r.rank_peak_mem_gib.size() ? r.rank_peak_mem_gib[k] : kAbsent;
      }));
    return c;
  }
  return per_file(rep, "memory", "Peak memory per file (GPU, or host RSS on the CPU)", "GiB",
                  [](const StepRecord& r) { return r.peak_mem_gib; }, true);
}

// The step-time breakdown of the first file that has one, in at most kMaxBars buckets of steps. The
// forward and backward are two parts where every record has the split, else one, "compute".
StackedBars breakdown_chart(const RunReport& rep) {
  StackedBars c{"breakdown", "Step time breakdown", "step", "ms per step", {}, {}, {}};
  for (const RunFile& f : rep.files) {
    std::vector<const StepRecord*> with;
    for (const StepRecord& r : f.steps)
      if (r.breakdown) with.push_back(&r);
    if (with.empty()) continue;
    const bool split =
        std::all_of(with.begin(), with.end(), [](const StepRecord* r) { return r->breakdown->has_forward_split(); });
    c.layers = split ? std::vector<std::string>{"data", "forward", "backward", "optimizer", "exposed communication",
                                                "other"}
                     : std::vector<std::string>{"data", "compute", "optimizer", "exposed communication", "other"};
    auto parts = [split](const StepBreakdown& d) {
      return split ? std::vector<double>{d.data_ms, d.forward_ms, d.backward_ms, d.optimizer_ms, d.exposed_comm_ms,
                                         d.other_ms}
                   : std::vector<double>{d.data_ms, d.compute_ms, d.optimizer_ms, d.exposed_comm_ms, d.other_ms};
    };
    c.title += " (" + f.label + ")";
    const size_t buckets = std::min(with.size(), kMaxBars);
    for (size_t b = 0; b < buckets; ++b) {
      const size_t begin = with.size() * b / buckets, end = with.size() * (b + 1) / buckets;
      std::vector<double> mean(c.layers.size(), 0.0);
      for (size_t i = begin; i < end; ++i) {
        const std::vector<double> p = parts(*with[i]->breakdown);
        for (size_t k = 0; k < p.size(); ++k) mean[k] += p[k] / double(end - begin);
      }
      c.bars.push_back(std::to_string(with[begin]->step));
      c.values.push_back(mean);
    }
    return c;
  }
  return c;
}

// The mean over a file's steps of the finite values of `v` (0 when none).
double mean_over_steps(const RunFile& f, const Field& v) {
  double sum = 0;
  int n = 0;
  for (const StepRecord& r : f.steps)
    if (const double x = v(r); std::isfinite(x)) sum += x, ++n;
  return n ? sum / n : 0.0;
}

// Per file (a rank's metrics), the communication's mean busy time split into what compute waited for
// (exposed) and the rest (hidden behind compute, or in a pipeline the stage link's traffic, which
// exposed_comm_ms does not count). Files without exposed_comm_ms have no bar.
StackedBars exposed_comm_chart(const RunReport& rep) {
  StackedBars c{"comm-exposed", "Communication: busy vs exposed (mean over the steps)", "file", "ms per step",
                {"exposed (compute waited)", "busy, not exposed"}, {}, {}};
  for (const RunFile& f : rep.files) {
    if (std::none_of(f.steps.begin(), f.steps.end(),
                     [](const StepRecord& r) { return std::isfinite(r.exposed_comm_ms); }))
      continue;
    const double busy = mean_over_steps(f, [](const StepRecord& r) { return r.comm_busy_ms; });
    const double exposed = mean_over_steps(f, [](const StepRecord& r) { return r.exposed_comm_ms; });
    c.bars.push_back(f.label);
    c.values.push_back({exposed, std::max(busy - exposed, 0.0)});
  }
  return c;
}

// Per file, the communication's mean busy time per kind (collectives and the pipeline's send_recv):
// the kinds the files name, the engine's in a fixed order (so colours mean the same in every report),
// then any other.
StackedBars comm_kinds_chart(const RunReport& rep) {
  StackedBars c{"comm-kinds", "Communication busy time per kind (mean over the steps)", "file", "ms per step",
                {}, {}, {}};
  std::vector<std::string> named;
  for (const RunFile& f : rep.files)
    for (const StepRecord& r : f.steps)
      for (const auto& [kind, ms] : r.comm_busy_by_kind_ms)
        if (std::find(named.begin(), named.end(), kind) == named.end()) named.push_back(kind);
  for (const char* kind : {"all_gather", "reduce_scatter", "all_reduce", "send_recv"})
    if (std::find(named.begin(), named.end(), kind) != named.end()) c.layers.push_back(kind);
  for (const std::string& kind : named)
    if (std::find(c.layers.begin(), c.layers.end(), kind) == c.layers.end()) c.layers.push_back(kind);
  for (const RunFile& f : rep.files) {
    if (std::all_of(f.steps.begin(), f.steps.end(),
                    [](const StepRecord& r) { return r.comm_busy_by_kind_ms.empty(); }))
      continue;
    std::vector<double> mean;
    for (const std::string& kind : c.layers)
      mean.push_back(mean_over_steps(f, [&kind](const StepRecord& r) {
        for (const auto& [k, ms] : r.comm_busy_by_kind_ms)
          if (k == kind) return ms;
        return r.comm_busy_by_kind_ms.empty() ? kAbsent : 0.0;  // a step without the kind spent nothing on it
      }));
    c.bars.push_back(f.label);
    c.values.push_back(std::move(mean));
  }
  return c;
}

// Mean communication busy time and the rest of the step per rank: a straggler's bar is taller, a
// rank waiting on it shows more communication. From the per_rank arrays of the first file holding
// them, else one bar per file from its comm_busy_ms.
StackedBars comm_chart(const RunReport& rep) {
  StackedBars c{"comm-per-rank", "Communication per rank (mean over the steps)", "rank", "ms per step",
                {"communication busy", "rest of the step"}, {}, {}};
  auto mean = [](const std::vector<double>& sum, const std::vector<int>& n, size_t k) {
    return n[k] ? sum[k] / n[k] : 0.0;
  };
  for (const RunFile& f : rep.files) {
    std::vector<double> comm, step;
    std::vector<int> n_comm, n_step;
    for (const StepRecord& r : f.steps) {
      const size_t ranks = r.rank_comm_busy_ms.size();
      comm.resize(std::max(comm.size(), ranks)), n_comm.resize(comm.size());
      step.resize(comm.size()), n_step.resize(comm.size());
      for (size_t k = 0; k < ranks; ++k) {
        if (std::isfinite(r.rank_comm_busy_ms[k])) comm[k] += r.rank_comm_busy_ms[k], ++n_comm[k];
        if (k < r.rank_step_ms.size() && std::isfinite(r.rank_step_ms[k])) step[k] += r.rank_step_ms[k], ++n_step[k];
      }
    }
    if (comm.empty()) continue;
    c.title += " (" + f.label + ")";
    for (size_t k = 0; k < comm.size(); ++k) {
      const double busy = mean(comm, n_comm, k);
      c.bars.push_back(std::to_string(k));
      c.values.push_back({busy, std::max(mean(step, n_step, k) - busy, 0.0)});
    }
    return c;
  }
  c.x_label = "file";
  for (const RunFile& f : rep.files) {
    double comm = 0, step = 0;
    int n = 0;
    for (const StepRecord& r : f.steps)
      if (std::isfinite(r.comm_busy_ms)) comm += r.comm_busy_ms, step += std::isfinite(r.step_ms) ? r.step_ms : 0, ++n;
    if (n == 0) continue;
    c.bars.push_back(f.label);
    c.values.push_back({comm / n, std::max(step - comm, 0.0) / n});
  }
  return c;
}

LineChart bubble_chart(const RunReport& rep) {
  LineChart c = per_file(rep, "bubble", "Pipeline bubble", "% of the step idle",
                         [](const StepRecord& r) { return 100 * r.bubble; }, true);
  c.series.push_back(series("theory", rep.files.front(), kStep,
                            [](const StepRecord& r) { return 100 * r.theoretical_bubble; }));
  // The theory alone is no bubble measured.
  if (std::none_of(rep.files.begin(), rep.files.end(), [](const RunFile& f) {
        return std::any_of(f.steps.begin(), f.steps.end(), [](const StepRecord& r) { return std::isfinite(r.bubble); });
      }))
    c.series.clear();
  return c;
}

void section(std::ostringstream& o, const std::string& svg, const std::string& absent) {
  if (!svg.empty())
    o << "<figure>" << svg << "</figure>\n";
  else
    o << "<p class=\"absent\">" << xml_escape(absent) << "</p>\n";
}

void summary(std::ostringstream& o, const RunReport& rep) {
  o << "<table><tr><th>file</th><th>steps</th><th>last loss</th><th>best validation loss</th><th>"
    << xml_escape(rep.files.front().unit) << "/s (mean)</th><th>peak memory GiB</th><th>skipped steps</th></tr>\n";
  for (const RunFile& f : rep.files) {
    double best_val = INFINITY, rate = 0, mem = 0;
    int rates = 0, skipped = 0;
    for (const StepRecord& r : f.steps) {
      if (std::isfinite(r.val_loss)) best_val = std::min(best_val, r.val_loss);
      if (std::isfinite(r.items_per_s)) rate += r.items_per_s, ++rates;
      if (std::isfinite(r.peak_mem_gib)) mem = std::max(mem, r.peak_mem_gib);
      skipped += r.skipped;
    }
    o << "<tr><td>" << xml_escape(f.label) << "</td><td>" << f.steps.front().step << "–" << f.steps.back().step
      << "</td><td>" << number(f.steps.back().loss) << "</td><td>" << number(best_val) << "</td><td>"
      << number(rates ? rate / rates : kAbsent, "%.1f") << "</td><td>" << number(mem, "%.3f") << "</td><td>"
      << skipped << "</td></tr>\n";
  }
  o << "</table>\n";
}

void checkpoints(std::ostringstream& o, const RunReport& rep) {
  for (const RunFile& f : rep.files) {
    if (f.checkpoints.empty()) continue;
    o << "<h2>Checkpoints (" << xml_escape(f.label) << ")</h2>\n<table><tr><th>step</th><th>seconds</th><th>GB</th>"
      << "<th>GB/s</th><th>path</th></tr>\n";
    for (const CheckpointEvent& c : f.checkpoints)
      o << "<tr><td>" << c.step << "</td><td>" << number(c.seconds, "%.2f") << "</td><td>"
        << number(double(c.bytes) / 1e9, "%.3f") << "</td><td>" << number(c.gb_per_s, "%.2f") << "</td><td>"
        << xml_escape(c.path) << "</td></tr>\n";
    o << "</table>\n";
    return;  // every rank writes the same events: the first file's are the run's
  }
}

void config_and_banner(std::ostringstream& o, const RunReport& rep) {
  for (const RunFile& f : rep.files) {
    if (!f.config && f.banner.empty()) continue;
    o << "<h2>Run (" << xml_escape(f.label) << (f.world ? ", world " + std::to_string(f.world) : "") << ")</h2>\n";
    if (!f.banner.empty()) {
      o << "<pre class=\"banner\">";
      for (const std::string& l : f.banner) o << xml_escape(l) << "\n";
      o << "</pre>\n";
    }
    // replace: a config string that is not UTF-8 must not stop the report.
    if (f.config)
      o << "<h3>Config</h3>\n<pre class=\"config\">"
        << xml_escape(f.config->dump(2, ' ', false, nlohmann::json::error_handler_t::replace)) << "</pre>\n";
    return;
  }
  o << "<p class=\"absent\">No start event (config and banner) in these files.</p>\n";
}

// Charts two by two on a wide screen, one under the other on a narrow one.
const char* const kStyle = R"(body{font-family:sans-serif;margin:1.5em;color:#222;max-width:1400px}
h1{font-size:1.4em}h2{font-size:1.15em;margin-top:1.5em}table{border-collapse:collapse;font-size:.9em}
td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}td:first-child,th:first-child{text-align:left}
figure{display:inline-block;vertical-align:top;width:660px;max-width:100%;margin:.3em 0}
svg.chart{width:100%;height:auto;font-size:12px}
.title{font-size:14px;font-weight:bold}.tick{fill:#555;font-size:11px}.label{fill:#333}.legend{font-size:12px}
.grid{stroke:#e4e4e4}.axis{stroke:#888}.series{stroke-width:1.5}.absent{color:#777;font-style:italic}
pre{background:#f6f6f6;padding:.6em;overflow-x:auto;font-size:.85em})";

}  // namespace

std::string run_report_html(const RunReport& rep) {
  const std::string unit = rep.files.front().unit;
  std::ostringstream o;
  o << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<title>ZeRO-Pipe run report</title>\n"
    << "<style>" << kStyle << "</style></head><body>\n<h1>ZeRO-Pipe run report</h1>\n";
  summary(o, rep);
  o << "<h2>Loss</h2>\n";
  section(o, svg_line_chart(loss_chart(rep, false)), "No loss in these files.");
  section(o, svg_line_chart(loss_chart(rep, true)), "No " + unit + " rate in these files to count " + unit + " seen.");
  o << "<h2>Optimizer</h2>\n";
  section(o, svg_line_chart(per_file(rep, "lr", "Learning rate", "lr", [](const StepRecord& r) { return r.lr; })),
          "No learning rate in these files.");
  section(o,
          svg_line_chart(per_file(rep, "grad-norm", "Gradient norm", "norm",
                                  [](const StepRecord& r) { return r.grad_norm; })),
          "No gradient norm in these files.");
  o << "<h2>Speed and memory</h2>\n";
  section(o,
          svg_line_chart(per_file(rep, "throughput", "Throughput", unit + "/s",
                                  [](const StepRecord& r) { return r.items_per_s; }, true)),
          "No throughput in these files.");
  section(o,
          svg_line_chart(per_file(rep, "mfu", "Model FLOPs utilisation", "% of the GPU's bf16 peak (0 on the CPU)",
                                  [](const StepRecord& r) { return 100 * r.mfu; }, true)),
          "No MFU in these files.");
  section(o,
          svg_line_chart(per_file(rep, "step-time", "Step time", "ms", [](const StepRecord& r) { return r.step_ms; }, true)),
          "No step time in these files.");
  section(o, svg_line_chart(memory_chart(rep)), "No peak memory in these files.");
  o << "<h2>Where the time goes</h2>\n";
  section(o, svg_stacked_bars(breakdown_chart(rep)), "No step-time breakdown (\"breakdown\") in these files.");
  section(o, svg_stacked_bars(comm_chart(rep)),
          "No communication timings (\"per_rank.comm_busy_ms\" or \"comm_busy_ms\") in these files.");
  section(o, svg_stacked_bars(exposed_comm_chart(rep)),
          "No exposed communication (\"breakdown.exposed_comm_ms\") in these files.");
  section(o, svg_stacked_bars(comm_kinds_chart(rep)),
          "No communication time per kind (\"breakdown.comm_busy_by_kind_ms\") in these files.");
  section(o, svg_line_chart(bubble_chart(rep)), "No pipeline in this run (no \"pipeline\" records).");
  checkpoints(o, rep);
  config_and_banner(o, rep);
  o << "<p class=\"absent\">Files:";
  for (const RunFile& f : rep.files) o << " " << xml_escape(f.path);
  o << "</p>\n</body></html>\n";
  return o.str();
}

}  // namespace zp::runtime
