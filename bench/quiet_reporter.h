// The reporter of ranks other than 0: every rank runs every benchmark (they work together), only
// rank 0 prints.
#pragma once
#include <benchmark/benchmark.h>

#include <vector>

namespace zp::bench {

class Quiet : public benchmark::BenchmarkReporter {
 public:
  bool ReportContext(const Context&) override { return true; }
  void ReportRuns(const std::vector<Run>&) override {}
};

}  // namespace zp::bench
