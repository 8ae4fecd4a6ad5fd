// The one thing to know: every dataset is a whole logical tensor, and a rank's part of a parameter is
// always one flat range of it (the parameter's slice of a block buffer intersected with a contiguous
// range of that buffer), so saving and loading are a list of flat-range writes and reads in which
// every rank takes part in every call, possibly with nothing to move.
#include "runtime/checkpoint.h"

#include <algorithm>
#include <functional>
#include <cstring>
#include <filesystem>
#include <limits>
#include <set>

#include "core/error.h"
#include "core/log.h"
#include "core/progress_meter.h"
#include "io/bounded_json.h"
#include "io/checkpoint_file.h"

namespace zp::runtime {
namespace fs = std::filesystem;

namespace {

// The fp32 states (weights, two moments, and the delayed update's lagging weights: `states`) of the
// blocks this rank's engine visits, for the progress of a save or load.
int64_t state_bytes(parallel::ZeroEngine& engine, int states) {
  int64_t n = 0;
  for (const nn::ParamBlock* b : engine.blocks()) n += b->padded() * 4 * states;
  return n;
}


constexpr const char* kKind = "checkpoint";

std::string model_ds(const std::string& name) { return "/model/" + name; }
std::string moment_ds(const std::string& name, const char* which) { return "/optimizer/" + name + "/" + which; }
std::string lagging_ds(const std::string& name) { return "/delayed_update/" + name; }

int comm_rank(MPI_Comm comm) {
  int r = 0;
  if (comm != MPI_COMM_NULL) ZP_MPI_CHECK(MPI_Comm_rank(comm, &r));
  return r;
}
int comm_size(MPI_Comm comm) {
  int n = 1;
  if (comm != MPI_COMM_NULL) ZP_MPI_CHECK(MPI_Comm_size(comm, &n));
  return n;
}

// Hub keys that describe how a config was produced rather than the model (diffusers' metadata keys
// all start with '_': _class_name, _diffusers_version, _name_or_path).
bool informational_key(const std::string& k) {
  static const std::set<std::string> keys = {"architectures", "torch_dtype", "transformers_version", "use_cache",
                                             "auto_map"};
  return keys.count(k) > 0 || (!k.empty() && k[0] == '_');
}

// "" when the two hub configs describe the same model, else the first differing key and both values.
std::string config_difference(const io::json& in_file, const io::json& now) {
  std::set<std::string> keys;
  for (const auto& [k, v] : in_file.items()) keys.insert(k);
  for (const auto& [k, v] : now.items()) keys.insert(k);
  for (const std::string& k : keys) {
    if (informational_key(k)) continue;
    const bool a = in_file.contains(k), b = now.contains(k);
    if (a && b && in_file[k] == now[k]) continue;
    return "'" + k + "' is " + (a ? in_file[k].dump() : std::string("absent")) + " in the checkpoint, " +
           (b ? now[k].dump() : std::string("absent")) + " in this run";
  }
  return "";
}

// The three datasets of a parameter and the optimizer state each holds.
struct StateDataset {
  const char* what;
  parallel::OptimizerState state;
};
const StateDataset kStates[3] = {
    {"weights", parallel::OptimizerState::Master},
    {"exp_avg", parallel::OptimizerState::ExpAvg},
    {"exp_avg_sq", parallel::OptimizerState::ExpAvgSq},
};
std::string dataset_of(int k, const std::string& name) {
  return k == 0 ? model_ds(name) : moment_ds(name, kStates[k].what);
}

// A parameter of the whole model as the file holds it, and its block's place in the model.
struct FileParam {
  std::string name;
  Shape shape;
  bool transposed = false;
};
struct FileBlock {
  int64_t position = 0;
  std::vector<FileParam> params;
};

int64_t position_of(const nn::ParamBlock& b, size_t index, const StageBlocks* stages) {
  return stages ? stages->position(b) : int64_t(index);
}

// The whole model's blocks in order: this engine's, and with `stages` every stage's (collective
// over stages->stages; each stage describes its blocks, the replica left out).
std::vector<FileBlock> whole_model(const parallel::ZeroEngine& engine, const StageBlocks* stages) {
  io::json mine = io::json::array();
  for (size_t i = 0; i < engine.blocks().size(); ++i) {
    const nn::ParamBlock& b = *engine.blocks()[i];
    if (stages && &b == stages->replica) continue;
    io::json params = io::json::array();
    for (const auto& p : b.params()) params.push_back({p->name, p->shape, p->file_transposed});
    mine.push_back({position_of(b, i, stages), params});
  }
  std::vector<io::json> parts{mine};
  if (stages && stages->count > 1) {
    const std::string text = mine.dump();
    int len = int(text.size()), n = 1;
    ZP_MPI_CHECK(MPI_Comm_size(stages->stages, &n));
    std::vector<int> lens(static_cast<size_t>(n)), displs(static_cast<size_t>(n), 0);
    ZP_MPI_CHECK(MPI_Allgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, stages->stages));
    for (size_t r = 1; r < lens.size(); ++r) displs[r] = displs[r - 1] + lens[r - 1];
    std::string all(size_t(displs.back() + lens.back()), '\0');
    ZP_MPI_CHECK(MPI_Allgatherv(text.data(), len, MPI_CHAR, all.data(), lens.data(), displs.data(), MPI_CHAR,
                                stages->stages));
    parts.clear();
    for (size_t r = 0; r < lens.size(); ++r) parts.push_back(io::json::parse(all.substr(size_t(displs[r]), size_t(lens[r]))));
  }
  std::vector<FileBlock> out;
  for (const io::json& part : parts)
    for (const io::json& b : part) {
      FileBlock fb{b[0].get<int64_t>(), {}};
      for (const io::json& p : b[1]) fb.params.push_back({p[0].get<std::string>(), p[1].get<Shape>(), p[2].get<bool>()});
      out.push_back(std::move(fb));
    }
  std::stable_sort(out.begin(), out.end(), [](const FileBlock& a, const FileBlock& b) { return a.position < b.position; });
  for (size_t i = 1; i < out.size(); ++i)
    ZP_CHECK(out[i].position != out[i - 1].position, "two pipeline stages hold the block at model position ",
             out[i].position);
  return out;
}

// fp32 weights and two moments per parameter (and the lagging weights of a delayed update).
int64_t file_bytes(const std::vector<FileBlock>& blocks, bool lagging) {
  int64_t bytes = int64_t(1) << 20;  // attributes, checksums, HDF5's own metadata
  for (const FileBlock& b : blocks)
    for (const FileParam& p : b.params) bytes += (lagging ? 4 : 3) * int64_t(sizeof(float)) * shape_numel(p.shape);
  return bytes;
}

}  // namespace

