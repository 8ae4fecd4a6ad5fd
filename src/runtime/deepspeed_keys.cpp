#include "runtime/deepspeed_keys.h"

#include "io/bounded_json.h"

namespace zp::runtime {
namespace {

using enum KeyHandling;

// Grouped as DeepSpeed's reference orders them. The honoured keys' meanings are the README's.
constexpr DeepSpeedKey kKeys[] = {
    // Batch size
    {"train_batch_size", Honoured, "checked against micro x accumulation x data-parallel size; inferred when left out or \"auto\""},
    {"train_micro_batch_size_per_gpu", Honoured, "sequences (or samples) per rank and micro-step; inferred from train_batch_size when left out or \"auto\""},
    {"gradient_accumulation_steps", Honoured, "micro-steps per optimizer step; inferred from train_batch_size when left out or \"auto\""},
    {"managed_gradient_accumulation", Warned, "the training loop always steps the optimizer at the accumulation boundary"},
    // Optimizer and scheduler
    {"optimizer.type", Honoured, "Adam and AdamW (any case): AdamW with decoupled weight decay; other types are errors"},
    {"optimizer.params.lr", Honoured, "peak learning rate; \"auto\": 6e-4"},
    {"optimizer.params.betas", Honoured, "AdamW betas; \"auto\": [0.9, 0.95]"},
    {"optimizer.params.eps", Honoured, "AdamW eps; \"auto\": 1e-8"},
    {"optimizer.params.weight_decay", Honoured, "decoupled weight decay (matrices only unless model.weight_decay_on_all); \"auto\": 0.1"},
    {"optimizer.params.adam_w_mode", Honoured, "true (AdamW); false (L2-coupled Adam) is an error"},
    {"optimizer.params.torch_adam", Warned, "one AdamW implementation per device: there is no fused/torch choice"},
    {"optimizer.params.amsgrad", Refused, "AMSGrad is not implemented"},
    {"optimizer.params.bias_correction", Refused, "AdamW without bias correction is not implemented"},
    {"optimizer.legacy_fusion", Warned, "no fused-optimizer variants"},
    {"scheduler.type", Honoured, "WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle, LRRangeTest with DeepSpeed's formulas"},
    {"scheduler.params", Honoured, "each schedule's parameters by DeepSpeed's names (configs/README.md)"},
    // Communication
    {"communication_data_type", Warned, "gradients are reduced in fp32 whatever the compute precision"},
    {"gradient_allreduce_op", Refused, "gradients are always averaged over the data-parallel ranks (\"mean\")"},
    {"prescale_gradients", Warned, "gradients are reduced in fp32, where dividing before or after the sum makes no difference"},
    {"gradient_predivide_factor", Warned, "gradients are reduced in fp32, where a pre-division factor makes no difference"},
    {"sparse_gradients", Warned, "embedding gradients are reduced densely (same values, more bytes)"},
    // Precision
    {"fp16.enabled", Honoured, "fp16 compute with dynamic loss scaling; \"auto\": true on a GPU without bf16 when bf16 is not enabled"},
    {"fp16.auto_cast", Warned, "with fp16.enabled the engine computes every layer in fp16 itself"},
    {"fp16.loss_scale", Honoured, "0: dynamic scaling; > 0: that fixed scale"},
    {"fp16.initial_scale_power", Honoured, "the dynamic scale starts at 2^power"},
    {"fp16.loss_scale_window", Honoured, "clean steps before the scale doubles"},
    {"fp16.hysteresis", Honoured, "overflows in a row before the scale halves"},
    {"fp16.consecutive_hysteresis", Honoured, "true: every clean step refills the hysteresis; false: only a doubling does"},
    {"fp16.min_loss_scale", Honoured, "the dynamic scale's floor"},
    {"fp16.fp16_master_weights_and_grads", Refused, "master weights and gradients are always fp32"},
    {"bf16.enabled", Honoured, "bf16 compute with fp32 master weights; \"auto\": true on a GPU with bf16 (compute capability 8 or later)"},
    {"bf16.immediate_grad_update", Warned, "gradients are accumulated into fp32 buffers as each block's backward ends anyway"},
    {"bf16.check_overflow", Warned, "non-finite steps are always detected (training.max_bad_steps)"},
    {"bf16.bf16_master_weights_and_grads", Refused, "master weights and gradients are always fp32"},
    {"bf16.bf16_optimizer_states", Refused, "AdamW moments are always fp32"},
    {"bfloat16", Refused, "DeepSpeed's old name of the section: rename it bf16", ""},
    {"amp", Refused, "Apex AMP is not available: use bf16.enabled or fp16.enabled"},
    {"torch_autocast", Refused, "per-module autocast is not available: use bf16.enabled or fp16.enabled"},
    {"gradient_clipping", Honoured, "global-norm clipping (0: none); \"auto\": 1.0"},
    // ZeRO
    {"zero_optimization.stage", Honoured, "0, 1, 2, 3"},
    {"zero_optimization.allgather_partitions", Warned, "updated shards are always all-gathered"},
    {"zero_optimization.allgather_bucket_size", Warned, "every parameter block is one bucket"},
    {"zero_optimization.overlap_comm", Honoured, "collectives on a communication stream, overlapping the backward"},
    {"zero_optimization.reduce_scatter", Warned, "stages 2 and 3 always reduce-scatter, stages 0 and 1 all-reduce"},
    {"zero_optimization.reduce_bucket_size", Warned, "every parameter block is one bucket"},
    {"zero_optimization.use_multi_rank_bucket_allreduce", Warned, "every parameter block is one bucket"},
    {"zero_optimization.contiguous_gradients", Warned, "a block's gradients are always one contiguous buffer"},
    {"zero_optimization.load_from_fp32_weights", Warned, "checkpoints always hold the fp32 master weights, which a resume loads"},
    {"zero_optimization.grad_hooks", Warned, "a block's gradients are reduced as soon as its backward ends"},
    {"zero_optimization.round_robin_gradients", Warned, "each block's gradient shard is copied by its owner"},
    {"zero_optimization.offload_param", Honoured, "parameter shards on the CPU or NVMe (stage 3; configs/README.md)"},
    {"zero_optimization.offload_optimizer", Honoured, "optimizer state on the CPU or NVMe (stages 1-3; configs/README.md)"},
    {"zero_optimization.sub_group_size", Warned, "the CPU and NVMe tiers update the state in chunks of their own"},
    {"zero_optimization.stage3_max_live_parameters", Warned, "stage 3 holds the block in use and the one prefetched"},
    {"zero_optimization.stage3_max_reuse_distance", Warned, "stage 3 releases a block as soon as its forward or backward ends"},
    {"zero_optimization.stage3_prefetch_bucket_size", Warned, "stage 3 prefetches one block ahead"},
    {"zero_optimization.stage3_param_persistence_threshold", Warned, "every block is sharded, small or not"},
    {"zero_optimization.stage3_model_persistence_threshold", Warned, "every block is sharded, small or not"},
    {"zero_optimization.stage3_gather_16bit_weights_on_model_save", Warned, "checkpoints always hold every weight whole; zeropipe convert writes a hub folder"},
    {"zero_optimization.stage3_module_granularity_threshold", Warned, "the gathering unit is always one block"},
    {"zero_optimization.stage3_use_all_reduce_for_fetch_params", Warned, "stage 3 gathers with all-gather"},
    {"zero_optimization.stage3_allgather_sequential", Warned, "stage 3 gathers one block at a time"},
    {"zero_optimization.ignore_unused_parameters", Warned, "every parameter of a block is reduced, used or not"},
    {"zero_optimization.legacy_stage1", Warned, "there is one stage 1"},
    {"zero_optimization.elastic_checkpoint", Warned, "every checkpoint resumes at any world size and stage"},
    {"zero_optimization.zero_hpz_partition_size", Warned, "ZeRO++'s secondary partition is not implemented: weights are gathered over all data-parallel ranks (same values, more inter-node traffic)"},
    {"zero_optimization.zero_quantized_weights", Refused, "ZeRO++'s quantized weight gathering is not implemented"},
    {"zero_optimization.zero_quantized_nontrainable_weights", Refused, "ZeRO++'s quantized weights are not implemented"},
    {"zero_optimization.zero_quantized_gradients", Refused, "ZeRO++'s quantized gradient reduction is not implemented"},
    {"zero_optimization.zeropp_loco_param", Refused, "ZeRO++'s LoCo error feedback is not implemented", ""},
    {"zero_optimization.mics_shard_size", Warned, "MiCS is not implemented: every rank of the data group holds a shard (less memory each, more traffic)"},
    {"zero_optimization.mics_hierarchical_params_gather", Warned, "MiCS is not implemented"},
    {"zero_optimization.memory_efficient_linear", Warned, "Linear layers always keep only what their backward needs"},
    {"zero_optimization.pipeline_loading_checkpoint", Warned, "loading reads only each rank's own slices anyway"},
    {"zero_optimization.override_module_apply", Warned, "there are no torch module hooks"},
    {"zero_optimization.log_trace_cache_warnings", Warned, "there is no trace cache: the engine knows each block's order"},
    {"zero_optimization.enable_sanity_checks", Warned, "there are no ZeRO-3 sanity checks to enable"},
    {"zero_optimization.save_muon_momentum_buffer_in_memory", Warned, "there is no Muon optimizer"},
    {"zero_optimization.leaf_module", Warned, "the gathering unit is always one block", ""},
    {"zero_optimization.zenflow", Refused, "ZenFlow is not implemented (offload_optimizer.delayed_update overlaps the CPU step differently)", ""},
    {"zero_optimization.cpu_offload", Refused, "deprecated by DeepSpeed: use zero_optimization.offload_optimizer.device = \"cpu\""},
    {"zero_optimization.cpu_offload_param", Refused, "deprecated by DeepSpeed: use zero_optimization.offload_param.device = \"cpu\""},
    {"zero_optimization.cpu_offload_use_pin_memory", Refused, "deprecated by DeepSpeed: use offload_optimizer.pin_memory and offload_param.pin_memory"},
    {"zero_optimization.stage3_gather_fp16_weights_on_model_save", Warned, "checkpoints always hold every weight whole; zeropipe convert writes a hub folder"},
    {"zero_allow_untested_optimizer", Warned, "AdamW is the only optimizer, and it is tested with every stage"},
    {"zero_force_ds_cpu_optimizer", Warned, "the CPU tier always runs zeropipe's own vectorised AdamW"},
    {"aio", Honoured, "block_size and queue_depth shape NVMe I/O; the libaio knobs are warned (configs/README.md)"},
    // Tensor and expert parallelism, hybrid engine
    {"tensor_parallel", Refused, "tensor parallelism has no configuration key yet", "autotp_size"},
    {"hybrid_engine", Refused, "the RLHF hybrid engine is not implemented"},
    {"expert_parallel", Refused, "mixture-of-experts models are not implemented"},
    // Logging and monitoring
    {"steps_per_print", Honoured, "rank 0's progress line every N steps (and the last and validation steps)"},
    {"wall_clock_breakdown", Honoured, "the step-time breakdown (data, forward and backward, optimizer, communication busy) in rank 0's progress line; the metrics JSONL always has it"},
    {"dump_state", Warned, "the start-up banner always shows the sharding, the tiers and the bytes per tier"},
    {"memory_breakdown", Warned, "the start-up banner and every progress line show memory already"},
    {"flops_profiler", Warned, "no per-module profile: the progress line shows MFU"},
    {"autotuning", Warned, "autotuning is run by DeepSpeed's launcher; zeropipe plan suggests what fits"},
    {"tensorboard", Warned, "no TensorBoard writer: use training.metrics_file (JSONL) or csv_monitor"},
    {"wandb", Warned, "no Weights & Biases client: use training.metrics_file (JSONL) or csv_monitor"},
    {"comet", Warned, "no Comet client: use training.metrics_file (JSONL) or csv_monitor"},
    {"csv_monitor", Honoured, "rank 0 writes <output_path>/<job_name>/Train_Samples_{train_loss,lr,loss_scale}.csv"},
    {"comms_logger", Warned, "no communication log yet (issue 15 item 2)"},
    // Activation checkpointing (the switch is model.activation_checkpointing)
    {"activation_checkpointing.partition_activations", Warned, "partitions checkpoints over model-parallel ranks, and there are none"},
    {"activation_checkpointing.cpu_checkpointing", Refused, "checkpointed activations stay on the device: moving them to the CPU is not implemented"},
    {"activation_checkpointing.contiguous_memory_optimization", Warned, "each block's checkpoint is one saved input already"},
    {"activation_checkpointing.number_checkpoints", Warned, "sizes DeepSpeed's contiguous buffer, which does not exist here"},
    {"activation_checkpointing.synchronize_checkpoint_boundary", Warned, "no device synchronisation between blocks"},
    {"activation_checkpointing.profile", Warned, "no per-checkpoint timing"},
    // Training techniques that change the model, the data or the batch
    {"sparse_attention", Refused, "sparse attention is not implemented: attention is dense", ""},
    {"data_efficiency", Refused, "curriculum sampling and random-LTD are not implemented"},
    {"curriculum_learning", Refused, "curriculum learning is not implemented"},
    {"progressive_layer_drop", Refused, "progressive layer dropping is not implemented"},
    {"eigenvalue", Warned, "no eigenvalue computation (it only feeds techniques that are refused)"},
    {"compression_training", Refused, "compression (quantization, pruning, layer reduction) is not implemented", ""},
    {"quantize_training", Refused, "quantized training is not implemented"},
    {"weight_quantization", Refused, "weight quantization is not implemented", ""},
    {"elasticity", Refused, "elastic batch sizes are not implemented: the batch keys are fixed"},
    {"compile", Warned, "nothing is compiled at run time: DeepCompile's passes have no meaning", "deepcompile"},
    // Checkpoints (the checkpoint section also holds zeropipe's dir, save_every, keep_last, async)
    {"checkpoint.tag_validation", Warned, "checkpoints are named by step and verified by checksums"},
    {"checkpoint.load_universal", Warned, "every checkpoint resumes at any world size and stage"},
    {"checkpoint.use_node_local_storage", Refused, "a checkpoint is one file written collectively: it needs a file system all ranks share"},
    {"checkpoint.parallel_write.pipeline_stage", Warned, "every rank writes its own slices in parallel already"},
    {"data_types.grad_accum_dtype", Warned, "gradients are always accumulated in fp32"},
    {"dataloader_drop_last", Warned, "zeropipe reads its own data files (data.*)"},
    // DeepSpeed's pipeline section (also zeropipe's: stages, partition)
    {"pipeline.stages", Honoured, "pipeline stages (world = stages x data-parallel size); DeepSpeed's \"auto\" is an error"},
    {"pipeline.partition", Honoured, "\"parameters\" and \"uniform\" as DeepSpeed's; also \"compute\" or layer indices"},
    {"pipeline.seed_layers", Warned, "initialisation does not depend on the layout: it is keyed by (seed, tensor, element)"},
    {"pipeline.activation_checkpoint_interval", Refused, "checkpointing every N layers is not implemented: model.activation_checkpointing checkpoints every block"},
    {"pipeline.pipe_partitioned", Warned, "partitions activations over tensor-parallel ranks, and there are none"},
    {"pipeline.grad_partitioned", Warned, "partitions gradients over tensor-parallel ranks, and there are none"},
    {"pipeline.use_reentrant", Warned, "there is no autograd to re-enter"},
};

bool off(const io::json& v) {
  return v.is_null() || v == false || (v.is_number() && v.get<double>() <= 1);
}

// Whether `value` at `key` asks for something: neither "auto" nor DeepSpeed's default (the schema's),
// and for a free-form section, neither null nor switched off.
bool asks(const DeepSpeedKey& key, const io::json& value, const io::json& deepspeed_default) {
  if (value.is_string() && value == "auto") return false;
  if (!deepspeed_default.is_null()) return value != deepspeed_default;
  if (value.is_null()) return false;
  if (key.on_switch.empty() || !value.is_object()) return !(value.is_object() && value.empty());
  const std::string on_switch(key.on_switch);
  return value.contains(on_switch) && !off(value[on_switch]);
}

}  // namespace

std::span<const DeepSpeedKey> deepspeed_keys() { return kKeys; }

void check_deepspeed_keys(io::ConfigReader& r) {
  for (const DeepSpeedKey& key : kKeys) {
    if (key.handling == Honoured) continue;
    const std::string path(key.path);
    const io::json& value = r.value(path);
    if (!asks(key, value, r.config().default_at(path))) continue;
    if (key.handling == Warned)
      r.warn(path + " = " + io::json_excerpt(value) + " is ignored: " + std::string(key.meaning));
    else
      r.reject(path, "is not supported: " + std::string(key.meaning));
  }
}

}  // namespace zp::runtime
