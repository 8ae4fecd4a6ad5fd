#include "comm/mpi_comm.h"

#include <array>
#include <climits>
#include <cstring>
#include <string>

#include "core/error.h"

namespace zp::comm {
namespace {

int comm_rank(MPI_Comm c) {
  int r = 0;
  ZP_MPI_CHECK(MPI_Comm_rank(c, &r));
  return r;
}
int comm_size(MPI_Comm c) {
  int n = 0;
  ZP_MPI_CHECK(MPI_Comm_size(c, &n));
  return n;
}

int mpi_count(int64_t count, const char* op) {
  ZP_CHECK(count <= INT_MAX, op, ": ", count, " elements do not fit MPI's int count; split the buffer");
  return int(count);
}

// User-defined reductions of 16-bit floats: widen to float, combine, round back.
struct SumF { float operator()(float a, float b) const { return a + b; } };
struct MaxF { float operator()(float a, float b) const { return a > b ? a : b; } };
struct MinF { float operator()(float a, float b) const { return a < b ? a : b; } };

template <class H, class F>
void reduce_16bit(void* in, void* inout, int* len, MPI_Datatype*) {
  const H* a = static_cast<const H*>(in);
  H* b = static_cast<H*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = H(F()(float(a[i]), float(b[i])));
}

// The six 16-bit ops, created on first use (MPI must be initialised by then) and kept until
// MPI_Finalize, which frees them.
struct HalfOps {
  std::array<MPI_Op, 3> bf16{}, f16{};  // sum, max, min
  HalfOps() {
    ZP_MPI_CHECK(MPI_Op_create(&reduce_16bit<zp::bf16, SumF>, 1, &bf16[0]));
    ZP_MPI_CHECK(MPI_Op_create(&reduce_16bit<zp::bf16, MaxF>, 1, &bf16[1]));
    ZP_MPI_CHECK(MPI_Op_create(&reduce_16bit<zp::bf16, MinF>, 1, &bf16[2]));
    ZP_MPI_CHECK(MPI_Op_create(&reduce_16bit<zp::f16, SumF>, 1, &f16[0]));
    ZP_MPI_CHECK(MPI_Op_create(&reduce_16bit<zp::f16, MaxF>, 1, &f16[1]));
    ZP_MPI_CHECK(MPI_Op_create(&reduce_16bit<zp::f16, MinF>, 1, &f16[2]));
  }
};

template <class T>
void divide_ints(void* buf, int64_t n, int by) {
  T* p = static_cast<T*>(buf);
  for (int64_t i = 0; i < n; ++i) p[i] = T(p[i] / T(by));
}
template <class T>
void scale_floats(void* buf, int64_t n, float s) {
  T* p = static_cast<T*>(buf);
  for (int64_t i = 0; i < n; ++i) p[i] = T(float(p[i]) * s);
}

// Avg = Sum, then this: divides the reduced values by the group size.
void divide_by(void* buf, int64_t n, DType dt, int size) {
  switch (dt) {
    case DType::F32: scale_floats<float>(buf, n, 1.f / float(size)); break;
    case DType::F64: {
      double* p = static_cast<double*>(buf);
      for (int64_t i = 0; i < n; ++i) p[i] /= double(size);
      break;
    }
    case DType::BF16: scale_floats<bf16>(buf, n, 1.f / float(size)); break;
    case DType::F16: scale_floats<f16>(buf, n, 1.f / float(size)); break;
    case DType::I32: divide_ints<int32_t>(buf, n, size); break;
    case DType::I64: divide_ints<int64_t>(buf, n, size); break;
    case DType::U8: divide_ints<uint8_t>(buf, n, size); break;
  }
}

}  // namespace

MPI_Datatype mpi_datatype(DType dt) {
  switch (dt) {
    case DType::F32: return MPI_FLOAT;
    case DType::F64: return MPI_DOUBLE;
    case DType::BF16: case DType::F16: return MPI_UINT16_T;
    case DType::I32: return MPI_INT32_T;
    case DType::I64: return MPI_INT64_T;
    case DType::U8: return MPI_UINT8_T;
  }
  ZP_FATAL("no MPI datatype for dtype ", int(dt));
}

MPI_Op mpi_op(ReduceOp op, DType dt) {
  int k = op == ReduceOp::Max ? 1 : op == ReduceOp::Min ? 2 : 0;  // Avg reduces as Sum
  if (dt == DType::BF16 || dt == DType::F16) {
    static HalfOps ops;
    return dt == DType::BF16 ? ops.bf16[size_t(k)] : ops.f16[size_t(k)];
  }
  return k == 1 ? MPI_MAX : k == 2 ? MPI_MIN : MPI_SUM;
}

MpiComm::MpiComm(MPI_Comm group, double timeout_s)
    : Communicator(comm_rank(group), comm_size(group)), timeout_s_(timeout_s) {
  set_timeout(timeout_s);
  ZP_MPI_CHECK(MPI_Comm_dup(group, &comm_));
  // Errors come back as return codes so ZP_MPI_CHECK can print MPI's message.
  ZP_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
}

MpiComm::~MpiComm() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

void MpiComm::set_timeout(double seconds) {
  ZP_REQUIRE(seconds > 0, "communicator timeout must be positive, got ", seconds);
  timeout_s_ = seconds;
}

void MpiComm::finish(MPI_Request* reqs, int n, const char* op, int64_t count, DType dt) {
  if (wait_for(reqs, n, timeout_s_) == WaitStatus::Done) return;
  std::string what = count < 0 ? std::string(op) : detail::cat(op, " of ", count, " ", dtype_name(dt));
  ZP_FATAL("communication watchdog: MPI ", what, " on rank ", rank(), " of a group of ", size(),
           " did not finish within ", timeout_s_,
           " s; another rank is dead, stuck or not calling it (ZP_COMM_TIMEOUT_S sets the limit)");
}

void MpiComm::do_all_reduce(const void* send, void* recv, int64_t count, DType dt, ReduceOp op,
                            StreamHandle) {
  int n = mpi_count(count, "all_reduce");
  MPI_Request req;
  ZP_MPI_CHECK(MPI_Iallreduce(send == recv ? MPI_IN_PLACE : send, recv, n, mpi_datatype(dt),
                              mpi_op(op, dt), comm_, &req));
  finish(&req, 1, "all_reduce", count, dt);
  if (op == ReduceOp::Avg) divide_by(recv, count, dt, size());
}

void MpiComm::do_reduce_scatter(const void* send, void* recv, int64_t count, DType dt, ReduceOp op,
                                StreamHandle) {
  int n = mpi_count(count, "reduce_scatter");
  size_t block = size_t(count) * dtype_size(dt);
  bool in_place = count > 0 && recv == static_cast<const char*>(send) + size_t(rank()) * block;
  MPI_Request req;
  if (in_place) {
    // MPI's in-place form reduces the whole input buffer and leaves this rank's block at its start.
    void* buf = const_cast<void*>(send);
    ZP_MPI_CHECK(MPI_Ireduce_scatter_block(MPI_IN_PLACE, buf, n, mpi_datatype(dt), mpi_op(op, dt), comm_, &req));
    finish(&req, 1, "reduce_scatter", count, dt);
    if (recv != buf) std::memmove(recv, buf, block);
  } else {
    ZP_MPI_CHECK(MPI_Ireduce_scatter_block(send, recv, n, mpi_datatype(dt), mpi_op(op, dt), comm_, &req));
    finish(&req, 1, "reduce_scatter", count, dt);
  }
  if (op == ReduceOp::Avg) divide_by(recv, count, dt, size());
}

void MpiComm::do_all_gather(const void* send, void* recv, int64_t count, DType dt, StreamHandle) {
  int n = mpi_count(count, "all_gather");
  size_t block = size_t(count) * dtype_size(dt);
  bool in_place = count > 0 && send == static_cast<const char*>(recv) + size_t(rank()) * block;
  MPI_Request req;
  if (in_place)
    ZP_MPI_CHECK(MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recv, n, mpi_datatype(dt), comm_, &req));
  else
    ZP_MPI_CHECK(MPI_Iallgather(send, n, mpi_datatype(dt), recv, n, mpi_datatype(dt), comm_, &req));
  finish(&req, 1, "all_gather", count, dt);
}

