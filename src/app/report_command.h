// `zeropipe report metrics-*.jsonl [--out report.html]`: the metrics files of a run (a rank's or a
// run's each, one series per file) as one self-contained HTML page with charts
// (runtime/run_report_html.h), written where --out says, by default report.html beside the first file.
#pragma once
#include <string>
#include <vector>

namespace zp::app {

struct ReportOptions {
  std::vector<std::string> inputs;
  std::string out;  // empty: report.html in the first input's folder
};

// The page's path for these options.
std::string report_path(const ReportOptions& o);

// Writes the report (whole or not at all) and prints one line saying where; returns 0. Bad input
// throws zp::Error naming the file (and line).
int run_report(const ReportOptions& o);

}  // namespace zp::app
