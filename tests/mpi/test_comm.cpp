// Communicator tests, run under mpirun at several world sizes (2, 3, 5). The same checks run on
// MpiComm with host buffers and, in the *Gpu suites, on NcclComm with device buffers.
//
// Inputs are small integers, so every sum, max and min is exact in every dtype (bf16 included) and
// results are compared exactly; only Avg of float types is compared with a tolerance.
// A test must never leave a rank out of a collective: checks before collectives use EXPECT (which
// does not return early), and every rank takes the same branches.
#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "comm/bootstrap.h"
#include "comm/communicator.h"
#include "comm/mpi_comm.h"
#include "comm/nccl_comm.h"
#include "comm/topology.h"
#include "comm/watchdog.h"
#include "core/log.h"
#include "test_util.h"

namespace zp::comm {
namespace {

using test::download;
using test::upload;

const std::vector<DType> kAllDtypes = {DType::F32, DType::F64, DType::BF16, DType::F16,
                                       DType::I32, DType::I64, DType::U8};
const std::vector<ReduceOp> kAllOps = {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min, ReduceOp::Avg};

// Element i of rank r's input: small integers, signed for float types, in [0, 10] for integers
// (so U8 sums of 5 ranks do not wrap and integer Avg has no rounding-direction question).
float value(int rank, int64_t i, DType dt) {
  int v = int((i * 7 + int64_t(rank) * 3 + 1) % 11);
  return dtype_is_float(dt) ? float(v - 5) : float(v);
}

float as_dtype(double x, DType dt) {
  if (dt == DType::BF16) return float(bf16(float(x)));
  if (dt == DType::F16) return float(f16(float(x)));
  return float(x);
}

// op over ranks of value(r, i), as the dtype stores it.
float expected_reduce(ReduceOp op, DType dt, int size, int64_t i) {
  double sum = 0, mx = -1e30, mn = 1e30;
  for (int r = 0; r < size; ++r) {
    double v = value(r, i, dt);
    sum += v;
    mx = std::max(mx, v);
    mn = std::min(mn, v);
  }
  switch (op) {
    case ReduceOp::Sum: return as_dtype(sum, dt);
    case ReduceOp::Max: return as_dtype(mx, dt);
    case ReduceOp::Min: return as_dtype(mn, dt);
    case ReduceOp::Avg: return as_dtype(dtype_is_float(dt) ? sum / size : std::floor(sum / size), dt);
  }
  return 0;
}

// Allowed |got - want| / max(1, |want|): exact except Avg of floats, which divides (NCCL scales
// every input before summing, MPI the sum after, so 16-bit results may differ by a few ulps).
double tolerance_for(ReduceOp op, DType dt) {
  if (op != ReduceOp::Avg || !dtype_is_float(dt)) return 0;
  switch (dt) {
    case DType::BF16: return 2e-2;
    case DType::F16: return 3e-3;
    case DType::F32: return 1e-6;
    default: return 1e-12;
  }
}

// Number of mismatches; prints the first one.
size_t count_mismatches(const std::vector<float>& got, const std::vector<float>& want, double tol,
                        const std::string& what) {
  EXPECT_EQ(got.size(), want.size()) << what;
  size_t bad = 0;
  for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
    double err = std::fabs(double(got[i]) - double(want[i]));
    if (err > tol * std::max(1.0, std::fabs(double(want[i])))) {
      if (bad == 0)
        ADD_FAILURE() << what << ": element " << i << " is " << got[i] << ", expected " << want[i]
                      << " (rank " << process_info().rank << ")";
      ++bad;
    }
  }
  return bad;
}

std::string describe(const char* op, DType dt, int64_t count, const char* form = "") {
  return detail::cat(op, " ", dtype_name(dt), " count ", count, form);
}

// Buffers on the communicator's device, filled from float values and read back as floats. Device
// uploads are synchronised before use (they go through the default stream, the comm uses `s`).
struct Harness {
  Communicator& c;
  StreamHandle s = nullptr;

