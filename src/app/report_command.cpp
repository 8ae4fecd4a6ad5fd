#include "app/report_command.h"

#include <cstdio>
#include <filesystem>

#include "io/atomic_file.h"
#include "runtime/run_report.h"
#include "runtime/run_report_html.h"

namespace zp::app {
namespace fs = std::filesystem;

std::string report_path(const ReportOptions& o) {
  if (!o.out.empty() || o.inputs.empty()) return o.out;
  return (fs::path(o.inputs.front()).parent_path() / "report.html").string();
}

int run_report(const ReportOptions& o) {
  const runtime::RunReport report = runtime::read_run_report(o.inputs);
  const std::string html = runtime::run_report_html(report);
  const std::string out = report_path(o);
  io::AtomicFile file(out, io::FileSync::None);
  file.write(html.data(), html.size());
  file.commit();
  size_t steps = 0;
  for (const auto& f : report.files) steps += f.steps.size();
  std::printf("wrote %s (%.0f KB): %zu file(s), %zu step records\n", out.c_str(), double(html.size()) / 1024,
              report.files.size(), steps);
  return 0;
}

}  // namespace zp::app
