#include "comm/topology.h"

#include "comm/mpi_comm.h"
#include "comm/nccl_comm.h"
#include "core/error.h"

namespace zp::comm {

std::string_view group_name(Group g) {
  switch (g) {
    case Group::World: return "world";
    case Group::Data: return "data";
    case Group::Tensor: return "tensor";
    case Group::Pipeline: return "pipeline";
  }
  return "?";
}

RankLayout::RankLayout(int world_size, ParallelSizes s) : world_size_(world_size), sizes_(s) {
  ZP_REQUIRE(s.data >= 1 && s.tensor >= 1 && s.pipeline >= 1, "parallel sizes must be >= 1, got data=",
             s.data, " tensor=", s.tensor, " pipeline=", s.pipeline);
  ZP_REQUIRE(int64_t(s.data) * s.tensor * s.pipeline == world_size, "parallel sizes data=", s.data,
             " x tensor=", s.tensor, " x pipeline=", s.pipeline, " = ", int64_t(s.data) * s.tensor * s.pipeline,
             " ranks, but the world has ", world_size);
}

GridCoord RankLayout::coord(int rank) const {
  ZP_CHECK(rank >= 0 && rank < world_size_, "rank ", rank, " outside a world of ", world_size_);
  GridCoord c;
  c.tensor = rank % sizes_.tensor;
  c.data = (rank / sizes_.tensor) % sizes_.data;
  c.pipeline = rank / (sizes_.tensor * sizes_.data);
  return c;
}

int RankLayout::rank_of(GridCoord c) const {
  ZP_CHECK(c.data >= 0 && c.data < sizes_.data && c.tensor >= 0 && c.tensor < sizes_.tensor &&
               c.pipeline >= 0 && c.pipeline < sizes_.pipeline,
           "grid coordinate (data ", c.data, ", tensor ", c.tensor, ", pipeline ", c.pipeline, ") outside the grid");
  return c.tensor + sizes_.tensor * (c.data + sizes_.data * c.pipeline);
}

int RankLayout::group_size(Group g) const {
  switch (g) {
    case Group::World: return world_size_;
    case Group::Data: return sizes_.data;
    case Group::Tensor: return sizes_.tensor;
    case Group::Pipeline: return sizes_.pipeline;
  }
  return 0;
}

int RankLayout::group_rank(Group g, int rank) const {
  GridCoord c = coord(rank);
  switch (g) {
    case Group::World: return rank;
    case Group::Data: return c.data;
    case Group::Tensor: return c.tensor;
    case Group::Pipeline: return c.pipeline;
  }
  return 0;
}

int RankLayout::group_color(Group g, int rank) const {
  GridCoord c = coord(rank);
  switch (g) {
    case Group::World: return 0;
    case Group::Data: return c.tensor + sizes_.tensor * c.pipeline;
    case Group::Tensor: return c.data + sizes_.data * c.pipeline;
    case Group::Pipeline: return c.tensor + sizes_.tensor * c.data;
  }
  return 0;
}

std::vector<int> RankLayout::group_ranks(Group g, int rank) const {
  std::vector<int> ranks;
  GridCoord c = coord(rank);
  for (int i = 0; i < group_size(g); ++i) {
    GridCoord m = c;
    switch (g) {
      case Group::World: ranks.push_back(i); continue;
      case Group::Data: m.data = i; break;
      case Group::Tensor: m.tensor = i; break;
      case Group::Pipeline: m.pipeline = i; break;
    }
    ranks.push_back(rank_of(m));
  }
  return ranks;
}

namespace {
int world_size_of(MPI_Comm c) {
  int n = 0;
  ZP_MPI_CHECK(MPI_Comm_size(c, &n));
  return n;
}
}  // namespace

Topology::Topology(MPI_Comm world, ParallelSizes sizes) : layout_(world_size_of(world), sizes) {
  ZP_MPI_CHECK(MPI_Comm_rank(world, &rank_));
  ZP_MPI_CHECK(MPI_Comm_dup(world, &world_));
  // The key orders each group by world rank, which is also the order of the group's coordinate.
  ZP_MPI_CHECK(MPI_Comm_split(world, layout_.group_color(Group::Data, rank_), rank_, &data_));
  ZP_MPI_CHECK(MPI_Comm_split(world, layout_.group_color(Group::Tensor, rank_), rank_, &tensor_));
  ZP_MPI_CHECK(MPI_Comm_split(world, layout_.group_color(Group::Pipeline, rank_), rank_, &pipeline_));
}

Topology::~Topology() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  for (MPI_Comm* c : {&world_, &data_, &tensor_, &pipeline_})
    if (*c != MPI_COMM_NULL) MPI_Comm_free(c);
}

MPI_Comm Topology::mpi_comm(Group g) const {
  switch (g) {
    case Group::World: return world_;
    case Group::Data: return data_;
    case Group::Tensor: return tensor_;
    case Group::Pipeline: return pipeline_;
  }
  return MPI_COMM_NULL;
}

std::unique_ptr<Communicator> Topology::make_communicator(Group g, Backend b) const {
  return comm::make_communicator(b, mpi_comm(g));
}

std::unique_ptr<Communicator> make_communicator(Backend b, MPI_Comm group) {
  if (b == Backend::Mpi) return std::make_unique<MpiComm>(group);
  return make_nccl_comm(group);
}

}  // namespace zp::comm