  Tensor put(const std::vector<float>& v, DType dt) const {
    static const std::vector<float> one_zero(1, 0.f);  // never ask an allocator for 0 bytes
    Tensor t = upload(v.empty() ? one_zero : v, dt, c.device());
    if (c.device().is_cuda()) device_synchronize();
    return t;
  }
  std::vector<float> get(const Tensor& t, int64_t n, int64_t offset = 0) const {
    c.wait(s);
    std::vector<float> v = download(t);
    return std::vector<float>(v.begin() + offset, v.begin() + offset + n);
  }
  static void* at(const Tensor& t, int64_t i) {
    return static_cast<char*>(t.data()) + size_t(i) * dtype_size(t.dtype());
  }

  std::vector<float> inputs(int64_t n, DType dt, int rank) const {
    std::vector<float> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[size_t(i)] = value(rank, i, dt);
    return v;
  }

  void check_all_reduce(DType dt, ReduceOp op, int64_t count, bool in_place) const {
    std::vector<float> in = inputs(count, dt, c.rank());
    Tensor send = put(in, dt);
    Tensor recv = in_place ? send : put(std::vector<float>(size_t(count), 77.f), dt);
    c.all_reduce(send.data(), recv.data(), count, dt, op, s);
    std::vector<float> want(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) want[size_t(i)] = expected_reduce(op, dt, c.size(), i);
    std::string what = describe("all_reduce", dt, count, in_place ? " in place" : "");
    count_mismatches(get(recv, count), want, tolerance_for(op, dt),
                     what + " " + std::string(reduce_op_name(op)));
    if (!in_place) count_mismatches(get(send, count), in, 0, what + ": input changed");
  }

  void check_reduce_scatter(DType dt, ReduceOp op, int64_t count, bool in_place) const {
    int64_t total = count * c.size();
    Tensor send = put(inputs(total, dt, c.rank()), dt);
    Tensor recv = in_place ? Tensor() : put(std::vector<float>(size_t(count), 77.f), dt);
    void* out = in_place ? at(send, c.rank() * count) : recv.data();
    c.reduce_scatter(send.data(), out, count, dt, op, s);
    std::vector<float> want(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i)
      want[size_t(i)] = expected_reduce(op, dt, c.size(), c.rank() * count + i);
    std::vector<float> got = in_place ? get(send, count, c.rank() * count) : get(recv, count);
    count_mismatches(got, want, tolerance_for(op, dt),
                     describe("reduce_scatter", dt, count, in_place ? " in place " : " ") +
                         std::string(reduce_op_name(op)));
  }

  void check_all_gather(DType dt, int64_t count, bool in_place) const {
    std::vector<float> mine = inputs(count, dt, c.rank());
    std::vector<float> want, init(size_t(count * c.size()), 77.f);
    for (int r = 0; r < c.size(); ++r) {
      std::vector<float> v = inputs(count, dt, r);
      want.insert(want.end(), v.begin(), v.end());
    }
    std::copy(mine.begin(), mine.end(), init.begin() + c.rank() * count);
    Tensor recv = put(init, dt);
    Tensor send = in_place ? Tensor() : put(mine, dt);
    const void* src = in_place ? at(recv, c.rank() * count) : send.data();
    c.all_gather(src, recv.data(), count, dt, s);
    count_mismatches(get(recv, count * c.size()), want, 0,
                     describe("all_gather", dt, count, in_place ? " in place" : ""));
  }

  void check_broadcast(DType dt, int64_t count, int root) const {
    Tensor buf = put(inputs(count, dt, c.rank()), dt);
    c.broadcast(buf.data(), count, dt, root, s);
    count_mismatches(get(buf, count), inputs(count, dt, root), 0,
                     describe("broadcast", dt, count) + " root " + std::to_string(root));
  }

  // Every rank sends its values to the next rank of a ring and receives from the previous one.
  void check_sendrecv_ring(DType dt, int64_t count) const {
    if (c.size() < 2) return;
    int next = (c.rank() + 1) % c.size(), prev = (c.rank() + c.size() - 1) % c.size();
    Tensor send = put(inputs(count, dt, c.rank()), dt);
    Tensor recv = put(std::vector<float>(size_t(count), 77.f), dt);
    c.sendrecv(send.data(), count, next, recv.data(), count, prev, dt, s);
    count_mismatches(get(recv, count), inputs(count, dt, prev), 0, describe("sendrecv ring", dt, count));
  }

