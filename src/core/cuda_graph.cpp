#include "core/cuda_graph.h"

#include "core/error.h"
#ifdef ZP_WITH_CUDA
#include "core/cuda_check.h"
#endif

namespace zp {

#ifdef ZP_WITH_CUDA
CudaGraph::~CudaGraph() {
  if (exec_) cudaGraphExecDestroy(exec_);
}

CudaGraph& CudaGraph::operator=(CudaGraph&& o) noexcept {
  if (this != &o) {
    if (exec_) cudaGraphExecDestroy(exec_);
    exec_ = o.exec_;
    o.exec_ = nullptr;
  }
  return *this;
}

void CudaGraph::begin_capture(StreamHandle s) {
  ZP_CHECK(s != nullptr, "CudaGraph: the legacy default stream cannot be captured");
  ZP_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
}

void CudaGraph::abandon_capture(StreamHandle s) {
  cudaGraph_t g = nullptr;
  cudaStreamEndCapture(s, &g);
  if (g) cudaGraphDestroy(g);
  cudaGetLastError();
}

CudaGraph CudaGraph::end_capture(StreamHandle s) {
  cudaGraph_t g = nullptr;
  ZP_CUDA_CHECK(cudaStreamEndCapture(s, &g));
  CudaGraph out;
  // Graph-owned allocations are freed inside the graph, so a replay may start before the last one's
  // memory is released: no flag needed.
  const cudaError_t e = cudaGraphInstantiate(&out.exec_, g, 0);
  cudaGraphDestroy(g);
  ZP_CUDA_CHECK(e);
  return out;
}

void CudaGraph::launch(StreamHandle s) const {
  ZP_CHECK(exec_, "CudaGraph::launch before a capture");
  ZP_CUDA_CHECK(cudaGraphLaunch(exec_, s));
}
#else
CudaGraph::~CudaGraph() = default;
CudaGraph& CudaGraph::operator=(CudaGraph&& o) noexcept {
  exec_ = o.exec_;
  o.exec_ = nullptr;
  return *this;
}
void CudaGraph::begin_capture(StreamHandle) { ZP_FATAL("CUDA graphs in a CPU-only build"); }
void CudaGraph::abandon_capture(StreamHandle) {}
CudaGraph CudaGraph::end_capture(StreamHandle) { ZP_FATAL("CUDA graphs in a CPU-only build"); }
void CudaGraph::launch(StreamHandle) const { ZP_FATAL("CUDA graphs in a CPU-only build"); }
#endif

}  // namespace zp
