#include "runtime/csv_monitor.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <system_error>

#include "core/error.h"

namespace zp::runtime {

CsvMonitor::CsvMonitor(const std::string& dir) : dir_(dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  ZP_REQUIRE(!ec && std::filesystem::is_directory(dir_), "csv_monitor.output_path/job_name '", dir_,
             "': cannot create the directory: ", ec.message());
}

void CsvMonitor::write(const std::string& event, int64_t samples, double value) const {
  std::string file = event, name = event.substr(event.rfind('/') + 1);
  for (char& ch : file)
    if (ch == '/' || ch == ' ') ch = '_';
  const std::filesystem::path path = std::filesystem::path(dir_) / (file + ".csv");
  std::error_code ec;
  const bool fresh = !std::filesystem::exists(path, ec) || std::filesystem::file_size(path, ec) == 0;
  std::ofstream out(path, std::ios::app);
  ZP_REQUIRE(out.good(), path.string(), ": cannot write the csv_monitor file");
  char row[64];
  std::snprintf(row, sizeof(row), "%lld,%.9g\n", (long long)samples, value);
  if (fresh) out << "step," << name << "\n";
  out << row;
  ZP_REQUIRE(out.good(), path.string(), ": cannot write the csv_monitor file");
}

}  // namespace zp::runtime
