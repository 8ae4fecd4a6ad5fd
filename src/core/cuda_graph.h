// A CUDA graph captured from the work one thread enqueues on one stream, replayed with one launch.
// Generation's decode steps are hundreds of small kernels each; at small batches the host's cost of
// launching them one by one is longer than the GPU's work, and a replayed graph removes it. Memory
// the captured work allocates from the stream-ordered pool becomes the graph's own (allocation
// nodes), so a replay never collides with tensors allocated since.
#pragma once
#include "core/device.h"

struct CUgraphExec_st;

namespace zp {

class CudaGraph {
 public:
  CudaGraph() = default;
  ~CudaGraph();
  CudaGraph(CudaGraph&& o) noexcept : exec_(o.exec_) { o.exec_ = nullptr; }
  CudaGraph& operator=(CudaGraph&& o) noexcept;
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;

  // Captures what `enqueue` puts on `s` (a stream of our own, not the legacy default stream) and
  // instantiates it; nothing runs until launch(). Calls from other threads are not captured.
  template <class F>
  static CudaGraph capture(StreamHandle s, F&& enqueue) {
    begin_capture(s);
    try {
      enqueue();
    } catch (...) {
      abandon_capture(s);
      throw;
    }
    return end_capture(s);
  }
  void launch(StreamHandle s) const;
  bool ready() const { return exec_ != nullptr; }

 private:
  static void begin_capture(StreamHandle s);
  static void abandon_capture(StreamHandle s);
  static CudaGraph end_capture(StreamHandle s);
  CUgraphExec_st* exec_ = nullptr;
};

}  // namespace zp
