// DeepSpeed's csv_monitor, file for file: rank 0 appends one "step,<name>" row per optimizer step to
// <output_path>/<job_name>/<event>.csv, one file per event named as DeepSpeed names it
// (Train/Samples/train_loss -> Train_Samples_train_loss.csv), the step being the samples trained so
// far, so scripts written for DeepSpeed's files read these. A resumed run appends to the same files.
#pragma once
#include <cstdint>
#include <string>

namespace zp::runtime {

class CsvMonitor {
 public:
  // Creates `dir` (and its parents); throws zp::Error naming csv_monitor.output_path when it cannot.
  explicit CsvMonitor(const std::string& dir);
  // Appends (samples, value) to the event's file, with the header first when the file is new.
  void write(const std::string& event, int64_t samples, double value) const;
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
};

}  // namespace zp::runtime
