// `zeropipe inspect FILE [--verify]`: what an HDF5 file holds (io::inspect: groups, datasets with dtype
// and shape, attributes) and, for ZeRO-Pipe weights and checkpoint files, the model's config as
// pretty JSON and its parameter count; with verify, every dataset's slice checksums are re-read, and a
// ZeRO-Pipe file whose /model cannot be read or carries no checksums fails verification.
#pragma once
#include <string>

namespace zp::app {

struct InspectReport {
  std::string text;  // what `zeropipe inspect` prints
  bool ok = true;    // false when verify found problems or could not read what it should verify
};

// Throws zp::Error naming the file when it is missing or not HDF5, or when a group of it is reached by
// more than one path (a hard-link cycle would send the tree walk into endless recursion).
InspectReport inspect_report(const std::string& path, bool verify);

// Prints inspect_report() to stdout; returns 0, or 1 when verify found problems.
int run_inspect(const std::string& path, bool verify);

}  // namespace zp::app
