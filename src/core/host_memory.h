// How much host memory a process may still take: the kernel's MemAvailable (what can be allocated
// without swapping, page cache counted as reclaimable), capped by the cgroup's limit where one is set
// (a SLURM job step or a container sees its own limit, not the node's RAM). The start-up fit check
// compares a node's offloaded state against it.
#pragma once
#include <cstdint>
#include <string>

namespace zp {

struct HostMemory {
  int64_t available = -1;  // bytes; -1 when unknown
  std::string source;      // "MemAvailable" | "cgroup memory.max" ...: which limit decided
};

HostMemory available_host_memory();

// For tests: the same from the given file contents ("" where absent).
HostMemory available_host_memory_from(const std::string& meminfo, const std::string& cgroup_max,
                                      const std::string& cgroup_current);

}  // namespace zp
