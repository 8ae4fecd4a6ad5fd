#include "app/parity_report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/config.h"

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

ParityCriterion::ParityCriterion(DType compute)
    : tol_(compute == DType::BF16 || compute == DType::F16 ? 3e-2 : 1e-4),
      reduced_(compute == DType::BF16 || compute == DType::F16) {}

ParityCriterion ParityCriterion::for_dump(const std::string& dir, DType compute) {
  ParityCriterion c(compute);
  const std::string path = (std::filesystem::path(dir) / "reference_error.json").string();
  if (!std::filesystem::exists(path)) return c;
  // The reference ran in float32 (TF32 off) and in bf16 autocast; fp16 compute is held to the bf16
  // column, the nearest precision measured (fp16 keeps more mantissa bits, so it is no looser).
  const char* column = c.reduced_ ? "bf16" : "fp32";
  const nlohmann::json j = io::read_json_file(path);
  ZP_REQUIRE(j.is_object() && j.contains(column) && j[column].is_object(), path, ": no object \"", column,
             "\" (the reference's relative error per tensor)");
  for (const auto& [name, v] : j[column].items()) {
    ZP_REQUIRE(v.is_number() && std::isfinite(v.get<double>()) && v.get<double>() >= 0, path, ": ", column, ".",
               name, " must be a finite non-negative number, got ", v.dump());
    c.ref_error_[name] = v.get<double>();
  }
  c.source_ = path + " (" + column + ")";
  return c;
}

ParityCriterion::Bound ParityCriterion::bound(const std::string& name) const {
  const bool final_param = name.starts_with("train.final.");
  const auto it = ref_error_.find(name);
  const double ref = it == ref_error_.end() ? -1.0 : it->second;
  const double factor = final_param && !reduced_ ? 4.0 : 2.0;
  return {std::max(tol_, factor * ref), !(final_param && reduced_), ref};
}

void ParityReport::expect(const std::vector<std::string>& dump_names) {
  for (const std::string& n : dump_names)
    if (!n.starts_with("input.") && !n.starts_with("grad_output.")) expected_.insert(n);
  for (const auto& [n, e] : criterion_.reference_errors()) expected_.insert(n);
}

void ParityReport::check(const std::string& name, std::vector<double> got, const std::vector<double>& want) {
  if (alter_) alter_(name, got);
  const double e = relative_error(got, want);
  const ParityCriterion::Bound b = criterion_.bound(name);
  const ParityEntry entry{name, e, b.bound, b.gated, e <= b.bound};
  entries_.push_back(entry);
  if (!print_) return;
  std::string why;  // where a bound above the tolerance comes from
  if (b.bound > criterion_.tolerance()) {
    char buf[64];
    std::snprintf(buf, sizeof buf, " (%gx reference %.2e)", b.bound / b.reference_error, b.reference_error);
    why = buf;
  }
  std::printf("%-4s %-60s rel_err %.3e  bound %.3e%s%s\n", !entry.gated ? "--" : entry.ok ? "ok" : "FAIL",
              name.c_str(), e, b.bound, why.c_str(), entry.gated ? "" : "  not gated");
}

void ParityReport::record_missing() {
  std::set<std::string> checked;
  for (const auto& e : entries_) checked.insert(e.name);
  for (const std::string& n : expected_) {
    if (checked.count(n)) continue;
    entries_.push_back({n, INFINITY, criterion_.bound(n).bound, true, false});
    if (print_) std::printf("%-4s %-60s missing: the dump expects it and the engine produced none\n", "FAIL", n.c_str());
  }
}

int ParityReport::finish() const {
  int gated = 0, failed = 0;
  double worst_ratio = 0;
  std::string worst;
  for (const auto& e : entries_) {
    if (!e.gated) continue;
    ++gated;
    failed += e.fails();
    const double ratio = e.rel_error / e.bound;
    if (worst.empty() || ratio > worst_ratio) worst_ratio = ratio, worst = e.name;
  }
  if (print_) {
    const int reported = int(entries_.size()) - gated;
    if (criterion_.source().empty())
      std::printf("criterion: every tensor within %.0e (no reference_error.json: strict)\n", criterion_.tolerance());
    else
      std::printf("criterion: within max(%.0e, 2x the reference's own error), train.final.* %s; reference errors from %s\n",
                  criterion_.tolerance(), criterion_.reduced_precision() ? "not gated" : "4x",
                  criterion_.source().c_str());
    std::printf("parity: %d of %d gated tensors within their bounds (largest error/bound %.2g: %s)", gated - failed,
                gated, worst_ratio, worst.c_str());
    if (reported) std::printf(", %d reported, not gated", reported);
    std::printf(": %s\n", failed || gated == 0 ? "FAILED" : "PASSED");
  }
  return failed || gated == 0 ? 1 : 0;
}

}  // namespace zp::app
