#include "runtime/train_config.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "core/log.h"
#include "io/bounded_json.h"
#include "io/weight_source.h"
#include "models/transformer.h"
#include "models/unet.h"
#include "parallel/pipeline_schedule.h"
#include "runtime/deepspeed_keys.h"

namespace zp::runtime {

// A default's JSON kind is its key's type, and an integer default makes an integer key: the loss
// scales, which DeepSpeed allows to be fractional, therefore default to 0.0 and 1.0. Keys that are
// DeepSpeed's only (runtime/deepspeed_keys.h) default to DeepSpeed's defaults, or to null for a
// free-form section, so that a value other than the default is one that asks for something.
const io::json& train_config_schema() {
  static const io::json schema = io::json::parse(R"({
    "train_batch_size": null,
    "train_micro_batch_size_per_gpu": 1,
    "gradient_accumulation_steps": 1,
    "managed_gradient_accumulation": true,
    "gradient_clipping": 1.0,
    "steps_per_print": 1,
    "seed": 1234,
    "wall_clock_breakdown": false,
    "dump_state": false,
    "memory_breakdown": false,
    "optimizer": {"type": "AdamW",
                  "params": {"lr": 6e-4, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1,
                             "torch_adam": false, "adam_w_mode": true, "amsgrad": false, "bias_correction": true},
                  "legacy_fusion": false,
                  "step_in_backward": false},
    "scheduler": {"type": "WarmupCosineLR",
                  "params": {"warmup_num_steps": 0, "total_num_steps": null, "cos_min_ratio": 0.1,
                             "warmup_min_ratio": 0.0, "warmup_type": "linear", "warmup_min_lr": 0.0,
                             "warmup_max_lr": null, "last_batch_iteration": -1,
                             "cycle_min_lr": null, "cycle_max_lr": null, "decay_lr_rate": 0.0,
                             "cycle_first_step_size": 2000, "cycle_second_step_size": null,
                             "cycle_first_stair_count": 0, "cycle_second_stair_count": null, "decay_step_size": 0,
                             "cycle_momentum": true, "cycle_min_mom": 0.8, "cycle_max_mom": 0.9, "decay_mom_rate": 0.0,
                             "lr_range_test_min_lr": 0.001, "lr_range_test_step_size": 2000,
                             "lr_range_test_step_rate": 1.0, "lr_range_test_staircase": false}},
    "communication_data_type": null,
    "gradient_allreduce_op": "mean",
    "prescale_gradients": false,
    "gradient_predivide_factor": 1.0,
    "sparse_gradients": false,
    "bf16": {"enabled": false, "immediate_grad_update": true, "check_overflow": false,
             "bf16_master_weights_and_grads": false, "bf16_optimizer_states": false},
    "fp16": {"enabled": false, "auto_cast": false, "loss_scale": 0.0, "initial_scale_power": 16,
             "loss_scale_window": 1000, "hysteresis": 2, "consecutive_hysteresis": false, "min_loss_scale": 1.0,
             "fp16_master_weights_and_grads": false},
    "bfloat16": null,
    "amp": null,
    "torch_autocast": null,
    "zero_optimization": {"stage": 0,
                          "offload_optimizer": {"device": "none", "nvme_path": "", "pin_memory": true,
                                                "buffer_count": 4, "ratio": 1.0, "fast_init": false,
                                                "delayed_update": false},
                          "offload_param": {"device": "none", "nvme_path": "", "pin_memory": true,
                                            "buffer_count": 5, "buffer_size": 1e8, "max_in_cpu": 1e9},
                          "overlap_comm": true, "contiguous_gradients": true, "reduce_scatter": true,
                          "reduce_bucket_size": 5e8, "use_multi_rank_bucket_allreduce": true,
                          "allgather_partitions": true, "allgather_bucket_size": 5e8,
                          "load_from_fp32_weights": true, "grad_hooks": true, "round_robin_gradients": false,
                          "sub_group_size": 1e9, "stage3_max_live_parameters": 1e9, "stage3_max_reuse_distance": 1e9,
                          "stage3_prefetch_bucket_size": 5e8, "stage3_param_persistence_threshold": 1e5,
                          "stage3_model_persistence_threshold": null,
                          "stage3_gather_16bit_weights_on_model_save": false,
                          "stage3_gather_fp16_weights_on_model_save": false,
                          "stage3_module_granularity_threshold": 0, "stage3_use_all_reduce_for_fetch_params": false,
                          "stage3_allgather_sequential": false, "ignore_unused_parameters": true,
                          "legacy_stage1": false, "elastic_checkpoint": false, "zero_hpz_partition_size": 1,
                          "zero_quantized_weights": false, "zero_quantized_nontrainable_weights": false,
                          "zero_quantized_gradients": false, "zeropp_loco_param": null, "mics_shard_size": -1,
                          "mics_hierarchical_params_gather": false, "memory_efficient_linear": true,
                          "pipeline_loading_checkpoint": false, "override_module_apply": true,
                          "log_trace_cache_warnings": false, "enable_sanity_checks": false,
                          "save_muon_momentum_buffer_in_memory": false, "leaf_module": null, "zenflow": null,
                          "cpu_offload": false, "cpu_offload_param": false, "cpu_offload_use_pin_memory": false},
    "zero_allow_untested_optimizer": false,
    "zero_force_ds_cpu_optimizer": true,
    "pipeline": {"stages": 1, "schedule": "1f1b", "virtual_stages": 1, "partition": null,
                 "keep_gathered": false, "seed_layers": false, "activation_checkpoint_interval": 0,
                 "pipe_partitioned": true, "grad_partitioned": true, "use_reentrant": true},
    "aio": {"block_size": 1048576, "queue_depth": 8, "thread_count": 1, "single_submit": false,
            "overlap_events": true},
    "activation_checkpointing": {"partition_activations": false, "cpu_checkpointing": false,
                                 "contiguous_memory_optimization": false, "number_checkpoints": null,
                                 "synchronize_checkpoint_boundary": false, "profile": false},
    "tensor_parallel": null,
    "hybrid_engine": null,
    "expert_parallel": null,
    "flops_profiler": null,
    "autotuning": null,
    "tensorboard": null,
    "wandb": null,
    "comet": null,
    "csv_monitor": {"enabled": false, "output_path": "", "job_name": "DeepSpeedJobName"},
    "comms_logger": null,
    "sparse_attention": null,
    "data_efficiency": null,
    "curriculum_learning": null,
    "progressive_layer_drop": null,
    "eigenvalue": null,
    "compression_training": null,
    "quantize_training": null,
    "weight_quantization": null,
    "elasticity": null,
    "compile": null,
    "data_types": {"grad_accum_dtype": null},
    "dataloader_drop_last": false,
    "model": {"type": "transformer", "config": null, "hub_dir": "", "init": "random", "init_std": 0.02,
              "activation_checkpointing": false, "weight_decay_on_all": false},
    "lora": {"r": 0, "alpha": 8, "dropout": 0.0, "target_modules": [], "rslora": false, "init_from": ""},
    "data": {"train_files": [], "val_files": [], "val_fraction": 0.0, "seq_len": 1024, "shuffle": true,
             "format": "tokens", "tokenizer": "", "chat_template": "auto", "packing": false},
    "checkpoint": {"dir": "", "save_every": 0, "keep_last": 3, "async": false, "tag_validation": "Warn", "load_universal": false,
                   "use_node_local_storage": false, "parallel_write": {"pipeline_stage": false}},
    "training": {"max_steps": 100, "eval_every": 0, "eval_batches": 4, "device": "auto", "metrics_file": "",
                 "max_bad_steps": 20}
  })");
  return schema;
}

