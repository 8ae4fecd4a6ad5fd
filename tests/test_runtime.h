// The comm::Runtime for a test that trains in the zp_tests process.
#pragma once
#include <mpi.h>

#include <cstdlib>
#include <functional>
#include <memory>

#include "comm/bootstrap.h"

namespace zp::test {

// The process's Runtime for as long as the lease lives: the live one (another test file keeps one
// for the whole run), or one made for this lease. MPI can be initialised only once per process, so
// the lease initialises it itself (finalised at exit, after every Runtime is gone): a Runtime made
// here then never owns MPI, and another file's Runtime can still be made later.
class RuntimeLease {
 public:
  RuntimeLease() {
    if (comm::Runtime::current()) return;
    int init = 0;
    MPI_Initialized(&init);
    if (!init) {
      int provided = 0;
      MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
      std::atexit([] {
        int fin = 0;
        MPI_Finalized(&fin);
        if (!fin) MPI_Finalize();
      });
    }
    own_ = std::make_unique<comm::Runtime>();
  }
  comm::Runtime& operator*() const { return *comm::Runtime::current(); }

 private:
  std::unique_ptr<comm::Runtime> own_;
};

// Runs f with the process's Runtime (a RuntimeLease for the call).
inline void with_runtime(const std::function<void(comm::Runtime&)>& f) {
  RuntimeLease rt;
  f(*rt);
}

}  // namespace zp::test
