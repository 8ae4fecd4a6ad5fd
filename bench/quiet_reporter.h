// Every rank runs every benchmark (they work together); only rank 0 reports.
#pragma once
#include <benchmark/benchmark.h>

#include <vector>

namespace zp::bench {

class Quiet : public benchmark::BenchmarkReporter {
 public:
  bool ReportContext(const Context&) override { return true; }
  void ReportRuns(const std::vector<Run>&) override {}
};

// After benchmark::Initialize: runs the selected benchmarks, printing on rank 0 only, and shuts
// Google Benchmark down.
inline void run_benchmarks_on_every_rank(int rank) {
  if (rank == 0) {
    benchmark::RunSpecifiedBenchmarks();
  } else {
    Quiet quiet;
    benchmark::RunSpecifiedBenchmarks(&quiet);
  }
  benchmark::Shutdown();
}

}  // namespace zp::bench
