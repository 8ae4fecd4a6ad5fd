#include "core/cpu_share.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <thread>

#include "core/error.h"

namespace zp {

namespace {

std::string first_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (in) std::getline(in, line);
  return line;
}

// The cgroup v1 cpuset directory of this process ("" when there is none).
std::string v1_cpuset_dir() {
  std::ifstream in("/proc/self/cgroup");
  for (std::string line; std::getline(in, line);) {
    // "3:cpuset:/slurm/uid_0/job_12/step_0"
    const size_t a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    if (line.substr(a + 1, b - a - 1) == "cpuset") return "/sys/fs/cgroup/cpuset" + line.substr(b + 1);
  }
  return "";
}

}  // namespace

std::vector<int> parse_cpu_list(const std::string& list) {
  std::vector<int> cpus;
  std::stringstream ss(list);
  for (std::string item; std::getline(ss, item, ',');) {
    item.erase(std::remove_if(item.begin(), item.end(), [](char c) { return std::isspace(static_cast<unsigned char>(c)); }),
               item.end());
    if (item.empty()) continue;
    const size_t dash = item.find('-');
    try {
      size_t used = 0;
      const int lo = std::stoi(item.substr(0, dash), &used);
      ZP_REQUIRE(used == (dash == std::string::npos ? item.size() : dash), "bad CPU list item");
      int hi = lo;
      if (dash != std::string::npos) {
        hi = std::stoi(item.substr(dash + 1), &used);
        ZP_REQUIRE(used == item.size() - dash - 1, "bad CPU list item");
      }
      ZP_REQUIRE(lo >= 0 && hi >= lo, "bad CPU range");
      for (int c = lo; c <= hi; ++c) cpus.push_back(c);
    } catch (const std::exception&) {
      throw Error(detail::cat("CPU list '", list, "': '", item, "' is not a CPU number or a range like 0-7"));
    }
  }
  std::sort(cpus.begin(), cpus.end());
  cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
  return cpus;
}

std::string cpu_list_str(const std::vector<int>& cpus) {
  std::string s;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!s.empty()) s += ',';
    s += std::to_string(cpus[i]);
    if (j > i) s += "-" + std::to_string(cpus[j]);
    i = j + 1;
  }
  return s;
}

std::vector<int> node_cpus() {
  for (const std::string& path : {std::string("/sys/fs/cgroup/cpuset.cpus.effective"),
                                  v1_cpuset_dir().empty() ? std::string() : v1_cpuset_dir() + "/cpuset.cpus",
                                  std::string("/sys/devices/system/cpu/online")}) {
    if (path.empty()) continue;
    const std::string line = first_line(path);
    if (line.empty()) continue;
    try {
      std::vector<int> cpus = parse_cpu_list(line);
      if (!cpus.empty()) return cpus;
    } catch (const Error&) {
    }
  }
  std::vector<int> all(std::max(1u, std::thread::hardware_concurrency()));
  for (size_t i = 0; i < all.size(); ++i) all[i] = int(i);
  return all;
}

std::vector<int> thread_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (pthread_getaffinity_np(pthread_self(), sizeof set, &set) != 0) return node_cpus();
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  return cpus;
}

std::vector<int> cpu_share(const std::vector<int>& cpus, int local_rank, int local_size) {
  ZP_CHECK(!cpus.empty() && local_size >= 1 && local_rank >= 0 && local_rank < local_size, "cpu_share of ",
           cpus.size(), " CPUs for local rank ", local_rank, " of ", local_size);
  const size_t n = cpus.size(), k = size_t(local_size), r = size_t(local_rank);
  if (n < k) return {cpus[r % n]};  // more ranks than CPUs: they share
  const size_t begin = r * n / k, end = (r + 1) * n / k;
  return std::vector<int>(cpus.begin() + long(begin), cpus.begin() + long(end));
}

CpuShare take_cpu_share(int local_rank, int local_size) {
  const std::vector<int> now = thread_cpus(), share = cpu_share(node_cpus(), local_rank, local_size);
  if (now.size() >= share.size()) return {now, "", false};  // the launcher gave at least our share: kept
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : share)
    if (c < CPU_SETSIZE) CPU_SET(c, &set);
  if (pthread_setaffinity_np(pthread_self(), sizeof set, &set) != 0)
    return {now,
            "this rank is bound to CPUs " + cpu_list_str(now) + " and may not take its share " + cpu_list_str(share) +
                " of the node: its host work (the offload tier's AdamW) runs on " + std::to_string(now.size()) +
                " CPU(s); launch with `mpirun --bind-to none` or give each rank more cores",
            true};
  return {share, "CPUs " + cpu_list_str(share) + " for this rank's host work (the launcher had bound it to " +
                     cpu_list_str(now) + ")",
          false};
}

}  // namespace zp
