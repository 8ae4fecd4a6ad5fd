// Where a training run runs (DESIGN decisions 5 and 13): its ranks laid out by comm::Topology
// (tensor innermost, then data, pipeline outermost: comm/topology.h), the device training.device
// picks with its stream, the global batch, and the communicators over the topology's groups.
//
// pipeline.stages P splits the world into P stages of world / P data-parallel ranks each (issue 12);
// the tensor group is one rank (no key sets it yet). The global batch is what the data group
// processes per step: the stages of a pipeline work on the same samples.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <memory>

#include "comm/bootstrap.h"
#include "comm/communicator.h"
#include "comm/mpi_comm.h"
#include "comm/stage_link.h"
#include "comm/topology.h"
#include "core/device.h"
#include "runtime/train_config.h"

namespace zp::runtime {

struct TrainingPlace {
  std::unique_ptr<comm::Topology> topology;
  Device dev;
  Stream stream;  // none on the CPU
  int64_t global_batch = 0;  // set with the configuration resolved for this place (run_training)

  StreamHandle s() const { return stream.handle(); }
  // This rank in the run (rank 0 reports), and this rank's index and size of its data group (which
  // samples it reads).
  int rank() const { return topology->rank(); }
  int world() const { return topology->layout().world_size(); }
  int data_rank() const { return topology->group_rank(comm::Group::Data); }
  int data_size() const { return topology->group_size(comm::Group::Data); }
  int stage() const { return topology->group_rank(comm::Group::Pipeline); }
  int stages() const { return topology->group_size(comm::Group::Pipeline); }
  bool wraps = false;  // the last stage sends to the first (interleaved schedules)
};

// Lays out the ranks of `group` (MPI_COMM_NULL: the whole world; collective over it) and picks the
// device. Throws zp::Error naming the key. The configuration meets the world here: run_training
// resolves it for the place (TrainConfig::resolve_for_place: batch keys, "auto" precision).
TrainingPlace place_training(const TrainConfig& cfg, comm::Runtime& rt, MPI_Comm group);

// The run's communicators, one per group of the topology that has more than one rank (none for a
// single rank): tensors on the device's backend (NCCL on GPUs, MPI on CPUs), the pipeline stage's
// links to its neighbours, and host scalars (losses, stop signals) over MPI in the whole run.
struct TrainingComms {
  std::unique_ptr<comm::Communicator> data, tensor;
  std::unique_ptr<comm::StageLink> stages;
  std::unique_ptr<comm::MpiComm> control;
};
TrainingComms make_training_comms(const TrainingPlace& at);

}  // namespace zp::runtime
