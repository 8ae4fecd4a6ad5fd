#include "runtime/train_config.h"

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "core/log.h"
#include "io/weight_source.h"

namespace zp::runtime {

const io::json& train_config_schema() {
  static const io::json schema = io::json::parse(R"({
    "train_batch_size": null,
    "train_micro_batch_size_per_gpu": 1,
    "gradient_accumulation_steps": 1,
    "gradient_clipping": 1.0,
    "steps_per_print": 1,
    "seed": 1234,
    "wall_clock_breakdown": false,
    "optimizer": {"type": "AdamW",
                  "params": {"lr": 6e-4, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1,
                             "torch_adam": false, "adam_w_mode": true},
                  "step_in_backward": false},
    "scheduler": {"type": "WarmupCosineLR",
                  "params": {"warmup_num_steps": 0, "total_num_steps": null, "cos_min_ratio": 0.1,
                             "warmup_min_ratio": 0.0, "warmup_type": "linear"}},
    "bf16": {"enabled": false},
    "fp16": {"enabled": false, "loss_scale": 0, "initial_scale_power": 16, "loss_scale_window": 1000,
             "hysteresis": 2, "min_loss_scale": 1},
    "zero_optimization": {"stage": 0,
                          "offload_optimizer": {"device": "none", "nvme_path": "", "pin_memory": true},
                          "offload_param": {"device": "none", "nvme_path": "", "pin_memory": true},
                          "overlap_comm": true, "contiguous_gradients": true, "reduce_bucket_size": 5e8,
                          "allgather_bucket_size": 5e8, "stage3_prefetch_bucket_size": 5e8},
    "model": {"type": "transformer", "config": null, "hub_dir": "", "init": "random", "init_std": 0.02,
              "activation_checkpointing": false, "weight_decay_on_all": false},
    "data": {"train_files": [], "val_files": [], "val_fraction": 0.0, "seq_len": 1024, "shuffle": true},
    "checkpoint": {"dir": "", "save_every": 0, "keep_last": 3},
    "training": {"max_steps": 100, "eval_every": 0, "eval_batches": 4, "device": "auto", "metrics_file": ""}
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
  TrainConfig t;
  t.micro_batch = c.get<int64_t>("train_micro_batch_size_per_gpu");
  t.grad_accum = c.get<int64_t>("gradient_accumulation_steps");
  ZP_REQUIRE(t.micro_batch >= 1, "train_micro_batch_size_per_gpu must be >= 1, got ", t.micro_batch);
  ZP_REQUIRE(t.grad_accum >= 1, "gradient_accumulation_steps must be >= 1, got ", t.grad_accum);
  t.grad_clip = c.get<double>("gradient_clipping");
  t.print_every = c.get<int64_t>("steps_per_print");
  const io::json& tbs = c.at("train_batch_size");
  t.train_batch_size = tbs.is_number() ? tbs.get<int64_t>() : 0;
  t.seed = c.get<uint64_t>("seed");

  ZP_REQUIRE(c.get<std::string>("optimizer.type") == "AdamW" || c.get<std::string>("optimizer.type") == "Adam",
             "optimizer.type: only AdamW (decoupled weight decay) is supported, got ", c.at("optimizer.type").dump());
  ZP_REQUIRE(c.get<bool>("optimizer.params.adam_w_mode"), "optimizer.params.adam_w_mode = false (L2-coupled Adam) is not supported");
  t.lr = c.get<double>("optimizer.params.lr");
  auto betas = c.get<std::vector<double>>("optimizer.params.betas");
  ZP_REQUIRE(betas.size() == 2, "optimizer.params.betas must hold two numbers");
  t.beta1 = betas[0];
  t.beta2 = betas[1];
  t.eps = c.get<double>("optimizer.params.eps");
  t.weight_decay = c.get<double>("optimizer.params.weight_decay");

  t.scheduler = c.get<std::string>("scheduler.type");
  ZP_REQUIRE(t.scheduler == "WarmupCosineLR" || t.scheduler == "WarmupDecayLR" || t.scheduler == "WarmupLR",
             "scheduler.type must be WarmupCosineLR, WarmupDecayLR or WarmupLR, got \"", t.scheduler, "\"");
  ZP_REQUIRE(c.get<std::string>("scheduler.params.warmup_type") == "linear",
             "scheduler.params.warmup_type: only \"linear\" is supported");
  t.warmup_steps = c.get<int64_t>("scheduler.params.warmup_num_steps");
  t.min_lr_ratio = c.get<double>("scheduler.params.cos_min_ratio");

  const bool bf16 = c.get<bool>("bf16.enabled");
  t.fp16 = c.get<bool>("fp16.enabled");
  ZP_REQUIRE(!(bf16 && t.fp16), "bf16.enabled and fp16.enabled cannot both be true");
  t.dtype = bf16 ? DType::BF16 : t.fp16 ? DType::F16 : DType::F32;
  const double fixed = c.get<double>("fp16.loss_scale");
  t.initial_scale = fixed > 0 ? fixed : double(int64_t(1) << c.get<int>("fp16.initial_scale_power"));
  t.scale_window = fixed > 0 ? INT64_MAX : c.get<int64_t>("fp16.loss_scale_window");
  t.hysteresis = c.get<int64_t>("fp16.hysteresis");
  t.min_scale = c.get<double>("fp16.min_loss_scale");

  t.zero_stage = c.get<int>("zero_optimization.stage");
  ZP_REQUIRE(t.zero_stage >= 0 && t.zero_stage <= 3, "zero_optimization.stage must be 0..3, got ", t.zero_stage);
  t.overlap_comm = c.get<bool>("zero_optimization.overlap_comm");
  // Each sharding unit (a block's flat buffer) is one bucket, so DeepSpeed's bucket sizes do not apply.
  for (const char* key : {"zero_optimization.reduce_bucket_size", "zero_optimization.allgather_bucket_size",
                          "zero_optimization.stage3_prefetch_bucket_size"})
    if (c.get<double>(key) != 5e8)
      ZP_LOG_WARN(key, " is ignored: every parameter block is one bucket (and stage 3 prefetches one block ahead)");
  t.step_in_backward = c.get<bool>("optimizer.step_in_backward");
  if (t.step_in_backward) {
    ZP_REQUIRE(t.zero_stage >= 2, "optimizer.step_in_backward needs zero_optimization.stage 2 or 3 (gradient buffers "
               "that live only while their block runs), got stage ", t.zero_stage);
    ZP_REQUIRE(t.grad_clip == 0, "optimizer.step_in_backward updates each block before the global gradient norm is "
               "known, so gradient_clipping must be 0, got ", t.grad_clip);
    ZP_REQUIRE(!t.fp16, "optimizer.step_in_backward cannot skip an fp16 overflow step: use bf16.enabled or fp32");
  }
  ZP_REQUIRE(c.get<std::string>("zero_optimization.offload_optimizer.device") == "none" &&
                 c.get<std::string>("zero_optimization.offload_param.device") == "none",
             "zero_optimization.offload_*: offload is not implemented yet (use \"none\")");

  t.model_type = c.get<std::string>("model.type");
  ZP_REQUIRE(t.model_type == "transformer", "model.type: only \"transformer\" trains today, got \"", t.model_type, "\"");
  t.hub_config = c.at("model.config");
  t.hub_dir = c.get<std::string>("model.hub_dir");
  ZP_REQUIRE(t.hub_config.is_object() != !t.hub_dir.empty(),
             "give exactly one of model.config (an inline hub config.json object) and model.hub_dir");
  t.init = c.get<std::string>("model.init");
  ZP_REQUIRE(t.init == "random" || t.init == "hub", "model.init must be \"random\" or \"hub\", got \"", t.init, "\"");
  ZP_REQUIRE(t.init == "random" || !t.hub_dir.empty(), "model.init = \"hub\" needs model.hub_dir");
  t.init_std = c.get<double>("model.init_std");
  t.activation_checkpointing = c.get<bool>("model.activation_checkpointing");
  t.decay_all = c.get<bool>("model.weight_decay_on_all");

  t.train_files = c.get<std::vector<std::string>>("data.train_files");
  t.val_files = c.get<std::vector<std::string>>("data.val_files");
  t.val_fraction = c.get<double>("data.val_fraction");
  t.seq_len = c.get<int64_t>("data.seq_len");
  t.shuffle = c.get<bool>("data.shuffle");
  ZP_REQUIRE(!t.train_files.empty(), "data.train_files is empty");
  ZP_REQUIRE(t.val_fraction >= 0 && t.val_fraction < 1, "data.val_fraction must be in [0, 1)");
  ZP_REQUIRE(t.seq_len >= 1, "data.seq_len must be >= 1");

  t.max_steps = c.get<int64_t>("training.max_steps");
  t.eval_every = c.get<int64_t>("training.eval_every");
  t.eval_batches = c.get<int64_t>("training.eval_batches");
  t.device = c.get<std::string>("training.device");
  ZP_REQUIRE(t.device == "auto" || t.device == "cpu" || t.device == "cuda", "training.device must be auto, cpu or cuda");
  t.metrics_file = c.get<std::string>("training.metrics_file");
  const io::json& total = c.at("scheduler.params.total_num_steps");
  t.total_steps = total.is_number() ? total.get<int64_t>() : t.max_steps;
  ZP_REQUIRE(t.max_steps >= 0, "training.max_steps must be >= 0");
  ZP_REQUIRE(t.warmup_steps >= 0, "scheduler.params.warmup_num_steps must be >= 0");
  t.checkpoint_dir = c.get<std::string>("checkpoint.dir");
  t.save_every = c.get<int64_t>("checkpoint.save_every");
  t.keep_last = c.get<int64_t>("checkpoint.keep_last");
  ZP_REQUIRE(t.save_every >= 0, "checkpoint.save_every must be >= 0 (0 = never), got ", t.save_every);
  ZP_REQUIRE(t.keep_last >= 0, "checkpoint.keep_last must be >= 0 (0 = keep all), got ", t.keep_last);
  ZP_REQUIRE(t.save_every == 0 || !t.checkpoint_dir.empty(), "checkpoint.save_every = ", t.save_every,
             " needs checkpoint.dir (where to save)");
  t.config_json = c.dump();
  return t;
}

}  // namespace zp::runtime
