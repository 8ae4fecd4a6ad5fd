// Rank-aware logging. Every line carries the rank; info() prints on rank 0 only unless asked.
#pragma once
#include <string>
#include "core/error.h"

namespace zp {

struct ProcessInfo {
  int rank = 0, world = 1, local_rank = 0;
  std::string host;
};
// Filled by the MPI bootstrap; before it, read from the launcher's environment variables.
ProcessInfo& process_info();

enum class LogLevel { Debug, Info, Warn, Error };
void log_line(LogLevel level, bool all_ranks, const std::string& msg);
void set_log_level(LogLevel level);

}  // namespace zp

#define ZP_LOG_INFO(...) ::zp::log_line(::zp::LogLevel::Info, false, ::zp::detail::cat(__VA_ARGS__))
#define ZP_LOG_INFO_ALL(...) ::zp::log_line(::zp::LogLevel::Info, true, ::zp::detail::cat(__VA_ARGS__))
#define ZP_LOG_WARN(...) ::zp::log_line(::zp::LogLevel::Warn, true, ::zp::detail::cat(__VA_ARGS__))
#define ZP_LOG_DEBUG(...) ::zp::log_line(::zp::LogLevel::Debug, true, ::zp::detail::cat(__VA_ARGS__))
