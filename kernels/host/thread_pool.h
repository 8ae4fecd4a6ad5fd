// A pool of threads created once and reused: the offload tier's optimizer runs once per block per step,
// and starting threads per call (as the reference AdamW does) costs more than a small block's update.
// The calling thread takes part as worker 0, so a pool of N threads starts N - 1. run() may be called
// from any thread; calls on one pool are serialised, separate pools run concurrently.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace zp::kernels::host {

class ThreadPool {
 public:
  explicit ThreadPool(int threads = 0);  // 0: std::thread::hardware_concurrency()
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return int(workers_.size()) + 1; }
  // Calls fn(worker) once on each of the size() threads, worker in [0, size()), and returns when all
  // have returned. An exception thrown by fn is rethrown here (the first one, if several threw).
  void run(const std::function<void(int worker)>& fn);

 private:
  void worker_loop(int worker);

  std::mutex run_mutex_;  // one run() at a time
  std::mutex mutex_;      // guards what follows
  std::condition_variable wake_, done_;
  const std::function<void(int)>* job_ = nullptr;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
  std::vector<std::thread> workers_;
};

}  // namespace zp::kernels::host
