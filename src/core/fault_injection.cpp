#include "core/fault_injection.h"

#include <mpi.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <string>

#include "core/error.h"

namespace zp::fault {
namespace {

struct Rule {
  int64_t nth = 0;  // 0: no fault at this site
  int rank = -1;    // -1: every rank
  std::atomic<int64_t> calls{0};
};

struct Plan {
  bool any = false;
  Rule rules[3];
};

const char* site_name(int i) { return i == 0 ? "write" : i == 1 ? "collective" : "alloc"; }

// "site:N[@R]" items separated by commas.
void parse(const std::string& text, Plan& plan) {
  size_t b = 0;
  while (b < text.size()) {
    size_t e = text.find(',', b);
    const std::string item = text.substr(b, e == std::string::npos ? std::string::npos : e - b);
    b = e == std::string::npos ? text.size() : e + 1;
    if (item.empty()) continue;
    const size_t colon = item.find(':');
    if (colon == std::string::npos) ZP_FATAL("ZP_FAULT item '", item, "': expected site:N[@rank]");
    const std::string site = item.substr(0, colon);
    int which = -1;
    for (int i = 0; i < 3; ++i)
      if (site == site_name(i)) which = i;
    if (which < 0) ZP_FATAL("ZP_FAULT item '", item, "': the site must be write, collective or alloc");
    const std::string rest = item.substr(colon + 1);
    const size_t at = rest.find('@');
    char* end = nullptr;
    const long long nth = std::strtoll(rest.c_str(), &end, 10);
    if (nth < 1 || (at == std::string::npos ? *end != '\0' : end != rest.c_str() + at))
      ZP_FATAL("ZP_FAULT item '", item, "': N must be an integer >= 1");
    Rule& r = plan.rules[which];
    r.nth = nth;
    if (at != std::string::npos) {
      const long long rank = std::strtoll(rest.c_str() + at + 1, &end, 10);
      if (rank < 0 || *end != '\0') ZP_FATAL("ZP_FAULT item '", item, "': the rank after '@' must be >= 0");
      r.rank = int(rank);
    }
    plan.any = true;
  }
}

Plan& plan() {
  static Plan p;
  static std::once_flag once;
  std::call_once(once, [] {
    if (const char* v = std::getenv("ZP_FAULT")) parse(v, p);
  });
  return p;
}

int world_rank() {
  int init = 0, fin = 0, r = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (init && !fin) MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

}  // namespace

bool hit(Site site) {
  Plan& p = plan();
  if (!p.any) return false;
  Rule& r = p.rules[int(site)];
  if (r.nth == 0 || (r.rank >= 0 && r.rank != world_rank())) return false;
  return r.calls.fetch_add(1, std::memory_order_relaxed) + 1 == r.nth;
}

}  // namespace zp::fault
