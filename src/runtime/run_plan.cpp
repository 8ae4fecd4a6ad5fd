#include "runtime/run_plan.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <memory>
#include <filesystem>
#include <optional>

#include "core/host_memory.h"
#include "core/log.h"
#include "io/latent_dataset.h"
#include "models/activation_estimate.h"
#include "models/transformer.h"
#include "models/unet.h"
#include "parallel/pipeline_partition.h"
#include "parallel/zero_engine.h"
#include "runtime/lora_run.h"
#include "runtime/optimizer_step.h"
#include "runtime/pipeline_chunks.h"

namespace zp::runtime {

std::string format_bytes(double bytes) {
  char buf[64];
  const double gib = double(int64_t(1) << 30), mib = double(1 << 20);
  if (bytes >= gib) std::snprintf(buf, sizeof buf, "%.1f GiB", bytes / gib);
  else if (bytes == 0) std::snprintf(buf, sizeof buf, "0");
  else std::snprintf(buf, sizeof buf, "%.0f MiB", bytes / mib);
  return buf;
}

double RunPlan::gpu_bytes() const {
  return gpu ? states.device_bytes() + activation_bytes + kRuntimeAllowanceBytes : 0;
}

double RunPlan::pinned_host_bytes() const { return states.host_pinned ? states.host_bytes() : 0; }

double RunPlan::pageable_host_bytes() const {
  // On CPUs the "device" is host memory too.
  return (states.host_pinned ? 0 : states.host_bytes()) + (gpu ? 0 : states.device_bytes() + activation_bytes);
}

RunPlan plan_run(std::span<nn::ParamBlock* const> blocks, const parallel::ShardingPolicy& policy,
                 const TrainConfig& cfg, int world, int ranks_per_node, double activation_bytes, bool gpu,
                 std::string model) {
  RunPlan p;
  p.model = std::move(model);
  p.states = parallel::plan_memory(blocks, policy, world, cfg.step_in_backward, gpu);
  p.trained_params = trained_parameters({blocks.begin(), blocks.end()});
  p.activation_bytes = activation_bytes;
  p.ranks_per_node = ranks_per_node;
  p.gpu = gpu;
  return p;
}

namespace {

// The parameters of `blocks`, unpadded.
int64_t parameters_in(const std::vector<nn::ParamBlock*>& blocks) {
  int64_t n = 0;
  for (const nn::Parameter* p : nn::parameters_of(blocks)) n += p->numel();
  return n;
}

std::string span_str(const std::string& unit, int64_t begin, int64_t end) {
  return detail::cat(unit, " [", begin, ", ", end, ")");
}

}  // namespace

PipelinePlan plan_pipeline(const TrainConfig& cfg, bool unet, int world, int ranks_per_node) {
  const int P = int(cfg.pipeline_stages);
  ZP_REQUIRE(P >= 1 && world % P == 0, "pipeline.stages = ", P, " does not divide the world size ", world);
  PipelinePlan out;
  out.data_size = world / P;
  out.ranks_per_node = ranks_per_node;
  out.micro_batches = cfg.grad_accum;
  const parallel::ShardingPolicy policy = sharding_policy(cfg);
  std::string source;
  const io::json hub = cfg.hub_config_json(source);
  // Each stage's blocks are sharded over its data-parallel group, padded as the engine pads them.
  const int64_t pad = parallel::shard_pad_multiple(out.data_size);
  const models::LoraSpec lora = lora_spec_of(cfg);
  std::string partition;
  std::vector<int64_t> bounds;  // of the P x V chunks, the same on every stage
  // A stage of `chunks` (runtime/pipeline_chunks.h) planned as the trainer plans it: each local chunk
  // laid out by make_chunk(span) (no memory), the blocks of them all, each one's activations per
  // micro-batch (bytes_of(chunk, span)), and what the stage holds (holds_of(span)); `unit` names the
  // partition's units.
  auto add_stage = [&](int stage, const auto& chunks, const std::string& unit, auto make_chunk, auto bytes_of,
                       auto holds_of) {
    partition = parallel::partition_str(chunks.bounds, unit);
    bounds = chunks.bounds;
    std::vector<decltype(make_chunk(chunks.local.front()))> parts;
    std::vector<nn::ParamBlock*> blocks;
    std::vector<double> chunk_bytes;
    StagePlan sp;
    for (const auto& span : chunks.local) {
      parts.push_back(make_chunk(span));
      for (nn::ParamBlock* b : parts.back()->blocks()) blocks.push_back(b);
      chunk_bytes.push_back(bytes_of(*parts.back(), span));
      sp.holds += (sp.holds.empty() ? "" : ", ") + holds_of(span);
    }
    sp.params = parameters_in(blocks);
    sp.plan = plan_run(blocks, policy, cfg, out.data_size, ranks_per_node,
                       stage_activation_bytes(cfg, stage, P, chunk_bytes), true, out.model);
    out.stages.push_back(std::move(sp));
  };
  char params[96];
  if (unet) {
    const models::UNetConfig mc = models::UNetConfig::from_hub_json(hub, source);
    models::UNet whole(mc, Device::cpu(), cfg.dtype, nullptr, pad, /*allocate=*/false, lora);
    // The latent size: the data's when the file is there, else the config's sample_size.
    int64_t H = hub.value("sample_size", int64_t(64)), W = H, L = 77;
    std::error_code ec;
    if (!cfg.train_files.empty() && std::filesystem::exists(cfg.train_files[0], ec)) {
      io::LatentDataset ds(cfg.train_files[0]);
      H = ds.height();
      W = ds.width();
      L = ds.text_len();
    }
    std::snprintf(params, sizeof params, "UNet, %.2fB parameters, %lldx%lld latents",
                  double(whole.num_parameters()) / 1e9, (long long)H, (long long)W);
    out.model = params + lora_summary(lora, whole.blocks());
    for (int stage = 0; stage < P; ++stage)
      add_stage(
          stage, unet_chunks(cfg, whole, H, W, L, stage, P), "UNet block",
          [&](const models::UNetSpan& span) {
            return std::make_unique<models::UNet>(mc, Device::cpu(), cfg.dtype, nullptr, pad, /*allocate=*/false, lora,
                                                  span);
          },
          [&](models::UNet& chunk, const models::UNetSpan&) {
            return models::unet_activation_bytes(chunk, cfg.micro_batch, H, W, L, cfg.dtype,
                                                 cfg.activation_checkpointing);
          },
          [&](const models::UNetSpan& span) {
            return span_str("UNet blocks", span.begin, span.end) + (span.begin == 0 ? " + stem" : "") +
                   (span.end == mc.num_units() ? " + head" : "");
          });
    for (size_t g = 1; g + 1 < bounds.size(); ++g)
      out.cut_bytes.push_back(double(mc.boundary_numel(bounds[g], cfg.micro_batch, H, W)) *
                              double(dtype_size(cfg.dtype)));
  } else {
    const models::TransformerConfig mc = models::TransformerConfig::from_hub_json(hub, source);
    models::Transformer whole(mc, Device::cpu(), cfg.dtype, nullptr, pad, /*allocate=*/false, {}, lora);
    std::snprintf(params, sizeof params, "%s, %.2fB parameters", mc.model_type.c_str(),
                  double(mc.num_parameters()) / 1e9);
    out.model = params + lora_summary(lora, whole.blocks());
    for (int stage = 0; stage < P; ++stage)
      add_stage(
          stage, lm_chunks(cfg, mc, stage, P), "layer",
          [&](const models::LayerSpan& span) {
            return std::make_unique<models::Transformer>(mc, Device::cpu(), cfg.dtype, nullptr, pad,
                                                         /*allocate=*/false, span, lora);
          },
          [&](models::Transformer&, const models::LayerSpan& span) {
            return models::transformer_activation_bytes(mc, cfg.micro_batch, cfg.seq_len, cfg.dtype,
                                                        cfg.activation_checkpointing, span);
          },
          [&](const models::LayerSpan& span) {
            return span_str("layers", span.begin, span.end) + (span.embedding ? " + embedding" : "") +
                   (span.head ? " + head" : "");
          });
    for (size_t g = 1; g + 1 < bounds.size(); ++g)
      out.cut_bytes.push_back(double(cfg.micro_batch * cfg.seq_len * mc.hidden) * double(dtype_size(cfg.dtype)));
  }
  if (P > 1)
    out.layout = detail::cat(P, " stages (", cfg.pipeline_schedule, ", M = ", cfg.grad_accum, " micro-batches; ",
                             partition, "), ", out.data_size, " data-parallel rank", out.data_size == 1 ? "" : "s",
                             " each");
  return out;
}

RunPlan plan_config(const TrainConfig& cfg, bool unet, int world, int ranks_per_node) {
  TrainConfig whole = cfg;  // the whole model on every rank
  whole.pipeline_stages = whole.virtual_stages = 1;
  return plan_pipeline(whole, unet, world, ranks_per_node).stages[0].plan;
}

size_t PipelinePlan::worst_stage() const {
  size_t worst = 0;
  auto need = [&](size_t s) {
    const RunPlan& p = stages[s].plan;
    return p.gpu ? p.gpu_bytes() : p.host_bytes();
  };
  for (size_t s = 1; s < stages.size(); ++s)
    if (need(s) > need(worst)) worst = s;
  return worst;
}

namespace {

// The most `per_rank` bytes that one node's ranks hold together: rank r is in stage r / data_size.
double fullest_node(const PipelinePlan& p, const std::function<double(const RunPlan&)>& per_rank) {
  const int world = int(p.stages.size()) * p.data_size, n = std::max(1, p.ranks_per_node);
  double fullest = 0;
  for (int first = 0; first < world; first += n) {
    double node = 0;
    for (int r = first; r < std::min(world, first + n); ++r) node += per_rank(p.stages[size_t(r / p.data_size)].plan);
    fullest = std::max(fullest, node);
  }
  return fullest;
}

}  // namespace

double PipelinePlan::host_bytes_per_node() const {
  return fullest_node(*this, [](const RunPlan& p) { return p.host_bytes(); });
}

double PipelinePlan::nvme_bytes_per_node() const {
  return fullest_node(*this, [](const RunPlan& p) { return p.states.nvme_bytes(); });
}

std::vector<Misfit> misfits(const RunPlan& p, const NodeResources& have, bool states_only) {
  std::vector<Misfit> out;
  if (p.gpu && have.gpu_bytes >= 0) {
    const double need = states_only ? p.states.device_bytes() : p.gpu_bytes();
    if (need > have.gpu_bytes) out.push_back({"GPU memory per rank", need, have.gpu_bytes});
  }
  // On CPUs the activations are host memory, and as uncertain there.
  const double host = p.host_bytes_per_node() - (states_only && !p.gpu ? p.activation_bytes * p.ranks_per_node : 0.0);
  if (have.host_bytes >= 0 && host > have.host_bytes)
    out.push_back({"host memory per node (" + std::to_string(p.ranks_per_node) + " ranks)", host, have.host_bytes});
  if (have.nvme_bytes >= 0 && p.nvme_bytes_per_node() > have.nvme_bytes)
    out.push_back({"NVMe per node (" + std::to_string(p.ranks_per_node) + " ranks' swap files)",
                   p.nvme_bytes_per_node(), have.nvme_bytes});
  return out;
}

std::string plan_report(const RunPlan& p, const NodeResources& have) {
  const parallel::MemoryPlan& s = p.states;
  std::string r = "model: " + p.model + "\n" + s.str() + "\n";
  auto line = [&](const std::string& what, double rank, double node, double avail, const std::string& note) {
    char buf[256];
    std::snprintf(buf, sizeof buf, "  %-14s %10s per rank", what.c_str(), format_bytes(rank).c_str());
    r += buf;
    if (avail >= 0) r += std::string(" (of ") + format_bytes(avail) + (rank <= avail ? ")" : ": DOES NOT FIT)");
    r += ", " + format_bytes(node) + " per node" + note + "\n";
  };
  const int n = p.ranks_per_node;
  if (p.gpu) {
    line("GPU", p.gpu_bytes(), p.gpu_bytes() * n, have.gpu_bytes, "");
    char buf[256];
    std::snprintf(buf, sizeof buf, "    model states %s (exact) + activations %s (estimate, one micro-batch) + runtime %s "
                  "(allowance)\n", format_bytes(s.device_bytes()).c_str(), format_bytes(p.activation_bytes).c_str(),
                  format_bytes(kRuntimeAllowanceBytes).c_str());
    r += buf;
  }
  const double host_avail = have.host_bytes;
  char buf[256];
  std::snprintf(buf, sizeof buf, "  %-14s %10s per rank, %s per node\n", "pinned host",
                format_bytes(p.pinned_host_bytes()).c_str(), format_bytes(p.pinned_host_bytes() * n).c_str());
  r += buf;
  std::snprintf(buf, sizeof buf, "  %-14s %10s per rank, %s per node\n", "pageable host",
                format_bytes(p.pageable_host_bytes()).c_str(), format_bytes(p.pageable_host_bytes() * n).c_str());
  r += buf;
  std::snprintf(buf, sizeof buf, "  %-14s %10s per node (%d rank%s)", "host total", format_bytes(p.host_bytes_per_node()).c_str(),
                n, n == 1 ? "" : "s");
  r += buf;
  if (host_avail >= 0)
    r += std::string(" of ") + format_bytes(host_avail) + (p.host_bytes_per_node() <= host_avail ? "" : ": DOES NOT FIT");
  r += "\n";
  if (s.nvme_bytes() > 0) {
    std::snprintf(buf, sizeof buf, "  %-14s %10s per rank, %s per node", "NVMe", format_bytes(s.nvme_bytes()).c_str(),
                  format_bytes(p.nvme_bytes_per_node()).c_str());
    r += buf;
    if (have.nvme_bytes >= 0)
      r += std::string(" of ") + format_bytes(have.nvme_bytes) +
           (p.nvme_bytes_per_node() <= have.nvme_bytes ? " free" : " free: DOES NOT FIT");
    r += " (checked against the free space at start)\n";
    auto under = [&](const char* what, double bytes, const std::string& path) {
      if (bytes <= 0) return;
      std::snprintf(buf, sizeof buf, "    %s %s per rank under ", what, format_bytes(bytes).c_str());
      r += buf + path + "\n";
    };
    under("optimizer state", s.nvme_optimizer_bytes, s.nvme_path);
    under("parameter shards", s.nvme_param_bytes, s.nvme_param_path);
  }
  return r;
}

std::vector<Misfit> misfits(const PipelinePlan& p, const NodeResources& have) {
  if (p.stages.size() == 1) return misfits(p.stages[0].plan, have);
  std::vector<Misfit> out;
  const size_t worst = p.worst_stage();
  const RunPlan& w = p.stages[worst].plan;
  if (w.gpu && have.gpu_bytes >= 0 && w.gpu_bytes() > have.gpu_bytes)
    out.push_back({detail::cat("GPU memory per rank (stage ", worst, ")"), w.gpu_bytes(), have.gpu_bytes});
  const std::string ranks = detail::cat(" (", p.ranks_per_node, " ranks");
  if (have.host_bytes >= 0 && p.host_bytes_per_node() > have.host_bytes)
    out.push_back({"host memory per node" + ranks + ")", p.host_bytes_per_node(), have.host_bytes});
  if (have.nvme_bytes >= 0 && p.nvme_bytes_per_node() > have.nvme_bytes)
    out.push_back({"NVMe per node" + ranks + "' swap files)", p.nvme_bytes_per_node(), have.nvme_bytes});
  return out;
}

std::string plan_report(const PipelinePlan& p, const NodeResources& have) {
  if (p.stages.size() == 1) return plan_report(p.stages[0].plan, have);
  std::string r = "model: " + p.model + "\npipeline: " + p.layout + "\n";
  char buf[512];
  std::snprintf(buf, sizeof buf, "  %-5s %-36s %9s %9s %10s %11s %10s %10s %9s\n", "stage", "holds", "params",
                "trained", "GPU states", "activations", "GPU total", "host", "NVMe");
  r += buf;
  for (size_t k = 0; k < p.stages.size(); ++k) {
    const StagePlan& st = p.stages[k];
    std::snprintf(buf, sizeof buf, "  %-5zu %-36s %8.1fM %8.1fM %10s %11s %10s %10s %9s\n", k, st.holds.c_str(),
                  double(st.params) / 1e6, double(st.plan.trained_params) / 1e6,
                  format_bytes(st.plan.states.device_bytes()).c_str(), format_bytes(st.plan.activation_bytes).c_str(),
                  format_bytes(st.plan.gpu_bytes()).c_str(),
                  format_bytes(st.plan.host_bytes()).c_str(),
                  format_bytes(st.plan.states.nvme_bytes()).c_str());
    r += buf;
  }
  if (!p.cut_bytes.empty()) {
    std::string cuts;
    double step = 0;
    for (double b : p.cut_bytes) {
      cuts += (cuts.empty() ? "" : " | ") + format_bytes(b);
      step += 2 * double(p.micro_batches) * b;
    }
    r += detail::cat("  across cuts    ", cuts, " per micro-batch (activations; their gradients the same back), ",
                     format_bytes(step), " a step per pipeline\n");
  }
  const size_t worst = p.worst_stage();
  const RunPlan& w = p.stages[worst].plan;
  r += detail::cat("worst stage ", worst, ": ", w.states.str(), "\n");
  if (w.gpu) {
    std::snprintf(buf, sizeof buf, "  %-14s %10s per rank", "GPU", format_bytes(w.gpu_bytes()).c_str());
    r += buf;
    if (have.gpu_bytes >= 0)
      r += " (of " + format_bytes(have.gpu_bytes) + (w.gpu_bytes() <= have.gpu_bytes ? ")" : ": DOES NOT FIT)");
    std::snprintf(buf, sizeof buf, ", stage %zu\n    model states %s (exact) + activations %s (estimate, the "
                  "micro-batches its schedule keeps in flight) + runtime %s (allowance)\n", worst,
                  format_bytes(w.states.device_bytes()).c_str(), format_bytes(w.activation_bytes).c_str(),
                  format_bytes(kRuntimeAllowanceBytes).c_str());
    r += buf;
  }
  const std::string ranks = detail::cat(p.ranks_per_node, " rank", p.ranks_per_node == 1 ? "" : "s");
  std::snprintf(buf, sizeof buf, "  %-14s %10s per node (%s, the fullest node)", "host total",
                format_bytes(p.host_bytes_per_node()).c_str(), ranks.c_str());
  r += buf;
  if (have.host_bytes >= 0)
    r += " of " + format_bytes(have.host_bytes) + (p.host_bytes_per_node() <= have.host_bytes ? "" : ": DOES NOT FIT");
  r += "\n";
  if (p.nvme_bytes_per_node() > 0) {
    std::snprintf(buf, sizeof buf, "  %-14s %10s per node (%s)", "NVMe", format_bytes(p.nvme_bytes_per_node()).c_str(),
                  ranks.c_str());
    r += buf;
    if (have.nvme_bytes >= 0)
      r += " of " + format_bytes(have.nvme_bytes) +
           (p.nvme_bytes_per_node() <= have.nvme_bytes ? " free" : " free: DOES NOT FIT");
    r += " (checked against the free space at start)\n";
  }
  return r;
}

std::string check_fit_at_start(const RunPlan& plan, Device dev, MPI_Comm comm) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  NodeResources have;
  if (dev.is_cuda()) {
    size_t free = 0, total = 0;
    cuda_memory_info(dev.index, free, total);
    have.gpu_bytes = double(free);
  }
  const HostMemory host = available_host_memory();
  if (host.available >= 0) have.host_bytes = double(host.available);
  std::string mine;
  for (const Misfit& m : misfits(plan, have, /*states_only=*/true))
    mine += (mine.empty() ? "" : "; ") + m.tier + " needs " + format_bytes(m.need) + " (model states and buffers, "
            "counted exactly), " + format_bytes(m.have) + " " + (m.tier.starts_with("GPU") ? "free on " + dev.str()
            : "available (" + host.source + ")");
  // The first failing rank's reason goes to every rank, so all stop with one message.
  struct {
    int ok, rank;
  } in{mine.empty() ? 1 : 0, rank}, out{};
  MPI_Allreduce(&in, &out, 1, MPI_2INT, MPI_MINLOC, comm);
  if (!out.ok) {
    int len = int(mine.size());
    MPI_Bcast(&len, 1, MPI_INT, out.rank, comm);
    std::string why(size_t(len), '\0');
    if (rank == out.rank) why = mine;
    MPI_Bcast(why.data(), len, MPI_CHAR, out.rank, comm);
    throw Error(detail::cat("the run does not fit on rank ", out.rank, ": ", why,
                            ". Nothing was allocated; `zeropipe plan --config ... --world N --gpu-memory ... "
                            "--host-memory ...` shows the plan and the cheapest change that fits"));
  }
  std::string line = std::string("fit check: ") + (plan.gpu ? "GPU " : "CPU training, in host memory: ") +
                     format_bytes(plan.states.device_bytes()) + " of model states + ~" +
                     format_bytes(plan.activation_bytes) + " of activations (estimate)";
  if (have.gpu_bytes >= 0) line += " of " + format_bytes(have.gpu_bytes) + " free";
  line += "; host " + format_bytes(plan.host_bytes_per_node()) + " per node";
  if (have.host_bytes >= 0) line += " of " + format_bytes(have.host_bytes) + " available (" + host.source + ")";
  if (rank == 0 && !misfits(plan, have).empty())
    ZP_LOG_WARN("the activation estimate (", format_bytes(plan.activation_bytes), ") and a ",
                format_bytes(kRuntimeAllowanceBytes), " allowance for the runtime exceed the GPU memory left after the "
                "model states: the run may run out of memory (model.activation_checkpointing or a smaller micro-batch "
                "would help)");
  return line;
}

}  // namespace zp::runtime