int64_t checkpoint_bytes(parallel::ZeroEngine& engine, const StageBlocks* stages) {
  return file_bytes(whole_model(engine, stages), engine.delays_update());
}

namespace {

// save_checkpoint, and with `snapshot` save_checkpoint_async: the states go to host tensors kept in
// `snapshot` (reused from the last save where the sizes match) and the writer is returned with its
// data still to write; without, each block's states are written as the visit reaches them.
std::unique_ptr<io::CheckpointWriter> write_checkpoint(const std::string& path, MPI_Comm comm,
                                                       parallel::ZeroEngine& engine, const CheckpointModel& model,
                                                       TrainState state, StreamHandle s, const StageBlocks* stages,
                                                       std::vector<Tensor>* snapshot) {
  state.world_size = stages ? comm_size(comm) : engine.world();
  state.zero_stage = engine.stage();
  state.optimizer_steps = engine.optimizer_steps();
  state.pipeline_stages = stages ? stages->count : 1;
  const std::vector<FileBlock> blocks = whole_model(engine, stages);
  const bool lagging = engine.delays_update();  // the same on every stage

  auto writer = std::make_unique<io::CheckpointWriter>(path, comm);
  io::CheckpointWriter& w = *writer;
  w.reserve(file_bytes(blocks, lagging));
  io::H5File& f = w.file();
  f.set_attr_string("/", "kind", kKind);
  f.set_attr_string("/", "model_family", model.model_family);
  f.set_attr_string("/", "config", model.config_json);
  f.set_attr_string("/", "model_config", model.model_config.dump(2));
  f.set_attr_int("/", "step", state.step);
  f.set_attr_int("/", "optimizer_steps", state.optimizer_steps);
  f.set_attr_int("/", "data_position", state.data_position);
  f.set_attr_int("/", "global_batch", state.global_batch);
  f.set_attr_int("/", "seed", int64_t(state.seed));  // the bit pattern; seeds above 2^63 read back negative
  f.set_attr_int("/", "world_size", state.world_size);
  f.set_attr_int("/", "zero_stage", state.zero_stage);
  f.set_attr_int("/", "loss_scaling", state.scaler.enabled ? 1 : 0);
  f.set_attr_double("/", "loss_scale", state.scaler.scale);
  f.set_attr_int("/", "loss_scale_clean_steps", state.scaler.clean_steps);
  f.set_attr_int("/", "loss_scale_overflows_left", state.scaler.overflows_left);
  f.set_attr_int("/", "skipped_steps", state.scaler.skipped);
  f.set_attr_int("/", "delayed_update", lagging ? 1 : 0);
  f.set_attr_int("/", "pipeline_stages", state.pipeline_stages);
  if (!model.lora.is_null()) {
    f.set_attr_string("/", "lora", model.lora.dump());
    f.set_attr_string("/", "base_model", model.base_model);
    f.set_attr_string("/", "base_fingerprint", model.base_fingerprint);
  }

  // Every rank writes every parameter of the whole model in order, elements [offset, offset +
  // count) of its states from `data` (nothing for another stage's parameters).
  auto write_param = [&](const FileParam& p, const float* const data[4], int64_t offset, int64_t count) {
    ZP_CHECK(p.name.find('/') == std::string::npos, "parameter name '", p.name, "' holds a '/'");
    for (int k = 0; k < (lagging ? 4 : 3); ++k) {
      const std::string ds = k < 3 ? dataset_of(k, p.name) : lagging_ds(p.name);
      if (snapshot) w.write_later(ds, DType::F32, p.shape, DType::F32, data ? data[k] : nullptr, offset, count);
      else w.write(ds, DType::F32, p.shape, DType::F32, data ? data[k] : nullptr, offset, count);
    }
    if (p.transposed) f.set_attr_int(model_ds(p.name), "hub_transposed", 1);
  };
  size_t next = 0;  // the whole model's next block to write
  auto write_others_before = [&](int64_t position) {
    for (; next < blocks.size() && blocks[next].position != position; ++next)
      for (const FileParam& p : blocks[next].params) write_param(p, nullptr, 0, 0);
  };

  // The visit waits for a delayed update in flight: the file holds the state after every update.
  // Progress on rank 0 for a big model (a line every 10 s; nothing for a save that takes less): the
  // states of the blocks visited so far, of this rank's part of the model.
  ProgressMeter progress((snapshot ? "copying for " : "saving ") + path, double(state_bytes(engine, lagging ? 4 : 3)), "GB");
  double visited_bytes = 0;
  size_t index = 0, kept = 0;  // kept: snapshot tensors used so far
  engine.visit_state([&](parallel::BlockState& st) {
    const nn::ParamBlock& b = st.block();
    visited_bytes += double(b.padded()) * 4 * (lagging ? 4 : 3);
    progress.update(visited_bytes);
    const int64_t position = position_of(b, index++, stages);
    if (stages && &b == stages->replica) return;
    write_others_before(position);
    ZP_CHECK(next < blocks.size(), "block ", b.name(), " is out of the model's order");
    ++next;
    const int64_t begin = st.shard_begin(), end = st.shard_end(), share = end - begin;
    // One download per state of the block: the part this rank writes.
    Tensor local[4];
    Tensor* host = local;
    if (snapshot) {  // pinned: the copy from a GPU goes at full speed
      if (snapshot->size() < kept + 4) snapshot->resize(kept + 4);
      host = snapshot->data() + kept;
      kept += 4;
    }
    for (int k = 0; k < (lagging ? 4 : 3); ++k) {
      if (!host[k].defined() || host[k].numel() != share) {
        // Pinned where the state may come from a GPU (a run with a stream); pageable when pinning is
        // refused (RLIMIT_MEMLOCK).
        const bool pin = snapshot && s != nullptr;
        try {
          host[k] = Tensor::empty({share}, DType::F32, Device::cpu(), "checkpoint", nullptr, pin);
        } catch (const Error&) {
          if (!pin) throw;
          host[k] = Tensor::empty({share}, DType::F32, Device::cpu(), "checkpoint");
        }
      }
      if (k < 3) st.read(kStates[k].state, begin, share, host[k].data<float>());
      else st.read_lagging_weights(begin, share, host[k].data<float>());
    }
    for (const auto& p : b.params()) {
      const int64_t lo = std::max(begin, p->offset), hi = std::min(end, p->offset + p->numel());
      const int64_t count = std::max<int64_t>(0, hi - lo);
      const float* data[4] = {};
      for (int k = 0; k < (lagging ? 4 : 3); ++k) data[k] = host[k].data<float>() + (count ? lo - begin : 0);
      write_param({p->name, p->shape, p->file_transposed}, data, count ? lo - p->offset : 0, count);
    }
  }, s);
  write_others_before(std::numeric_limits<int64_t>::max());
  if (!snapshot) {
    w.commit();
    return nullptr;
  }
  snapshot->resize(kept);  // blocks the engine no longer has
  w.start_writing();
  return writer;
}

}  // namespace