  // Rank 0 sends rank r's input to each r, which sends it back plus one; separate send and recv.
  void check_send_recv_pairs(DType dt, int64_t count) const {
    if (c.size() < 2) return;
    if (c.rank() == 0) {
      for (int r = 1; r < c.size(); ++r) {
        Tensor out = put(inputs(count, dt, r), dt);
        Tensor back = put(std::vector<float>(size_t(count), 77.f), dt);
        c.send(out.data(), count, dt, r, s);
        c.recv(back.data(), count, dt, r, s);
        std::vector<float> want = inputs(count, dt, r);
        for (float& x : want) x += 1;
        count_mismatches(get(back, count), want, 0, describe("send/recv echo", dt, count));
      }
    } else {
      Tensor buf = put(std::vector<float>(size_t(count), 77.f), dt);
      c.recv(buf.data(), count, dt, 0, s);
      std::vector<float> got = get(buf, count);
      count_mismatches(got, inputs(count, dt, c.rank()), 0, describe("recv from rank 0", dt, count));
      for (float& x : got) x += 1;
      Tensor reply = put(got, dt);
      c.send(reply.data(), count, dt, 0, s);
      c.wait(s);
    }
  }

  // Rank 0 arrives late; nobody may leave the barrier before it arrived. Ranks share a host, so
  // steady_clock (CLOCK_MONOTONIC) readings are comparable between them.
  void check_barrier() const {
    using namespace std::chrono;
    int64_t arrived_ns = 0;
    if (c.rank() == 0) {
      std::this_thread::sleep_for(milliseconds(100));
      arrived_ns = duration_cast<nanoseconds>(steady_clock::now().time_since_epoch()).count();
    }
    c.barrier(s);
    int64_t left_ns = duration_cast<nanoseconds>(steady_clock::now().time_since_epoch()).count();
    MPI_Bcast(&arrived_ns, 1, MPI_INT64_T, 0, MPI_COMM_WORLD);
    EXPECT_GE(left_ns, arrived_ns) << "rank " << c.rank() << " left the barrier before rank 0 entered it";
    for (int i = 0; i < 20; ++i) c.barrier(s);
  }

