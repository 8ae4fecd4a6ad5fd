// Topology: how the world's ranks form data-, tensor- and pipeline-parallel groups, and the
// communicators of this rank's groups (DESIGN decision 5).
//
// Layout (Megatron's): tensor index fastest, then data, then pipeline:
//     world rank = tensor + T * (data + D * pipeline)
// so a tensor-parallel group is T consecutive ranks (one node, fast links) and pipeline stages are
// the farthest apart. A rank's index inside each group is its coordinate along that axis.
#pragma once
#include <mpi.h>

#include <memory>
#include <string_view>
#include <vector>

#include "comm/communicator.h"

namespace zp::comm {

struct ParallelSizes {
  int data = 1, tensor = 1, pipeline = 1;
};
struct GridCoord {
  int data = 0, tensor = 0, pipeline = 0;
  bool operator==(const GridCoord&) const = default;
};
enum class Group : uint8_t { World, Data, Tensor, Pipeline };
std::string_view group_name(Group g);

// The arithmetic alone, no MPI: usable for any world size, e.g. to validate a config.
class RankLayout {
 public:
  // Throws zp::Error unless every size is >= 1 and data*tensor*pipeline == world_size.
  RankLayout(int world_size, ParallelSizes sizes);
  int world_size() const { return world_size_; }
  const ParallelSizes& sizes() const { return sizes_; }
  GridCoord coord(int rank) const;
  int rank_of(GridCoord c) const;
  int group_size(Group g) const;
  // Index of `rank` inside its group `g` (its coordinate along g; the world rank for World).
  int group_rank(Group g, int rank) const;
  // World ranks of the group `g` that holds `rank`, ordered by group rank.
  std::vector<int> group_ranks(Group g, int rank) const;
  // Ranks of a group share this number (MPI_Comm_split's colour).
  int group_color(Group g, int rank) const;

 private:
  int world_size_;
  ParallelSizes sizes_;
};

class Topology {
 public:
  // Collective over `world`: splits it (MPI_Comm_split) into this rank's data, tensor and pipeline
  // groups. Throws zp::Error (on every rank alike) when the sizes do not multiply to its size.
  Topology(MPI_Comm world, ParallelSizes sizes);
  ~Topology();
  Topology(const Topology&) = delete;
  Topology& operator=(const Topology&) = delete;

  const RankLayout& layout() const { return layout_; }
  int rank() const { return rank_; }
  GridCoord coord() const { return layout_.coord(rank_); }
  int group_rank(Group g) const { return layout_.group_rank(g, rank_); }
  int group_size(Group g) const { return layout_.group_size(g); }
  MPI_Comm mpi_comm(Group g) const;

  // A new communicator over this rank's group `g` (collective over that group). Nccl uses the
  // current CUDA device (the one Runtime selected).
  std::unique_ptr<Communicator> make_communicator(Group g, Backend b) const;

 private:
  RankLayout layout_;
  int rank_ = 0;
  MPI_Comm world_ = MPI_COMM_NULL, data_ = MPI_COMM_NULL, tensor_ = MPI_COMM_NULL,
           pipeline_ = MPI_COMM_NULL;
};

// A communicator of backend `b` over the MPI communicator `group` (collective over it). Nccl in a
// build without CUDA throws zp::Error.
std::unique_ptr<Communicator> make_communicator(Backend b, MPI_Comm group);

}  // namespace zp::comm
