#include "core/host_memory.h"

#include <algorithm>
#include <fstream>
#include <sstream>

namespace zp {

namespace {

std::string read_all(const char* path) {
  std::ifstream in(path);
  if (!in) return "";
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A cgroup v2 value: a byte count, or "max" / absent (-1).
int64_t cgroup_value(const std::string& s) {
  if (s.empty() || s.starts_with("max")) return -1;
  try {
    return std::stoll(s);
  } catch (...) {
    return -1;
  }
}

}  // namespace

HostMemory available_host_memory_from(const std::string& meminfo, const std::string& cgroup_max,
                                      const std::string& cgroup_current) {
  HostMemory m;
  std::istringstream in(meminfo);
  std::string key;
  int64_t kib = 0;
  std::string unit;
  while (in >> key >> kib) {
    std::getline(in, unit);
    if (key == "MemAvailable:") {
      m.available = kib * 1024;
      m.source = "MemAvailable";
    }
  }
  const int64_t limit = cgroup_value(cgroup_max), used = cgroup_value(cgroup_current);
  if (limit >= 0) {
    const int64_t left = limit - std::max<int64_t>(0, used);
    if (m.available < 0 || left < m.available) {
      m.available = std::max<int64_t>(0, left);
      m.source = "the cgroup's memory.max";
    }
  }
  return m;
}

HostMemory available_host_memory() {
  std::string max = read_all("/sys/fs/cgroup/memory.max"), current = read_all("/sys/fs/cgroup/memory.current");
  if (max.empty()) {  // cgroup v1
    max = read_all("/sys/fs/cgroup/memory/memory.limit_in_bytes");
    current = read_all("/sys/fs/cgroup/memory/memory.usage_in_bytes");
    // v1 reports "no limit" as a huge number rather than "max".
    if (cgroup_value(max) > (int64_t(1) << 60)) max.clear();
  }
  return available_host_memory_from(read_all("/proc/meminfo"), max, current);
}

}  // namespace zp