  // The whole suite on one communicator.
  void check_collectives(const std::vector<int64_t>& counts) const {
    for (DType dt : kAllDtypes)
      for (int64_t n : counts) {
        for (ReduceOp op : kAllOps)
          for (bool in_place : {false, true}) {
            check_all_reduce(dt, op, n, in_place);
            check_reduce_scatter(dt, op, n, in_place);
          }
        for (bool in_place : {false, true}) check_all_gather(dt, n, in_place);
      }
  }
};

bool single_host() {
  Runtime* rt = Runtime::current();
  return rt && rt->local_size() == rt->world_size();
}

// ---------------------------------------------------------------------------------------------
// Bootstrap

TEST(CommRuntime, Bootstrap) {
  Runtime rt;
  int rank = -1, size = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  EXPECT_EQ(rt.rank(), rank);
  EXPECT_EQ(rt.world_size(), size);
  EXPECT_FALSE(rt.initialized_mpi()) << "the test main initialised MPI already";
  EXPECT_EQ(Runtime::current(), &rt);
  EXPECT_GE(rt.local_rank(), 0);
  EXPECT_LT(rt.local_rank(), rt.local_size());
  EXPECT_LE(rt.local_size(), rt.world_size());
  EXPECT_FALSE(rt.host().empty());
  EXPECT_GE(rt.thread_level(), MPI_THREAD_SINGLE);
  EXPECT_EQ(process_info().rank, rank);
  EXPECT_EQ(process_info().world, size);
  EXPECT_EQ(process_info().local_rank, rt.local_rank());
  EXPECT_EQ(process_info().host, rt.host());
  if (cuda_device_count() == 0) EXPECT_TRUE(rt.device().is_cpu());
  else EXPECT_EQ(rt.device(), Device::cuda(rt.local_rank() % cuda_device_count()));
  // Node-local ranks are distinct and dense: their sum over the node is 0 + 1 + ... + (n-1).
  int local_rank = rt.local_rank(), local_sum = 0;
  MPI_Allreduce(&local_rank, &local_sum, 1, MPI_INT, MPI_SUM, rt.node());
  EXPECT_EQ(local_sum, rt.local_size() * (rt.local_size() - 1) / 2);
  MPI_Errhandler eh;
  MPI_Comm_get_errhandler(MPI_COMM_WORLD, &eh);
  EXPECT_TRUE(eh == MPI_ERRORS_RETURN) << "MPI errors must come back as return codes";
  MPI_Errhandler_free(&eh);
}

TEST(CommRuntime, CanBeRecreated) {
  { Runtime a; }
  Runtime b;
  EXPECT_EQ(Runtime::current(), &b);
}

// ---------------------------------------------------------------------------------------------
// MpiComm

TEST(MpiComm, Basics) {
  Runtime rt;
  MpiComm c(MPI_COMM_WORLD);
  EXPECT_EQ(c.rank(), rt.rank());
  EXPECT_EQ(c.size(), rt.world_size());
  EXPECT_EQ(c.backend(), Backend::Mpi);
  EXPECT_EQ(c.device_kind(), DeviceKind::Cpu);
  EXPECT_NE(c.mpi_comm(), MPI_COMM_WORLD) << "MpiComm works on its own duplicate";
  EXPECT_THROW(c.set_timeout(0), Error);
  c.set_timeout(12.5);
  EXPECT_EQ(c.timeout_s(), 12.5);
}

TEST(MpiComm, EveryDtypeOpAndForm) {
  Runtime rt;
  MpiComm c(MPI_COMM_WORLD);
  Harness{c}.check_collectives({0, 1, 2, 7, 1001});
}

TEST(MpiComm, LargeOddCount) {
  Runtime rt;
  MpiComm c(MPI_COMM_WORLD);
  Harness h{c};
  for (DType dt : {DType::F32, DType::BF16}) {
    h.check_all_reduce(dt, ReduceOp::Sum, 1000003, false);
    h.check_all_reduce(dt, ReduceOp::Avg, 1000003, true);
  }
  h.check_reduce_scatter(DType::F32, ReduceOp::Sum, 200003, true);
  h.check_all_gather(DType::F32, 200003, false);
  h.check_broadcast(DType::F32, 1000003, c.size() - 1);
}

TEST(MpiComm, SixteenBitSumsAreExactOnIntegers) {
  Runtime rt;
  MpiComm c(MPI_COMM_WORLD);
  // bf16 holds integers up to 256 exactly, f16 up to 2048: rank r contributes (i % m) + r, with m
  // as large as keeps the sum within that range.
  for (DType dt : {DType::BF16, DType::F16}) {
    const int64_t n = 4099, exact = dt == DType::BF16 ? 256 : 2048, ranks = c.size();
    const int64_t m = (exact - ranks * (ranks - 1) / 2) / ranks;
    std::vector<float> in(n), want(n);
    for (int64_t i = 0; i < n; ++i) {
      in[size_t(i)] = float(i % m + c.rank());
      want[size_t(i)] = float(ranks * (i % m) + ranks * (ranks - 1) / 2);
    }
    Tensor t = upload(in, dt, Device::cpu());
    c.all_reduce(t.data(), t.data(), n, dt, ReduceOp::Sum);
    count_mismatches(download(t), want, 0, std::string("16-bit sum ") + std::string(dtype_name(dt)));
  }
}

TEST(MpiComm, BroadcastFromEveryRoot) {
  Runtime rt;
  MpiComm c(MPI_COMM_WORLD);
  Harness h{c};
  for (DType dt : kAllDtypes)
    for (int root = 0; root < c.size(); ++root)
      for (int64_t n : {0, 1, 1001}) h.check_broadcast(dt, n, root);
}

TEST(MpiComm, SendRecv) {
  Runtime rt;
  MpiComm c(MPI_COMM_WORLD);
  Harness h{c};
  for (DType dt : kAllDtypes)
    for (int64_t n : {0, 1, 1001}) {
      h.check_sendrecv_ring(dt, n);
      h.check_send_recv_pairs(dt, n);
    }
  h.check_sendrecv_ring(DType::F32, 1000003);
}

TEST(MpiComm, Barrier) {
  Runtime rt;
  if (!single_host()) GTEST_SKIP() << "compares clocks of ranks on different hosts";
  MpiComm c(MPI_COMM_WORLD);
  Harness{c}.check_barrier();
}

// ---------------------------------------------------------------------------------------------
// Watchdog

TEST(CommWatchdog, TimeoutFromEnvironment) {
  const char* old = std::getenv("ZP_COMM_TIMEOUT_S");
  std::string keep = old ? old : "";
  unsetenv("ZP_COMM_TIMEOUT_S");
  EXPECT_EQ(default_timeout_s(), 300.0);
  setenv("ZP_COMM_TIMEOUT_S", "2.5", 1);
  EXPECT_EQ(default_timeout_s(), 2.5);
  setenv("ZP_COMM_TIMEOUT_S", "ten", 1);
  EXPECT_THROW(default_timeout_s(), Error);
  setenv("ZP_COMM_TIMEOUT_S", "-1", 1);
  EXPECT_THROW(default_timeout_s(), Error);
  if (old) setenv("ZP_COMM_TIMEOUT_S", keep.c_str(), 1);
  else unsetenv("ZP_COMM_TIMEOUT_S");
}

// Rank 0 joins a barrier 600 ms late. The others' short wait must report TimedOut (the fatal
// path's trigger) without aborting; then everyone completes the barrier so nothing hangs.
TEST(CommWatchdog, ReportsATimedOutCollective) {
  Runtime rt;
  MpiComm c(MPI_COMM_WORLD);
  MPI_Request req = MPI_REQUEST_NULL;
  if (c.rank() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(600));
  MPI_Ibarrier(c.mpi_comm(), &req);
  if (c.rank() != 0) {
    auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(wait_for(&req, 1, 0.1), WaitStatus::TimedOut);
    double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_GE(waited, 0.1);
    EXPECT_LT(waited, 0.5) << "the wait overran its deadline";
  }
  EXPECT_EQ(wait_for(&req, 1, 60.0), WaitStatus::Done);
  // A collective everyone joins at once completes well within a short deadline.
  MPI_Ibarrier(c.mpi_comm(), &req);
  EXPECT_EQ(wait_for(&req, 1, 30.0), WaitStatus::Done);
  // And the communicator still works afterwards.
  Harness{c}.check_all_reduce(DType::F32, ReduceOp::Sum, 17, false);
}

// ---------------------------------------------------------------------------------------------
// Topology

TEST(Topology, MegatronLayout) {
  // Megatron's example: 16 ranks, tensor 2, pipeline 4 (so data 2).
  RankLayout l(16, {.data = 2, .tensor = 2, .pipeline = 4});
  EXPECT_EQ(l.group_ranks(Group::Tensor, 5), (std::vector<int>{4, 5}));
  EXPECT_EQ(l.group_ranks(Group::Data, 5), (std::vector<int>{5, 7}));
  EXPECT_EQ(l.group_ranks(Group::Pipeline, 5), (std::vector<int>{1, 5, 9, 13}));
  EXPECT_EQ(l.coord(13), (GridCoord{.data = 0, .tensor = 1, .pipeline = 3}));
  EXPECT_EQ(l.group_rank(Group::Pipeline, 13), 3);
  EXPECT_EQ(l.group_ranks(Group::World, 3).size(), 16u);
}

TEST(Topology, GroupsPartitionTheWorld) {
  for (ParallelSizes s : {ParallelSizes{2, 2, 2}, ParallelSizes{3, 2, 2}, ParallelSizes{1, 4, 3},
                          ParallelSizes{5, 1, 1}, ParallelSizes{1, 1, 1}}) {
    int world = s.data * s.tensor * s.pipeline;
    RankLayout l(world, s);
    for (int r = 0; r < world; ++r) {
      EXPECT_EQ(l.rank_of(l.coord(r)), r);
      for (Group g : {Group::Data, Group::Tensor, Group::Pipeline}) {
        std::vector<int> ranks = l.group_ranks(g, r);
        ASSERT_EQ(int(ranks.size()), l.group_size(g));
        EXPECT_EQ(ranks[size_t(l.group_rank(g, r))], r) << group_name(g);
        for (int m : ranks) {
          EXPECT_EQ(l.group_color(g, m), l.group_color(g, r)) << group_name(g);
          EXPECT_EQ(l.group_ranks(g, m), ranks) << group_name(g);
        }
      }
      // Tensor groups are consecutive ranks.
      std::vector<int> t = l.group_ranks(Group::Tensor, r);
      for (size_t i = 1; i < t.size(); ++i) EXPECT_EQ(t[i], t[i - 1] + 1);
    }
  }
}

TEST(Topology, BadSplitIsAnError) {
  EXPECT_THROW(RankLayout(5, {.data = 2, .tensor = 2, .pipeline = 1}), Error);
  EXPECT_THROW(RankLayout(4, {.data = 0, .tensor = 4, .pipeline = 1}), Error);
  try {
    RankLayout(6, {.data = 2, .tensor = 2, .pipeline = 2});
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("world has 6"), std::string::npos) << m;
    EXPECT_NE(m.find("data=2"), std::string::npos) << m;
  }
  Runtime rt;
  // Every rank throws before any collective, so nobody is left waiting.
  EXPECT_THROW(Topology(MPI_COMM_WORLD, {.data = rt.world_size() + 1}), Error);
  EXPECT_THROW(Topology(MPI_COMM_WORLD, {.data = 1, .tensor = 2 * rt.world_size()}), Error);
}