io::json TrainConfig::hub_config_json(std::string& source) const {
  if (hub_config.is_object()) {
    source = "model.config";
    return hub_config;
  }
  source = io::is_h5_path(hub_dir) ? hub_dir : (std::filesystem::path(hub_dir) / "config.json").string();
  return io::hub_config_of(hub_dir);
}

TrainConfig TrainConfig::from(const io::Config& c) {
  io::ConfigReader r(c);
  TrainConfig t = read(r, "transformer");
  r.throw_if_any();
  return t;
}

namespace {

// DeepSpeed's offload keys as they are (zero_optimization.offload_optimizer / offload_param, aio).
// What each tier honours is read; a key that means nothing for the chosen devices is accepted with
// one warning naming it when it differs from its default, so a DeepSpeed config runs unchanged.
void read_offload(io::ConfigReader& r, TrainConfig& t) {
  const std::string opt = "zero_optimization.offload_optimizer.", par = "zero_optimization.offload_param.";
  t.offload_optimizer = r.one_of(opt + "device", {"none", "cpu", "nvme"});
  t.offload_param = r.one_of(par + "device", {"none", "cpu", "nvme"});
  t.offload_optimizer_pin_memory = r.boolean(opt + "pin_memory");
  t.offload_param_pin_memory = r.boolean(par + "pin_memory");
  t.offload_optimizer_nvme_path = r.string(opt + "nvme_path");
  t.offload_param_nvme_path = r.string(par + "nvme_path");
  t.offload_optimizer_buffer_count = r.integer(opt + "buffer_count", 1, 64);
  t.offload_param_buffer_count = r.integer(par + "buffer_count", 1, 64);
  if (t.offload_optimizer != "none")
    r.require(t.zero_stage >= 1, opt + "device = \"" + t.offload_optimizer + "\" needs zero_optimization.stage 1, 2 "
              "or 3 (stage 0 keeps no optimizer shard), got stage " + std::to_string(t.zero_stage));
  if (t.offload_param != "none")
    r.require(t.zero_stage == 3, par + "device = \"" + t.offload_param + "\" needs zero_optimization.stage 3 (only "
              "stage 3 shards the parameters), got stage " + std::to_string(t.zero_stage));
  if (t.offload_optimizer == "nvme")
    r.require(!t.offload_optimizer_nvme_path.empty(), opt + "device = \"nvme\" needs " + opt + "nvme_path");
  // The delayed update (the ZeRO-Offload paper's DPU; DeepSpeed has no key for it) overlaps the CPU's
  // update with the next step, so it needs the update on the CPU and one update per step.
  t.offload_optimizer_delayed_update = r.boolean(opt + "delayed_update");
  if (t.offload_optimizer_delayed_update) {
    r.require(t.offload_optimizer != "none", opt + "delayed_update needs " + opt + "device = \"cpu\" or \"nvme\" "
              "(it overlaps the CPU's optimizer step with the next step), got \"none\"");
    r.require(!t.step_in_backward, opt + "delayed_update and optimizer.step_in_backward cannot both be true: stepping "
              "in the backward updates each block at once, there is no step-long update to delay");
  }
  if (t.offload_param == "nvme")
    r.require(!t.offload_param_nvme_path.empty(), par + "device = \"nvme\" needs " + par + "nvme_path");
  t.offload_optimizer_ratio = r.number(opt + "ratio", io::Range::closed(0, 1));
  if (t.offload_optimizer_delayed_update)
    r.require(t.offload_optimizer_ratio == 1.0, opt + "delayed_update needs " + opt + "ratio 1 (the delayed update "
              "runs the whole update on a host thread, so none of the optimizer state may stay on the device)");

  // Read for their types and ranges even where they mean nothing, so a typo is still an error.
  r.boolean(opt + "fast_init");
  const double buffer_size = r.number(par + "buffer_size", io::Range::above(0));
  r.require(buffer_size <= 9e15, par + "buffer_size must be at most 9e15 elements");
  t.offload_param_buffer_size = int64_t(buffer_size);
  r.number(par + "max_in_cpu", io::Range::at_least(0));
  r.boolean("aio.single_submit");
  r.boolean("aio.overlap_events");
  t.aio_block_size = r.integer("aio.block_size", 4096, int64_t(1) << 30);
  t.aio_queue_depth = r.integer("aio.queue_depth", 1, 4096);
  t.aio_thread_count = r.integer("aio.thread_count", 1, 256);

  // Keys with no meaning here, or none for the devices chosen.
  std::vector<std::string> unused;
  auto unless = [&](bool meaningful, const std::string& key) {
    if (!meaningful && r.value(key) != r.config().default_at(key)) unused.push_back(key);
  };
  const bool opt_nvme = t.offload_optimizer == "nvme", par_nvme = t.offload_param == "nvme";
  unless(opt_nvme, opt + "nvme_path");
  unless(opt_nvme, opt + "buffer_count");
  unless(t.offload_optimizer != "none", opt + "pin_memory");
  unless(t.offload_optimizer != "none", opt + "ratio");
  unless(false, opt + "fast_init");  // state is created shard by shard on its tier anyway
  unless(par_nvme, par + "nvme_path");
  unless(par_nvme, par + "buffer_count");
  unless(par_nvme, par + "buffer_size");
  unless(false, par + "max_in_cpu");  // DeepSpeed's CPU cache of NVMe parameters: we read them from NVMe each time
  unless(t.offload_param != "none", par + "pin_memory");
  for (const char* k : {"block_size", "queue_depth"}) unless(opt_nvme || par_nvme, std::string("aio.") + k);
  // io_uring needs no submitting threads and batches on its own: a swap file has one ring and one
  // thread reaping it, so DeepSpeed's libaio knobs mean nothing here.
  for (const char* k : {"thread_count", "single_submit", "overlap_events"}) unless(false, std::string("aio.") + k);
  if (!unused.empty()) {
    std::string list;
    for (const std::string& k : unused) list += (list.empty() ? "" : ", ") + k;
    r.warn("ignored: " + list + " (no meaning with offload_optimizer.device = \"" + t.offload_optimizer +
           "\" and offload_param.device = \"" + t.offload_param + "\")");
  }
}

// The pipeline section: what can be checked without the model or the world size (the layer count
// and the world's divisibility are checked when training starts).
void read_pipeline(io::ConfigReader& r, TrainConfig& t) {
  t.pipeline_stages = r.integer("pipeline.stages", 1, 4096);
  t.virtual_stages = r.integer("pipeline.virtual_stages", 1, 64);
  t.pipeline_schedule = r.one_of("pipeline.schedule", {"1f1b", "interleaved", "zb-h1"});
  const io::json& part = r.value("pipeline.partition");
  if (part.is_array()) {
    t.pipeline_partition = "layers";
    bool ok = true;
    for (const io::json& v : part) {
      ok = ok && v.is_number_integer() && v.get<int64_t>() > (t.partition_layers.empty() ? 0 : t.partition_layers.back());
      if (ok) t.partition_layers.push_back(v.get<int64_t>());
    }
    const size_t want = size_t(t.pipeline_stages * t.virtual_stages - 1);
    if (!ok)
      r.reject("pipeline.partition", "must be \"parameters\", \"uniform\", \"compute\" or a strictly increasing "
               "list of positive layer indices (the first layer, or UNet block, of every model chunk after the "
               "first)");
    else
      r.require(t.partition_layers.size() == want,
                "pipeline.partition lists " + std::to_string(t.partition_layers.size()) + " layer boundaries; " +
                    std::to_string(t.pipeline_stages) + " stages x " + std::to_string(t.virtual_stages) +
                    " virtual stages need " + std::to_string(want));
  } else if (part.is_null()) {  // null (the default, so that a list is allowed too): "parameters"
    t.pipeline_partition = "parameters";
  } else if (!part.is_string() || (part != "parameters" && part != "uniform" && part != "compute")) {
    r.reject("pipeline.partition", "must be \"parameters\", \"uniform\", \"compute\" or a list of layer indices");
  } else {
    t.pipeline_partition = part.get<std::string>();
  }
  t.keep_gathered = r.boolean("pipeline.keep_gathered");
  if (t.keep_gathered && t.zero_stage < 3)
    r.warn("pipeline.keep_gathered has no effect at zero_optimization.stage " + std::to_string(t.zero_stage) +
           ": only stage 3 gathers the weights for each use");
  // An accumulation inferred from train_batch_size is known, and checked, when the run is placed.
  if (t.grad_accum > 0) {
    try {
      parallel::check_schedule(parallel::schedule_kind_from(t.pipeline_schedule, "pipeline.schedule"),
                               {int(t.pipeline_stages), int(t.grad_accum), int(t.virtual_stages)});
    } catch (const Error& e) {
      r.require(false, e.what());
    }
  }
  r.require(!t.step_in_backward || t.pipeline_stages == 1,
            "optimizer.step_in_backward with pipeline.stages > 1: a tied embedding's two copies must add their "
            "gradients before the update, which the backward cannot wait for");
}


// DeepSpeed's batch keys: what can be decided without the world size. When train_batch_size is not
// given, the micro-batch must be (left out, zeropipe's default 1; "auto" has nothing to come from, as
// the HF Trainer takes it from --per_device_train_batch_size) and the accumulation is 1 unless given.
// When it is given, a missing or "auto" micro-batch or accumulation is inferred at placement.
void read_batch(io::ConfigReader& r, TrainConfig& t) {
  const io::Config& c = r.config();
  t.train_batch_size = r.integer_or_auto("train_batch_size", 1).value_or(0);
  const bool total_known = t.train_batch_size > 0;
  // A number given in the file or a --set; else inferred when the run is placed (0) when
  // train_batch_size is known, and zeropipe's default (1) when it is not.
  auto given_or_inferred = [&](const char* key) {
    return c.given(key) && !c.is_auto(key) ? r.integer(key, 1) : total_known ? 0 : c.default_at(key).get<int64_t>();
  };
  t.micro_batch = given_or_inferred("train_micro_batch_size_per_gpu");
  t.grad_accum = given_or_inferred("gradient_accumulation_steps");
  if (!total_known && c.is_auto("train_micro_batch_size_per_gpu"))
    r.reject("train_micro_batch_size_per_gpu", "cannot be resolved: give it a number, or give train_batch_size "
             "(zeropipe has no --per_device_train_batch_size to take it from)");
}

// optimizer.*: DeepSpeed's Adam and AdamW (its names in any case, as DeepSpeed lowercases them);
// "auto" parameters take zeropipe's defaults, as the HF Trainer takes its own arguments' values.
void read_optimizer(io::ConfigReader& r, TrainConfig& t) {
  using io::Range;
  const io::json& type = r.value("optimizer.type");
  std::string lower = type.is_string() ? type.get<std::string>() : "";
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char ch) { return char(std::tolower(ch)); });
  if (lower != "adam" && lower != "adamw")
    r.reject("optimizer.type", "is not supported: zeropipe has \"AdamW\" and \"Adam\" (with adam_w_mode true); "
             "DeepSpeed's OneBitAdam, ZeroOneAdam, Lamb, OneBitLamb, Muon and torch optimizers are not implemented");
  r.require(r.boolean("optimizer.params.adam_w_mode"),
            "optimizer.params.adam_w_mode = false (L2-coupled Adam) is not supported");
  r.boolean("optimizer.params.torch_adam");
  for (const char* key : {"optimizer.params.lr", "optimizer.params.betas", "optimizer.params.eps",
                          "optimizer.params.weight_decay"})
    r.resolve_auto(key, r.config().default_at(key));
  t.lr = r.number("optimizer.params.lr", Range::above(0));
  const auto betas = r.numbers("optimizer.params.betas", 2, Range::half_open(0, 1));
  t.beta1 = betas[0];
  t.beta2 = betas[1];
  t.eps = r.number("optimizer.params.eps", Range::above(0));
  t.weight_decay = r.number("optimizer.params.weight_decay", Range::at_least(0));
}

