#include "core/log.h"

#include <mpi.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

namespace zp {
namespace {
int env_int(const char* a, const char* b, const char* c) {
  for (const char* n : {a, b, c})
    if (const char* v = std::getenv(n)) return std::atoi(v);
  return -1;
}
// ZP_LOG_LEVEL=debug|info|warn|error sets the level a run starts at; anything else is an error.
LogLevel level_from_env() {
  const char* v = std::getenv("ZP_LOG_LEVEL");
  if (!v || !*v) return LogLevel::Info;
  const std::string s = v;
  if (s == "debug") return LogLevel::Debug;
  if (s == "info") return LogLevel::Info;
  if (s == "warn") return LogLevel::Warn;
  if (s == "error") return LogLevel::Error;
  std::fprintf(stderr, "ZP_LOG_LEVEL=%s: expected debug, info, warn or error\n", v);
  std::exit(2);
}
LogLevel g_level = level_from_env();
std::mutex g_log_mutex;
}  // namespace

ProcessInfo& process_info() {
  static ProcessInfo info = [] {
    ProcessInfo p;
    int r = env_int("OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID");
    int w = env_int("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS");
    int l = env_int("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID");
    p.rank = r < 0 ? 0 : r;
    p.world = w < 1 ? 1 : w;
    p.local_rank = l < 0 ? 0 : l;
    char h[256] = {0};
    gethostname(h, sizeof(h) - 1);
    p.host = h;
    return p;
  }();
  return info;
}

void set_log_level(LogLevel level) { g_level = level; }

void log_line(LogLevel level, bool all_ranks, const std::string& msg) {
  if (level < g_level) return;
  const ProcessInfo& p = process_info();
  if (!all_ranks && p.rank != 0) return;
  static const char* tags[] = {"debug", "info", "warn", "error"};
  std::lock_guard<std::mutex> lock(g_log_mutex);
  FILE* out = level >= LogLevel::Warn ? stderr : stdout;
  std::fprintf(out, "[zp %s r%d] %s\n", tags[int(level)], p.rank, msg.c_str());
  std::fflush(out);
}

[[noreturn]] void fatal(const char* file, int line, const std::string& what) {
  const ProcessInfo& p = process_info();
  std::fprintf(stderr, "[zp FATAL rank %d host %s] %s:%d: %s\n", p.rank, p.host.c_str(), file, line,
               what.c_str());
  std::fflush(stderr);
  int inited = 0, finalized = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&finalized);
  if (inited && !finalized && p.world > 1) MPI_Abort(MPI_COMM_WORLD, 1);
  std::abort();
}

std::string mpi_error_string(int rc) {
  char buf[MPI_MAX_ERROR_STRING] = {0};
  int len = 0;
  if (MPI_Error_string(rc, buf, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(rc);
  return std::string(buf, size_t(len));
}

}  // namespace zp
