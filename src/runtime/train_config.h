// The training configuration: every known key with its default (the schema, also printed by
// `zeropipe train --print-defaults`), and the typed view the trainer uses. ZeRO and training keys
// follow DeepSpeed's ds_config.json names; "model", "data", "checkpoint" and "training" are ours.
#pragma once
#include <string>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"
#include "io/config.h"
#include "io/config_reader.h"
#include "runtime/lr_schedule.h"

namespace zp::runtime {

const io::json& train_config_schema();

struct TrainConfig {
  // batch: DeepSpeed's three keys. Any of them may be left out or "auto" and is then inferred from
  // the others and the data-parallel size when the run is placed (resolve_for_place); 0 = not yet.
  int64_t micro_batch = 1, grad_accum = 1, seq_len = 1024;
  int64_t train_batch_size = 0;  // sequences per step over all data-parallel ranks
  // optimizer
  double lr = 6e-4, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1, grad_clip = 1.0;
  bool decay_all = false;  // weight decay on norms, biases and embeddings too
  bool step_in_backward = false;  // update each block as its gradients complete (ZeRO 2/3, no clipping)
  // schedule (scheduler.*; its lr and warmup_max_lr follow optimizer.params.lr unless given)
  LrSchedule schedule;
  // precision; bf16.enabled / fp16.enabled = "auto" are decided by the device (resolve_for_place)
  DType dtype = DType::F32;
  bool fp16 = false;
  bool bf16_auto = false, fp16_auto = false;
  double initial_scale = 65536, min_scale = 1;
  int64_t scale_window = 1000, hysteresis = 2;
  bool consecutive_hysteresis = false;  // every clean step refills the hysteresis (runtime/loss_scaler.h)
  // ZeRO
  int zero_stage = 0;
  // zero_optimization.offload_optimizer / offload_param (DeepSpeed's keys): "none" | "cpu" | "nvme",
  // and what the tiers honour; aio.* for the NVMe tier.
  std::string offload_optimizer = "none", offload_param = "none";
  bool offload_optimizer_pin_memory = true, offload_param_pin_memory = true;
  std::string offload_optimizer_nvme_path, offload_param_nvme_path;
  int64_t offload_optimizer_buffer_count = 4, offload_param_buffer_count = 5;
  int64_t offload_param_buffer_size = 100000000;  // elements per NVMe parameter buffer: every shard must fit
  int64_t aio_block_size = 1 << 20, aio_queue_depth = 8, aio_thread_count = 1;
  // zero_optimization.offload_optimizer.delayed_update (ours): the CPU update of step s overlaps step
  // s+1, which computes with the weights of update s-1 (parallel/delayed_update.h).
  bool offload_optimizer_delayed_update = false;
  // zero_optimization.offload_optimizer.ratio (DeepSpeed's partial offload): the share of the optimizer
  // state the offloaded tier takes; the rest stays on the device (parallel::ShardingPolicy).
  double offload_optimizer_ratio = 1.0;
  bool overlap_comm = true;  // collectives on a communication stream (GPUs)
  // pipeline (issue 12): stages P (world = P x data-parallel size), the schedule, model chunks per
  // stage (interleaved), and how layers are cut: "parameters" | "uniform" | "compute", or the first
  // layer of every chunk after the first (partition_layers).
  int64_t pipeline_stages = 1, virtual_stages = 1;
  std::string pipeline_schedule = "1f1b", pipeline_partition = "parameters";
  bool keep_gathered = false;  // ZeRO-3: gather each block once per step (parallel::ShardingPolicy::keeps_gathered)
  std::vector<int64_t> partition_layers;
  // model
  std::string model_type = "transformer";
  io::json hub_config;       // inline config.json
  std::string hub_dir;       // folder with config.json (+ weights when init == "hub"), or a weights .h5 / checkpoint
  std::string init = "random";
  double init_std = 0.02;
  bool activation_checkpointing = false;
  // LoRA (models::LoraSpec): r 0 = off.
  int64_t lora_r = 0;
  double lora_alpha = 8, lora_dropout = 0;
  std::vector<std::string> lora_targets;
  bool lora_rslora = false;
  std::string lora_init_from;  // an adapter the adapters start from (models::LoraInitialAdapter)
  // data
  std::vector<std::string> train_files, val_files;
  double val_fraction = 0.0;
  bool shuffle = true;
  // data.format: "tokens" (token files) | "jsonl" (instruction records, tokenised at start-up with
  // data.tokenizer) | "instruct" (instruction token files); instruction data is formatted with
  // data.chat_template and, with data.packing, several records share a row (io/instruction_dataset.h).
  std::string data_format = "tokens", tokenizer, chat_template = "auto";
  bool packing = false;
  bool instruction_data() const { return data_format != "tokens"; }
  // loop
  int64_t max_steps = 100, eval_every = 0, eval_batches = 4, print_every = 1;
  bool wall_clock_breakdown = false;  // the step-time breakdown in rank 0's progress line
  int64_t max_bad_steps = 20;  // non-finite steps in a row that stop the run (runtime/step_loop.h)
  uint64_t seed = 1234;
  std::string device = "auto";  // auto | cpu | cuda
  std::string metrics_file;      // JSONL, "" = none; "{rank}" is replaced by the rank
  std::string csv_monitor_dir;   // csv_monitor: <output_path>/<job_name> where rank 0 writes CSV; "" = none
  // checkpoints (runtime/checkpoint.h)
  std::string checkpoint_dir;    // where step-<N>.h5 files go; "" = no checkpoints
  int64_t save_every = 0;        // save after every N steps and after the last one; 0 = never
  int64_t keep_last = 3;         // keep the newest K checkpoints in checkpoint_dir; 0 = keep all
  bool checkpoint_async = false; // periodic saves written by a thread while training goes on (loop_checkpoints.h)
  std::string resume;            // not a config key (`zeropipe train --resume`): "" | "latest" | a file
  std::string config_json;       // the whole configuration as given, recorded in every checkpoint
  std::vector<std::string> warnings;  // the reader's, each logged once when the configuration was read

  // The hub config.json object: model.config inline, model.hub_dir/config.json, or the config an .h5
  // model.hub_dir records. `source` names where it came from, for error messages.
  io::json hub_config_json(std::string& source) const;

  // Reads and validates; throws one zp::Error listing every problem (the Config's own included), each
  // naming its key.
  static TrainConfig from(const io::Config& c);
  // Reads the keys every training run shares into a TrainConfig, recording problems in `r` instead
  // of throwing, so that a caller with keys of its own (UNetTrainConfig::from) reports them all at
  // once. model.type must be `model_type`.
  static TrainConfig read(io::ConfigReader& r, const std::string& model_type);

  // This configuration as it runs on `data_parallel_size` data-parallel ranks of `world_size` on
  // `device`: the batch keys inferred as DeepSpeed infers them (and train_batch_size checked against
  // micro x accumulation x data-parallel size), "auto" precision decided by the device. Throws
  // zp::Error naming the keys.
  TrainConfig resolve_for_place(int data_parallel_size, int world_size, Device device) const;
};

}  // namespace zp::runtime
