// Communicator: the one collective interface of the engine (DESIGN decision 5). One instance per
// group of ranks (world, data, tensor or pipeline group). Two implementations:
//   MpiComm  (mpi_comm.h)   host memory, any dtype, synchronous: every call has finished on return;
//   NcclComm (nccl_comm.h)  device memory of the current CUDA device, enqueued on the given stream.
// So code written against Communicator runs unchanged on CPUs under mpirun and on GPUs.
//
// Every call is collective over the group (send/recv/sendrecv over the two peers): all members call
// it in the same order with the same count, dtype, op and root. Counts are elements, not bytes.
// In-place forms, matching NCCL:
//   all_reduce      recv == send;
//   reduce_scatter  recv == send + rank*count (this rank's block of the input);
//   all_gather      send == recv + rank*count (this rank's block of the output);
//   broadcast       always in place.
// Any other overlap of send and recv is a programming error (ZP_CHECK).
// In-place reduce_scatter may leave the other blocks of the input modified.
//
// Avg is Sum followed by division by size(); on integer dtypes the division truncates.
// wait(stream) blocks the host until this communicator's work enqueued on `stream` has finished,
// under the watchdog (watchdog.h): a collective that does not finish within the timeout aborts the
// whole job with the op's name instead of hanging.
#pragma once
#include <cstdint>
#include <string_view>

#include "core/device.h"
#include "core/dtype.h"

namespace zp::comm {

enum class ReduceOp : uint8_t { Sum, Max, Min, Avg };
enum class Backend : uint8_t { Mpi, Nccl };

std::string_view reduce_op_name(ReduceOp op);
std::string_view backend_name(Backend b);

class Communicator {
 public:
  virtual ~Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  virtual Backend backend() const = 0;
  // Where the buffers must live: cpu for MPI, the CUDA device the communicator was built on for NCCL.
  virtual Device device() const = 0;
  DeviceKind device_kind() const { return device().kind; }

  // recv[i] = op over ranks of send[i], i < count.
  void all_reduce(const void* send, void* recv, int64_t count, DType dt, ReduceOp op,
                  StreamHandle s = nullptr);
  // send holds size()*count elements; recv[i] = op over ranks of send[rank()*count + i].
  void reduce_scatter(const void* send, void* recv, int64_t count, DType dt, ReduceOp op,
                      StreamHandle s = nullptr);
  // send holds count elements; recv[r*count + i] = send of rank r [i].
  void all_gather(const void* send, void* recv, int64_t count, DType dt, StreamHandle s = nullptr);
  // buf of `root` is copied into buf of every rank.
  void broadcast(void* buf, int64_t count, DType dt, int root, StreamHandle s = nullptr);
  // Point to point. A rank that both sends and receives in one step (a ring, a pipeline exchange)
  // must use sendrecv: two separate blocking calls would deadlock.
  void send(const void* buf, int64_t count, DType dt, int peer, StreamHandle s = nullptr);
  void recv(void* buf, int64_t count, DType dt, int peer, StreamHandle s = nullptr);
  void sendrecv(const void* send_buf, int64_t send_count, int dst, void* recv_buf, int64_t recv_count,
                int src, DType dt, StreamHandle s = nullptr);
  // Returns on each rank only after every rank of the group has called it (host-side, under the
  // watchdog, for both backends).
  void barrier(StreamHandle s = nullptr);
  // Blocks until the work this communicator enqueued on `s` has finished (no-op for MPI).
  void wait(StreamHandle s = nullptr) { do_wait(s); }

 protected:
  Communicator(int rank, int size) : rank_(rank), size_(size) {}

  // Arguments arrive checked (ranks in range, counts >= 0, in-place forms valid).
  virtual void do_all_reduce(const void* send, void* recv, int64_t count, DType dt, ReduceOp op,
                             StreamHandle s) = 0;
  virtual void do_reduce_scatter(const void* send, void* recv, int64_t count, DType dt, ReduceOp op,
                                 StreamHandle s) = 0;
  virtual void do_all_gather(const void* send, void* recv, int64_t count, DType dt, StreamHandle s) = 0;
  virtual void do_broadcast(void* buf, int64_t count, DType dt, int root, StreamHandle s) = 0;
  virtual void do_send(const void* buf, int64_t count, DType dt, int peer, StreamHandle s) = 0;
  virtual void do_recv(void* buf, int64_t count, DType dt, int peer, StreamHandle s) = 0;
  virtual void do_sendrecv(const void* send_buf, int64_t send_count, int dst, void* recv_buf,
                           int64_t recv_count, int src, DType dt, StreamHandle s) = 0;
  virtual void do_barrier(StreamHandle s) = 0;
  virtual void do_wait(StreamHandle s) = 0;

 private:
  int rank_, size_;
};

}  // namespace zp::comm