void save_checkpoint(const std::string& path, MPI_Comm comm, parallel::ZeroEngine& engine, const CheckpointModel& model,
                     TrainState state, StreamHandle s, const StageBlocks* stages) {
  write_checkpoint(path, comm, engine, model, state, s, stages, nullptr);
}

std::unique_ptr<io::CheckpointWriter> save_checkpoint_async(const std::string& path, MPI_Comm comm,
                                                            parallel::ZeroEngine& engine, const CheckpointModel& model,
                                                            TrainState state, std::vector<Tensor>& snapshot,
                                                            StreamHandle s, const StageBlocks* stages) {
  return write_checkpoint(path, comm, engine, model, state, s, stages, &snapshot);
}

int64_t checkpoint_snapshot_bytes(parallel::ZeroEngine& engine) {
  int64_t n = 0;
  engine.visit_state([&](parallel::BlockState& st) { n += (st.shard_end() - st.shard_begin()) * 4 * (engine.delays_update() ? 4 : 3); });
  return n;
}

namespace {

// load_checkpoint on one stage: `comm` is its data group, `names` the whole model's parameters.
TrainState load_stage(const std::string& path, MPI_Comm comm, parallel::ZeroEngine& engine,
                      const CheckpointModel& model, StreamHandle s, const std::set<std::string>& names) {
  io::CheckpointReader reader(path, comm);
  const io::H5File& f = reader.file();
  auto string_attr = [&](const char* name) -> std::string {
    ZP_REQUIRE(f.has_attr("/", name) && f.attr_kind("/", name) == io::AttrKind::String, path,
               ": not a training checkpoint (no string attribute '", name, "' on the root group)");
    return f.attr_string("/", name);
  };
  const std::string kind = string_attr("kind");
  ZP_REQUIRE(kind == kKind, path, ": not a training checkpoint (kind = '", kind, "'",
             kind == "weights" ? "; a weights file initialises a model through model.hub_dir, it cannot be resumed" : "",
             ")");
  const std::string family = string_attr("model_family");
  ZP_REQUIRE(family == model.model_family, path, ": a checkpoint of a ", family, " model (model_family '", family,
             "'), this run trains a ", model.model_family);
  const io::json& model_config = model.model_config;
  const io::json file_config = io::parse_json_bounded(string_attr("model_config"), path + ": the model_config attribute");
  const std::string diff = config_difference(file_config, model_config);
  const std::string hint = diff.empty() ? "" : " (the checkpoint's model config differs: " + diff + ")";
  // A LoRA run's checkpoint holds its adapters only: the settings that shape them and the base they
  // adapt must be this run's (dropout may change).
  const bool file_lora = f.has_attr("/", "lora");
  ZP_REQUIRE(file_lora == !model.lora.is_null(), path,
             file_lora ? ": a LoRA checkpoint (adapters only), this run trains every weight (lora.r = 0)"
                       : ": a checkpoint of full training, this run trains LoRA adapters (lora.r > 0): start from its "
                         "weights with model.hub_dir = the checkpoint and model.init = \"hub\" instead");
  if (file_lora) {
    io::json in_file = io::parse_json_bounded(string_attr("lora"), path + ": the lora attribute"), now = model.lora;
    if (in_file.is_object()) in_file.erase("dropout");
    now.erase("dropout");
    const std::string lora_diff = config_difference(in_file, now);
    ZP_REQUIRE(lora_diff.empty(), path, ": the checkpoint's LoRA settings differ from this run's: ", lora_diff);
    const std::string fingerprint = string_attr("base_fingerprint");
    ZP_REQUIRE(fingerprint == model.base_fingerprint, path, ": adapters trained on another base model: the "
               "checkpoint's base is ", string_attr("base_model"), " (fingerprint ", fingerprint, "), this run's is ",
               model.base_model, " (fingerprint ", model.base_fingerprint, ")");
  }

  // Everything is checked before anything is read, identically on every rank (metadata queries are
  // local), so a mismatch makes every rank throw at the same point.
  std::vector<const nn::Parameter*> params;
  engine.visit_state([&](parallel::BlockState& st) {
    for (const auto& p : st.block().params()) params.push_back(p.get());
  });
  for (const nn::Parameter* p : params) {
    for (int k = 0; k < 3; ++k) {
      const std::string ds = dataset_of(k, p->name);
      ZP_REQUIRE(f.is_dataset(ds), path, ": dataset '", ds, "' is missing (this model has parameter ", p->name,
                 shape_str(p->shape), ")", hint);
      const io::DatasetInfo info = f.dataset_info(ds);
      ZP_REQUIRE(info.shape == p->shape, path, ": dataset '", ds, "': shape ", shape_str(info.shape),
                 " in the checkpoint, this model's parameter is ", shape_str(p->shape), hint);
      ZP_REQUIRE(info.dtype == DType::F32, path, ": dataset '", ds, "' is ", dtype_name(info.dtype),
                 ", a checkpoint keeps f32");
    }
  }
  if (f.is_group("/model"))
    for (const std::string& c : f.children("/model"))
      ZP_REQUIRE(names.count(c), path, ": dataset '", model_ds(c), "' is not a parameter of this model", hint);
  ZP_REQUIRE(diff.empty(), path, ": the checkpoint's model config differs from this run's: ", diff);

  TrainState st;
  st.step = f.attr_int("/", "step");
  st.optimizer_steps = f.attr_int("/", "optimizer_steps");
  st.data_position = f.attr_int("/", "data_position");
  st.global_batch = f.attr_int("/", "global_batch");
  st.seed = uint64_t(f.attr_int("/", "seed"));
  st.world_size = int(f.attr_int("/", "world_size"));
  st.zero_stage = int(f.attr_int("/", "zero_stage"));
  st.pipeline_stages = f.has_attr("/", "pipeline_stages") ? int(f.attr_int("/", "pipeline_stages")) : 1;
  st.scaler.enabled = f.attr_int("/", "loss_scaling") != 0;
  st.scaler.scale = f.attr_double("/", "loss_scale");
  st.scaler.clean_steps = f.attr_int("/", "loss_scale_clean_steps");
  st.scaler.overflows_left = f.attr_int("/", "loss_scale_overflows_left");
  st.scaler.skipped = f.attr_int("/", "skipped_steps");
  ZP_REQUIRE(st.step >= 0 && st.optimizer_steps >= 0 && st.optimizer_steps <= st.step && st.data_position >= 0, path,
             ": inconsistent step attributes (step ", st.step, ", optimizer_steps ", st.optimizer_steps,
             ", data_position ", st.data_position, ")");

  // A run with the delayed update resumes computing with the weights the writer's next step would
  // have used (the file's /delayed_update, one update behind /model), where the file has them.
  const bool lagging = engine.delays_update() && f.has_attr("/", "delayed_update") &&
                       f.attr_int("/", "delayed_update") != 0;
  if (lagging)
    for (const nn::Parameter* p : params) {
      const std::string ds = lagging_ds(p->name);
      ZP_REQUIRE(f.is_dataset(ds), path, ": dataset '", ds, "' is missing (the file says delayed_update = 1)");
      const io::DatasetInfo info = f.dataset_info(ds);
      ZP_REQUIRE(info.shape == p->shape && info.dtype == DType::F32, path, ": dataset '", ds, "' is ",
                 dtype_name(info.dtype), shape_str(info.shape), ", expected f32", shape_str(p->shape));
    }
  else if (engine.delays_update())
    ZP_LOG_INFO(path, " was written without the delayed update: the first step computes with its master weights");

  // The compute weights are rewritten from the loaded master weights when the visit ends (with the
  // delayed update and the file's lagging weights: from those, and the master weights go in next).
  ProgressMeter progress("loading " + path, double(state_bytes(engine, lagging ? 4 : 3)), "GB");
  double visited_bytes = 0;
  engine.visit_state([&](parallel::BlockState& bs) {
    progress.update(visited_bytes);
    visited_bytes += double(bs.block().padded()) * 4 * (lagging ? 4 : 3);
    const int64_t begin = bs.owned_begin(), size = bs.owned_end() - begin;
    // The rank's part of every parameter of the block, for one kind of state, in one stream of reads.
    auto read_block = [&](const std::function<std::string(const std::string&)>& dataset, float* host) {
      std::vector<io::CheckpointReader::ReadRequest> reads;
      for (const auto& p : bs.block().params()) {
        const int64_t lo = std::max(begin, p->offset), hi = std::min(begin + size, p->offset + p->numel());
        const int64_t count = std::max<int64_t>(0, hi - lo);
        reads.push_back({dataset(p->name), p->shape, DType::F32, host + (count ? lo - begin : 0),
                         count ? lo - p->offset : 0, count});
      }
      reader.read_all(reads);
    };
    if (lagging) {
      Tensor host = Tensor::empty({size}, DType::F32, Device::cpu(), "checkpoint");
      bs.read_lagging_weights(begin, size, host.data<float>());  // alignment gaps keep their values
      read_block(lagging_ds, host.data<float>());
      bs.write_lagging_weights(begin, size, host.data<float>());
    }
    for (int k = 0; k < 3; ++k) {
      Tensor host = Tensor::empty({size}, DType::F32, Device::cpu(), "checkpoint");
      bs.read(kStates[k].state, begin, size, host.data<float>());  // alignment gaps keep their values
      read_block([&](const std::string& name) { return dataset_of(k, name); }, host.data<float>());
      bs.write(kStates[k].state, begin, size, host.data<float>());
    }
  }, s);
  engine.set_optimizer_steps(st.optimizer_steps);
  return st;
}

}  // namespace

