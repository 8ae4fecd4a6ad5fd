// The NUMA node a device is attached to, for the per-rank start line: a GPU's from its PCI device
// in sysfs (<sys>/bus/pci/devices/<bus id>/numa_node), the CPU's from the node directory of the core
// the calling thread runs on (<sys>/devices/system/cpu/cpu<N>/node<K>). No libnuma; -1 when unknown
// (no sysfs, a machine without NUMA, or the kernel's own -1).
#pragma once
#include <string>

#include "core/device.h"

namespace zp {

int numa_node_of(Device d, const std::string& sys = "/sys");
int numa_node_of_pci(const std::string& bus_id, const std::string& sys = "/sys");
int numa_node_of_cpu(int cpu, const std::string& sys = "/sys");

}  // namespace zp
