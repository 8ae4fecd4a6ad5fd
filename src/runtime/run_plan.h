// A training run's memory before anything is allocated (issue 11 item 5): per rank and per node, the
// bytes on the GPU, in pinned and pageable host memory (and on NVMe), from the model's layout, the
// sharding policy and the batch. Model states are counted exactly (parallel/memory_plan.h);
// activations and the runtime's own allowance are estimates and labelled so. `zeropipe plan` prints
// it against the resources a user names; `zeropipe train` checks it against what the node has free
// before it allocates, so a run that cannot fit stops at once naming the tier and the bytes.
#pragma once
#include <mpi.h>

#include <span>
#include <string>
#include <vector>

#include "nn/parameter.h"
#include "parallel/memory_plan.h"
#include "parallel/sharding_policy.h"
#include "runtime/train_config.h"

namespace zp::runtime {

// The CUDA context, NCCL's buffers and the cuBLAS workspaces per rank: an allowance, not a count.
inline constexpr double kRuntimeAllowanceBytes = double(int64_t(1) << 30);

struct RunPlan {
  std::string model;             // "llama, 1.24B parameters"
  // Those that train, counted over the model's blocks as the engine finds them: all of them, or with
  // a lora section the adapters the model builds (the base frozen: its weights only in `states`).
  int64_t trained_params = 0;
  parallel::MemoryPlan states;   // per rank, exact
  double activation_bytes = 0;   // per rank, one micro-batch, an estimate
  int ranks_per_node = 1;
  bool gpu = true;

  double gpu_bytes() const;         // per rank: states on the device + activations + the allowance
  double pinned_host_bytes() const;    // per rank
  double pageable_host_bytes() const;  // per rank
  double host_bytes() const { return pinned_host_bytes() + pageable_host_bytes(); }  // per rank, both kinds
  double host_bytes_per_node() const { return host_bytes() * ranks_per_node; }
  double nvme_bytes_per_node() const { return states.nvme_bytes() * ranks_per_node; }
};

// What a node offers: memory per GPU, host memory for all its ranks, free space under the nvme_paths
// for all its ranks' swap files; <0: unknown (not checked).
struct NodeResources {
  double gpu_bytes = -1, host_bytes = -1, nvme_bytes = -1;
};

// One tier that does not fit: "GPU memory per rank", needed and available bytes.
struct Misfit {
  std::string tier;
  double need = 0, have = 0;
};

// The plan of laid-out `blocks` under `policy` (the driver's, at start-up).
RunPlan plan_run(std::span<nn::ParamBlock* const> blocks, const parallel::ShardingPolicy& policy,
                 const TrainConfig& cfg, int world, int ranks_per_node, double activation_bytes, bool gpu,
                 std::string model);

// The plan of a configuration alone (`zeropipe plan`): the model is laid out from its config (with
// its LoRA adapters and frozen base when the config has a lora section, as the run builds it), the
// activations estimated from the batch; UNets take their latent size from the training data when
// the file is there, else from the config's sample_size. `unet` selects the diffusion reading.
RunPlan plan_config(const TrainConfig& cfg, bool unet, int world, int ranks_per_node);

// One pipeline stage of a run (issue 12): what it holds and the plan of each of its ranks, with ZeRO
// and the offload tiers within its data-parallel group (world / P ranks) and the activations of the
// micro-batches its schedule keeps in flight (runtime/pipeline_chunks.h, as the trainer counts them).
struct StagePlan {
  std::string holds;        // "layers [0, 6) + embedding", "UNet blocks [5, 7) + head"
  int64_t params = 0;       // the parameters of its blocks (unpadded; a tied head's stage holds the embedding block again)
  RunPlan plan;             // per rank of the stage
};

// A run's plan stage by stage: one stage, the whole model, without a pipeline. Ranks are numbered
// as comm::Topology lays them out (pipeline outermost: the D ranks of stage 0 first), and a node
// holds ranks_per_node consecutive ones.
struct PipelinePlan {
  std::string model;   // RunPlan::model, of the whole model
  std::string layout;  // "5 stages (1f1b, M = 5; UNet blocks [0, 2) | ...), 1 data-parallel rank each"
  std::vector<StagePlan> stages;
  int data_size = 1, ranks_per_node = 1;
  // Bytes one micro-batch's activations carry across each cut between consecutive model chunks (P x V
  // - 1 cuts), the same as their gradients carry back: a language model's hidden state; the UNet's
  // hidden state, the skip activations relayed across the cut and the time embedding.
  std::vector<double> cut_bytes;
  int64_t micro_batches = 1;  // per step (gradient_accumulation_steps)

  size_t worst_stage() const;  // the one needing the most GPU memory per rank (CPUs: host memory)
  double host_bytes_per_node() const;  // of the fullest node
  double nvme_bytes_per_node() const;  // of the fullest node
};

// plan_config stage by stage: pipeline.stages P stages over `world` ranks.
PipelinePlan plan_pipeline(const TrainConfig& cfg, bool unet, int world, int ranks_per_node);

// The tiers that do not fit: GPU, host memory, NVMe. With `states_only` the GPU check counts only what the plan
// counts exactly (model states and buffers), as the start-up check does: an activation estimate
// never stops a run, it warns.
std::vector<Misfit> misfits(const RunPlan& plan, const NodeResources& have, bool states_only = false);

// A pipelined plan's: the worst stage's GPU memory per rank, the fullest node's host memory and
// NVMe. With one stage, misfits(stages[0].plan, have).
std::vector<Misfit> misfits(const PipelinePlan& plan, const NodeResources& have);

// The plan as lines for a terminal: per rank and per node, each tier, and against `have`.
std::string plan_report(const RunPlan& plan, const NodeResources& have);
// A pipelined plan's: a line per stage, then the worst stage's tiers and the fullest node's against
// `have`. With one stage, plan_report(stages[0].plan, have).
std::string plan_report(const PipelinePlan& plan, const NodeResources& have);

// "18.3 GiB"
std::string format_bytes(double bytes);

// The start-up check (collective over `comm`): each rank measures its GPU's free memory and its
// node's available host memory (core/host_memory.h, shared by the node's `plan.ranks_per_node`
// ranks); when the exact part of the plan does not fit on some rank, every rank throws the same
// zp::Error naming the rank, the tier and the bytes, before anything is allocated. When only the
// activation estimate tips it over, rank 0 warns. Returns the line rank 0 logs.
std::string check_fit_at_start(const RunPlan& plan, Device dev, MPI_Comm comm);

}  // namespace zp::runtime
