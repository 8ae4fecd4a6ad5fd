// Process bootstrap: the one object a ZeRO-Pipe program creates first (DESIGN decision 5).
// It initialises MPI unless that already happened (a test main, a host application), learns the
// world and node-local ranks, fills zp::process_info() so logs and fatal errors name the right
// rank and host, makes MPI errors come back as return codes (so ZP_MPI_CHECK prints MPI's message),
// and picks this rank's device: CUDA device local_rank % device_count when there is one, else the CPU.
// MPI is finalized when the Runtime dies, only if the Runtime initialised it.
#pragma once
#include <mpi.h>

#include <string>

#include "core/device.h"

namespace zp::comm {

class Runtime {
 public:
  // Requests MPI_THREAD_MULTIPLE and accepts whatever MPI provides (see thread_level()).
  // argc/argv may be null. At most one Runtime is alive at a time (ZP_CHECK).
  explicit Runtime(int* argc = nullptr, char*** argv = nullptr);
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  // Rank and number of ranks on this node (ranks sharing memory with this one).
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }
  const std::string& host() const { return host_; }
  // cuda:k selected for this rank (and made current), or cpu when there is no CUDA device.
  Device device() const { return device_; }
  // MPI_THREAD_SINGLE .. MPI_THREAD_MULTIPLE as provided. Below MULTIPLE, only one thread at a
  // time may call MPI (communicators included).
  int thread_level() const { return thread_level_; }
  bool initialized_mpi() const { return owns_mpi_; }
  MPI_Comm world() const { return MPI_COMM_WORLD; }
  MPI_Comm node() const { return node_comm_; }

  // After an error on this rank: waits up to `timeout_s` for every rank to get here too. True when
  // they all did (an error the ranks agreed on: a full disk, a damaged checkpoint, divergence), so
  // the job can end through MPI_Finalize with every rank's clean-up done; false when some rank is
  // elsewhere (most likely waiting in a collective for this one) and the job must be aborted.
  // Runs on a communicator of its own, so it never matches a collective the others are in.
  bool all_ranks_failed(double timeout_s);

  // The live Runtime, or nullptr.
  static Runtime* current();

 private:
  int rank_ = 0, world_size_ = 1, local_rank_ = 0, local_size_ = 1, thread_level_ = MPI_THREAD_SINGLE;
  bool owns_mpi_ = false;
  std::string host_;
  Device device_;
  MPI_Comm node_comm_ = MPI_COMM_NULL;
  MPI_Comm failure_comm_ = MPI_COMM_NULL;
};

}  // namespace zp::comm
