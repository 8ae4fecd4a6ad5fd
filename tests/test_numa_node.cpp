// The NUMA node of a device from a fake sysfs tree: a GPU's PCI device, the CPU's core, and -1 when
// sysfs says nothing or says -1.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/numa_node.h"

namespace zp::test {
namespace fs = std::filesystem;

TEST(NumaNode, ReadsPciDeviceAndCpuCoreFromSysfs) {
  const fs::path sys = fs::temp_directory_path() / "zp_fake_sys";
  fs::remove_all(sys);
  fs::create_directories(sys / "bus/pci/devices/0000:1b:00.0");
  std::ofstream(sys / "bus/pci/devices/0000:1b:00.0/numa_node") << "1\n";
  fs::create_directories(sys / "bus/pci/devices/0000:2c:00.0");
  std::ofstream(sys / "bus/pci/devices/0000:2c:00.0/numa_node") << "-1\n";
  fs::create_directories(sys / "devices/system/cpu/cpu3/node2");
  fs::create_directories(sys / "devices/system/cpu/cpu3/cache");
  fs::create_directories(sys / "devices/system/cpu/cpu4/cache");
  EXPECT_EQ(numa_node_of_pci("0000:1B:00.0", sys.string()), 1) << "CUDA's upper-case bus id";
  EXPECT_EQ(numa_node_of_pci("0000:2c:00.0", sys.string()), -1) << "the kernel's own unknown";
  EXPECT_EQ(numa_node_of_pci("0000:99:00.0", sys.string()), -1);
  EXPECT_EQ(numa_node_of_pci("", sys.string()), -1);
  EXPECT_EQ(numa_node_of_cpu(3, sys.string()), 2);
  EXPECT_EQ(numa_node_of_cpu(4, sys.string()), -1) << "no node directory";
  EXPECT_EQ(numa_node_of_cpu(5, sys.string()), -1);
  EXPECT_GE(numa_node_of(Device::cpu()), -1);
  fs::remove_all(sys);
}

}  // namespace zp::test
