// Variable-length text from every rank to one (results of requests that were split across ranks:
// generation, evaluation). Small control traffic, so MPI, not NCCL.
#pragma once
#include <mpi.h>

#include <string>
#include <vector>

namespace zp::comm {

// On `root`: every rank's `mine`, by rank; elsewhere: empty. comm MPI_COMM_NULL (no MPI job):
// {mine}. Collective over comm.
std::vector<std::string> gather_text(const std::string& mine, int root, MPI_Comm comm);

}  // namespace zp::comm
