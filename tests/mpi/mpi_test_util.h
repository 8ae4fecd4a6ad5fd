// Helpers for tests that run under mpirun: the world rank and size, whether every rank has a GPU, and
// a scratch folder that rank 0 creates (named per process, so ctest's np2/np3/np5 runs cannot
// collide) and removes at the end.
#pragma once
#include <mpi.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "comm/bootstrap.h"
#include "core/device.h"

namespace zp::test {

// Whether every rank of the world has a GPU of its own (the same answer on every rank).
inline bool every_rank_has_a_gpu() {
  comm::Runtime rt;
  int ok = rt.device().is_cuda() && cuda_device_count() >= rt.local_size(), all = 0;
  MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return all != 0;
}

inline int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

inline int world_size() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

class SharedDir {
 public:
  explicit SharedDir(const std::string& name) {
    char buf[256] = {0};
    if (world_rank() == 0) {
      const std::filesystem::path d =
          std::filesystem::temp_directory_path() / ("zp_" + name + "_" + std::to_string(::getpid()));
      std::filesystem::remove_all(d);
      std::filesystem::create_directories(d);
      std::snprintf(buf, sizeof buf, "%s", d.c_str());
    }
    MPI_Bcast(buf, sizeof buf, MPI_CHAR, 0, MPI_COMM_WORLD);
    dir_ = buf;
  }
  ~SharedDir() {
    MPI_Barrier(MPI_COMM_WORLD);
    std::error_code ec;
    if (world_rank() == 0) std::filesystem::remove_all(dir_, ec);
  }
  SharedDir(const SharedDir&) = delete;
  SharedDir& operator=(const SharedDir&) = delete;
  std::string operator/(const std::string& f) const { return dir_ + "/" + f; }
  const std::string& str() const { return dir_; }

 private:
  std::string dir_;
};

}  // namespace zp::test