// Every (data, tensor, pipeline) split of the current world: each group communicator has the
// layout's size and members (gathered over the group itself), and reduces over exactly them.
void check_topology_groups(Backend backend) {
  Runtime* rt = Runtime::current();
  int world = rt->world_size();
  for (int d = 1; d <= world; ++d)
    for (int t = 1; t <= world / d; ++t) {
      if (world % (d * t)) continue;
      ParallelSizes s{d, t, world / (d * t)};
      Topology topo(MPI_COMM_WORLD, s);
      for (Group g : {Group::World, Group::Data, Group::Tensor, Group::Pipeline}) {
        std::string what = detail::cat(group_name(g), " group of data=", d, " tensor=", t,
                                       " pipeline=", s.pipeline, " (", backend_name(backend), ")");
        std::unique_ptr<Communicator> c = topo.make_communicator(g, backend);
        EXPECT_EQ(c->size(), topo.group_size(g)) << what;
        EXPECT_EQ(c->rank(), topo.group_rank(g)) << what;
        Harness h{*c};
        std::vector<int> members = topo.layout().group_ranks(g, topo.rank());
        Tensor mine = h.put({float(topo.rank())}, DType::I32);
        Tensor all = h.put(std::vector<float>(members.size(), -1.f), DType::I32);
        c->all_gather(mine.data(), all.data(), 1, DType::I32);
        std::vector<float> want(members.begin(), members.end());
        count_mismatches(h.get(all, int64_t(members.size())), want, 0, what);
        h.check_all_reduce(DType::F32, ReduceOp::Sum, 33, false);
        if (c->size() > 1) h.check_sendrecv_ring(DType::F32, 5);
      }
    }
}

