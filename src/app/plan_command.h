// zeropipe plan: a training configuration's memory per rank and per node on each tier, whether it
// fits the GPUs, host memory and NVMe space named on the command line, and the cheapest change that would make
// it fit (issue 11 item 5). With pipeline.stages P > 1, stage by stage (issue 12): the verdict and the
// change are the worst stage's and the fullest node's. Nothing is allocated and MPI is not started:
// it runs on a laptop.
#pragma once
#include <string>
#include <vector>

namespace zp::app {

struct PlanOptions {
  std::string config;
  std::vector<std::string> sets;
  int world = 1, ranks_per_node = 0;  // 0: all ranks on one node
  std::string gpu_memory, host_memory;  // "24GiB", "64GB", "" (not checked)
  std::string nvme_free;                // free space under the nvme_paths of a node, "1TiB", "" (not checked)
};

// Prints the plan; returns 0 when it fits (or nothing was given to check against), 1 when not.
int run_plan(const PlanOptions& o);

// "24GiB" -> bytes. Units B, KB/MB/GB/TB (powers of 1000), KiB/MiB/GiB/TiB (powers of 1024), or none
// (bytes). Throws zp::Error naming `what` for anything else.
double parse_bytes(const std::string& text, const std::string& what);

}  // namespace zp::app
