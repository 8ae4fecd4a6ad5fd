#include "comm/nccl_comm.h"

#include "core/device.h"
#include "core/error.h"

#ifdef ZP_WITH_CUDA
#include <nccl.h>

#include <string>

#include "core/cuda_check.h"

namespace zp::comm {
namespace {

ncclDataType_t nccl_dtype(DType dt) {
  switch (dt) {
    case DType::F32: return ncclFloat32;
    case DType::F64: return ncclFloat64;
    case DType::BF16: return ncclBfloat16;
    case DType::F16: return ncclFloat16;
    case DType::I32: return ncclInt32;
    case DType::I64: return ncclInt64;
    case DType::U8: return ncclUint8;
  }
  ZP_FATAL("no NCCL datatype for dtype ", int(dt));
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Max: return ncclMax;
    case ReduceOp::Min: return ncclMin;
    case ReduceOp::Avg: return ncclAvg;
  }
  ZP_FATAL("no NCCL op for ", int(op));
}

cudaStream_t stream_of(StreamHandle s) { return reinterpret_cast<cudaStream_t>(s); }

}  // namespace

NcclComm::NcclComm(MPI_Comm group, int cuda_device, double timeout_s)
    : Communicator([&] { int r = 0; ZP_MPI_CHECK(MPI_Comm_rank(group, &r)); return r; }(),
                   [&] { int n = 0; ZP_MPI_CHECK(MPI_Comm_size(group, &n)); return n; }()),
      device_(cuda_device) {
  set_timeout(timeout_s);
  ncclUniqueId id{};
  if (rank() == 0) ZP_NCCL_CHECK(ncclGetUniqueId(&id));
  MPI_Request req;
  ZP_MPI_CHECK(MPI_Ibcast(&id, int(sizeof(id)), MPI_BYTE, 0, group, &req));
  wait_or_die(&req, 1, timeout_s_, "broadcast of the NCCL unique id");
  ZP_CUDA_CHECK(cudaSetDevice(device_));
  ncclComm_t c = nullptr;
  ZP_NCCL_CHECK(ncclCommInitRank(&c, size(), id, rank()));
  comm_ = c;
  cudaEvent_t e = nullptr;
  ZP_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  done_ = e;
  ZP_CUDA_CHECK(cudaMalloc(&barrier_word_, sizeof(float)));
  ZP_CUDA_CHECK(cudaMemset(barrier_word_, 0, sizeof(float)));
}

NcclComm::~NcclComm() {
  if (done_) cudaEventDestroy(reinterpret_cast<cudaEvent_t>(done_));
  if (barrier_word_) cudaFree(barrier_word_);
  if (comm_) ncclCommDestroy(comm_);
}

void NcclComm::set_timeout(double seconds) {
  ZP_REQUIRE(seconds > 0, "communicator timeout must be positive, got ", seconds);
  timeout_s_ = seconds;
}

void NcclComm::abort_and_die(const std::string& why) {
  ncclComm_t c = comm_;
  comm_ = nullptr;
  if (c) ncclCommAbort(c);
  ZP_FATAL(why);
}

void NcclComm::do_all_reduce(const void* send, void* recv, int64_t count, DType dt, ReduceOp op,
                             StreamHandle s) {
  if (count == 0) return;  // every rank has the same count, so every rank skips
  ZP_NCCL_CHECK(ncclAllReduce(send, recv, size_t(count), nccl_dtype(dt), nccl_op(op), comm_, stream_of(s)));
}

void NcclComm::do_reduce_scatter(const void* send, void* recv, int64_t count, DType dt, ReduceOp op,
                                 StreamHandle s) {
  if (count == 0) return;
  ZP_NCCL_CHECK(ncclReduceScatter(send, recv, size_t(count), nccl_dtype(dt), nccl_op(op), comm_, stream_of(s)));
}

void NcclComm::do_all_gather(const void* send, void* recv, int64_t count, DType dt, StreamHandle s) {
  if (count == 0) return;
  ZP_NCCL_CHECK(ncclAllGather(send, recv, size_t(count), nccl_dtype(dt), comm_, stream_of(s)));
}

