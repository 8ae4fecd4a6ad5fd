// Training checkpoints (DESIGN decision 6): the ZeRO engine's fp32 master weights and AdamW moments,
// plus what the loop needs to continue exactly, in one HDF5 file written collectively by the ranks
// of the data group through io::CheckpointWriter (<path>.tmp, renamed when complete).
//
// File layout (on top of io::CheckpointWriter's zeropipe_format and per-slice checksums):
//   root attributes
//     kind               "checkpoint" (a weights file from `zeropipe convert` says "weights")
//     model_family       "transformer" (runtime/lm_training.h) or "unet" (runtime/diffusion_training.h)
//     config             the training configuration JSON, as given (after --set)
//     model_config       the model's config.json object (transformers' or diffusers')
//     step               training steps done (steps skipped for an fp16 overflow included)
//     optimizer_steps    AdamW updates done (bias correction and the LR schedule follow it)
//     data_position      global index of the first sample the next step reads
//     global_batch, seed the data order's parameters when the file was written
//     world_size, zero_stage   how it was written (informational: any world and stage can resume)
//     loss_scaling, loss_scale, loss_scale_clean_steps, loss_scale_overflows_left, skipped_steps
//                        the fp16 loss scaler (loss_scaling = 0: off)
//     lora, base_model, base_fingerprint   a LoRA run only: its LoRA settings (JSON), and the path and
//                        fingerprint of the frozen base; /model and /optimizer then hold the
//                        adapters (<module>.lora_A.weight, .lora_B.weight) and nothing else
//   /model/<name>                      fp32 master weights, full logical shape in the engine layout
//                                      ([out, in]); weights the hub stores transposed (GPT-2's
//                                      Conv1D) carry hub_transposed = 1, as in a weights file
//   /optimizer/<name>/exp_avg, exp_avg_sq   fp32 Adam moments, same shape
//   /delayed_update/<name>             with delayed_update = 1 (a root attribute; the run had
//                                      zero_optimization.offload_optimizer.delayed_update on): the
//                                      compute weights the next step uses, one update behind /model
//                                      (parallel/delayed_update.h), widened to fp32, same shape. /model
//                                      and /optimizer hold the state after `optimizer_steps` updates
//                                      (the update in flight is waited for); a delayed run resumes
//                                      computing with these weights and installs /model after its
//                                      first step, as the uninterrupted run does. Others ignore them.
//
// Sharded I/O. Parameter p of a block occupies elements [p.offset, p.offset + numel) of the block's
// padded flat buffer, and a rank owns a range of that buffer; the engine's state visitor
// (ZeroEngine::visit_state, parallel/engine_state.h) yields it block by block and copies state to
// and from host memory, whatever tier the state lives on. Saving, rank r writes the intersection of
// every parameter with its shard [r, r+1) * padded / N of the block (inside its owned range at every
// stage; at stage 0, where every rank owns everything, this splits the writes so each element is
// written once). Loading, every rank reads the intersection of every parameter
// with the range it owns now. Datasets hold whole logical tensors, so the intersections are just
// flat ranges of them and the reading world size and stage need not be the writing ones. Nothing is
// gathered on one rank; host memory is one block's range (times three) at a time.
//
// Pipelined runs (issue 12) write the same file: each stage's data group writes its own blocks'
// datasets and every rank takes part in every write, with nothing to move for another stage's
// blocks (the stages exchange the names and shapes of their parameters first). A copy of another
// stage's block (the tied embedding's replica on the last stage) is never written; it loads from the
// original's datasets. Each stage reads its blocks with its own data group. So a file written by P
// stages of D ranks resumes on any other (P', D') and the reverse; root attribute pipeline_stages
// says how it was written (informational, 1 when unpipelined).
#pragma once
#include <mpi.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/device.h"
#include "io/checkpoint_file.h"
#include "io/config.h"
#include "parallel/zero_engine.h"