// bf16 / fp16. "auto" is decided by the device when the run is placed; the fp16 loss-scaling keys
// are DeepSpeed's.
void read_precision(io::ConfigReader& r, TrainConfig& t) {
  using io::Range;
  t.bf16_auto = r.config().is_auto("bf16.enabled");
  t.fp16_auto = r.config().is_auto("fp16.enabled");
  const bool bf16 = !t.bf16_auto && r.boolean("bf16.enabled");
  t.fp16 = !t.fp16_auto && r.boolean("fp16.enabled");
  r.require(!(bf16 && t.fp16), "bf16.enabled and fp16.enabled cannot both be true");
  t.dtype = bf16 ? DType::BF16 : t.fp16 ? DType::F16 : DType::F32;
  const double fixed = r.number("fp16.loss_scale", Range::at_least(0));
  // 2^63 and beyond do not fit the int64 the scale was once computed in, and no gradient needs them.
  const int64_t power = r.integer("fp16.initial_scale_power", 0, 63);
  const int64_t window = r.integer("fp16.loss_scale_window", 1);
  t.hysteresis = r.integer("fp16.hysteresis", 1);
  t.consecutive_hysteresis = r.boolean("fp16.consecutive_hysteresis");
  const double min_loss_scale = r.number("fp16.min_loss_scale", Range::above(0));
  // A fixed scale (DeepSpeed's static scaler) never grows and, being its own floor, never halves:
  // an overflowing step is skipped, and counts towards training.max_bad_steps.
  t.initial_scale = fixed > 0 ? fixed : std::ldexp(1.0, int(power));
  t.scale_window = fixed > 0 ? INT64_MAX : window;
  t.min_scale = fixed > 0 ? fixed : min_loss_scale;
}

