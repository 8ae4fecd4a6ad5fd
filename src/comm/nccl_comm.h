// NcclComm: the Communicator for device memory (DESIGN decision 5). Buffers live on the CUDA device
// the communicator was built on; every call is enqueued on the given stream and returns at once
// (barrier excepted). wait(stream) is where the host blocks, under the watchdog: it polls the
// stream's completion and ncclCommGetAsyncError, and on an NCCL error or after the timeout it calls
// ncclCommAbort (which unblocks the device) and fatals, which MPI_Aborts the job.
//
// Construction is collective over the MPI group: its rank 0 creates the ncclUniqueId and
// broadcasts it over MPI (under the watchdog), then every rank joins with ncclCommInitRank.
// Wait for outstanding work before destroying a communicator. NCCL needs one device per rank.
#pragma once
#include <mpi.h>

#include <memory>

#include "comm/communicator.h"
#include "comm/watchdog.h"

namespace zp::comm {

// An NcclComm over `group` on the current CUDA device. Throws zp::Error in a build without CUDA or
// when there is no CUDA device.
std::unique_ptr<Communicator> make_nccl_comm(MPI_Comm group, double timeout_s = default_timeout_s());

}  // namespace zp::comm

#ifdef ZP_WITH_CUDA
struct ncclComm;  // what ncclComm_t points to (nccl.h)

namespace zp::comm {

class NcclComm final : public Communicator {
 public:
  NcclComm(MPI_Comm group, int cuda_device, double timeout_s = default_timeout_s());
  ~NcclComm() override;

  Backend backend() const override { return Backend::Nccl; }
  Device device() const override { return Device::cuda(device_); }
  ncclComm* nccl_comm() const { return comm_; }
  double timeout_s() const { return timeout_s_; }
  void set_timeout(double seconds);

 protected:
  void do_all_reduce(const void* send, void* recv, int64_t count, DType dt, ReduceOp op,
                     StreamHandle s) override;
  void do_reduce_scatter(const void* send, void* recv, int64_t count, DType dt, ReduceOp op,
                         StreamHandle s) override;
  void do_all_gather(const void* send, void* recv, int64_t count, DType dt, StreamHandle s) override;
  void do_broadcast(void* buf, int64_t count, DType dt, int root, StreamHandle s) override;
  void do_send(const void* buf, int64_t count, DType dt, int peer, StreamHandle s) override;
  void do_recv(void* buf, int64_t count, DType dt, int peer, StreamHandle s) override;
  void do_sendrecv(const void* send_buf, int64_t send_count, int dst, void* recv_buf, int64_t recv_count,
                   int src, DType dt, StreamHandle s) override;
  void do_barrier(StreamHandle s) override;
  void do_wait(StreamHandle s) override;

 private:
  // ncclCommAbort, then ZP_FATAL with `why`.
  [[noreturn]] void abort_and_die(const std::string& why);

  ncclComm* comm_ = nullptr;
  int device_ = 0;
  double timeout_s_ = 0;
  CUevent_st* done_ = nullptr;  // recorded by wait() to poll the stream without blocking on it
  float* barrier_word_ = nullptr;  // one device float all-reduced by barrier()
};

}  // namespace zp::comm
#endif