TEST(Topology, GroupCommunicatorsMpi) {
  Runtime rt;
  check_topology_groups(Backend::Mpi);
}

TEST(NcclComm, IsAnErrorWithoutADevice) {
  if (cuda_device_count() > 0) GTEST_SKIP() << "this host has a CUDA device";
  Runtime rt;
  EXPECT_THROW(make_nccl_comm(MPI_COMM_WORLD), Error);
  Topology topo(MPI_COMM_WORLD, {.data = rt.world_size()});
  EXPECT_THROW(topo.make_communicator(Group::Data, Backend::Nccl), Error);
}

// ---------------------------------------------------------------------------------------------
// NcclComm on device buffers: the same checks. They need one GPU per rank; every rank must agree
// on skipping, or the ones that do not skip would wait in a collective forever.

bool every_rank_has_its_own_gpu(const Runtime& rt) {
  int mine = cuda_device_count() >= rt.local_size() ? 1 : 0, all = 0;
  MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return all == 1;
}

#define ZP_SKIP_WITHOUT_GPU_PER_RANK(rt)                                                         \
  do {                                                                                           \
    if (!every_rank_has_its_own_gpu(rt))                                                         \
      GTEST_SKIP() << "needs one CUDA device per rank (" << cuda_device_count() << " devices, " \
                   << (rt).local_size() << " ranks on this host)";                               \
  } while (0)

