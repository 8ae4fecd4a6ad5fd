// The comm::Runtime for a test that trains in the zp_tests process.
#pragma once
#include <mpi.h>

#include <cstdlib>
#include <functional>

#include "comm/bootstrap.h"

namespace zp::test {

// Runs f with the process's Runtime: the live one (another test file keeps one for the whole run), or
// one made for this call. MPI can be initialised only once per process, so this initialises it
// itself (finalized at exit, after every Runtime is gone): a Runtime made here then never owns MPI,
// and another file's Runtime can still be made later.
inline void with_runtime(const std::function<void(comm::Runtime&)>& f) {
  if (comm::Runtime* live = comm::Runtime::current()) return f(*live);
  int inited = 0;
  MPI_Initialized(&inited);
  if (!inited) {
    int provided = 0;
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
    std::atexit([] {
      int done = 0;
      MPI_Finalized(&done);
      if (!done) MPI_Finalize();
    });
  }
  comm::Runtime rt;
  f(rt);
}

}  // namespace zp::test
