// The CPUs a rank's host work (the offload tier's CPU optimizer) runs on. mpirun binds each rank to
// one core by default (Open MPI: --bind-to core for up to two ranks, socket beyond), which leaves a
// multi-threaded CPU AdamW on one core: measured on an H100 host with 16 cores, an offloaded step of a
// 1.42B model took 2.1 s bound and 0.47 s unbound. So a rank takes its contiguous share of the CPUs
// the node's cgroup allows (local rank r of n: the r-th n-th), unless the launcher already gave it at
// least that many (srun --cpus-per-task, mpirun --map-by ...:pe=K): a deliberate binding is kept.
#pragma once
#include <string>
#include <vector>

namespace zp {

// "0-3,8,10-11" -> {0,1,2,3,8,10,11}; throws zp::Error on a malformed list.
std::vector<int> parse_cpu_list(const std::string& list);
// {0,1,2,3,8} -> "0-3,8"
std::string cpu_list_str(const std::vector<int>& cpus);

// The CPUs this node's cgroup allows (cpuset.cpus.effective, v1's cpuset.cpus, else every online CPU).
std::vector<int> node_cpus();
// The calling thread's affinity.
std::vector<int> thread_cpus();
// Local rank r's contiguous share of `cpus` among n ranks (at least one CPU).
std::vector<int> cpu_share(const std::vector<int>& cpus, int local_rank, int local_size);

// Widens the calling thread's affinity (and so that of the threads it starts later) to this rank's
// share when it is narrower.
struct CpuShare {
  std::vector<int> cpus;  // what the rank's host work may use now
  std::string note;       // what was done, for the log ("" when the binding was kept)
  bool refused = false;   // the share could not be taken (a cpuset forbids it): `note` says so, a warning
};
CpuShare take_cpu_share(int local_rank, int local_size);

}  // namespace zp
