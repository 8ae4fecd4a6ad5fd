// The comparison half of `zeropipe parity`: relative error ||got - want|| / ||want|| per tensor,
// each held to its bound by the parity criterion, one line per tensor and a summary, shared by the
// transformer and UNet parity runs and by the tests.
#pragma once
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"

namespace zp::app {

// Any float tensor (any device) as host doubles.
std::vector<double> host_values(const Tensor& t);
// [rows, cols] row-major -> [cols, rows].
std::vector<double> transpose(const std::vector<double>& v, int64_t rows, int64_t cols);
double relative_error(const std::vector<double>& got, const std::vector<double>& want);

// The parity criterion (DESIGN.md decision 15, tests/golden/README.md). Tolerance 1e-4 in fp32 (and
// fp64), 3e-2 in bf16/fp16. A dump's reference_error.json holds the reference implementation's own
// relative error on each of its tensors, because transformers and diffusers themselves miss those
// tolerances on a few ill-conditioned tensors: every tensor passes within max(tolerance, 2 x that
// error), a `train.final.*` parameter in fp32 within max(tolerance, 4 x) (five AdamW steps amplify
// the gradient's rounding). In bf16/fp16 `train.final.*` is reported but not gated: a parameter whose
// gradient is below the precision's noise takes AdamW steps of random sign, and `train.loss` gates
// the trajectory. Without reference errors (no file, or a tensor the file does not list) the bound is
// the tolerance.
class ParityCriterion {
 public:
  struct Bound {
    double bound;            // the largest relative error that passes
    bool gated;              // false: reported only, never fails the run
    double reference_error;  // the reference's own error on this tensor; negative when unknown
  };

  // Strict: the tolerance of `compute` for every tensor.
  explicit ParityCriterion(DType compute);
  // The criterion for the dump folder `dir`: reads `dir`/reference_error.json (the column of
  // `compute`'s precision) when present, strict when absent. Throws zp::Error for a malformed file.
  static ParityCriterion for_dump(const std::string& dir, DType compute);

  Bound bound(const std::string& name) const;
  double tolerance() const { return tol_; }
  bool reduced_precision() const { return reduced_; }
  // "" when strict, else the file and column the reference errors came from.
  const std::string& source() const { return source_; }
  // The tensors the reference error file lists: results the dump expects the engine to produce.
  const std::map<std::string, double>& reference_errors() const { return ref_error_; }

 private:
  double tol_;
  bool reduced_;  // bf16 or fp16 compute
  std::map<std::string, double> ref_error_;
  std::string source_;
};

struct ParityEntry {
  std::string name;
  double rel_error;
  double bound;
  bool gated;
  bool ok;  // rel_error <= bound; only a gated entry that is not ok fails the run
  bool fails() const { return gated && !ok; }
};

// Changes an engine result (host values, in the dump's layout) before it is compared.
using AlterResult = std::function<void(const std::string& name, std::vector<double>& got)>;

class ParityReport {
 public:
  explicit ParityReport(ParityCriterion criterion, bool print = true)
      : criterion_(std::move(criterion)), print_(print) {}
  // Names every result the dump holds (`io.safetensors`'s names; the inputs the engine is given,
  // `input.*` and `grad_output.*`, are left out) and those of the reference error file: each must be
  // checked, or record_missing() fails it.
  void expect(const std::vector<std::string>& dump_names);
  // For tests: every result passes through `alter` before check() compares it, so a test can show
  // that a wrong engine fails.
  void alter_results(AlterResult alter) { alter_ = std::move(alter); }
  // Records (and prints) one tensor; a size mismatch counts as an infinite error.
  void check(const std::string& name, std::vector<double> got, const std::vector<double>& want);
  // Records every expected tensor that no check() compared as a gated failure (a naming bug that
  // drops checks must fail, not pass on the tensors that remain).
  void record_missing();
  // Prints the summary; returns the exit code (0 exactly when every gated tensor passes).
  int finish() const;
  const std::vector<ParityEntry>& entries() const { return entries_; }
  const ParityCriterion& criterion() const { return criterion_; }
  double tolerance() const { return criterion_.tolerance(); }

 private:
  ParityCriterion criterion_;
  bool print_;
  AlterResult alter_;
  std::set<std::string> expected_;
  std::vector<ParityEntry> entries_;
};

}  // namespace zp::app
