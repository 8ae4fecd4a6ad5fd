#include "runtime/optimizer_step.h"

#include <cmath>

namespace zp::runtime {

parallel::AdamWHyper adamw_hyper(const TrainConfig& cfg) {
  parallel::AdamWHyper h{cfg.lr, cfg.beta1, cfg.beta2, cfg.eps, cfg.weight_decay, cfg.decay_all};
  h.step_in_backward = cfg.step_in_backward;
  return h;
}

parallel::ShardingPolicy sharding_policy(const TrainConfig& cfg) {
  auto p = parallel::ShardingPolicy::from_config(cfg.zero_stage, cfg.offload_optimizer, cfg.offload_param);
  // One pin_memory for both kinds of host state: DeepSpeed has one per offload section, but a rank
  // pinning one kind and not the other buys nothing.
  p.set_pin_host_memory(cfg.offload_optimizer_pin_memory && cfg.offload_param_pin_memory);
  p.set_delayed_update(cfg.offload_optimizer_delayed_update);
  p.set_offload_ratio(cfg.offload_optimizer_ratio);
  p.set_keep_gathered(cfg.keep_gathered);
  p.set_optimizer_nvme({cfg.offload_optimizer_nvme_path, cfg.aio_block_size, int(cfg.aio_queue_depth),
                        int(cfg.offload_optimizer_buffer_count)});
  parallel::NvmeSettings params{cfg.offload_param_nvme_path, cfg.aio_block_size, int(cfg.aio_queue_depth),
                                int(cfg.offload_param_buffer_count), cfg.offload_param_buffer_size};
  params.path_key = "zero_optimization.offload_param.nvme_path";
  p.set_parameter_nvme(params);
  return p;
}

parallel::ScheduledHyper scheduled_hyper(const LrSchedule& schedule, int64_t step) {
  parallel::ScheduledHyper h{schedule.at(step)};
  if (const auto betas = schedule.betas_at(step)) {
    h.beta1 = betas->beta1;
    h.beta2 = betas->beta2;
  }
  return h;
}

void begin_micro_step(parallel::ZeroEngine& engine, const LrSchedule& schedule, int64_t micro, int64_t grad_accum,
                      float loss_scale) {
  const bool last = micro + 1 == grad_accum;
  engine.begin_micro_step(last);
  // No clipping in this mode (the configuration refuses it), and bf16/fp32 never skip a step.
  if (last && engine.updates_in_backward()) engine.set_update_in_backward(1.f / loss_scale, scheduled_hyper(schedule, engine.optimizer_steps()));
}

StepUpdate finish_step(parallel::ZeroEngine& engine, LossScaler& scaler, const LrSchedule& schedule, double grad_clip,
                       float loss_scale, const PipelineGradients* pipeline) {
  StepUpdate u;
  engine.finish_gradients();
  if (engine.updates_in_backward()) {  // the backward has updated every block
    u.grad_norm = std::sqrt(engine.grad_norm_squared()) / loss_scale;
    u.lr = schedule.at(engine.optimizer_steps() - 1);
    return u;
  }
  double norm_sq = 0;
  if (pipeline) {
    if (pipeline->tied_group) engine.sum_gradients_over(*pipeline->tied, *pipeline->tied_group);
    norm_sq = engine.grad_norm_squared(pipeline->tied_is_replica ? pipeline->tied : nullptr);
    if (pipeline->stages) pipeline->stages->all_reduce(&norm_sq, &norm_sq, 1, DType::F64, comm::ReduceOp::Sum);
  } else {
    norm_sq = engine.grad_norm_squared();
  }
  u.grad_norm = std::sqrt(norm_sq) / loss_scale;
  u.skipped = scaler.update(!std::isfinite(u.grad_norm));
  const parallel::ScheduledHyper sched = scheduled_hyper(schedule, engine.optimizer_steps());
  u.lr = sched.lr;
  if (u.skipped) {
    engine.skip_step();  // with the delayed update: still publishes the previous update's weights
    return u;
  }
  // `loss_scale` is the one this step's gradients were made with (the scaler may have changed its
  // own since): a delayed update keeps this factor for when it runs.
  const double clip = grad_clip > 0 && u.grad_norm > grad_clip ? grad_clip / u.grad_norm : 1.0;
  engine.step(float(clip / loss_scale), sched);
  return u;
}

}  // namespace zp::runtime
