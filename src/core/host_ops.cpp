#include "core/host_ops.h"

#include <cstdlib>
#include <set>
#include <sstream>
#include <string>

#include "core/log.h"
#ifdef ZP_WITH_CUDA
#include "core/cuda_check.h"
#endif

namespace zp {
namespace {

struct HostOps {
  bool enabled = false, all = false;
  std::set<std::string> names;
  HostOps() {
    const char* v = std::getenv("ZP_HOST_OPS");
    if (!v || !*v) return;
    enabled = true;
    std::stringstream list(v);
    for (std::string name; std::getline(list, name, ',');)
      if (name == "all") all = true;
      else if (!name.empty()) names.insert(name);
    ZP_LOG_WARN("ZP_HOST_OPS=", v, ": those ops run their CPU reference on managed device memory (a diagnostic; slow)");
  }
};

const HostOps& host_ops() {
  static const HostOps ops;
  return ops;
}

}  // namespace

bool host_ops_enabled() { return host_ops().enabled; }

bool runs_on_host(const char* op) {
  const HostOps& ops = host_ops();
  if (!ops.enabled || (!ops.all && !ops.names.count(op))) return false;
#ifdef ZP_WITH_CUDA
  // Waiting for the device is refused while a stream captures a CUDA graph (a decode step's).
  const cudaError_t e = cudaDeviceSynchronize();
  if (e == cudaErrorStreamCaptureUnsupported || e == cudaErrorStreamCaptureImplicit ||
      e == cudaErrorStreamCaptureInvalidated)
    ZP_FATAL("ZP_HOST_OPS: ", op, " cannot run on the host while a CUDA graph is captured; set ZP_HOST_OPS for "
             "runs without graphs (training, parity)");
  ZP_CUDA_CHECK(e);
#endif
  return true;
}

}  // namespace zp