void MpiComm::do_broadcast(void* buf, int64_t count, DType dt, int root, StreamHandle) {
  MPI_Request req;
  ZP_MPI_CHECK(MPI_Ibcast(buf, mpi_count(count, "broadcast"), mpi_datatype(dt), root, comm_, &req));
  finish(&req, 1, "broadcast", count, dt);
}

void MpiComm::do_send(const void* buf, int64_t count, DType dt, int peer, StreamHandle) {
  MPI_Request req;
  ZP_MPI_CHECK(MPI_Isend(buf, mpi_count(count, "send"), mpi_datatype(dt), peer, 0, comm_, &req));
  finish(&req, 1, "send", count, dt);
}

void MpiComm::do_recv(void* buf, int64_t count, DType dt, int peer, StreamHandle) {
  MPI_Request req;
  ZP_MPI_CHECK(MPI_Irecv(buf, mpi_count(count, "recv"), mpi_datatype(dt), peer, 0, comm_, &req));
  finish(&req, 1, "recv", count, dt);
}

void MpiComm::do_sendrecv(const void* send_buf, int64_t send_count, int dst, void* recv_buf,
                          int64_t recv_count, int src, DType dt, StreamHandle) {
  MPI_Request reqs[2];
  ZP_MPI_CHECK(MPI_Irecv(recv_buf, mpi_count(recv_count, "sendrecv"), mpi_datatype(dt), src, 0, comm_, &reqs[0]));
  ZP_MPI_CHECK(MPI_Isend(send_buf, mpi_count(send_count, "sendrecv"), mpi_datatype(dt), dst, 0, comm_, &reqs[1]));
  finish(reqs, 2, "sendrecv", send_count, dt);
}

void MpiComm::do_barrier(StreamHandle) {
  MPI_Request req;
  ZP_MPI_CHECK(MPI_Ibarrier(comm_, &req));
  finish(&req, 1, "barrier", -1, DType::U8);
}

}  // namespace zp::comm
