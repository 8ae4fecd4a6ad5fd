// Where a model's starting weights come from (model.hub_dir, `zeropipe parity`, `convert`): a hub
// folder (config.json with <stem>.safetensors or its shards) or a ZeRO-Pipe HDF5 file, either a
// weights file from `zeropipe convert` or a training checkpoint (its /model: fine-tuning from a
// checkpoint without its optimizer state). The one non-obvious part is the layout: tensors come out
// in the engine's layout, so a weight the hub stores transposed (GPT-2's Conv1D, [in, out]) is
// transposed on its way out of safetensors, while an HDF5 file already holds it as [out, in]
// (marked hub_transposed = 1). Reads from HDF5 are verified against the file's checksums.
//
// Range reads (read_range) serve a rank that keeps only its slice of each block (sharded inference):
// they read the bytes of the elements asked for, not the tensor's: an HDF5 selection of that flat
// range (a checksummed file widens it to the checksum slices it touches, to verify them), the byte
// range of a safetensors tensor (memory-mapped, so only those pages come from the disk; a transposed
// weight reads the stored columns of the rows asked for). bytes_read() counts what came off the files.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "io/config.h"

namespace zp::io {

class WeightSource {
 public:
  virtual ~WeightSource() = default;
  // `path`: a hub folder holding <stem>.safetensors[.index.json], or an .h5 weights file or checkpoint.
  // Throws zp::Error naming the path when it is neither, or damaged.
  static std::unique_ptr<WeightSource> open(const std::string& path, const std::string& stem);

  const std::string& path() const { return path_; }
  // The hub config.json object the weights belong to.
  virtual json config() const = 0;
  virtual std::vector<std::string> names() const = 0;  // sorted
  virtual bool contains(const std::string& name) const = 0;
  // Tensor `name`'s shape in the engine layout; `hub_transposed`: the hub stores it transposed.
  virtual Shape shape(const std::string& name, bool hub_transposed) const = 0;
  // Tensor `name` on the CPU as `dt` (float types convert) in the engine layout.
  virtual Tensor read(const std::string& name, DType dt, bool hub_transposed) const = 0;
  // Elements [first, first + count) of tensor `name` flattened in the engine layout, as `dt`, into
  // `out` (count elements of dt, host memory): equal to that range of read(name, dt, hub_transposed).
  // Throws zp::Error naming the path and tensor for a range outside it. This default reads the whole
  // tensor (a source whose values need all of it, as a merged LoRA update does).
  virtual void read_range(const std::string& name, DType dt, bool hub_transposed, int64_t first, int64_t count,
                          void* out) const;
  // Bytes of tensor data read from the files so far (as stored, before any conversion).
  virtual int64_t bytes_read() const = 0;

 protected:
  explicit WeightSource(std::string path) : path_(std::move(path)) {}
  std::string path_;
};

// The hub config.json object of model.hub_dir: <dir>/config.json, or the config an .h5 file records.
json hub_config_of(const std::string& path);

// True for a path naming an HDF5 file rather than a hub folder.
bool is_h5_path(const std::string& path);

}  // namespace zp::io