// scheduler.*: DeepSpeed's schedules and parameter names (runtime/lr_schedule.h). "auto" resolves as
// the HF Trainer resolves it: warmup_min_lr 0, warmup_max_lr the optimizer's lr, warmup_num_steps
// zeropipe's 0, total_num_steps training.max_steps.
void read_schedule(io::ConfigReader& r, TrainConfig& t) {
  using io::Range;
  LrSchedule& s = t.schedule;
  const std::string p = "scheduler.params.";
  s.type = r.one_of("scheduler.type", {"WarmupCosineLR", "WarmupDecayLR", "WarmupLR", "OneCycle", "LRRangeTest"});
  s.lr = t.lr;
  s.warmup_shape = r.one_of(p + "warmup_type", {"linear", "log"}) == "log" ? WarmupShape::Log : WarmupShape::Linear;
  r.resolve_auto(p + "warmup_num_steps", r.config().default_at(p + "warmup_num_steps"));
  s.warmup_steps = r.integer(p + "warmup_num_steps", 0);
  s.total_steps = r.integer_or_auto(p + "total_num_steps", 1).value_or(t.max_steps);
  s.cos_min_ratio = r.number(p + "cos_min_ratio", Range::closed(0, 1));
  s.warmup_min_ratio = r.number(p + "warmup_min_ratio", Range::closed(0, 1));
  r.resolve_auto(p + "warmup_min_lr", 0.0);
  s.warmup_min_lr = r.number(p + "warmup_min_lr", Range::at_least(0));
  r.resolve_auto(p + "warmup_max_lr", t.lr);
  s.warmup_max_lr = r.number_or_null(p + "warmup_max_lr", Range::above(0)).value_or(t.lr);
  r.integer(p + "last_batch_iteration", -1, -1);  // a resumed run continues its schedule from the checkpoint
  if (s.type == "OneCycle") {
    const auto min_lr = r.number_or_null(p + "cycle_min_lr", Range::at_least(0));
    const auto max_lr = r.number_or_null(p + "cycle_max_lr", Range::above(0));
    r.require(min_lr && max_lr, "scheduler.type = \"OneCycle\" needs scheduler.params.cycle_min_lr and cycle_max_lr");
    s.cycle_min_lr = min_lr.value_or(0);
    s.cycle_max_lr = max_lr.value_or(t.lr);
    s.decay_lr_rate = r.number(p + "decay_lr_rate", Range::at_least(0));
    s.cycle_first_step_size = double(r.integer(p + "cycle_first_step_size", 1));
    // Null (DeepSpeed's None): the second half of the cycle mirrors the first.
    const auto second = r.integer_or_auto(p + "cycle_second_step_size", 0);
    s.cycle_second_step_size = second ? double(*second) : s.cycle_first_step_size;
    s.cycle_first_stair_count = r.integer(p + "cycle_first_stair_count", 0);
    s.cycle_second_stair_count =
        r.integer_or_auto(p + "cycle_second_stair_count", 0).value_or(s.cycle_first_stair_count);
    s.decay_step_size = double(r.integer(p + "decay_step_size", 0));
    // Momentum: AdamW's beta1 cycles inversely to the learning rate, and beta2 is DeepSpeed's 0.99.
    s.cycle_momentum = r.boolean(p + "cycle_momentum");
    s.cycle_min_mom = r.number(p + "cycle_min_mom", Range::half_open(0, 1));
    s.cycle_max_mom = r.number(p + "cycle_max_mom", Range::half_open(0, 1));
    s.decay_mom_rate = r.number(p + "decay_mom_rate", Range{});  // either way: checked over the run below
    if (s.cycle_momentum) {
      // The decay moves beta1 one way only: the last update's is its extreme.
      const double last = s.betas_at(std::max<int64_t>(t.max_steps - 1, 0))->beta1;
      r.require(last >= 0 && last < 1,
                detail::cat("scheduler.params.decay_mom_rate = ", s.decay_mom_rate, " takes AdamW's beta1 to ", last,
                            " by training.max_steps = ", t.max_steps, "; it must stay in [0, 1)"));
    }
  }
  if (s.type == "LRRangeTest") {
    s.range_test_min_lr = r.number(p + "lr_range_test_min_lr", Range::above(0));
    s.range_test_step_size = r.integer(p + "lr_range_test_step_size", 1);
    s.range_test_step_rate = r.number(p + "lr_range_test_step_rate", Range::at_least(0));
    s.range_test_staircase = r.boolean(p + "lr_range_test_staircase");
  }
}

