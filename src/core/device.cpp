#include "core/device.h"

#include <functional>

#include "core/error.h"
#include "core/host_wait.h"
#ifdef ZP_WITH_CUDA
#include "core/cuda_check.h"
#endif

namespace zp {

#ifdef ZP_WITH_CUDA
namespace {
// A host wait on the device, bounded (core/host_wait.h): work queued on a stream may wait on an
// NCCL receive whose send never comes (a pipeline peer that hangs), and cudaStreamSynchronize would
// then block for ever. `query` is cudaStreamQuery or cudaEventQuery of what is waited for.
void wait_for_device(const std::function<cudaError_t()>& query, const char* what) {
  cudaError_t last = cudaSuccess;
  const double limit = wait_timeout_s();
  if (poll_until([&] { return (last = query()) != cudaErrorNotReady; }, limit) == WaitStatus::TimedOut)
    ZP_FATAL("device watchdog: ", what, " did not finish within ", limit,
             " s; work queued on the GPU waits for something that never came (an NCCL transfer whose peer"
             " is dead or stuck?); ZP_COMM_TIMEOUT_S sets the limit");
  ZP_CUDA_CHECK(last);
}
}  // namespace

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
}
std::string cuda_unavailable_reason() {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return std::string("no CUDA device: ") + cudaGetErrorString(e);
  }
  return n == 0 ? "no CUDA device found" : "";
}
Stream::Stream(Device d, int priority) : dev_(d) {
  if (d.is_cuda()) {
    ZP_CUDA_CHECK(cudaSetDevice(d.index));
    ZP_CUDA_CHECK(cudaStreamCreateWithPriority(&h_, cudaStreamNonBlocking, priority));
  }
}
Stream::~Stream() {
  if (h_) cudaStreamDestroy(h_);
}
Stream& Stream::operator=(Stream&& o) noexcept {
  if (this != &o) {
    if (h_) cudaStreamDestroy(h_);
    h_ = o.h_;
    dev_ = o.dev_;
    o.h_ = nullptr;
  }
  return *this;
}
void Stream::synchronize() const {
  if (h_) wait_for_device([this] { return cudaStreamQuery(h_); }, "a stream's work");
}
Event::Event() { ZP_CUDA_CHECK(cudaEventCreate(&e_)); }
Event::~Event() {
  if (e_) cudaEventDestroy(e_);
}
void Event::record(StreamHandle s) { ZP_CUDA_CHECK(cudaEventRecord(e_, s)); }
void Event::wait_on(StreamHandle s) const { ZP_CUDA_CHECK(cudaStreamWaitEvent(s, e_, 0)); }
void Event::synchronize() const {
  wait_for_device([this] { return cudaEventQuery(e_); }, "the work before an event");
}
float Event::elapsed_ms_since(const Event& start) const {
  float ms = 0;
  ZP_CUDA_CHECK(cudaEventElapsedTime(&ms, start.e_, e_));
  return ms;
}
void device_synchronize() { ZP_CUDA_CHECK(cudaDeviceSynchronize()); }

double cuda_peak_bf16_tflops(int index) {
  int sms = 0, clk_khz = 0, major = 0, minor = 0;
  ZP_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, index));
  ZP_CUDA_CHECK(cudaDeviceGetAttribute(&clk_khz, cudaDevAttrClockRate, index));
  ZP_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, index));
  ZP_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, index));
  const double per_clk = major == 9 ? 4096 : (major == 8 && minor == 0 ? 2048 : 0);
  return sms * (clk_khz * 1e3) * per_clk / 1e12;
}

bool cuda_supports_bf16(int index) {
  int major = 0;
  ZP_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, index));
  return major >= 8;
}

double cuda_peak_dram_gbs(int index) {
  int mem_khz = 0, bus_bits = 0;
  ZP_CUDA_CHECK(cudaDeviceGetAttribute(&mem_khz, cudaDevAttrMemoryClockRate, index));
  ZP_CUDA_CHECK(cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, index));
  return 2.0 * (mem_khz * 1e3) * bus_bits / 8 / 1e9;
}

std::string cuda_device_name(int index) {
  cudaDeviceProp p{};
  ZP_CUDA_CHECK(cudaGetDeviceProperties(&p, index));
  return p.name;
}
std::string cuda_pci_bus_id(int index) {
  char id[64] = {0};
  if (cudaDeviceGetPCIBusId(id, int(sizeof(id)), index) != cudaSuccess) return "";
  return id;
}
void stream_synchronize(StreamHandle s) {
  wait_for_device([s] { return cudaStreamQuery(s); }, "a stream's work");
}
void cuda_memory_info(int index, size_t& free, size_t& total) {
  int current = 0;
  ZP_CUDA_CHECK(cudaGetDevice(&current));
  ZP_CUDA_CHECK(cudaSetDevice(index));
  ZP_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  ZP_CUDA_CHECK(cudaSetDevice(current));
}
void set_current_device(Device d) {
  if (d.is_cuda()) ZP_CUDA_CHECK(cudaSetDevice(d.index));
}
#else
int cuda_device_count() { return 0; }
void cuda_memory_info(int, size_t& free, size_t& total) { free = total = 0; }
std::string cuda_unavailable_reason() { return "built without CUDA (ZP_CUDA=OFF)"; }
Stream::Stream(Device d, int) : dev_(d) {
  ZP_CHECK(!d.is_cuda(), "CUDA stream requested in a CPU-only build");
}
Stream::~Stream() = default;
Stream& Stream::operator=(Stream&& o) noexcept { dev_ = o.dev_; return *this; }
void Stream::synchronize() const {}
Event::Event() = default;
Event::~Event() = default;
void Event::record(StreamHandle) {}
void Event::wait_on(StreamHandle) const {}
void Event::synchronize() const {}
float Event::elapsed_ms_since(const Event&) const { return 0.f; }
void device_synchronize() {}
void set_current_device(Device d) { ZP_CHECK(!d.is_cuda(), "CUDA device requested in a CPU-only build"); }
double cuda_peak_bf16_tflops(int) { return 0; }
double cuda_peak_dram_gbs(int) { return 0; }
bool cuda_supports_bf16(int) { return false; }
std::string cuda_device_name(int) { return "none"; }
std::string cuda_pci_bus_id(int) { return ""; }
void stream_synchronize(StreamHandle) {}
#endif

}  // namespace zp
