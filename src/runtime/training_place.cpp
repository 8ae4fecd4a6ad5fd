#include "runtime/training_place.h"

#include "core/error.h"

namespace zp::runtime {

TrainingPlace place_training(const TrainConfig& cfg, comm::Runtime& rt, MPI_Comm group) {
  if (group == MPI_COMM_NULL) group = rt.world();
  int ranks = 1;
  ZP_MPI_CHECK(MPI_Comm_size(group, &ranks));
  TrainingPlace at;
  const int stages = int(cfg.pipeline_stages);
  // Every rank sees the same sizes, so every rank throws alike.
  ZP_REQUIRE(ranks % stages == 0, "pipeline.stages = ", stages, " does not divide the world size ", ranks,
             " (world = pipeline stages x data-parallel size)");
  at.topology = std::make_unique<comm::Topology>(group, comm::ParallelSizes{.data = ranks / stages, .pipeline = stages});
  at.wraps = stages > 1 && cfg.pipeline_schedule == "interleaved";
  at.dev = rt.device();
  if (cfg.device == "cpu") at.dev = Device::cpu();
  if (cfg.device == "cuda") ZP_REQUIRE(at.dev.is_cuda(), "training.device = \"cuda\": ", cuda_unavailable_reason());
  if (at.dev.is_cuda()) at.stream = Stream(at.dev);
  return at;
}

TrainingComms make_training_comms(const TrainingPlace& at) {
  const comm::Topology& topo = *at.topology;
  const comm::Backend tensors = at.dev.is_cuda() ? comm::Backend::Nccl : comm::Backend::Mpi;
  TrainingComms c;
  if (topo.group_size(comm::Group::Data) > 1) c.data = topo.make_communicator(comm::Group::Data, tensors);
  if (topo.layout().world_size() > 1) c.control = std::make_unique<comm::MpiComm>(topo.mpi_comm(comm::Group::World));
  if (topo.group_size(comm::Group::Tensor) > 1) c.tensor = topo.make_communicator(comm::Group::Tensor, tensors);
  if (topo.group_size(comm::Group::Pipeline) > 1)
    c.stages = comm::make_stage_link(tensors, topo.mpi_comm(comm::Group::Pipeline), at.wraps, at.dev, at.s());
  return c;
}

}  // namespace zp::runtime
