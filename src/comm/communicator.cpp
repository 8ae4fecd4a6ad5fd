#include "comm/communicator.h"

#include "core/error.h"
#include "core/fault_injection.h"

namespace zp::comm {

std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Max: return "max";
    case ReduceOp::Min: return "min";
    case ReduceOp::Avg: return "avg";
  }
  return "?";
}

std::string_view backend_name(Backend b) { return b == Backend::Mpi ? "mpi" : "nccl"; }

namespace {
// [a, a+na) and [b, b+nb) share a byte.
bool overlaps(const void* a, size_t na, const void* b, size_t nb) {
  auto pa = reinterpret_cast<uintptr_t>(a), pb = reinterpret_cast<uintptr_t>(b);
  return na > 0 && nb > 0 && pa < pb + nb && pb < pa + na;
}
// A collective that ZP_FAULT marks fails as a real one does (NCCL and MPI errors are fatal).
void inject_fault(const char* op, int rank) {
  if (fault::hit(fault::Site::Collective)) ZP_FATAL("collective ", op, " failed on rank ", rank, fault::kInjected);
}
}  // namespace

void Communicator::all_reduce(const void* send, void* recv, int64_t count, DType dt, ReduceOp op,
                              StreamHandle s) {
  inject_fault("all_reduce", rank());
  ZP_CHECK(count >= 0, "all_reduce count ", count);
  size_t n = size_t(count) * dtype_size(dt);
  ZP_CHECK(send == recv || !overlaps(send, n, recv, n), "all_reduce: send and recv partly overlap");
  do_all_reduce(send, recv, count, dt, op, s);
}

void Communicator::reduce_scatter(const void* send, void* recv, int64_t count, DType dt, ReduceOp op,
                                  StreamHandle s) {
  inject_fault("reduce_scatter", rank());
  ZP_CHECK(count >= 0, "reduce_scatter count ", count);
  size_t n = size_t(count) * dtype_size(dt);
  const void* own = static_cast<const char*>(send) + size_t(rank()) * n;
  ZP_CHECK(recv == own || !overlaps(send, n * size_t(size()), recv, n),
           "reduce_scatter: recv overlaps send but is not this rank's block of it");
  do_reduce_scatter(send, recv, count, dt, op, s);
}

void Communicator::all_gather(const void* send, void* recv, int64_t count, DType dt, StreamHandle s) {
  inject_fault("all_gather", rank());
  ZP_CHECK(count >= 0, "all_gather count ", count);
  size_t n = size_t(count) * dtype_size(dt);
  const void* own = static_cast<const char*>(recv) + size_t(rank()) * n;
  ZP_CHECK(send == own || !overlaps(send, n, recv, n * size_t(size())),
           "all_gather: send overlaps recv but is not this rank's block of it");
  do_all_gather(send, recv, count, dt, s);
}

void Communicator::broadcast(void* buf, int64_t count, DType dt, int root, StreamHandle s) {
  inject_fault("broadcast", rank());
  ZP_CHECK(count >= 0, "broadcast count ", count);
  ZP_CHECK(root >= 0 && root < size(), "broadcast root ", root, " outside a group of ", size());
  do_broadcast(buf, count, dt, root, s);
}

void Communicator::send(const void* buf, int64_t count, DType dt, int peer, StreamHandle s) {
  inject_fault("send", rank());
  ZP_CHECK(count >= 0, "send count ", count);
  ZP_CHECK(peer >= 0 && peer < size() && peer != rank(), "send to peer ", peer, " from rank ", rank(),
           " of ", size());
  do_send(buf, count, dt, peer, s);
}

void Communicator::recv(void* buf, int64_t count, DType dt, int peer, StreamHandle s) {
  inject_fault("recv", rank());
  ZP_CHECK(count >= 0, "recv count ", count);
  ZP_CHECK(peer >= 0 && peer < size() && peer != rank(), "recv from peer ", peer, " on rank ", rank(),
           " of ", size());
  do_recv(buf, count, dt, peer, s);
}

void Communicator::sendrecv(const void* send_buf, int64_t send_count, int dst, void* recv_buf,
                            int64_t recv_count, int src, DType dt, StreamHandle s) {
  inject_fault("sendrecv", rank());
  ZP_CHECK(send_count >= 0 && recv_count >= 0, "sendrecv counts ", send_count, ", ", recv_count);
  ZP_CHECK(dst >= 0 && dst < size() && dst != rank(), "sendrecv to peer ", dst, " from rank ", rank());
  ZP_CHECK(src >= 0 && src < size() && src != rank(), "sendrecv from peer ", src, " on rank ", rank());
  size_t es = dtype_size(dt);
  ZP_CHECK(!overlaps(send_buf, size_t(send_count) * es, recv_buf, size_t(recv_count) * es),
           "sendrecv: send and recv buffers overlap");
  do_sendrecv(send_buf, send_count, dst, recv_buf, recv_count, src, dt, s);
}

void Communicator::barrier(StreamHandle s) {
  inject_fault("barrier", rank());
  do_barrier(s);
}

}  // namespace zp::comm
