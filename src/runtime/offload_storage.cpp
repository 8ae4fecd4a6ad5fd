#include "runtime/offload_storage.h"

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "parallel/memory_plan.h"

namespace zp::runtime {

namespace fs = std::filesystem;

namespace {

// The problem with `dir` for `ranks` swap files of `need` bytes together, or "".
std::string nvme_problem(const std::string& key, const std::string& dir, int64_t need, int ranks,
                         const std::string& what) {
  const std::string where = key + " '" + dir + "'";
  std::error_code ec;
  if (fs::exists(dir, ec) && !fs::is_directory(dir, ec)) return where + ": exists and is not a directory";
  fs::create_directories(dir, ec);
  if (ec) return where + ": does not exist and cannot be created: " + ec.message();
  // A probe file: permissions, a read-only mount and quotas all show here, before any work.
  const std::string probe = (fs::path(dir) / (".zeropipe-probe-" + std::to_string(::getpid()))).string();
  const int fd = ::open(probe.c_str(), O_CREAT | O_WRONLY | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return where + ": not writable (creating a probe file there failed: " + std::strerror(errno) + ")";
  const char bytes[4096] = {};
  const bool wrote = ::write(fd, bytes, sizeof bytes) == ssize_t(sizeof bytes);
  const int err = errno;
  ::close(fd);
  ::unlink(probe.c_str());
  if (!wrote) return where + ": not writable (writing a probe file there failed: " + std::strerror(err) + ")";
  struct statvfs v {};
  if (::statvfs(dir.c_str(), &v) != 0) return where + ": cannot read the free space: " + std::strerror(errno);
  const int64_t free = int64_t(v.f_bavail) * int64_t(v.f_frsize);
  if (free < need)
    return detail::cat(where, ": ", free, " bytes free, but the swap files of this node's ", ranks, " rank(s) need ",
                       need, " bytes for ", what, ": free space there, point nvme_path at a larger disk, or shard "
                       "over more nodes");
  return "";
}

}  // namespace

void check_nvme_storage(const std::string& key, const std::string& dir, int64_t bytes_per_rank,
                        const std::string& what, MPI_Comm comm) {
  int rank = 0;
  ZP_MPI_CHECK(MPI_Comm_rank(comm, &rank));
  MPI_Comm node = MPI_COMM_NULL;
  ZP_MPI_CHECK(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node));
  int node_rank = 0, node_size = 1;
  ZP_MPI_CHECK(MPI_Comm_rank(node, &node_rank));
  ZP_MPI_CHECK(MPI_Comm_size(node, &node_size));
  int64_t node_bytes = 0;
  ZP_MPI_CHECK(MPI_Allreduce(&bytes_per_rank, &node_bytes, 1, MPI_INT64_T, MPI_SUM, node));
  ZP_MPI_CHECK(MPI_Comm_free(&node));
  std::string problem = node_rank == 0 ? nvme_problem(key, dir, node_bytes, node_size, what) : "";
  // The lowest failing rank's message goes to every rank.
  int mine = problem.empty() ? INT_MAX : rank, first = INT_MAX;
  ZP_MPI_CHECK(MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, comm));
  if (first == INT_MAX) return;
  int64_t len = int64_t(problem.size());
  ZP_MPI_CHECK(MPI_Bcast(&len, 1, MPI_INT64_T, first, comm));
  problem.resize(size_t(len));
  ZP_MPI_CHECK(MPI_Bcast(problem.data(), int(len), MPI_CHAR, first, comm));
  throw Error(problem);
}

void check_nvme_tiers(std::span<nn::ParamBlock* const> blocks, const parallel::ShardingPolicy& policy, int data_size,
                      MPI_Comm comm) {
  const bool optimizer = policy.optimizer_tier() == parallel::StateTier::Nvme;
  const bool params = policy.shards_parameters() && policy.parameter_tier() == parallel::StateTier::Nvme;
  if (!optimizer && !params) return;
  const parallel::MemoryPlan plan = parallel::plan_memory(blocks, policy, data_size, false, false);
  const std::string optimizer_what = "the optimizer state (fp32 master weights and two moments)";
  const std::string params_what = "the parameter shards (the compute weights)";
  const std::string& optimizer_dir = policy.optimizer_nvme().path;
  const std::string& params_dir = policy.parameter_nvme().path;
  if (optimizer && params && optimizer_dir == params_dir) {
    check_nvme_storage("zero_optimization.offload_optimizer.nvme_path and zero_optimization.offload_param.nvme_path",
                       optimizer_dir, int64_t(plan.nvme_bytes()), optimizer_what + " and " + params_what, comm);
    return;
  }
  if (optimizer)
    check_nvme_storage("zero_optimization.offload_optimizer.nvme_path", optimizer_dir,
                       int64_t(plan.nvme_optimizer_bytes), optimizer_what, comm);
  if (params)
    check_nvme_storage(policy.parameter_nvme().path_key, params_dir, int64_t(plan.nvme_param_bytes), params_what, comm);
}

}  // namespace zp::runtime