namespace zp::runtime {

// The fp16 loss scaler's state (see runtime::LossScaler).
struct LossScalerState {
  bool enabled = false;         // fp16 dynamic scaling was on
  double scale = 1.0;
  int64_t clean_steps = 0;      // clean steps since the scale last changed or overflowed
  int64_t overflows_left = 0;   // overflows still absorbed before the scale halves
  int64_t skipped = 0;          // steps skipped so far
};

// Everything besides the tensors.
struct TrainState {
  int64_t step = 0, optimizer_steps = 0, data_position = 0, global_batch = 0;
  uint64_t seed = 0;
  LossScalerState scaler;
  int world_size = 1, zero_stage = 0, pipeline_stages = 1;  // of the writer; filled in by save_checkpoint
};

// A pipelined run's part of the model: the engine holds this stage's blocks, the file the whole model.
struct StageBlocks {
  int count = 1;                     // the pipeline's stages
  MPI_Comm stages = MPI_COMM_NULL;   // this rank's peers in the other stages (comm::Group::Pipeline)
  MPI_Comm data = MPI_COMM_NULL;     // this stage's data group (the engine's): it reads the stage's blocks
  std::function<int64_t(const nn::ParamBlock&)> position;  // a block's place in the whole model
  const nn::ParamBlock* replica = nullptr;  // another stage's block copied here: read, never written
};

// What a checkpoint says about the run that wrote it; a resumed run must have the same model_family
// and model_config.
struct CheckpointModel {
  std::string config_json;   // the training configuration
  io::json model_config;     // the hub config.json object
  std::string model_family;  // "transformer" | "unet"
  // A LoRA run (its checkpoints hold the adapters only): the LoRA settings {"r", "alpha", "dropout",
  // "target_modules", "rslora"} (null: not LoRA), and the frozen base's path and fingerprint
  // (runtime/base_fingerprint.h), which a resume must match.
  io::json lora;
  std::string base_model, base_fingerprint;
};

// About the size of a checkpoint of the whole model (collective over stages->stages when given):
// fp32 weights and two moments per parameter.
int64_t checkpoint_bytes(parallel::ZeroEngine& engine, const StageBlocks* stages = nullptr);

// Collective over `comm` (every rank of the run: the engine's data group, or with `stages` the
// whole world; a null or one-rank communicator writes serially). Writes `path` atomically; on any
// failure every rank throws the same zp::Error naming the file and an existing file at `path` is
// left as it was.
void save_checkpoint(const std::string& path, MPI_Comm comm, parallel::ZeroEngine& engine, const CheckpointModel& model,
                     TrainState state, StreamHandle s = nullptr, const StageBlocks* stages = nullptr);

// An asynchronous save (checkpoint.async): collective as save_checkpoint. At the call, the state this
// rank writes is copied into `snapshot` (host tensors, pinned, kept by the caller and reused from one
// save to the next: host memory of checkpoint_snapshot_bytes()) and the file's structure and
// attributes are written; the returned writer's thread then writes the data, calling neither MPI nor
// HDF5, while the caller trains on. The caller polls written() and calls commit() (collective: the
// same on every rank) before it touches `snapshot` again; commit() throws as save_checkpoint does,
// a failure of the thread included, and the file then never appears at `path`.
std::unique_ptr<io::CheckpointWriter> save_checkpoint_async(const std::string& path, MPI_Comm comm,
                                                            parallel::ZeroEngine& engine, const CheckpointModel& model,
                                                            TrainState state, std::vector<Tensor>& snapshot,
                                                            StreamHandle s = nullptr,
                                                            const StageBlocks* stages = nullptr);
// The host memory an asynchronous save's snapshot takes on this rank: its share of the checkpoint.
int64_t checkpoint_snapshot_bytes(parallel::ZeroEngine& engine);

// Collective over `comm` (as for save_checkpoint). Checks that `path` is a checkpoint of this model
// (kind "checkpoint"; the same model_family; every parameter of the whole model present as f32 with
// its shape, under /model and /optimizer, and no other; the same hub config, keys starting with '_'
// and other metadata aside), reads the owned ranges into the engine's master weights and moments,
// refreshes the compute weights and sets the optimizer step count. Returns the loop state. Throws
// zp::Error naming the file (and the model family, dataset or config key) on any mismatch, before
// anything is loaded; a damaged file throws io::DamagedFileError. With `stages`, whatever one stage
// finds every rank throws.
TrainState load_checkpoint(const std::string& path, MPI_Comm comm, parallel::ZeroEngine& engine,
                           const CheckpointModel& model, StreamHandle s = nullptr, const StageBlocks* stages = nullptr);

// What `--resume` names, newest first: for "latest", every complete checkpoint in `dir` (none in an
// existing folder: start from step 0, said in the log; a folder that does not exist is an error,
// most likely a mistyped path), anything else the one file, which must exist. Decided on rank 0 of
// `comm`, so every rank gets the same list or throws the same zp::Error.
std::vector<std::string> resume_candidates(const std::string& resume, const std::string& dir, MPI_Comm comm);

// Runs `decide` on rank 0 of `comm` only and hands its result to every rank: the returned text, or,
// when it threw zp::Error, the same error thrown on every rank. For decisions about the file system
// that must not differ between ranks (which checkpoint, whether a folder is usable).
std::string decided_by_rank0(MPI_Comm comm, const std::function<std::string()>& decide);

}  // namespace zp::runtime
