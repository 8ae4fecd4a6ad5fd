// The comparison half of `zeropipe parity`: relative error ||got - want|| / ||want|| per tensor,
// one line per tensor and a summary, shared by the transformer and UNet parity runs.
#pragma once
#include <string>
#include <vector>

#include "core/tensor.h"

namespace zp::app {

// Any float tensor (any device) as host doubles.
std::vector<double> host_values(const Tensor& t);
// [rows, cols] row-major -> [cols, rows].
std::vector<double> transpose(const std::vector<double>& v, int64_t rows, int64_t cols);
double relative_error(const std::vector<double>& got, const std::vector<double>& want);

struct ParityEntry {
  std::string name;
  double rel_error;
  bool ok;
};

class ParityReport {
 public:
  explicit ParityReport(double tol, bool print = true) : tol_(tol), print_(print) {}
  // Records (and prints) one tensor; a size mismatch counts as an infinite error.
  void check(const std::string& name, const std::vector<double>& got, const std::vector<double>& want);
  // Prints the summary; returns the exit code (0 when every tensor is within tolerance).
  int finish() const;
  const std::vector<ParityEntry>& entries() const { return entries_; }
  double tolerance() const { return tol_; }

 private:
  double tol_;
  bool print_;
  std::vector<ParityEntry> entries_;
};

}  // namespace zp::app
