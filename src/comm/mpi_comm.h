// MpiComm: the Communicator for host memory, on an MPI communicator. Synchronous: every call has
// finished when it returns (the stream argument is ignored). Each operation is started
// non-blocking and waited for under the watchdog (watchdog.h), so a rank that never arrives makes
// the others abort with the op's name after the timeout instead of hanging forever.
//
// MPI knows no 16-bit floats: bf16 and f16 travel as MPI_UINT16_T and are reduced by user-defined
// MPI_Ops that widen to float, combine and round back (what NCCL does per step as well).
// Counts must fit in an int (MPI's count type); a larger buffer is a programming error.
// One thread at a time may use a given MpiComm (MPI matches collectives by call order).
#pragma once
#include <mpi.h>

#include "comm/communicator.h"
#include "comm/watchdog.h"

namespace zp::comm {

class MpiComm final : public Communicator {
 public:
  // Duplicates `group` (collective over it): this communicator's messages can never match anyone
  // else's, and `group` may be freed afterwards.
  explicit MpiComm(MPI_Comm group, double timeout_s = default_timeout_s());
  ~MpiComm() override;

  Backend backend() const override { return Backend::Mpi; }
  Device device() const override { return Device::cpu(); }
  MPI_Comm mpi_comm() const { return comm_; }
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
  void do_wait(StreamHandle) override {}

 private:
  // Waits for `reqs` under the watchdog; on timeout fatals naming op, count and dtype (count < 0:
  // an op without payload).
  void finish(MPI_Request* reqs, int n, const char* op, int64_t count, DType dt);

  MPI_Comm comm_ = MPI_COMM_NULL;
  double timeout_s_;
};

// The MPI datatype that carries `dt` (MPI_UINT16_T for bf16 and f16).
MPI_Datatype mpi_datatype(DType dt);
// The MPI_Op computing `op` on `dt`; Avg maps to the sum (the caller divides afterwards).
MPI_Op mpi_op(ReduceOp op, DType dt);

}  // namespace zp::comm