void NcclComm::do_broadcast(void* buf, int64_t count, DType dt, int root, StreamHandle s) {
  if (count == 0) return;
  ZP_NCCL_CHECK(ncclBroadcast(buf, buf, size_t(count), nccl_dtype(dt), root, comm_, stream_of(s)));
}

void NcclComm::do_send(const void* buf, int64_t count, DType dt, int peer, StreamHandle s) {
  if (count == 0) return;  // the receiver's count is 0 as well
  ZP_NCCL_CHECK(ncclSend(buf, size_t(count), nccl_dtype(dt), peer, comm_, stream_of(s)));
}

void NcclComm::do_recv(void* buf, int64_t count, DType dt, int peer, StreamHandle s) {
  if (count == 0) return;
  ZP_NCCL_CHECK(ncclRecv(buf, size_t(count), nccl_dtype(dt), peer, comm_, stream_of(s)));
}

void NcclComm::do_sendrecv(const void* send_buf, int64_t send_count, int dst, void* recv_buf,
                           int64_t recv_count, int src, DType dt, StreamHandle s) {
  // Fused in one group so both directions progress together (a ring would deadlock otherwise).
  // An empty direction is skipped on both ends (dst's recv_count is our send_count).
  ZP_NCCL_CHECK(ncclGroupStart());
  if (send_count > 0)
    ZP_NCCL_CHECK(ncclSend(send_buf, size_t(send_count), nccl_dtype(dt), dst, comm_, stream_of(s)));
  if (recv_count > 0)
    ZP_NCCL_CHECK(ncclRecv(recv_buf, size_t(recv_count), nccl_dtype(dt), src, comm_, stream_of(s)));
  ZP_NCCL_CHECK(ncclGroupEnd());
}

void NcclComm::do_barrier(StreamHandle s) {
  ZP_NCCL_CHECK(ncclAllReduce(barrier_word_, barrier_word_, 1, ncclFloat32, ncclSum, comm_, stream_of(s)));
  do_wait(s);
}

void NcclComm::do_wait(StreamHandle s) {
  ZP_CHECK(comm_ != nullptr, "NCCL communicator was aborted");
  cudaEvent_t e = reinterpret_cast<cudaEvent_t>(done_);
  ZP_CUDA_CHECK(cudaEventRecord(e, stream_of(s)));
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s_);
  Backoff backoff;
  for (;;) {
    ncclResult_t async = ncclSuccess;
    ZP_NCCL_CHECK(ncclCommGetAsyncError(comm_, &async));
    if (async != ncclSuccess && async != ncclInProgress)
      abort_and_die(detail::cat("NCCL asynchronous error on rank ", rank(), " of a group of ", size(), ": ",
                                ncclGetErrorString(async), " (", ncclGetLastError(comm_), ")"));
    cudaError_t q = cudaEventQuery(e);
    if (q == cudaSuccess) return;
    if (q != cudaErrorNotReady)
      abort_and_die(detail::cat("waiting for NCCL work: ", cudaGetErrorName(q), ": ", cudaGetErrorString(q)));
    if (std::chrono::steady_clock::now() >= deadline)
      abort_and_die(detail::cat("communication watchdog: NCCL work on rank ", rank(), " of a group of ", size(),
                                " did not finish within ", timeout_s_,
                                " s; another rank is dead, stuck or not calling the same collective"
                                " (ZP_COMM_TIMEOUT_S sets the limit)"));
    backoff.pause();
  }
}

std::unique_ptr<Communicator> make_nccl_comm(MPI_Comm group, double timeout_s) {
  ZP_REQUIRE(cuda_device_count() > 0, "NCCL communicator requested but ", cuda_unavailable_reason());
  int dev = 0;
  ZP_CUDA_CHECK(cudaGetDevice(&dev));
  return std::make_unique<NcclComm>(group, dev, timeout_s);
}

}  // namespace zp::comm

#else  // !ZP_WITH_CUDA

namespace zp::comm {
std::unique_ptr<Communicator> make_nccl_comm(MPI_Comm, double) {
  ZP_REQUIRE(false, "NCCL communicator requested but this build has no CUDA (ZP_CUDA=OFF)");
  return nullptr;
}
}  // namespace zp::comm

#endif
