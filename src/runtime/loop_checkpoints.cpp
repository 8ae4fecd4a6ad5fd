#include "runtime/loop_checkpoints.h"

#include <algorithm>

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "core/host_memory.h"
#include "core/log.h"
#include "io/checkpoint_file.h"

namespace zp::runtime {
namespace fs = std::filesystem;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

LoopCheckpoints::LoopCheckpoints(const TrainConfig& cfg, MPI_Comm group, parallel::ZeroEngine& engine,
                                 CheckpointModel model, int64_t global_batch, StreamHandle s,
                                 std::optional<StageBlocks> stages)
    : cfg_(cfg), group_(group), engine_(engine), model_(std::move(model)), global_batch_(global_batch), s_(s),
      stages_(std::move(stages)), bytes_per_checkpoint_(checkpoint_bytes(engine, stage_blocks())) {
  if (cfg_.checkpoint_async && !cfg_.checkpoint_dir.empty()) check_snapshot_memory();
}

void LoopCheckpoints::check_snapshot_memory() {
  // The ranks of this node take a snapshot each, at the same save point.
  MPI_Comm node = MPI_COMM_NULL;
  ZP_MPI_CHECK(MPI_Comm_split_type(group_, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
  int64_t mine = checkpoint_snapshot_bytes(engine_), on_node = 0;
  ZP_MPI_CHECK(MPI_Allreduce(&mine, &on_node, 1, MPI_INT64_T, MPI_SUM, node));
  ZP_MPI_CHECK(MPI_Comm_free(&node));
  const HostMemory host = available_host_memory();
  std::string problem;
  if (host.available >= 0 && on_node > host.available)
    problem = detail::cat("checkpoint.async = true: the asynchronous save copies each rank's share of the checkpoint "
                          "into host memory, ", on_node, " bytes for the ranks of this node, but ", host.available,
                          " bytes are available (", host.source, "): set checkpoint.async = false (saves then stop "
                          "training while they write) or give the job more memory");
  problem = io::first_error(group_, problem);
  if (!problem.empty()) throw Error(problem);
  if (host.available >= 0 && on_node > host.available / 2)
    ZP_LOG_WARN("checkpoint.async = true: the snapshots of this node's ranks take ", on_node, " of the ",
                host.available, " bytes of host memory available");
}

LossScalerState LoopCheckpoints::scaler_state(const LossScaler& sc) const {
  LossScalerState st;
  st.enabled = sc.enabled();
  st.scale = sc.scale();
  st.skipped = skipped_steps(sc);
  st.clean_steps = sc.clean_steps();
  st.overflows_left = sc.overflows_left();
  return st;
}

void LoopCheckpoints::check_storage() const {
  const std::string dir = cfg_.checkpoint_dir;
  if (dir.empty()) return;
  decided_by_rank0(group_, [&]() -> std::string {
    const std::string key = "checkpoint.dir '" + dir + "'";
    std::error_code ec;
    int64_t existing = 0;
    for (const auto& c : io::list_checkpoints(dir)) existing += int64_t(fs::file_size(c.path, ec));
    ZP_REQUIRE(!fs::exists(dir, ec) || fs::is_directory(dir, ec), key, ": exists and is not a directory");
    fs::create_directories(dir, ec);
    ZP_REQUIRE(!ec, key, ": cannot be created: ", ec.message());
    // A probe file: permissions, a read-only mount and quotas all show here, before any work.
    const std::string probe = (fs::path(dir) / (".zeropipe-probe-" + std::to_string(::getpid()))).string();
    const int fd = ::open(probe.c_str(), O_CREAT | O_WRONLY | O_TRUNC | O_CLOEXEC, 0644);
    ZP_REQUIRE(fd >= 0, key, ": not writable (creating a probe file there failed: ", std::strerror(errno), ")");
    const char bytes[4096] = {};
    const bool wrote = ::write(fd, bytes, sizeof bytes) == ssize_t(sizeof bytes);
    const int err = errno;
    ::close(fd);
    ::unlink(probe.c_str());
    ZP_REQUIRE(wrote, key, ": not writable (writing a probe file there failed: ", std::strerror(err), ")");
    // Room for keep_last complete checkpoints and the one being written; files already there count
    // against that (rotation deletes them). keep_last = 0 keeps all: every save of this run stays.
    const int64_t saves = cfg_.save_every > 0 ? (cfg_.max_steps - start_step_) / cfg_.save_every + 1 : 1;
    const int64_t kept = cfg_.keep_last > 0 ? cfg_.keep_last + 1 : saves;
    const int64_t need = std::max<int64_t>(bytes_per_checkpoint_, kept * bytes_per_checkpoint_ - existing);
    struct statvfs v {};
    ZP_REQUIRE(::statvfs(dir.c_str(), &v) == 0, key, ": cannot read the free space: ", std::strerror(errno));
    const int64_t free = int64_t(v.f_bavail) * int64_t(v.f_frsize);
    ZP_REQUIRE(free >= need, key, ": ", free, " bytes free, but ", kept, " checkpoints of this model (checkpoint.keep_last ",
               cfg_.keep_last, " + the one being written) need about ", kept * bytes_per_checkpoint_, " bytes (",
               bytes_per_checkpoint_, " each", existing ? ", less " + std::to_string(existing) + " in checkpoints already there" : "",
               "): free space or lower checkpoint.keep_last");
    return "";
  });
}

void LoopCheckpoints::resume(LossScaler& scaler, TrainResult& result) {
  const std::vector<std::string> candidates = resume_candidates(cfg_.resume, cfg_.checkpoint_dir, group_);
  check_storage();
  if (candidates.empty()) return;
  const auto t0 = std::chrono::steady_clock::now();
  TrainState st;
  std::string from;
  std::vector<std::string> damaged;
  for (const std::string& c : candidates) {
    try {
      const std::string problem = decided_by_rank0(group_, [&] { return io::probe_metadata(c); });
      if (!problem.empty()) throw io::DamagedFileError(problem);
      st = load_checkpoint(c, group_, engine_, model_, s_, stage_blocks());
      from = c;
      break;
    } catch (const io::DamagedFileError& e) {
      if (cfg_.resume != "latest") throw;
      // Renamed, so that neither rotation (which would keep it as one of the newest) nor a later
      // `--resume latest` takes it for a checkpoint again.
      ZP_LOG_WARN("--resume latest: skipping damaged checkpoint ", c, " (renamed to ", c, ".damaged): ", e.what());
      decided_by_rank0(group_, [&] {
        std::error_code ec;
        fs::rename(c, c + ".damaged", ec);
        if (ec) ZP_LOG_WARN(c, ": cannot rename: ", ec.message());
        return std::string();
      });
      damaged.push_back(c);
    }
  }
  ZP_REQUIRE(!from.empty(), "--resume latest: every checkpoint in ", cfg_.checkpoint_dir, " is damaged (",
             damaged.size(), " tried, newest first, each renamed to <name>.damaged); nothing to resume from");
  start_step_ = st.step;
  data_position_ = st.data_position;
  std::error_code size_error;
  load_ = {seconds_since(t0), int64_t(fs::file_size(from, size_error))};
  if (size_error) load_.bytes = 0;
  result.first_step = start_step_;
  result.resumed_from = from;

  // The loss scaler as it was: its scale, hysteresis left and clean steps towards the next doubling.
  if (cfg_.fp16 && !st.scaler.enabled) {
    ZP_LOG_INFO("the checkpoint was not trained with fp16 loss scaling: starting the scale at ", cfg_.initial_scale);
  } else if (cfg_.fp16) {
    scaler.restore(st.scaler.scale, std::clamp<int64_t>(st.scaler.overflows_left, 1, cfg_.hysteresis),
                   cfg_.scale_window > 1 ? st.scaler.clean_steps % cfg_.scale_window : 0);
  }
  skipped_before_ = st.scaler.skipped;

  auto layout = [](int world, int zero, int stages) {
    return std::to_string(world) + " rank(s) at ZeRO stage " + std::to_string(zero) +
           (stages > 1 ? " in " + std::to_string(stages) + " pipeline stages" : "");
  };
  int world = 1;
  ZP_MPI_CHECK(MPI_Comm_size(group_, &world));
  ZP_LOG_INFO("resumed from ", from, " in ", seconds_since(t0), " s (checksums verified): step ", st.step, ", ",
              st.optimizer_steps, " optimizer steps, sample ", st.data_position, " (written by ",
              layout(st.world_size, st.zero_stage, st.pipeline_stages), "; now ",
              layout(world, engine_.stage(), stages_ ? stages_->count : 1), ")");
  if (st.global_batch != global_batch_)
    ZP_LOG_INFO("note: the checkpoint was trained with a global batch of ", st.global_batch, ", this run uses ",
                global_batch_, "; the data continues from sample ", st.data_position);
  if (st.seed != cfg_.seed)
    ZP_LOG_INFO("note: the checkpoint was trained with seed ", st.seed, ", this run uses ", cfg_.seed,
                ": the data order changes");
}

void LoopCheckpoints::step_done(int64_t steps_done, bool healthy, bool stop, const LossScaler& scaler,
                                TrainResult& result) {
  if (cfg_.checkpoint_dir.empty()) return;
  const bool last = steps_done == cfg_.max_steps || stop;
  const bool due = (cfg_.save_every > 0 && steps_done % cfg_.save_every == 0) || last;
  if (in_flight_) finish_pending(due || last, result);
  if (!due && !save_pending_) return;
  if (!healthy) {
    if (!save_pending_ || steps_done == cfg_.max_steps || stop) ZP_LOG_WARN("step ", steps_done, ": no checkpoint from a step whose loss or gradient norm is not finite",
                steps_done == cfg_.max_steps || stop ? " (the run ends here: the newest checkpoint stays the last healthy one)"
                                                      : "; the save waits for a healthy step");
    save_pending_ = true;
    return;
  }
  save_pending_ = false;
  save(steps_done, scaler, result, cfg_.checkpoint_async && !last);
}

void LoopCheckpoints::finish_pending(bool wait, TrainResult& result) {
  // Every rank's thread done? The same answer on every rank, so all commit at the same step.
  int done = in_flight_->written() ? 1 : 0;
  if (!wait) ZP_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &done, 1, MPI_INT, MPI_MIN, group_));
  if (!wait && !done) return;
  std::unique_ptr<io::CheckpointWriter> w = std::move(in_flight_);
  try {
    w->commit();
  } catch (const Error& e) {
    throw Error(std::string("asynchronous checkpoint save failed (the checkpoints committed before are kept): ") +
                e.what());
  }
  const std::string path = w->path();
  w.reset();
  committed(path, in_flight_since_, " (asynchronously)", result);
}

void LoopCheckpoints::committed(const std::string& path, std::chrono::steady_clock::time_point since,
                                const char* how, TrainResult& result) {
  std::vector<std::string> deleted;
  if (cfg_.keep_last > 0) deleted = io::keep_last_checkpoints(cfg_.checkpoint_dir, "step-", int(cfg_.keep_last), group_);
  result.saved.push_back(path);
  std::error_code ec;
  last_save_ = {seconds_since(since), int64_t(fs::file_size(path, ec))};
  if (ec) last_save_.bytes = 0;
  ZP_LOG_INFO("saved ", path, how, " in ", last_save_.seconds, " s",
              deleted.empty() ? "" : " (deleted " + std::to_string(deleted.size()) + " older)");
}

void LoopCheckpoints::save(int64_t steps_done, const LossScaler& scaler, TrainResult& result, bool async) {
  const auto t0 = std::chrono::steady_clock::now();
  TrainState st;
  st.step = steps_done;
  st.data_position = first_sample(steps_done);
  st.global_batch = global_batch_;
  st.seed = cfg_.seed;
  st.scaler = scaler_state(scaler);
  const std::string path = (fs::path(cfg_.checkpoint_dir) / io::checkpoint_filename(steps_done)).string();
  if (async) {
    in_flight_since_ = t0;
    in_flight_ = save_checkpoint_async(path, group_, engine_, model_, st, snapshot_, s_, stage_blocks());
    return;
  }
  save_checkpoint(path, group_, engine_, model_, st, s_, stage_blocks());
  committed(path, t0, "", result);
}

}  // namespace zp::runtime
