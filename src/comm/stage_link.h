// StageLink: the point-to-point traffic of one pipeline stage (issue 12's transport): activations go
// to the stage that runs the next model chunk, their gradients come back, on two channels.
//
// The one non-obvious part is how it avoids deadlock for any schedule: receives are posted early (as
// soon as the receiver knows what comes next) and sends never wait for their receiver, so a stage
// blocks only when the input it needs next has not arrived, which a valid schedule
// (parallel/pipeline_schedule.h) rules out.
//   MPI   non-blocking MPI_Isend / MPI_Irecv on a private duplicate of the pipeline group, matched by
//         tags (channel, micro-batch, chunk), so posting order does not matter. Waits are polled
//         under the watchdog (comm/watchdog.h).
//   NCCL  NCCL has no tags: messages match in posting order per communicator, and a communicator's
//         operations run in one order on each rank. So every flow (one channel over one link
//         between neighbours, link i joining pipeline ranks i and i+1 mod P) gets its own 2-rank
//         NCCL communicator and its own stream: a flow's stream holds only its sends (or only its
//         receives) in schedule order, which is the same order on both ends, and no flow waits
//         behind another. The compute stream waits for a receive through an event; a send waits for
//         the compute stream the same way. Unlike MPI's, an NCCL receive is a kernel that spins on
//         its GPU until the send arrives, and host calls that synchronize with the device (NCCL's
//         lazy connection set-up among them) wait for it: so a receive is posted early only on the
//         host (its buffer and the compute stream's position are kept) and enqueued when its pass
//         needs it, and every flow connects at construction (a one-word message), not mid-step.
#pragma once
#include <mpi.h>

#include <memory>

#include "comm/communicator.h"
#include "core/tensor.h"

namespace zp::comm {

enum class PipeChannel : uint8_t { Activations, Gradients };

class StageLink {
 public:
  // Tags are in [0, kMaxTag).
  static constexpr int kMaxTag = 1 << 14;

  virtual ~StageLink() = default;

  // Starts receiving `buf` (allocated by the caller; left untouched until wait_recv) from pipeline
  // rank `peer`; `tag` (in [0, kMaxTag)) names the message among the channel's. NCCL: posts must come
  // in the order the peer sends.
  virtual void post_recv(PipeChannel ch, Tensor buf, int peer, int tag) = 0;
  // The buffer posted with (ch, tag) may be read: the host waits (MPI) or `compute` is ordered after
  // the receive (NCCL). Returns the buffer.
  virtual Tensor wait_recv(PipeChannel ch, int tag) = 0;
  // Sends `buf` (complete on `compute` once the work enqueued so far is done) to pipeline rank
  // `peer`; returns at once. The link keeps `buf` alive until the send has completed.
  virtual void send(PipeChannel ch, Tensor buf, int peer, int tag) = 0;
  // Waits (under the watchdog) until every send and receive posted so far has completed; buffers of
  // completed sends are released.
  virtual void finish() = 0;
  // Seconds the host spent blocked in wait_recv and finish since the last call (MPI; NCCL waits
  // on the device and reports 0).
  virtual double take_wait_seconds() = 0;
  // Milliseconds the link was busy since the last call: the step-time breakdown's "send_recv"
  // communication kind. MPI: the host's time inside the link's calls (posting, and waiting for
  // transfers to complete); NCCL: each send's and receive's span on its flow's stream, bracketed by
  // events (the flows run concurrently, so the sum may exceed the wall time, like the collectives'
  // busy time). A receive is busy from its start until its data has arrived, so either way the time
  // a peer still spent computing what it sends counts too: a stage's bubble shows in it. Called
  // after finish() (NCCL reuses the events of completed messages).
  virtual double take_busy_ms() = 0;
};

// Whether ZP_PIPELINE_TRACE is set (to anything but "" or "0"): the stages then log, on every rank,
// each pass they start and each message their link posts, enqueues, waits for and sends, so that a
// hung or killed pipeline shows where each stage stopped. Read once.
bool pipeline_trace_enabled();

// Collective over `pipeline` (its ranks are the stages, in order). `wraps`: the last stage also
// sends to the first (interleaved schedules). NCCL: `dev` is this rank's GPU and `compute` the
// stream the stage computes on. Throws zp::Error for NCCL in a build without CUDA.
std::unique_ptr<StageLink> make_stage_link(Backend b, MPI_Comm pipeline, bool wraps, Device dev,
                                           StreamHandle compute);

}  // namespace zp::comm
