// Bounded host waits (core/host_wait.h): polling ends when the awaited thing is done or the deadline
// passes; on a GPU, a host wait on a stream whose work never finishes ends the process naming the
// device watchdog instead of blocking for ever.
#include <atomic>
#include <chrono>
#include <thread>

#include "core/host_wait.h"
#include "core/tensor.h"
#include "test_util.h"
#ifdef ZP_WITH_CUDA
#include "core/cuda_check.h"
#endif

namespace zp::test {

TEST(HostWait, PollUntilReturnsWhenDoneOrAtTheDeadline) {
  int calls = 0;
  EXPECT_EQ(poll_until([&] { return ++calls == 3; }, 10.0), WaitStatus::Done);
  EXPECT_EQ(calls, 3);

  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(poll_until([] { return false; }, 0.05), WaitStatus::TimedOut);
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GE(waited, 0.05);
  EXPECT_LT(waited, 5.0) << "a timed-out wait ends near its deadline";

  // Done by the time the deadline is checked: done, not timed out.
  std::atomic<bool> flag{false};
  std::thread setter([&] { flag = true; });
  setter.join();
  EXPECT_EQ(poll_until([&] { return flag.load(); }, 0.0), WaitStatus::Done);
}

#ifdef ZP_WITH_CUDA
namespace {
std::atomic<bool> g_release{false};
// A stream that never gets past this point: its host function blocks until released, as an NCCL
// receive whose peer never sends blocks its stream.
void block_stream(cudaStream_t s) {
  ZP_CUDA_CHECK(cudaLaunchHostFunc(
      s, [](void*) { while (!g_release) std::this_thread::sleep_for(std::chrono::milliseconds(1)); }, nullptr));
}
}  // namespace

TEST(DeviceWaitGpu, AStuckStreamEndsTheProcessNamingTheWatchdog) {
  ZP_SKIP_WITHOUT_GPU();
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // the child starts afresh: CUDA does not survive fork
  EXPECT_DEATH(
      {
        setenv("ZP_COMM_TIMEOUT_S", "0.5", 1);
        Stream s(Device::cuda(0));
        block_stream(s.handle());
        Event e;
        e.record(s.handle());
        e.synchronize();
      },
      "device watchdog: the work before an event did not finish within 0.5 s");
  EXPECT_DEATH(
      {
        setenv("ZP_COMM_TIMEOUT_S", "0.5", 1);
        Stream s(Device::cuda(0));
        Tensor d = Tensor::zeros({16}, DType::F32, Device::cuda(0), "test", s.handle());
        block_stream(s.handle());
        Tensor h = d.to(Device::cpu(), s.handle());  // a download waits for the stream first
      },
      "device watchdog: a stream's work did not finish within 0.5 s");
  // A stream that does finish is waited for as before.
  Stream s(Device::cuda(0));
  Tensor d = Tensor::zeros({16}, DType::F32, Device::cuda(0), "test", s.handle());
  Tensor h = d.to(Device::cpu(), s.handle());
  EXPECT_EQ(h.data<float>()[15], 0.f);
  s.synchronize();
}
#endif

}  // namespace zp::test
