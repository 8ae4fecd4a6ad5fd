// Checked calls. A failure prints rank, host, file:line and the library's own message, then aborts
// the whole MPI job (MPI_Abort), so one failing rank never leaves the others waiting in a collective.
#pragma once
#include <sstream>
#include <string>

namespace zp {

[[noreturn]] void fatal(const char* file, int line, const std::string& what);

// A recoverable error for bad input (config, files, arguments): the caller decides whether to abort.
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

namespace detail {
template <class... Args> std::string cat(const Args&... a) {
  std::ostringstream s;
  (s << ... << a);
  return s.str();
}
}  // namespace detail

}  // namespace zp

#define ZP_FATAL(...) ::zp::fatal(__FILE__, __LINE__, ::zp::detail::cat(__VA_ARGS__))
#define ZP_CHECK(cond, ...) \
  do { if (!(cond)) ZP_FATAL("check failed: " #cond " ", ##__VA_ARGS__); } while (0)
// Throws zp::Error: for user-facing input validation.
#define ZP_REQUIRE(cond, ...) \
  do { if (!(cond)) throw ::zp::Error(::zp::detail::cat(__VA_ARGS__)); } while (0)

#define ZP_MPI_CHECK(call)                                               \
  do {                                                                   \
    int zp_rc_ = (call);                                                 \
    if (zp_rc_ != 0) ZP_FATAL(#call ": ", ::zp::mpi_error_string(zp_rc_)); \
  } while (0)

namespace zp {
std::string mpi_error_string(int rc);
}  // namespace zp
