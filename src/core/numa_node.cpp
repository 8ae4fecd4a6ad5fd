#include "core/numa_node.h"

#include <sched.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>

namespace zp {

int numa_node_of_pci(const std::string& bus_id, const std::string& sys) {
  if (bus_id.empty()) return -1;
  std::string id = bus_id;  // CUDA writes the hex digits in upper case, sysfs in lower case
  std::transform(id.begin(), id.end(), id.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  std::ifstream in(sys + "/bus/pci/devices/" + id + "/numa_node");
  int node = -1;
  if (!(in >> node)) return -1;
  return node < 0 ? -1 : node;
}

int numa_node_of_cpu(int cpu, const std::string& sys) {
  if (cpu < 0) return -1;
  std::error_code ec;
  const std::filesystem::path dir = sys + "/devices/system/cpu/cpu" + std::to_string(cpu);
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.size() > 4 && name.compare(0, 4, "node") == 0 &&
        std::all_of(name.begin() + 4, name.end(), [](unsigned char c) { return std::isdigit(c); }))
      return std::stoi(name.substr(4));
  }
  return -1;
}

int numa_node_of(Device d, const std::string& sys) {
  if (d.is_cuda()) return numa_node_of_pci(cuda_pci_bus_id(d.index), sys);
  return numa_node_of_cpu(sched_getcpu(), sys);
}

}  // namespace zp