TrainState load_checkpoint(const std::string& path, MPI_Comm comm, parallel::ZeroEngine& engine,
                           const CheckpointModel& model, StreamHandle s, const StageBlocks* stages) {
  std::set<std::string> names;
  for (const FileBlock& b : whole_model(engine, stages))
    for (const FileParam& p : b.params) names.insert(p.name);
  if (!stages || stages->count == 1) return load_stage(path, comm, engine, model, s, names);
  // Each stage reads on its own; then every rank learns whether any failed, and how.
  TrainState st;
  std::string problem;
  try {
    st = load_stage(path, stages->data, engine, model, s, names);
  } catch (const io::DamagedFileError& e) {
    problem = std::string("D") + e.what();
  } catch (const Error& e) {
    problem = std::string("E") + e.what();
  }
  problem = io::first_error(comm, problem);
  if (problem.empty()) return st;
  if (problem[0] == 'D') throw io::DamagedFileError(problem.substr(1));
  throw Error(problem.substr(1));
}

std::string decided_by_rank0(MPI_Comm comm, const std::function<std::string()>& decide) {
  int failed = 0;
  std::string text;
  if (comm_rank(comm) == 0) {
    try {
      text = decide();
    } catch (const Error& e) {
      failed = 1;
      text = e.what();
    }
  }
  if (comm_size(comm) > 1) {
    int64_t len = int64_t(text.size());
    ZP_MPI_CHECK(MPI_Bcast(&failed, 1, MPI_INT, 0, comm));
    ZP_MPI_CHECK(MPI_Bcast(&len, 1, MPI_INT64_T, 0, comm));
    text.resize(size_t(len));
    ZP_MPI_CHECK(MPI_Bcast(text.data(), int(len), MPI_CHAR, 0, comm));
  }
  if (failed) throw Error(text);
  return text;
}