TEST(NcclCommGpu, EveryDtypeOpAndForm) {
  Runtime rt;
  ZP_SKIP_WITHOUT_GPU_PER_RANK(rt);
  std::unique_ptr<Communicator> c = make_nccl_comm(MPI_COMM_WORLD);
  EXPECT_EQ(c->backend(), Backend::Nccl);
  EXPECT_EQ(c->device(), rt.device());
  Stream stream(rt.device());
  Harness{*c, stream.handle()}.check_collectives({0, 1, 2, 7, 1001});
}

TEST(NcclCommGpu, LargeOddCount) {
  Runtime rt;
  ZP_SKIP_WITHOUT_GPU_PER_RANK(rt);
  std::unique_ptr<Communicator> c = make_nccl_comm(MPI_COMM_WORLD);
  Stream stream(rt.device());
  Harness h{*c, stream.handle()};
  for (DType dt : {DType::F32, DType::BF16}) {
    h.check_all_reduce(dt, ReduceOp::Sum, 1000003, false);
    h.check_all_reduce(dt, ReduceOp::Avg, 1000003, true);
  }
  h.check_reduce_scatter(DType::F32, ReduceOp::Sum, 200003, true);
  h.check_all_gather(DType::F32, 200003, false);
  h.check_broadcast(DType::F32, 1000003, c->size() - 1);
}

TEST(NcclCommGpu, BroadcastFromEveryRoot) {
  Runtime rt;
  ZP_SKIP_WITHOUT_GPU_PER_RANK(rt);
  std::unique_ptr<Communicator> c = make_nccl_comm(MPI_COMM_WORLD);
  Stream stream(rt.device());
  Harness h{*c, stream.handle()};
  for (DType dt : kAllDtypes)
    for (int root = 0; root < c->size(); ++root)
      for (int64_t n : {0, 1, 1001}) h.check_broadcast(dt, n, root);
}

TEST(NcclCommGpu, SendRecv) {
  Runtime rt;
  ZP_SKIP_WITHOUT_GPU_PER_RANK(rt);
  std::unique_ptr<Communicator> c = make_nccl_comm(MPI_COMM_WORLD);
  Stream stream(rt.device());
  Harness h{*c, stream.handle()};
  for (DType dt : kAllDtypes)
    for (int64_t n : {0, 1, 1001}) {
      h.check_sendrecv_ring(dt, n);
      h.check_send_recv_pairs(dt, n);
    }
  h.check_sendrecv_ring(DType::F32, 1000003);
}

TEST(NcclCommGpu, Barrier) {
  Runtime rt;
  ZP_SKIP_WITHOUT_GPU_PER_RANK(rt);
  std::unique_ptr<Communicator> c = make_nccl_comm(MPI_COMM_WORLD);
  Stream stream(rt.device());
  Harness{*c, stream.handle()}.check_barrier();
}

TEST(NcclCommGpu, TopologyGroups) {
  Runtime rt;
  ZP_SKIP_WITHOUT_GPU_PER_RANK(rt);
  check_topology_groups(Backend::Nccl);
}

}  // namespace
}  // namespace zp::comm
