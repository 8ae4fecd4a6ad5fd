// Start-up checks of the offload tiers' storage, before any state is allocated (issue 11 items 5
// and 8): a run whose NVMe directory is missing, not writable or too small stops with a message
// naming the key, on every rank, instead of failing on one rank in the middle of start-up.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <span>
#include <string>

#include "nn/parameter.h"
#include "parallel/sharding_policy.h"

namespace zp::runtime {

// `dir` (the value of configuration key `key`) exists or can be created, takes a new file, and has
// room for the swap files of the ranks of `comm` on the same node, `bytes_per_rank` this rank's
// (one rank per node checks: node-local disks differ; a shared file system is counted per node).
// `what` names the files' contents for the message ("the optimizer state (fp32 master weights and
// two moments)"). Collective over `comm`; when a node fails, every rank throws the same zp::Error.
void check_nvme_storage(const std::string& key, const std::string& dir, int64_t bytes_per_rank,
                        const std::string& what, MPI_Comm comm);

// check_nvme_storage for each NVMe tier of `policy` (the optimizer state's, the parameter shards'),
// with the bytes its swap file takes for laid-out `blocks` on a data group of `data_size` ranks; two
// tiers under one directory are checked once, for both. Collective over `comm`.
void check_nvme_tiers(std::span<nn::ParamBlock* const> blocks, const parallel::ShardingPolicy& policy, int data_size,
                      MPI_Comm comm);

}  // namespace zp::runtime
