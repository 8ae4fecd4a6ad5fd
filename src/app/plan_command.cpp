#include "app/plan_command.h"

#include <cctype>
#include <cstdio>
#include <functional>
#include <utility>

#include "core/error.h"
#include "io/config.h"
#include "parallel/pipeline_schedule.h"
#include "runtime/diffusion_config.h"
#include "runtime/pipeline_chunks.h"
#include "runtime/run_plan.h"
#include "runtime/train_config.h"

namespace zp::app {

double parse_bytes(const std::string& text, const std::string& what) {
  size_t end = 0;
  double v = -1;
  try {
    v = std::stod(text, &end);
  } catch (...) {
  }
  std::string unit = text.substr(std::min(end, text.size()));
  while (!unit.empty() && std::isspace(static_cast<unsigned char>(unit.front()))) unit.erase(0, 1);
  for (char& c : unit) c = char(std::toupper(static_cast<unsigned char>(c)));
  const struct {
    const char* name;
    double scale;
  } units[] = {{"", 1},          {"B", 1},          {"KB", 1e3},       {"MB", 1e6},       {"GB", 1e9},
               {"TB", 1e12},     {"KIB", 1024.0},   {"MIB", 1048576.0}, {"GIB", 1073741824.0},
               {"TIB", 1099511627776.0}};
  for (const auto& u : units)
    if (unit == u.name && v >= 0 && end > 0) return v * u.scale;
  throw Error(detail::cat(what, " '", text, "': expected a size such as 24GiB, 64GB or 1TiB"));
}

namespace {

// A change that makes a run smaller; false when it does not apply to this config.
using Change = std::function<bool(runtime::TrainConfig&)>;

// More pipeline stages (issue 12): the next P' > P that divides the `world` and leaves every one of
// the P' x V model chunks at least one of the model's `units`. Each stage's data-parallel group
// shrinks to world / P', so the accumulation grows by P' / P to keep the global batch (a P' for which
// that is no integer is passed over); the schedule's rule then still holds (M >= P' for 1F1B and
// ZB-H1, M a multiple of P' interleaved). An explicit partition list cuts P stages: not changed.
bool more_pipeline_stages(runtime::TrainConfig& c, int world, int64_t units) {
  if (c.pipeline_partition == "layers") return false;
  const int64_t P = c.pipeline_stages;
  for (int64_t next = P + 1; next <= world && next * c.virtual_stages <= units; ++next) {
    if (world % next != 0 || (c.grad_accum * next) % P != 0) continue;
    c.pipeline_stages = next;
    c.grad_accum = c.grad_accum * next / P;
    parallel::check_schedule(parallel::schedule_kind_from(c.pipeline_schedule, "pipeline.schedule"),
                             {int(c.pipeline_stages), int(c.grad_accum), int(c.virtual_stages)});
    return true;
  }
  return false;
}

// Cheapest in speed first: recomputation (about a third more compute), ZeRO-2 (the communication of
// plain data parallelism), more pipeline stages (an idle bubble of (P - 1) / (M + P - 1) in theory, but
// only activations between neighbours), ZeRO-3 (every weight all-gathered twice per micro-batch: the
// traffic a pipeline avoids on PCIe), the offload tiers (PCIe and the CPU's step), then smaller
// micro-batches (the same global batch through more accumulation). `world` and the model's pipeline
// `units` bound the stages.
std::vector<Change> changes(int world, int64_t units) {
  return {
      [](runtime::TrainConfig& c) { return !std::exchange(c.activation_checkpointing, true); },
      [](runtime::TrainConfig& c) { return c.zero_stage < 2 && (c.zero_stage = 2) == 2; },
      [=](runtime::TrainConfig& c) { return more_pipeline_stages(c, world, units); },
      [](runtime::TrainConfig& c) { return c.zero_stage < 3 && (c.zero_stage = 3) == 3; },
      [](runtime::TrainConfig& c) {
        if (c.offload_optimizer != "none" || c.zero_stage < 1) return false;
        c.offload_optimizer = "cpu";
        return true;
      },
      [](runtime::TrainConfig& c) {
        if (c.offload_param != "none" || c.zero_stage < 3) return false;
        c.offload_param = "cpu";
        return true;
      },
      // Off NVMe, for a disk too small: the same state in host memory instead (faster, but it takes RAM).
      [](runtime::TrainConfig& c) {
        if (c.offload_param != "nvme") return false;
        c.offload_param = "cpu";
        return true;
      },
      [](runtime::TrainConfig& c) {
        if (c.offload_optimizer != "nvme") return false;
        c.offload_optimizer = "cpu";
        return true;
      },
      [](runtime::TrainConfig& c) {
        if (c.micro_batch % 2 != 0) return false;
        c.micro_batch /= 2;
        c.grad_accum *= 2;
        return true;
      },
  };
}

// The --set options that turn `from` into `to` (for the fields changes() touches).
std::string sets_between(const runtime::TrainConfig& from, const runtime::TrainConfig& to) {
  std::string out;
  auto add = [&](bool differ, const std::string& kv) {
    if (differ) out += " --set " + kv;
  };
  add(from.activation_checkpointing != to.activation_checkpointing, "model.activation_checkpointing=true");
  add(from.zero_stage != to.zero_stage, "zero_optimization.stage=" + std::to_string(to.zero_stage));
  add(from.pipeline_stages != to.pipeline_stages, "pipeline.stages=" + std::to_string(to.pipeline_stages));
  add(from.offload_optimizer != to.offload_optimizer, "zero_optimization.offload_optimizer.device=" + to.offload_optimizer);
  add(from.offload_param != to.offload_param, "zero_optimization.offload_param.device=" + to.offload_param);
  add(from.micro_batch != to.micro_batch, "train_micro_batch_size_per_gpu=" + std::to_string(to.micro_batch));
  add(from.grad_accum != to.grad_accum, "gradient_accumulation_steps=" + std::to_string(to.grad_accum));
  return out;
}

}  // namespace

int run_plan(const PlanOptions& o) {
  io::Config cfg = io::Config::from_file(runtime::train_schema_with_diffusion(), o.config, io::Config::OnProblem::Keep);
  for (const auto& s : o.sets) cfg.set(s);
  const bool unet = cfg.get<std::string>("model.type") == "unet";
  runtime::TrainConfig given = unet ? runtime::UNetTrainConfig::from(cfg).common : runtime::TrainConfig::from(cfg);
  ZP_REQUIRE(o.world >= 1, "--world ", o.world, ": must be at least 1");
  ZP_REQUIRE(o.world % given.pipeline_stages == 0, "pipeline.stages = ", given.pipeline_stages,
             " does not divide --world ", o.world);
  // A plan is for GPUs: "auto" precision plans bf16, as on Ampere and later.
  if (given.bf16_auto && !given.fp16) given.dtype = DType::BF16;
  given.bf16_auto = given.fp16_auto = false;
  const runtime::TrainConfig tc =
      given.resolve_for_place(o.world / int(given.pipeline_stages), o.world, Device::cpu());
  const int per_node = o.ranks_per_node > 0 ? o.ranks_per_node : o.world;
  ZP_REQUIRE(per_node <= o.world, "--ranks-per-node ", per_node, " exceeds --world ", o.world);
  runtime::NodeResources have;
  if (!o.gpu_memory.empty()) have.gpu_bytes = parse_bytes(o.gpu_memory, "--gpu-memory");
  if (!o.host_memory.empty()) have.host_bytes = parse_bytes(o.host_memory, "--host-memory");
  if (!o.nvme_free.empty()) have.nvme_bytes = parse_bytes(o.nvme_free, "--nvme-free");

  // With pipeline.stages P > 1, stage by stage; the verdict is the worst stage's and the fullest node's.
  const runtime::PipelinePlan plan = runtime::plan_pipeline(tc, unet, o.world, per_node);
  std::printf("%s", runtime::plan_report(plan, have).c_str());
  const std::vector<runtime::Misfit> bad = runtime::misfits(plan, have);
  if (have.gpu_bytes < 0 && have.host_bytes < 0 && have.nvme_bytes < 0) {
    std::printf("give --gpu-memory and --host-memory (and --nvme-free with NVMe offload) to check whether it fits\n");
    return 0;
  }
  if (bad.empty()) {
    std::printf("fits\n");
    return 0;
  }
  for (const auto& m : bad)
    std::printf("does not fit: %s needs %s, %s available\n", m.tier.c_str(), runtime::format_bytes(m.need).c_str(),
                runtime::format_bytes(m.have).c_str());
  // The cheapest change: one change alone if one suffices, else the changes in order, cumulatively,
  // until it fits; then each one the fit no longer needs (a costlier one after it did the work) is
  // dropped again, the costliest first.
  auto fits_with = [&](const runtime::TrainConfig& c) {
    return runtime::misfits(runtime::plan_pipeline(c, unet, o.world, per_node), have).empty();
  };
  const std::vector<Change> candidates = changes(o.world, runtime::pipeline_units(tc, unet));
  for (const Change& change : candidates) {
    runtime::TrainConfig c = tc;
    if (change(c) && fits_with(c)) {
      std::printf("cheapest change that fits:%s\n", sets_between(tc, c).c_str());
      return 1;
    }
  }
  // `steps` (indices into candidates) applied to tc in order; false when one no longer applies.
  auto replay = [&](const std::vector<size_t>& steps, runtime::TrainConfig& c) {
    c = tc;
    for (size_t i : steps)
      if (!candidates[i](c)) return false;
    return true;
  };
  std::vector<size_t> steps;
  runtime::TrainConfig c = tc;
  bool fits = false;
  for (bool changed = true; changed && !fits;) {
    changed = false;
    for (size_t i = 0; i < candidates.size() && !fits; ++i) {
      if (!candidates[i](c)) continue;
      changed = true;
      steps.push_back(i);
      fits = fits_with(c);
    }
  }
  if (fits) {
    for (size_t k = steps.size(); k-- > 0;) {
      std::vector<size_t> without = steps;
      without.erase(without.begin() + long(k));
      runtime::TrainConfig d;
      if (replay(without, d) && fits_with(d)) steps = std::move(without);
    }
    replay(steps, c);
    std::printf("cheapest changes that fit, together:%s\n", sets_between(tc, c).c_str());
    return 1;
  }
  std::printf("no change of checkpointing, ZeRO stage, pipeline stages, offload or micro-batch fits it: more GPUs "
              "(--world), more "
              "host memory per node%s are needed\n",
              plan.nvme_bytes_per_node() > 0 ? ", or a larger disk under nvme_path (or fewer ranks per node: "
              "--ranks-per-node)" : "");
  return 1;
}

}  // namespace zp::app
