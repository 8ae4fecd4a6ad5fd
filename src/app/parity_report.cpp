#include "app/parity_report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace zp::app {

std::vector<double> host_values(const Tensor& t) {
  Tensor h = t.device().is_cpu() ? t : t.to(Device::cpu());
  std::vector<double> v(size_t(h.numel()));
  for (size_t i = 0; i < v.size(); ++i) {
    switch (h.dtype()) {
      case DType::F32: v[i] = h.data<float>()[i]; break;
      case DType::BF16: v[i] = float(h.data<bf16>()[i]); break;
      case DType::F16: v[i] = float(h.data<f16>()[i]); break;
      case DType::F64: v[i] = h.data<double>()[i]; break;
      default: ZP_FATAL("not a float tensor: ", h.str());
    }
  }
  return v;
}

std::vector<double> transpose(const std::vector<double>& v, int64_t rows, int64_t cols) {
  std::vector<double> t(v.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) t[size_t(c * rows + r)] = v[size_t(r * cols + c)];
  return t;
}

double relative_error(const std::vector<double>& got, const std::vector<double>& want) {
  if (got.size() != want.size()) return INFINITY;
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  if (!std::isfinite(num)) return INFINITY;
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

void ParityReport::check(const std::string& name, const std::vector<double>& got, const std::vector<double>& want) {
  double e = relative_error(got, want);
  bool ok = e <= tol_;
  entries_.push_back({name, e, ok});
  if (print_) std::printf("%-4s %-60s rel_err %.3e\n", ok ? "ok" : "FAIL", name.c_str(), e);
}

int ParityReport::finish() const {
  int failed = 0;
  double worst = 0;
  for (const auto& e : entries_) {
    failed += !e.ok;
    worst = std::max(worst, e.rel_error);
  }
  if (print_)
    std::printf("parity: %d of %d tensors within %.0e (worst %.3e): %s\n", int(entries_.size()) - failed,
                int(entries_.size()), tol_, worst, failed ? "FAILED" : "PASSED");
  return failed ? 1 : 0;
}

}  // namespace zp::app