// csv_monitor: DeepSpeed's directory layout, <output_path>/<job_name>.
void read_monitors(io::ConfigReader& r, TrainConfig& t) {
  if (!r.boolean("csv_monitor.enabled")) return;
  const std::string out = r.string("csv_monitor.output_path"), job = r.string("csv_monitor.job_name");
  t.csv_monitor_dir = (std::filesystem::path(out.empty() ? "." : out) / job).string();
}

}  // namespace

TrainConfig TrainConfig::read(io::ConfigReader& r, const std::string& model_type) {
  using io::Range;
  TrainConfig t;
  read_batch(r, t);
  r.resolve_auto("gradient_clipping", r.config().default_at("gradient_clipping"));  // HF: --max_grad_norm
  t.grad_clip = r.number("gradient_clipping", Range::at_least(0));
  t.print_every = r.integer("steps_per_print", 1);
  t.wall_clock_breakdown = r.boolean("wall_clock_breakdown");
  t.seed = r.unsigned_integer("seed");
  read_optimizer(r, t);
  read_precision(r, t);
  t.zero_stage = int(r.integer("zero_optimization.stage", 0, 3));
  t.overlap_comm = r.boolean("zero_optimization.overlap_comm");
  check_deepspeed_keys(r);
  t.step_in_backward = r.boolean("optimizer.step_in_backward");
  if (t.step_in_backward) {
    r.require(t.zero_stage >= 2, "optimizer.step_in_backward needs zero_optimization.stage 2 or 3 (gradient buffers "
              "that live only while their block runs), got stage " + std::to_string(t.zero_stage));
    r.require(t.grad_clip == 0, "optimizer.step_in_backward updates each block before the global gradient norm is "
              "known, so gradient_clipping must be 0, got " + io::json(t.grad_clip).dump());
    r.require(!t.fp16, "optimizer.step_in_backward cannot skip an fp16 overflow step: use bf16.enabled or fp32");
  }
  read_offload(r, t);
  read_pipeline(r, t);

  t.model_type = r.one_of("model.type", {model_type},
                          model_type == "unet" ? "diffusion training" : "or \"unet\" for diffusion training");
  t.hub_config = r.value("model.config");
  t.hub_dir = r.string("model.hub_dir");
  if (r.require(t.hub_config.is_object() || t.hub_config.is_null(),
                "model.config must be an object (an inline hub config.json) or null, got " +
                    io::json_excerpt(t.hub_config)))
    r.require(t.hub_config.is_object() != !t.hub_dir.empty(),
              "give exactly one of model.config (an inline hub config.json object) and model.hub_dir");
  // An inline hub config is checked here too, so that its problems come with the others, before MPI
  // starts (a model.hub_dir's config.json is read when training starts).
  if (t.hub_config.is_object()) {
    try {
      if (model_type == "unet")
        models::UNetConfig::from_hub_json(t.hub_config, "model.config");
      else
        models::TransformerConfig::from_hub_json(t.hub_config, "model.config");
    } catch (const Error& e) {
      r.require(false, e.what());
    }
  }
  t.init = r.one_of("model.init", {"random", "hub"});
  r.require(t.init == "random" || !t.hub_dir.empty(), "model.init = \"hub\" needs model.hub_dir");
  t.init_std = r.number("model.init_std", Range::above(0));
  t.activation_checkpointing = r.boolean("model.activation_checkpointing");
  // DeepSpeed's section tunes its checkpointing library; the model code (HF: --gradient_checkpointing)
  // turns checkpointing on, here model.activation_checkpointing.
  if (!t.activation_checkpointing && r.config().given("activation_checkpointing"))
    r.warn("activation_checkpointing.* tune checkpointing, which is off: model.activation_checkpointing = true "
           "turns it on (as --gradient_checkpointing does for the HF Trainer)");
  t.decay_all = r.boolean("model.weight_decay_on_all");
  t.lora_r = r.integer("lora.r", 0, 1 << 16);
  t.lora_alpha = r.number("lora.alpha", Range::above(0));
  t.lora_dropout = r.number("lora.dropout", Range::half_open(0, 1));
  t.lora_targets = r.strings("lora.target_modules");
  t.lora_rslora = r.boolean("lora.rslora");
  t.lora_init_from = r.string("lora.init_from");
  r.require(t.lora_init_from.empty() || t.lora_r > 0, "lora.init_from names an adapter but lora.r is 0 (LoRA off): "
            "set lora.r, lora.alpha and lora.target_modules to the adapter's");
  r.require(t.lora_r == 0 || !t.lora_targets.empty(), "lora.r = " + std::to_string(t.lora_r) +
            " needs lora.target_modules (the hub's module names, e.g. [\"q_proj\", \"v_proj\"])");
  r.require(t.lora_r > 0 || t.lora_targets.empty(),
            "lora.target_modules names modules but lora.r is 0 (LoRA off): set lora.r");

  t.train_files = r.strings("data.train_files");
  t.val_files = r.strings("data.val_files");
  t.val_fraction = r.number("data.val_fraction", Range::half_open(0, 1));
  t.seq_len = r.integer("data.seq_len", 1);
  t.shuffle = r.boolean("data.shuffle");
  r.require(!t.train_files.empty(), "data.train_files is empty");
  // Instruction data (issue 14): JSONL records tokenised at start-up, or a file `zeropipe tokenize
  // --format instruct` wrote; either way rows of one record (or several, packed) with the loss on
  // the responses only.
  t.data_format = r.one_of("data.format", {"tokens", "jsonl", "instruct"});
  t.tokenizer = r.string("data.tokenizer");
  t.chat_template = r.one_of("data.chat_template", {"auto", "llama3", "chatml", "plain"});
  t.packing = r.boolean("data.packing");
  if (t.data_format == "jsonl") {
    r.require(!t.tokenizer.empty(), "data.format \"jsonl\" needs data.tokenizer (a tokenizer.json, or a folder "
              "holding it or GPT-2's vocab.json + merges.txt) to tokenise the records with");
  } else {
    if (!t.tokenizer.empty())
      r.warn("data.tokenizer is read only with data.format \"jsonl\" (data.format is \"" + t.data_format +
             "\"): it is ignored");
    if (t.data_format == "tokens") {
      r.require(!t.packing, "data.packing = true needs instruction data: data.format \"jsonl\" or \"instruct\" "
                "(token files are already one stream of tokens)");
      r.require(t.chat_template == "auto", "data.chat_template = \"" + t.chat_template +
                "\" needs instruction data: data.format \"jsonl\" or \"instruct\"");
    }
  }

  t.max_steps = r.integer("training.max_steps", 0);
  t.eval_every = r.integer("training.eval_every", 0);
  // Every evaluation runs this many forwards on every rank before training goes on: a million is
  // already hours, and the bound keeps eval_batches * world * micro far from int64's end.
  t.eval_batches = r.integer("training.eval_batches", 1, 1000000);
  t.max_bad_steps = r.integer("training.max_bad_steps", 1);
  t.device = r.one_of("training.device", {"auto", "cpu", "cuda"});
  t.metrics_file = r.string("training.metrics_file");
  read_schedule(r, t);
  read_monitors(r, t);
  t.checkpoint_dir = r.string("checkpoint.dir");
  t.save_every = r.integer("checkpoint.save_every", 0);
  t.keep_last = r.integer("checkpoint.keep_last", 0);
  t.checkpoint_async = r.boolean("checkpoint.async");
  r.require(t.save_every == 0 || !t.checkpoint_dir.empty(),
            "checkpoint.save_every = " + std::to_string(t.save_every) + " needs checkpoint.dir (where to save)");
  t.config_json = r.config().dump();
  t.warnings = r.warnings();
  // Every rank reads the same configuration before MPI starts: rank 0 alone says what it found.
  for (const std::string& w : t.warnings) log_line(LogLevel::Warn, /*all_ranks=*/false, w);
  return t;
}

