// Every rank runs every benchmark (they work together); only rank 0 reports.
#pragma once
#include <benchmark/benchmark.h>

#include <string_view>
#include <vector>

namespace zp::bench {

class Quiet : public benchmark::BenchmarkReporter {
 public:
  bool ReportContext(const Context&) override { return true; }
  void ReportRuns(const std::vector<Run>&) override {}
};

// Before benchmark::Initialize: on ranks other than 0, drops --benchmark_out and
// --benchmark_out_format, so only rank 0 opens (and truncates) the output file: two ranks writing one
// file interleave their reports.
inline void keep_output_file_on_rank0(int rank, int* argc, char** argv) {
  if (rank == 0) return;
  int kept = 1;
  for (int i = 1; i < *argc; ++i)
    if (!std::string_view(argv[i]).starts_with("--benchmark_out")) argv[kept++] = argv[i];
  *argc = kept;
  argv[kept] = nullptr;
}

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
