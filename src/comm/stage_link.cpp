#include "comm/stage_link.h"

#include <chrono>
#include <cstdlib>
#include <deque>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "comm/mpi_comm.h"
#include "comm/topology.h"
#include "comm/watchdog.h"
#include "core/error.h"
#include "core/log.h"

namespace zp::comm {

bool pipeline_trace_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("ZP_PIPELINE_TRACE");
    return v && *v && std::string(v) != "0";
  }();
  return on;
}

namespace {

const char* channel_name(PipeChannel ch) { return ch == PipeChannel::Activations ? "activations" : "gradients"; }

// One line per link event when tracing (pipeline_trace_enabled).
template <class... A>
void trace(const A&... parts) {
  if (pipeline_trace_enabled()) ZP_LOG_INFO_ALL("pipeline trace: ", parts...);
}

int mpi_tag(PipeChannel ch, int tag) {
  ZP_CHECK(tag >= 0 && tag < StageLink::kMaxTag, "pipeline message tag ", tag, " out of range");
  return tag * 2 + int(ch);
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Adds the host time of its scope to `seconds`.
class HostTimer {
 public:
  explicit HostTimer(double& seconds) : seconds_(seconds) {}
  ~HostTimer() { seconds_ += seconds_since(t0_); }
  HostTimer(const HostTimer&) = delete;
  HostTimer& operator=(const HostTimer&) = delete;

 private:
  double& seconds_;
  std::chrono::steady_clock::time_point t0_ = std::chrono::steady_clock::now();
};

class MpiStageLink final : public StageLink {
 public:
  explicit MpiStageLink(MPI_Comm pipeline) : timeout_s_(default_timeout_s()) {
    ZP_MPI_CHECK(MPI_Comm_dup(pipeline, &comm_));
  }
  ~MpiStageLink() override {
    // Every message was waited for (finish()) unless an exception is unwinding; then MPI_Abort follows.
    if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
  }

  void post_recv(PipeChannel ch, Tensor buf, int peer, int tag) override {
    ZP_CHECK(buf.device().is_cpu(), "MPI pipeline link: host buffers only");
    const HostTimer busy(busy_s_);
    const int t = mpi_tag(ch, tag);
    ZP_CHECK(!recvs_.count(t), "pipeline receive ", tag, " posted twice");
    trace("post receive of ", channel_name(ch), " ", tag, " from stage ", peer);
    Pending& p = recvs_[t];
    p.buf = std::move(buf);
    ZP_MPI_CHECK(MPI_Irecv(p.buf.data(), count_of(p.buf), mpi_datatype(p.buf.dtype()), peer, t, comm_, &p.req));
  }

  Tensor wait_recv(PipeChannel ch, int tag) override {
    auto it = recvs_.find(mpi_tag(ch, tag));
    ZP_CHECK(it != recvs_.end(), "pipeline receive ", tag, " was never posted");
    const auto t0 = std::chrono::steady_clock::now();
    trace("wait for ", channel_name(ch), " ", tag);
    wait_or_die(&it->second.req, 1, timeout_s_,
                detail::cat("pipeline receive of ", channel_name(ch), " (message ", tag, ")"));
    const double waited = seconds_since(t0);
    wait_s_ += waited;
    busy_s_ += waited;
    Tensor out = std::move(it->second.buf);
    recvs_.erase(it);
    return out;
  }

  void send(PipeChannel ch, Tensor buf, int peer, int tag) override {
    ZP_CHECK(buf.device().is_cpu(), "MPI pipeline link: host buffers only");
    const HostTimer busy(busy_s_);
    trace("send ", channel_name(ch), " ", tag, " to stage ", peer);
    sends_.push_back({std::move(buf), MPI_REQUEST_NULL});
    Pending& p = sends_.back();
    ZP_MPI_CHECK(MPI_Isend(p.buf.data(), count_of(p.buf), mpi_datatype(p.buf.dtype()), peer, mpi_tag(ch, tag), comm_,
                           &p.req));
    reap_sends();
  }

  void finish() override {
    trace("finish: waiting for ", recvs_.size(), " receives and ", sends_.size(), " sends");
    const auto t0 = std::chrono::steady_clock::now();
    for (auto& [t, p] : recvs_) wait_or_die(&p.req, 1, timeout_s_, "a pipeline receive");
    recvs_.clear();
    for (Pending& p : sends_) wait_or_die(&p.req, 1, timeout_s_, "a pipeline send");
    sends_.clear();
    const double waited = seconds_since(t0);
    wait_s_ += waited;
    busy_s_ += waited;
  }

  double take_wait_seconds() override { return std::exchange(wait_s_, 0.0); }
  double take_busy_ms() override { return 1e3 * std::exchange(busy_s_, 0.0); }

 private:
  struct Pending {
    Tensor buf;
    MPI_Request req = MPI_REQUEST_NULL;
  };
  static int count_of(const Tensor& t) {
    ZP_CHECK(t.numel() < (int64_t(1) << 31), "pipeline message of ", t.numel(), " elements exceeds MPI's int count");
    return int(t.numel());
  }
  // Frees the buffers of sends that have completed, oldest first, so memory stays bounded.
  void reap_sends() {
    while (!sends_.empty()) {
      int done = 0;
      ZP_MPI_CHECK(MPI_Test(&sends_.front().req, &done, MPI_STATUS_IGNORE));
      if (!done) break;
      sends_.erase(sends_.begin());
    }
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  double timeout_s_;
  double wait_s_ = 0, busy_s_ = 0;
  std::map<int, Pending> recvs_;
  std::vector<Pending> sends_;
};

#ifdef ZP_WITH_CUDA
// One flow: one channel over one link, its 2-rank communicator and its stream.
struct Flow {
  std::unique_ptr<Communicator> comm;
  Stream stream;
  std::deque<std::pair<int, int>> unqueued;  // posted receives not yet given to NCCL, in posting order
};

class NcclStageLink final : public StageLink {
 public:
  NcclStageLink(MPI_Comm pipeline, bool wraps, Device dev, StreamHandle compute) : compute_(compute) {
    int rank = 0, size = 1;
    ZP_MPI_CHECK(MPI_Comm_rank(pipeline, &rank));
    ZP_MPI_CHECK(MPI_Comm_size(pipeline, &size));
    rank_ = rank;
    size_ = size;
    MPI_Group all;
    ZP_MPI_CHECK(MPI_Comm_group(pipeline, &all));
    // Link i joins ranks i (rank 0 of the link's communicators) and i + 1 mod P; every rank creates
    // the links it is on in increasing i, so two ranks sharing two links (P = 2) agree on the order.
    const int links = wraps ? size : size - 1;
    for (int i = 0; i < links; ++i) {
      const int members[2] = {i, (i + 1) % size};
      if (rank != members[0] && rank != members[1]) continue;
      MPI_Group g;
      MPI_Comm c;
      ZP_MPI_CHECK(MPI_Group_incl(all, 2, members, &g));
      ZP_MPI_CHECK(MPI_Comm_create_group(pipeline, g, /*tag=*/i, &c));
      for (PipeChannel ch : {PipeChannel::Activations, PipeChannel::Gradients}) {
        Flow f{make_communicator(Backend::Nccl, c), Stream(dev), {}};
        connect(f, /*sending=*/(ch == PipeChannel::Activations) == (rank == members[0]), dev);
        flows_[{i, int(ch)}] = std::move(f);
      }
      ZP_MPI_CHECK(MPI_Comm_free(&c));
      ZP_MPI_CHECK(MPI_Group_free(&g));
    }
    ZP_MPI_CHECK(MPI_Group_free(&all));
  }

  ~NcclStageLink() override {
    for (auto& [k, f] : flows_) f.stream.synchronize();
  }

  void post_recv(PipeChannel ch, Tensor buf, int peer, int tag) override {
    Flow& f = flow_to(ch, peer, /*sending=*/false);
    ZP_CHECK(!recvs_.count({int(ch), tag}), "pipeline receive ", tag, " posted twice");
    Pending& p = recvs_[{int(ch), tag}];
    // The buffer was allocated on the compute stream: the receive may not overwrite it before the
    // compute stream is done with what that memory held before (its position now, not when the
    // receive is enqueued, so the transfer may still overlap the passes in between).
    p.ready = std::make_unique<Event>();
    p.ready->record(compute_);
    p.buf = std::move(buf);
    p.flow = &f;
    f.unqueued.push_back({int(ch), tag});
    trace("post receive of ", channel_name(ch), " ", tag, " from stage ", peer, " (enqueued when needed)");
  }

  Tensor wait_recv(PipeChannel ch, int tag) override {
    auto it = recvs_.find({int(ch), tag});
    ZP_CHECK(it != recvs_.end(), "pipeline receive ", tag, " was never posted");
    if (!it->second.done) enqueue_through(*it->second.flow, {int(ch), tag});
    trace("compute waits for ", channel_name(ch), " ", tag);
    it->second.done->wait_on(compute_);
    Tensor out = std::move(it->second.buf);
    recvs_.erase(it);
    return out;
  }

  void send(PipeChannel ch, Tensor buf, int peer, int tag) override {
    Flow& f = flow_to(ch, peer, /*sending=*/true);
    trace("send ", channel_name(ch), " ", tag, " to stage ", peer);
    Event ready;
    ready.record(compute_);
    ready.wait_on(f.stream.handle());
    next_event().record(f.stream.handle());
    f.comm->send(buf.data(), buf.numel(), buf.dtype(), f.comm->rank() ^ 1, f.stream.handle());
    next_event().record(f.stream.handle());
    sent_.push_back(std::move(buf));  // freed in finish(), after the flow's stream has passed the send
  }

  void finish() override {
    trace("finish: waiting for every flow");
    for (auto& [k, f] : flows_)
      if (!f.unqueued.empty()) enqueue_through(f, f.unqueued.back());
    for (auto& [k, f] : flows_) f.comm->wait(f.stream.handle());  // polled under the watchdog
    recvs_.clear();
    sent_.clear();
  }

  double take_wait_seconds() override { return 0; }

  // The events come in (start, end) pairs, one per send and receive since the last call.
  double take_busy_ms() override {
    double ms = 0;
    for (size_t i = 0; i + 1 < events_used_; i += 2) {
      events_[i + 1]->synchronize();
      ms += events_[i + 1]->elapsed_ms_since(*events_[i]);
    }
    events_used_ = 0;
    return ms;
  }

 private:
  struct Pending {
    Tensor buf;
    Flow* flow = nullptr;
    std::unique_ptr<Event> ready;  // the compute stream when the receive was posted
    Event* done = nullptr;         // the end of the receive's span (events_), once enqueued
  };
  // Enqueues the flow's posted receives, in posting order, up to and including `key`'s. A receive
  // goes to NCCL only when its pass needs it (or at finish()): an NCCL receive spins on its GPU until
  // the matching send arrives, so one enqueued a pass early makes any host call that synchronizes
  // with the device (NCCL's own lazy connection set-up, a device allocation) wait for the peer's
  // next send, while the peer's host may be waiting the same way for this rank's: a deadlock that
  // MPI's receives, which wait on the host only, never had.
  void enqueue_through(Flow& f, std::pair<int, int> key) {
    while (!f.unqueued.empty()) {
      const std::pair<int, int> k = f.unqueued.front();
      f.unqueued.pop_front();
      Pending& p = recvs_.at(k);
      trace("enqueue receive of ", channel_name(PipeChannel(k.first)), " ", k.second);
      p.ready->wait_on(f.stream.handle());
      next_event().record(f.stream.handle());
      f.comm->recv(p.buf.data(), p.buf.numel(), p.buf.dtype(), f.comm->rank() ^ 1, f.stream.handle());
      p.done = &next_event();
      p.done->record(f.stream.handle());
      if (k == key) return;
    }
    ZP_CHECK(false, "pipeline receive ", key.second, " is not queued on its flow");
  }
  // Makes the flow's NCCL connection now, while nothing else is in flight: NCCL connects a pair of
  // ranks lazily, inside their first send and receive, and that set-up waits on the host for the
  // peer (and may synchronize the device), which in the middle of a schedule can wait on work the
  // peer enqueues only later. Both ends of a link call this for its flows in the same order.
  static void connect(Flow& f, bool sending, Device dev) {
    trace("connect a flow (", sending ? "sending" : "receiving", ")");
    Tensor word = Tensor::zeros({1}, DType::F32, dev, "pipeline", f.stream.handle());
    if (sending)
      f.comm->send(word.data(), 1, DType::F32, f.comm->rank() ^ 1, f.stream.handle());
    else
      f.comm->recv(word.data(), 1, DType::F32, f.comm->rank() ^ 1, f.stream.handle());
    f.comm->wait(f.stream.handle());  // polled under the watchdog
  }
  // Events are reused from step to step: take_busy_ms() releases them all.
  Event& next_event() {
    if (events_.size() <= events_used_) events_.push_back(std::make_unique<Event>());
    return *events_[events_used_++];
  }
  // The flow that carries `ch` between this rank and `peer`: activations go from link i's rank i to
  // rank i + 1, gradients the other way.
  Flow& flow_to(PipeChannel ch, int peer, bool sending) {
    const bool downstream = (ch == PipeChannel::Activations) == sending;  // this rank is the link's first
    const int link = downstream ? rank_ : peer;
    ZP_CHECK((link + 1) % size_ == (downstream ? peer : rank_), "pipeline link: rank ", peer,
             " is not the neighbour of rank ", rank_, " for this message");
    auto it = flows_.find({link, int(ch)});
    ZP_CHECK(it != flows_.end(), "pipeline link ", link, " was not created (wraps?)");
    return it->second;
  }

  StreamHandle compute_;
  int rank_ = 0, size_ = 1;
  std::map<std::pair<int, int>, Flow> flows_;  // (link, channel)
  std::map<std::pair<int, int>, Pending> recvs_;
  std::vector<Tensor> sent_;
  std::vector<std::unique_ptr<Event>> events_;
  size_t events_used_ = 0;
};
#endif

}  // namespace

std::unique_ptr<StageLink> make_stage_link(Backend b, MPI_Comm pipeline, bool wraps, Device dev,
                                           StreamHandle compute) {
  if (b == Backend::Mpi) return std::make_unique<MpiStageLink>(pipeline);
#ifdef ZP_WITH_CUDA
  return std::make_unique<NcclStageLink>(pipeline, wraps, dev, compute);
#else
  (void)wraps;
  (void)dev;
  (void)compute;
  throw Error("pipeline stages over NCCL need a build with CUDA");
#endif
}

}  // namespace zp::comm
