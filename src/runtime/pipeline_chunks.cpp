#include "runtime/pipeline_chunks.h"

#include <functional>
#include <string>

#include "models/unet_flops.h"
#include "parallel/pipeline_partition.h"
#include "parallel/pipeline_schedule.h"
#include "runtime/lora_run.h"

namespace zp::runtime {

namespace {

// The P x V cut of `units` by pipeline.partition; `costs` is asked only for "parameters" and
// "compute". `unit` names the units in the partition's messages.
std::vector<int64_t> chunk_bounds(const TrainConfig& cfg, int64_t units, int stages, const std::string& unit,
                                  const std::function<parallel::LayerCosts()>& costs) {
  const int chunks = stages * int(cfg.virtual_stages);
  if (chunks == 1) return {0, units};
  if (cfg.pipeline_partition == "layers") return parallel::explicit_partition(cfg.partition_layers, units, chunks, unit);
  if (cfg.pipeline_partition == "uniform") return parallel::uniform_partition(units, chunks, unit);
  return parallel::balanced_partition(costs(), chunks, unit);
}

// Global chunks stage, stage + P, ...: the indices into `bounds` of this stage's chunks.
std::vector<int> local_chunks(const TrainConfig& cfg, int stage, int stages) {
  std::vector<int> g;
  for (int v = 0; v < int(cfg.virtual_stages); ++v) g.push_back(v * stages + stage);
  return g;
}

}  // namespace

LmChunks lm_chunks(const TrainConfig& cfg, const models::TransformerConfig& m, int stage, int stages) {
  LmChunks c;
  c.bounds = chunk_bounds(cfg, m.layers, stages, "layer", [&] {
    // Every layer is alike; the first chunk carries the embedding, the last the final norm and the
    // head (a tied head's replica of the embedding counts there too: it is memory).
    const double C = double(m.hidden), vocab_rows = double(m.vocab) * C;
    const double layer_params = double(m.num_parameters() - m.vocab * m.hidden -
                                       (m.learned_positions ? m.max_positions * m.hidden : 0) -
                                       (m.tied ? 0 : m.vocab * m.hidden)) /
                                double(m.layers);  // the final norm's few weights ride along
    if (cfg.pipeline_partition == "parameters")
      return parallel::LayerCosts{std::vector<double>(size_t(m.layers), layer_params),
                                  vocab_rows + (m.learned_positions ? double(m.max_positions) * C : 0.0), vocab_rows};
    // "compute": FLOPs per token (a LoRA run's too); the lookup costs nothing, the head its GEMM
    const models::LmTrainFlops flops = models::lm_train_flops_per_token(m, lora_spec_of(cfg), cfg.seq_len);
    return parallel::LayerCosts{std::vector<double>(size_t(m.layers), flops.layer), 0.0, flops.head};
  });
  const int last = int(c.bounds.size()) - 2;
  for (int g : local_chunks(cfg, stage, stages))
    c.local.push_back({c.bounds[size_t(g)], c.bounds[size_t(g) + 1], g == 0, g == last});
  return c;
}

UNetChunks unet_chunks(const TrainConfig& cfg, models::UNet& whole, int64_t H, int64_t W, int64_t L, int stage,
                       int stages) {
  const models::UNetConfig& m = whole.config();
  const int64_t units = m.num_units();
  UNetChunks c;
  c.bounds = chunk_bounds(cfg, units, stages, "UNet block", [&] {
    parallel::LayerCosts costs;
    costs.layers.assign(size_t(units), 0.0);
    for (nn::ParamBlock* b : whole.blocks()) {
      const std::vector<nn::Parameter*> params = nn::parameters_of({b});
      double cost = 0;
      if (cfg.pipeline_partition == "parameters")
        for (nn::Parameter* p : params) cost += double(p->numel());
      else
        cost = models::unet_train_flops_per_sample(m, params, H, W, L);
      const int64_t u = m.unit_of_block(b->name());
      (u < 0 ? costs.first_extra : u == units ? costs.last_extra : costs.layers[size_t(u)]) += cost;
    }
    return costs;
  });
  for (int g : local_chunks(cfg, stage, stages)) c.local.push_back({c.bounds[size_t(g)], c.bounds[size_t(g) + 1]});
  return c;
}

int64_t pipeline_units(const TrainConfig& cfg, bool unet) {
  std::string source;
  const io::json hub = cfg.hub_config_json(source);
  return unet ? models::UNetConfig::from_hub_json(hub, source).num_units()
              : models::TransformerConfig::from_hub_json(hub, source).layers;
}

double stage_activation_bytes(const TrainConfig& cfg, int stage, int stages, const std::vector<double>& chunk_bytes) {
  if (stages == 1) return chunk_bytes.at(0);
  const parallel::PipelineScheduleKind kind = parallel::schedule_kind_from(cfg.pipeline_schedule, "pipeline.schedule");
  const parallel::PipelineShape shape{stages, int(cfg.grad_accum), int(cfg.virtual_stages)};
  parallel::check_schedule(kind, shape);
  return parallel::peak_in_flight_bytes(parallel::stage_schedule(kind, shape, stage), chunk_bytes);
}

}  // namespace zp::runtime
