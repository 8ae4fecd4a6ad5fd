// `zeropipe convert`: hub folders (config.json + safetensors) <-> ZeRO-Pipe weights files (HDF5),
// and the model of a training checkpoint out to either (weights out of the engine: the checkpoint's
// fp32 master weights, from whatever world size and ZeRO stage wrote it, since every dataset is a
// whole logical tensor; its optimizer state stays behind).
//
// Weights file layout (an HDF5 file written by io::CheckpointWriter, so it appears atomically under
// its name and every dataset carries per-slice crc32 checksums that `zeropipe inspect --verify` and
// io::verify_checksums check):
//   root attributes
//     zeropipe_format      int     1
//     checksum             string  "crc32"
//     kind                 string  "weights" (a training checkpoint says otherwise; convert refuses it)
//     model_family         string  "transformer" (LMs, hub stem "model") | "unet" (diffusers, stem
//                                  "diffusion_pytorch_model")
//     config               string  the hub config.json, byte for byte as it was in the folder
//     safetensors_metadata string  the hub files' "__metadata__" as a JSON object (usually
//                                  {"format":"pt"}, which transformers checks on loading)
//   /model/<hub name>      one dataset per tensor of the hub weights file(s), every one of them (also
//                          those the engine does not use), under the hub's own name. Shape as in the
//                          hub file, except the weights that the hub stores transposed
//                          (TransformerConfig::hub_transposed: GPT-2's Conv1D [in, out]), which are
//                          stored [out, in] as the engine keeps them and carry the int attribute
//                          hub_transposed = 1. dtype: the source dtype (--dtype keep), or bf16 / f32
//                          for every float tensor (integer tensors are always kept); bf16 is HDF5's
//                          user-defined 16-bit float, which h5py reads as float32.
//
// Every read of an HDF5 source is verified against its per-slice checksums, and the source's tensor
// set against its config (every parameter of the model the config describes, with its shape; a
// checkpoint holds exactly those), before anything is written; a hub folder is checked the same way.
//
// Direction follows the input: a folder converts to a weights file; a weights file or checkpoint to
// a weights file when --to ends in .h5, else to a folder
// (config.json plus <stem>.safetensors, or shards of at most max_shard_bytes named
// <stem>-00001-of-0000N.safetensors with <stem>.safetensors.index.json, as the hub writes them).
// LoRA (io/lora_adapter_files.h). A LoRA training checkpoint (an .h5 whose root has a "lora"
// attribute and whose /model holds only <module>.lora_A/B.weight) converts to an adapter folder:
// PEFT's (adapter_model.safetensors + adapter_config.json) for model_family transformer, diffusers'
// (pytorch_lora_weights.safetensors) for unet; --dtype keep writes fp32. Every adapter module is
// checked against the base model its model_config describes (a linear map or 1x1 convolution with
// A [r, in], B [out, r] for its weight [out, in]) before anything is written. target_modules is the
// run's own when PEFT would adapt exactly these modules with it, else the modules' full paths.
// --merge-lora ADAPTER (a LoRA checkpoint, a PEFT folder, or a diffusers / kohya-ss file or folder)
// writes the base (--from: a hub folder or weights .h5; default the base the adapter names) with each
// adapted weight replaced by W + scale * B A, computed in float64 in the engine layout and rounded
// once to the output dtype (the base's with keep); GPT-2's Conv1D weights go back to [in, out] in a
// hub folder as in any conversion. The destination is a weights .h5 or a hub folder, by its name as
// above; intermediate weights files <to>.lora-base.h5 / <to>.lora-merged.h5 are removed afterwards.
// A shape that disagrees with the base is an error naming the tensor.
//
// Tensors stream one at a time, in pieces where no transpose is needed, so memory stays bounded by
// the largest transposed weight. hub -> h5 -> hub with dtype "keep" gives back bit-identical tensors
// and the identical config.json.
#pragma once
#include <cstdint>
#include <string>

namespace zp::app {

struct ConvertOptions {
  std::string from, to;
  std::string dtype = "keep";  // keep | bf16 | fp16 | fp32
  std::string merge_lora;      // --merge-lora: the adapter to merge into `from` (see above)
  bool force = false;          // replace an existing destination
  // Largest safetensors shard when writing a folder (the hub's 5 GB); a model within it is one file.
  int64_t max_shard_bytes = 5'000'000'000;
};

// Converts opts.from to opts.to; returns 0. Throws zp::Error naming the file (and tensor) on a missing
// or unreadable input, a folder without weights, an unknown dtype, an existing destination without
// force, or an HDF5 file that is not a weights file. A failure never leaves a partial file under a
// final name.
int run_convert(const ConvertOptions& opts);

}  // namespace zp::app
