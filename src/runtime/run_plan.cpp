#include "runtime/run_plan.h"

#include <cstdio>
#include <filesystem>
#include <optional>

#include "core/host_memory.h"
#include "core/log.h"
#include "io/latent_dataset.h"
#include "models/activation_estimate.h"
#include "models/transformer.h"
#include "models/unet.h"
#include "parallel/zero_engine.h"
#include "runtime/lora_run.h"
#include "runtime/optimizer_step.h"

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

RunPlan plan_config(const TrainConfig& cfg, bool unet, int world, int ranks_per_node) {
  parallel::ShardingPolicy policy = sharding_policy(cfg);
  std::string source;
  const io::json hub = cfg.hub_config_json(source);
  const int64_t pad = parallel::shard_pad_multiple(world);
  const models::LoraSpec lora = lora_spec_of(cfg);
  char params[64];
  if (unet) {
    const models::UNetConfig mc = models::UNetConfig::from_hub_json(hub, source);
    models::UNet m(mc, Device::cpu(), cfg.dtype, nullptr, pad, /*allocate=*/false, lora);
    // The latent size: the data's when the file is there, else the config's sample_size.
    int64_t H = hub.value("sample_size", int64_t(64)), W = H, L = 77;
    std::error_code ec;
    if (!cfg.train_files.empty() && std::filesystem::exists(cfg.train_files[0], ec)) {
      io::LatentDataset ds(cfg.train_files[0]);
      H = ds.height();
      W = ds.width();
      L = ds.text_len();
    }
    std::snprintf(params, sizeof params, "UNet, %.2fB parameters, %lldx%lld latents", double(m.num_parameters()) / 1e9,
                  (long long)H, (long long)W);
    const double act =
        models::unet_activation_bytes(m, cfg.micro_batch, H, W, L, cfg.dtype, cfg.activation_checkpointing);
    return plan_run(m.blocks(), policy, cfg, world, ranks_per_node, act, true, params + lora_summary(lora, m.blocks()));
  }
  const models::TransformerConfig mc = models::TransformerConfig::from_hub_json(hub, source);
  models::Transformer m(mc, Device::cpu(), cfg.dtype, nullptr, pad, /*allocate=*/false, {}, lora);
  std::snprintf(params, sizeof params, "%s, %.2fB parameters", mc.model_type.c_str(), double(mc.num_parameters()) / 1e9);
  const double act = models::transformer_activation_bytes(mc, cfg.micro_batch, cfg.seq_len, cfg.dtype,
                                                          cfg.activation_checkpointing);
  return plan_run(m.blocks(), policy, cfg, world, ranks_per_node, act, true, params + lora_summary(lora, m.blocks()));
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
