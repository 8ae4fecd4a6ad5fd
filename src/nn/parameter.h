// Parameters live in blocks: a ParamBlock is one sharding unit (DESIGN decision 2) whose parameters
// are slices of one flat buffer of compute values (dt) and one flat fp32 gradient buffer. Each
// parameter starts at an aligned offset, except that a parameter added with `packed = true` follows
// the previous one with no gap, so a group such as q/k/v weights forms one matrix for a fused GEMM.
// The flat size is padded to a multiple of `pad_multiple` (the ZeRO engine asks for world x align,
// so every rank owns an equal, aligned slice). The buffers can be re-bound: ZeRO-3 binds a gathered
// full buffer around a block's forward and backward and unbinds it after.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace zp::nn {

struct Parameter {
  std::string name;   // the hub name ("model.layers.0.self_attn.q_proj.weight")
  Shape shape;        // our layout: linear weights are [out, in]
  bool decay = true;  // subject to weight decay (off for norms, biases and embeddings by default)
  bool file_transposed = false;  // stored [in, out] in hub files (GPT-2's Conv1D)
  // Not trained (a LoRA run's base weights): modules compute no gradient for it and its block has no
  // gradient buffer, master weights or optimizer state (ParamBlock::freeze).
  bool frozen = false;
  int64_t offset = 0; // element offset in the block's flat buffers
  Tensor value;       // dt view of the compute copy
  Tensor grad;        // fp32 view of the gradient accumulator
  int64_t numel() const { return shape_numel(shape); }
  float* g() const { return static_cast<float*>(grad.data()); }
  void* v() const { return value.data(); }
};

class ParamBlock {
 public:
  static constexpr int64_t kAlign = 64;  // elements: 128-byte aligned slices for bf16, 256 for fp32

  explicit ParamBlock(std::string name) : name_(std::move(name)) {}
  const std::string& name() const { return name_; }
  // Marks every parameter frozen (Parameter::frozen): the block's values are used, never trained.
  void freeze();
  bool frozen() const { return frozen_; }

  // Declares a parameter (before allocate()). The returned pointer stays valid for the block's life.
  Parameter* add(const std::string& name, Shape shape, bool decay, bool packed = false);
  // Leaves `elements` zeros after the last parameter added (rows a GEMM may read past the tensor, e.g.
  // a vocabulary padded to a multiple of 64); they stay zero: no optimizer or loader touches them.
  void add_gap(int64_t elements) { numel_ += elements; }
  // Fixes the layout (device, dtype, padded size) without allocating: the ZeRO engine then allocates
  // what each stage keeps, one block at a time.
  void layout(Device dev, DType dt, int64_t pad_multiple = 1);
  // layout() and full zeroed value and gradient buffers, every parameter pointed at its slice.
  void allocate(Device dev, DType dt, StreamHandle s = nullptr, int64_t pad_multiple = 1);

  int64_t numel() const { return numel_; }     // parameters and alignment gaps
  int64_t padded() const { return padded_; }   // the flat buffers' size
  Device device() const { return dev_; }
  DType dtype() const { return dt_; }
  const Tensor& values() const { return values_; }
  const Tensor& grads() const { return grads_; }
  const std::vector<std::unique_ptr<Parameter>>& params() const { return params_; }
  void zero_grad(StreamHandle s = nullptr) { grads_.zero_(s); }

  // Points every parameter at `full` (padded() elements of dtype(), or fp32 for grads); an undefined
  // tensor unbinds (the views become undefined, so a use outside a bound window fails loudly).
  void bind_values(Tensor full);
  void bind_grads(Tensor full);

 private:
  std::string name_;
  bool frozen_ = false;
  std::vector<std::unique_ptr<Parameter>> params_;
  int64_t numel_ = 0, padded_ = 0;
  Device dev_;
  DType dt_ = DType::F32;
  Tensor values_, grads_;
};

// A model's parameters across its blocks, in block order, and one of them by name (nullptr when
// absent): what every model exposes over its blocks() (models/transformer.h, models/unet.h).
std::vector<Parameter*> parameters_of(const std::vector<ParamBlock*>& blocks);
Parameter* find_parameter(const std::vector<ParamBlock*>& blocks, const std::string& name);

}  // namespace zp::nn