std::vector<std::string> resume_candidates(const std::string& resume, const std::string& dir, MPI_Comm comm) {
  if (resume.empty()) return {};
  const std::string joined = decided_by_rank0(comm, [&]() -> std::string {
    std::error_code ec;
    if (resume != "latest") {
      ZP_REQUIRE(fs::is_regular_file(resume, ec), resume, ": no such checkpoint file (--resume)");
      return resume;
    }
    ZP_REQUIRE(!dir.empty(), "--resume latest needs checkpoint.dir (the folder to look in)");
    ZP_REQUIRE(fs::exists(dir, ec), "--resume latest: checkpoint.dir '", dir,
               "' does not exist (a mistyped path? create it to start from step 0)");
    ZP_REQUIRE(fs::is_directory(dir, ec), "--resume latest: checkpoint.dir '", dir, "' is not a directory");
    const std::vector<io::CheckpointEntry> all = io::list_checkpoints(dir);
    if (all.empty()) ZP_LOG_INFO("--resume latest: no checkpoint in ", dir, " yet, starting from step 0");
    std::string out;
    for (auto it = all.rbegin(); it != all.rend(); ++it) out += it->path + '\n';
    return out;
  });
  std::vector<std::string> out;
  for (size_t b = 0; b < joined.size();) {
    const size_t e = joined.find('\n', b);
    out.push_back(joined.substr(b, e - b));
    b = e == std::string::npos ? joined.size() : e + 1;
  }
  return out;
}

}  // namespace zp::runtime
