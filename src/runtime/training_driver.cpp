#include "runtime/training_driver.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <algorithm>
#include <string>
#include <vector>

#include "core/cpu_share.h"
#include "core/log.h"
#include "core/numa_node.h"
#include "core/progress_meter.h"
#include "io/bounded_json.h"
#include "nn/trained_blocks.h"
#include "parallel/pipeline_schedule.h"
#include "parallel/zero_engine.h"
#include "runtime/loop_checkpoints.h"
#include "runtime/loss_scaler.h"
#include "runtime/lr_schedule.h"
#include "runtime/offload_storage.h"
#include "runtime/optimizer_step.h"
#include "runtime/run_plan.h"
#include "runtime/step_loop.h"
#include "runtime/step_report.h"

namespace zp::runtime {

namespace {

// "0:cuda:0@node1 1:cuda:1@node1 ...": where every rank of `comm` runs (collective; the string is
// rank 0's to print), so a user sees at start that ranks and GPUs pair as intended.
std::string rank_device_map(MPI_Comm comm, Device dev) {
  constexpr int kLen = 96;
  char mine[kLen] = {0}, host[64] = {0};
  ::gethostname(host, sizeof(host) - 1);
  std::snprintf(mine, kLen, "%s@%s", dev.str().c_str(), host);
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  std::vector<char> all(size_t(size) * kLen);
  MPI_Gather(mine, kLen, MPI_CHAR, all.data(), kLen, MPI_CHAR, 0, comm);
  std::string out;
  for (int r = 0; rank == 0 && r < size; ++r) {
    if (r) out += ' ';
    out.append(std::to_string(r)).append(":").append(&all[size_t(r) * kLen]);
  }
  return out;
}

// Every stage's master weights (`mine`: this stage's blocks in order, as ZeroEngine::gather_master
// gives them) in the whole model's order, on every rank (tests; small models only): blocks sorted by
// their position in the model, a replica left out.
std::vector<float> gather_stages(const std::vector<float>& mine, const TrainingPlace& at,
                                 const nn::ParamBlock* replica, const std::vector<nn::ParamBlock*>& blocks,
                                 PipelineStageModel& stage) {
  std::vector<double> keyed;  // per block: key, size, values...
  size_t at_elem = 0;
  for (const nn::ParamBlock* b : nn::trained_blocks(blocks)) {  // gather_master covers those
    int64_t n = 0;
    for (const auto& p : b->params()) n += p->numel();
    if (b != replica) {
      keyed.push_back(double(stage.model_position(*b)));
      keyed.push_back(double(n));
      keyed.insert(keyed.end(), mine.begin() + long(at_elem), mine.begin() + long(at_elem + size_t(n)));
    }
    at_elem += size_t(n);
  }
  const MPI_Comm stages = at.topology->mpi_comm(comm::Group::Pipeline);
  int count = int(keyed.size());
  std::vector<int> counts(size_t(at.stages())), displs(size_t(at.stages()), 0);
  ZP_MPI_CHECK(MPI_Allgather(&count, 1, MPI_INT, counts.data(), 1, MPI_INT, stages));
  for (size_t r = 1; r < counts.size(); ++r) displs[r] = displs[r - 1] + counts[r - 1];
  std::vector<double> all(size_t(displs.back() + counts.back()));
  ZP_MPI_CHECK(MPI_Allgatherv(keyed.data(), count, MPI_DOUBLE, all.data(), counts.data(), displs.data(), MPI_DOUBLE,
                              stages));
  std::vector<std::pair<double, std::pair<size_t, size_t>>> pieces;  // key, (offset, size)
  for (size_t i = 0; i < all.size();) {
    const size_t n = size_t(all[i + 1]);
    pieces.push_back({all[i], {i + 2, n}});
    i += 2 + n;
  }
  std::sort(pieces.begin(), pieces.end());
  std::vector<float> out;
  for (const auto& [key, piece] : pieces)
    for (size_t k = 0; k < piece.second; ++k) out.push_back(float(all[piece.first + k]));
  return out;
}

}  // namespace

TrainResult run_training(const TrainConfig& given, comm::Runtime& rt, MPI_Comm group, bool return_params,
                         const TrainingTaskFactory& make_task) {
  const auto run_start = std::chrono::steady_clock::now();  // for the final summary's wall time
  TrainingPlace at = place_training(given, rt, group);
  const TrainConfig cfg = given.resolve_for_place(at.data_size(), at.world(), at.dev);
  at.global_batch = cfg.train_batch_size;
  // The task reads its data and model config first: a bad file is reported before any communicator
  // or model memory exists.
  const std::unique_ptr<TrainingTask> task = make_task(cfg, at);
  PipelineStageModel* stage_model = at.stages() > 1 ? task->pipeline_stage() : nullptr;
  ZP_REQUIRE(at.stages() == 1 || stage_model, "pipeline.stages = ", at.stages(), ": the ",
             task->checkpoint_model().model_family, " family cannot run in pipeline stages yet");
  const TrainingComms comms = make_training_comms(at);
  const StreamHandle s = at.s();

  // The ZeRO engine (optimizer state, gradient reduction, stage-3 gathering) allocates each block of
  // the laid-out model and has the task fill it, one at a time.
  std::vector<nn::ParamBlock*> blocks = task->lay_out_model(parallel::shard_pad_multiple(at.data_size()));
  parallel::ShardingPolicy policy = sharding_policy(cfg);
  if (at.dev.is_cpu()) policy.set_pin_host_memory(false);  // pinning serves copies to and from a GPU
  // The node's ranks share its cores for their CPU optimizers, whatever core the launcher bound each to.
  if (policy.optimizer_tier() != parallel::StateTier::Device) {
    const CpuShare share = take_cpu_share(rt.local_rank(), rt.local_size());
    if (share.refused) ZP_LOG_WARN(share.note);
    else if (!share.note.empty()) ZP_LOG_INFO(share.note);
    policy.set_host_threads(int(share.cpus.size()));
  }
  // Before the engine allocates anything: the swap files' directories, on every node, with room.
  check_nvme_tiers(blocks, policy, at.data_size(), at.topology->mpi_comm(comm::Group::World));
  // Before anything is allocated: the plan against what this node has free.
  const RunPlan plan = plan_run(blocks, policy, cfg, at.data_size(), rt.local_size(), task->activation_bytes(),
                                at.dev.is_cuda(), "");
  const std::string fit = check_fit_at_start(plan, at.dev, at.topology->mpi_comm(comm::Group::World));
  // Filling the blocks reads the hub weights (or draws them): a large model shows its progress on
  // rank 0 (its pipeline stage's blocks), a small one prints nothing (ProgressMeter).
  auto block_bytes = [](const nn::ParamBlock& b) { return double(b.padded()) * double(dtype_size(b.dtype())); };
  double model_bytes = 0, filled_bytes = 0;
  for (const nn::ParamBlock* b : blocks) model_bytes += block_bytes(*b);
  ProgressMeter fill_progress(cfg.init == "hub" ? "loading the weights of " + cfg.hub_dir : "initialising the model",
                              model_bytes, "GB");
  parallel::ZeroEngine engine(blocks, policy, comms.data.get(), adamw_hyper(cfg), s, [&](nn::ParamBlock& b) {
    task->fill_block(b);
    filled_bytes += block_bytes(b);
    fill_progress.update(filled_bytes);
  });
  task->set_block_access(&engine);
  engine.set_overlap_comm(cfg.overlap_comm);

  // A pipeline stage: its schedule, and the stages' part in the update.
  std::unique_ptr<PipelineStep> pipeline;
  PipelineGradients pipeline_grads;
  std::unique_ptr<comm::MpiComm> stage_scalars;
  std::unique_ptr<comm::Communicator> tied_copies;
  if (stage_model) {
    pipeline = std::make_unique<PipelineStep>(
        parallel::schedule_kind_from(cfg.pipeline_schedule, "pipeline.schedule"),
        parallel::PipelineShape{at.stages(), int(cfg.grad_accum), int(cfg.virtual_stages)}, at.stage(), *comms.stages,
        engine, *stage_model, s);
    stage_scalars = std::make_unique<comm::MpiComm>(at.topology->mpi_comm(comm::Group::Pipeline));
    pipeline_grads.stages = stage_scalars.get();
    if (stage_model->has_shared_blocks()) {
      // The first and the last stage at each data coordinate hold the tied embedding's two copies.
      const bool holds = at.stage() == 0 || at.stage() + 1 == at.stages();
      MPI_Comm pair = MPI_COMM_NULL;
      ZP_MPI_CHECK(MPI_Comm_split(at.topology->mpi_comm(comm::Group::World), holds ? at.data_rank() : MPI_UNDEFINED,
                                  at.stage(), &pair));
      if (holds) {
        tied_copies = comm::make_communicator(at.dev.is_cuda() ? comm::Backend::Nccl : comm::Backend::Mpi, pair);
        ZP_MPI_CHECK(MPI_Comm_free(&pair));
        const PipelineStageModel::SharedBlock shared = stage_model->shared_block();
        ZP_CHECK(shared.block, "stage ", at.stage(), " holds no copy of the tied embedding");
        pipeline_grads.tied = shared.block;
        pipeline_grads.tied_is_replica = shared.replica;
        pipeline_grads.tied_group = tied_copies.get();
      }
    }
  }

  const LrSchedule& sched = cfg.schedule;
  LossScaler scaler(cfg.fp16, cfg.initial_scale, cfg.min_scale, cfg.scale_window, cfg.hysteresis,
                    cfg.consecutive_hysteresis);
  TrainResult result;
  std::optional<StageBlocks> stage_blocks;
  if (stage_model) {
    stage_blocks = StageBlocks{at.stages(), at.topology->mpi_comm(comm::Group::Pipeline),
                               at.topology->mpi_comm(comm::Group::Data),
                               [stage_model](const nn::ParamBlock& b) { return stage_model->model_position(b); },
                               pipeline_grads.tied_is_replica ? pipeline_grads.tied : nullptr};
  }
  LoopCheckpoints checkpoints(cfg, at.topology->mpi_comm(comm::Group::World), engine, task->checkpoint_model(),
                              at.global_batch, s, stage_blocks);
  checkpoints.resume(scaler, result);

  // The verification banner: what is sharded and where each kind of state lives, the ranks and their
  // devices, and the bytes per tier.
  const std::string ranks = rank_device_map(at.topology->mpi_comm(comm::Group::World), at.dev);
  const ProgressUnit unit = task->progress();
  const std::vector<std::string> banner = {engine.policy().str() + " | " + std::to_string(at.world()) + " rank(s): " + ranks,
                                           engine.memory_plan().str(), fit, task->describe()};
  for (size_t i = 0; i + 1 < banner.size(); ++i) ZP_LOG_INFO(banner[i]);
  // And every rank's own line: host, device, its NUMA node (for checking the launcher's binding)
  // and what it holds in each tier.
  char host[64] = {0};
  ::gethostname(host, sizeof(host) - 1);
  const parallel::MemoryPlan mem = engine.memory_plan();
  const std::string rank_line =
      rank_start_line(at.rank(), at.world(), host,
                      at.dev.is_cuda() ? at.dev.str() + " (" + cuda_device_name(at.dev.index) + ")" : at.dev.str(),
                      numa_node_of(at.dev), mem.device_bytes(), mem.host_bytes(), mem.nvme_bytes());
  ZP_LOG_INFO_ALL(rank_line);
  // A resumed run continues its metrics file.
  StepReporter reporter(cfg.metrics_file, at.rank(), at.world(), at.dev, unit.unit,
                        at.global_batch * unit.items_per_sample, unit.flops_per_item, cfg.max_steps, cfg.print_every,
                        !result.resumed_from.empty());
  reporter.set_csv_monitor(cfg.csv_monitor_dir, at.global_batch, cfg.fp16);
  reporter.show_breakdown(cfg.wall_clock_breakdown);
  const std::string& config = task->checkpoint_model().config_json;
  reporter.start_event(config.empty() ? io::json() : io::parse_json_bounded(config, "the run's configuration"), banner,
                       rank_line);
  if (!result.resumed_from.empty())
    reporter.checkpoint_load_event(result.first_step, result.resumed_from, checkpoints.load_timing().seconds,
                                   checkpoints.load_timing().bytes);
  ZP_LOG_INFO(banner.back());

  std::function<double(int64_t)> validate;
  if (task->has_validation()) validate = [&](int64_t first) { return task->validation_loss(first); };
  run_steps({cfg, engine, scaler, sched, checkpoints, reporter, comms.control.get(), at.data_rank(), at.data_size(), s,
             pipeline.get(), stage_model ? &pipeline_grads : nullptr, [&] { return task->take_data_seconds(); },
             [&] { return task->take_forward_ms(); },
             [&](int64_t first, int64_t samples) { return task->begin_step(first, samples); }},
            [&](int64_t step, int64_t first, float scale) { return task->micro_step(step, first, scale); }, validate,
            result);
  reporter.summary(std::chrono::duration<double>(std::chrono::steady_clock::now() - run_start).count(),
                   result.saved.empty() ? std::string() : result.saved.back());
  if (return_params) {
    result.final_params = engine.gather_master();
    if (stage_model)
      result.final_params = gather_stages(result.final_params, at,
                                          pipeline_grads.tied_is_replica ? pipeline_grads.tied : nullptr, blocks,
                                          *stage_model);
  }
  return result;
}

}  // namespace zp::runtime
