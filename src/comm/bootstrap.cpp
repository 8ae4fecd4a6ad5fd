#include "comm/bootstrap.h"

#include <chrono>
#include <thread>

#include "core/error.h"
#include "core/log.h"
#ifdef ZP_WITH_CUDA
#include "core/cuda_check.h"
#endif

namespace zp::comm {
namespace {
Runtime* g_current = nullptr;
}  // namespace

Runtime* Runtime::current() { return g_current; }

bool Runtime::all_ranks_failed(double timeout_s) {
  if (world_size_ == 1) return true;
  MPI_Request req = MPI_REQUEST_NULL;
  if (MPI_Ibarrier(failure_comm_, &req) != MPI_SUCCESS) return false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (std::chrono::steady_clock::now() < deadline) {
    int done = 0;
    if (MPI_Test(&req, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) return false;
    if (done) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return false;  // the request stays pending: MPI_Abort follows
}

Runtime::Runtime(int* argc, char*** argv) {
  ZP_CHECK(g_current == nullptr, "a zp::comm::Runtime already exists in this process");
  int inited = 0;
  ZP_MPI_CHECK(MPI_Initialized(&inited));
  if (inited) {
    ZP_MPI_CHECK(MPI_Query_thread(&thread_level_));
  } else {
    ZP_MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &thread_level_));
    owns_mpi_ = true;
  }
  ZP_MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  ZP_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank_));
  ZP_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &world_size_));
  ZP_MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node_comm_));
  ZP_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &failure_comm_));
  ZP_MPI_CHECK(MPI_Comm_rank(node_comm_, &local_rank_));
  ZP_MPI_CHECK(MPI_Comm_size(node_comm_, &local_size_));
  char name[MPI_MAX_PROCESSOR_NAME] = {0};
  int len = 0;
  ZP_MPI_CHECK(MPI_Get_processor_name(name, &len));
  host_.assign(name, size_t(len));

  ProcessInfo& p = process_info();
  p.rank = rank_;
  p.world = world_size_;
  p.local_rank = local_rank_;
  p.host = host_;

  int devices = cuda_device_count();
  if (devices > 0) {
    device_ = Device::cuda(local_rank_ % devices);
#ifdef ZP_WITH_CUDA
    ZP_CUDA_CHECK(cudaSetDevice(device_.index));
#endif
    if (local_size_ > devices)
      ZP_LOG_WARN(local_size_, " ranks share ", devices, " CUDA devices on ", host_,
                  "; NCCL needs one device per rank");
  }
  g_current = this;
}

Runtime::~Runtime() {
  g_current = nullptr;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  if (node_comm_ != MPI_COMM_NULL) MPI_Comm_free(&node_comm_);
  if (failure_comm_ != MPI_COMM_NULL) MPI_Comm_free(&failure_comm_);
  if (owns_mpi_) MPI_Finalize();
}

}  // namespace zp::comm
