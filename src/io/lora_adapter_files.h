// LoRA adapters in the files the ecosystem loads, and ZeRO-Pipe's LoRA training checkpoints.
//
// Internal names (the engine's, and a LoRA checkpoint's /model): for a module whose base weight is
// "<path>.weight" under the hub's name, its adapter is "<path>.lora_A.weight" [r, in] and
// "<path>.lora_B.weight" [out, r], in and out being the module's as a linear map (GPT-2's Conv1D
// c_attn: in = C, out = 3C, although its hub weight is stored [in, out]). A convolution's adapter
// has PEFT's 4-d shapes: A [r, in, kh, kw] (the base's kernel), B [out, r, 1, 1]. The update merged
// into the base weight W [out, in] (a convolution's [out, in * kh * kw]) is scale * B A, A and B
// flattened to [r, in * kh * kw] and [out, r], scale = alpha / r (alpha / sqrt(r) with rslora), PEFT's rule.
//
// Layouts written and read:
//  - PEFT (LMs): a folder with adapter_model.safetensors, keys "base_model.model.<path>.lora_A.weight"
//    / ".lora_B.weight" (PEFT drops the adapter name when saving and inserts its own when loading),
//    metadata {"format": "pt"}, and adapter_config.json with LoraConfig's fields. Only fields that
//    every PEFT release since 0.10 knows are written: older releases refuse an unknown field, newer
//    ones fill in the defaults of what is missing.
//  - diffusers (UNets): a folder with pytorch_lora_weights.safetensors, keys
//    "unet.<module path>.lora_A.weight" / ".lora_B.weight" (what StableDiffusionPipeline.
//    save_lora_weights writes), and alpha where diffusers looks for it: the safetensors metadata
//    "lora_adapter_metadata", a JSON object of the LoraConfig fields prefixed "unet." ("unet.r",
//    "unet.lora_alpha", ...). Without that entry diffusers takes alpha = r (scale 1), and so do we.
//  - kohya-ss (read only): "lora_unet_<module path with '_' for '.'>.lora_down.weight" (= lora_A),
//    ".lora_up.weight" (= lora_B) and an optional scalar ".alpha" per module (absent: alpha = r).
//    '_' also occurs inside module names (down_blocks, to_q), so the path is found by matching
//    against the model's modules, which the caller passes as its known internal adapter names.
//
// Anything a plain LoRA merge would silently get wrong is refused with an error naming the file and
// the tensor or field: DoRA magnitude vectors, embedding LoRA, LoRA biases, an adapter name inside
// the keys, text-encoder adapters, rank or alpha patterns, initialisations that rewrite the base
// weights (PiSSA, OLoRA, CorDA, LoftQ), modules_to_save, pickled weights.
#pragma once
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"

namespace zp::io {

// A LoRA run's configuration (a checkpoint's root attribute "lora"):
// {"r": 16, "alpha": 32, "dropout": 0.05, "target_modules": ["q_proj", ...], "rslora": false}.
struct LoraConfig {
  int64_t r = 0;
  double alpha = 0, dropout = 0;
  std::vector<std::string> target_modules;
  bool rslora = false;

  // PEFT's scaling of a module of rank `rank` with `alpha`: alpha / rank, or alpha / sqrt(rank).
  double scale_for(int64_t rank, double module_alpha) const;
  nlohmann::json to_json() const;
  // Throws zp::Error naming `source` and the key on a missing, mistyped, out-of-range or unknown key.
  static LoraConfig from_json(const nlohmann::json& j, const std::string& source);
};

inline constexpr const char* kLoraASuffix = ".lora_A.weight";
inline constexpr const char* kLoraBSuffix = ".lora_B.weight";
// The module path of an internal adapter name ("<path>.lora_A.weight" -> "<path>"); "" for a name
// that is neither an A nor a B.
std::string lora_module_of(const std::string& internal_name);

// An adapter in memory, under internal names, whatever file it came from.
struct LoraAdapter {
  LoraConfig config;
  std::map<std::string, Tensor> tensors;      // internal name -> CPU tensor, in the file's dtype
  std::map<std::string, double> module_alpha;  // modules whose alpha is not config.alpha (kohya)
  bool fan_in_fan_out = false;  // PEFT's flag: the base weights are Conv1D's [in, out] (GPT-2)
  std::string base_model;       // base_model_name_or_path / the checkpoint's base_model; may be ""
  std::string source;           // the file it was read from, for messages

