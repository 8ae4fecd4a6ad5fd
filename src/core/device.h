// Devices, streams and events. Stream handles are CUstream_st* (what cudaStream_t is), declared here
// without CUDA headers so the CPU-only build and CPU code share every signature.
#pragma once
#include <cstdint>
#include <string>

struct CUstream_st;
struct CUevent_st;

namespace zp {

using StreamHandle = CUstream_st*;  // nullptr = the legacy default stream (or "no stream" on the CPU)

enum class DeviceKind : uint8_t { Cpu, Cuda };

struct Device {
  DeviceKind kind = DeviceKind::Cpu;
  int index = 0;
  static Device cpu() { return {DeviceKind::Cpu, 0}; }
  static Device cuda(int i = 0) { return {DeviceKind::Cuda, i}; }
  bool is_cuda() const { return kind == DeviceKind::Cuda; }
  bool is_cpu() const { return kind == DeviceKind::Cpu; }
  bool operator==(const Device&) const = default;
  std::string str() const { return is_cuda() ? "cuda:" + std::to_string(index) : "cpu"; }
};

// Number of usable CUDA devices; 0 in the CPU-only build or when the driver finds none.
int cuda_device_count();
// Human-readable reason why there is no CUDA device (for test skips and errors).
std::string cuda_unavailable_reason();
// Free and total memory of CUDA device `index` in bytes, as the driver reports them now.
void cuda_memory_info(int index, size_t& free, size_t& total);

// An owned CUDA stream (non-blocking). On a CPU device it holds nothing.
class Stream {
 public:
  Stream() = default;
  explicit Stream(Device d, int priority = 0);
  ~Stream();
  Stream(Stream&& o) noexcept : h_(o.h_), dev_(o.dev_) { o.h_ = nullptr; }
  Stream& operator=(Stream&& o) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  StreamHandle handle() const { return h_; }
  Device device() const { return dev_; }
  void synchronize() const;

 private:
  StreamHandle h_ = nullptr;
  Device dev_;
};

// An owned CUDA event (timing enabled). Used to order streams and to time kernels.
class Event {
 public:
  Event();
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  void record(StreamHandle s);
  void wait_on(StreamHandle s) const;  // make `s` wait for this event
  void synchronize() const;
  float elapsed_ms_since(const Event& start) const;

 private:
  CUevent_st* e_ = nullptr;
};

// Peak dense bf16 tensor-core rate of CUDA device `index` in TFLOP/s at its maximum clock
// (SMs x clock x 4096 flop/clk/SM on sm_90, 2048 on sm_80; 0 for architectures we have no figure
// for), and its DRAM bandwidth in GB/s (2 x memory clock x bus width). Used for MFU and benchmarks.
double cuda_peak_bf16_tflops(int index);
double cuda_peak_dram_gbs(int index);
// Whether device `index` computes in bf16 at full speed (Ampere, compute capability 8, and later).
bool cuda_supports_bf16(int index);
std::string cuda_device_name(int index);
// Device `index`'s PCI bus id, "0000:1b:00.0" as CUDA writes it; "" when unknown.
std::string cuda_pci_bus_id(int index);

void device_synchronize();
// Makes `d` the calling thread's current CUDA device (a thread starts on device 0); nothing for the CPU.
void set_current_device(Device d);
void stream_synchronize(StreamHandle s);

}  // namespace zp