TrainConfig TrainConfig::resolve_for_place(int data_parallel_size, int world_size, Device device) const {
  TrainConfig t = *this;
  const int64_t dp = data_parallel_size;
  const std::string ranks =
      " (world size " + std::to_string(world_size) + " / pipeline.stages " + std::to_string(pipeline_stages) + ")";
  // DeepSpeed's inference (runtime/config.py, _set_batch_related_parameters): the missing keys from
  // the given ones, the accumulation 1 when only train_batch_size is given.
  if (t.train_batch_size > 0 && (t.micro_batch == 0 || t.grad_accum == 0)) {
    if (t.micro_batch == 0 && t.grad_accum == 0) t.grad_accum = 1;
    const bool micro_known = t.micro_batch > 0;
    const int64_t known = micro_known ? t.micro_batch : t.grad_accum;
    ZP_REQUIRE(t.train_batch_size % (known * dp) == 0, "train_batch_size ", t.train_batch_size,
               " is not divisible by ", micro_known ? "train_micro_batch_size_per_gpu " : "gradient_accumulation_steps ",
               known, " x data-parallel size ", dp, ranks, ": ",
               micro_known ? "gradient_accumulation_steps" : "train_micro_batch_size_per_gpu", " cannot be inferred");
    (micro_known ? t.grad_accum : t.micro_batch) = t.train_batch_size / (known * dp);
  }
  const int64_t global = t.micro_batch * t.grad_accum * dp;
  ZP_REQUIRE(t.train_batch_size == 0 || t.train_batch_size == global, "train_batch_size ", t.train_batch_size,
             " != train_micro_batch_size_per_gpu ", t.micro_batch, " x gradient_accumulation_steps ", t.grad_accum,
             " x data-parallel size ", dp, ranks);
  t.train_batch_size = global;
  parallel::check_schedule(parallel::schedule_kind_from(t.pipeline_schedule, "pipeline.schedule"),
                           {int(t.pipeline_stages), int(t.grad_accum), int(t.virtual_stages)});

  // "auto" precision: bf16 where the GPU computes in it, fp16 (with loss scaling) on an older GPU,
  // fp32 on the CPU.
  const bool gpu_bf16 = device.is_cuda() && cuda_supports_bf16(device.index);
  const bool bf16 = t.bf16_auto ? gpu_bf16 && !t.fp16 : t.dtype == DType::BF16;
  if (t.fp16_auto) t.fp16 = device.is_cuda() && !gpu_bf16 && !bf16;
  t.dtype = bf16 ? DType::BF16 : t.fp16 ? DType::F16 : DType::F32;
  if (t.fp16 && t.fp16_auto) {
    ZP_REQUIRE(!t.step_in_backward, "fp16.enabled = \"auto\" chose fp16 on ", device.str(), " (no bf16), which "
               "optimizer.step_in_backward cannot run with (it cannot skip an overflow step): set fp16.enabled false");
  }
  t.bf16_auto = t.fp16_auto = false;
  return t;
}

}  // namespace zp::runtime