  std::vector<std::string> modules() const;  // sorted module paths
  const Tensor& a(const std::string& module) const;
  const Tensor& b(const std::string& module) const;
  int64_t rank(const std::string& module) const { return a(module).size(0); }
  double scale_of(const std::string& module) const;
  // Every module has both tensors; A is [r, in] and B [out, r] (or [r, in, kh, kw] / [out, r, 1, 1]);
  // every name is an A or a B. Throws zp::Error naming `source` and the tensor.
  void check() const;
};

// The tensors converted to `dtype` (F32, BF16 or F16), as new CPU tensors.
std::map<std::string, Tensor> lora_tensors_as(const LoraAdapter& a, DType dtype);

// PEFT's merge of one module: adds scale * B A to its base weight `w` [out, in] in the engine layout
// (a convolution's [out, in, kh, kw] as [out, in * kh * kw]; `w_shape` is its shape), in float64. Throws zp::Error
// naming the adapter's file, the tensor and the weight's shape when A or B does not fit.
void add_lora_update(const LoraAdapter& a, const std::string& module, double* w, const Shape& w_shape);

// --- PEFT --------------------------------------------------------------------------------------

inline constexpr const char* kPeftWeightsFile = "adapter_model.safetensors";
inline constexpr const char* kPeftConfigFile = "adapter_config.json";

struct PeftWriteOptions {
  std::string task_type = "CAUSAL_LM";
  DType dtype = DType::F32;  // of the safetensors tensors: F32, BF16 or F16
};

// adapter_config.json's object for `a` (a.base_model as base_model_name_or_path).
nlohmann::json peft_adapter_config(const LoraAdapter& a, const PeftWriteOptions& o);
// Writes both files into `dir` (created when missing; files of the same names replaced), each
// atomically, the weights first so that a folder with adapter_config.json is complete; a failure
// removes what this call wrote. Checks `a` first.
void write_peft_adapter(const std::string& dir, const LoraAdapter& a, const PeftWriteOptions& o = {});
// Reads a PEFT LoRA folder. Errors name the file and the tensor or field.
LoraAdapter read_peft_adapter(const std::string& dir);

// --- diffusers and kohya-ss (UNets) --------------------------------------------------------------

inline constexpr const char* kDiffusersLoraFile = "pytorch_lora_weights.safetensors";
inline constexpr const char* kDiffusersMetadataKey = "lora_adapter_metadata";

// Writes <dir>/pytorch_lora_weights.safetensors (dir created when missing), atomically.
void write_diffusers_lora(const std::string& dir, const LoraAdapter& a, DType dtype = DType::F32);
// Reads a diffusers or kohya-ss UNet LoRA: `path` is a .safetensors file, or a folder holding
// pytorch_lora_weights.safetensors (or exactly one .safetensors file). `known_names`: the internal
// adapter names the model can have (both A and B of every module); kohya's names must resolve to
// exactly one of them, diffusers' must be among them when the list is not empty.
LoraAdapter read_diffusers_lora(const std::string& path, const std::vector<std::string>& known_names);

// A PEFT folder (it has adapter_config.json), a ZeRO-Pipe LoRA checkpoint (read_lora_checkpoint), or
// else a diffusers / kohya-ss file or folder.
LoraAdapter read_lora_adapter_files(const std::string& path, const std::vector<std::string>& known_names);

// --- ZeRO-Pipe LoRA training checkpoints ---------------------------------------------------------

// What a LoRA checkpoint says besides its adapter.
struct LoraCheckpointInfo {
  std::string model_family;      // "transformer" | "unet"
  nlohmann::json model_config;   // the base's hub config.json ("model_config", else the base's own)
  std::string base_fingerprint;  // as recorded (hex); "" when absent
};

// True when `path` is an .h5 file whose root has a "lora" attribute.
bool is_lora_checkpoint(const std::string& path);
// Reads a LoRA training checkpoint (kind "checkpoint", root attributes lora, base_model,
// model_family; /model holding only adapter tensors), verified against its checksums. `info` may be
// null. Errors name the file and the attribute or dataset.
LoraAdapter read_lora_checkpoint(const std::string& path, LoraCheckpointInfo* info = nullptr);

}  // namespace zp::io
