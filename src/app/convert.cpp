// The non-obvious part is keeping memory bounded: a safetensors header must list every tensor's
// offsets before any data, so the folder writer plans the shards from the HDF5 dataset infos alone,
// writes each header, then appends the tensors piece by piece as they are read; only the transposed
// GPT-2 weights are held whole (one matrix at a time), since a transpose needs all of it.
#include "app/convert.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <vector>

#include "core/error.h"
#include "core/log.h"
#include "core/progress_meter.h"
#include "io/bounded_json.h"
#include "io/atomic_file.h"
#include "io/checkpoint_file.h"
#include "io/lora_adapter_files.h"
#include "io/safetensors.h"
#include "io/weight_source.h"
#include "kernels/elementwise.h"
#include "models/transformer.h"
#include "models/unet.h"

namespace zp::app {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr int64_t kPieceBytes = int64_t(64) << 20;  // largest buffer of one streamed piece
// Largest checksum slice of a weights file: a rank of sharded inference reads only its part of a
// tensor, widened to the checksum slices that part touches (io/checkpoint_file.h), so small slices
// keep what it reads close to its share.
constexpr int64_t kChecksumSliceBytes = int64_t(4) << 20;

// w.write of elements [offset, offset + count) of dataset `ds` (stored as `dt`, from `dt`), in pieces
// of at most kChecksumSliceBytes, each its own checksum slice.
void write_in_checksum_slices(io::CheckpointWriter& w, const std::string& ds, DType dt, const Shape& shape,
                              const void* data, int64_t offset, int64_t count) {
  const int64_t esize = int64_t(dtype_size(dt)), step = std::max<int64_t>(1, kChecksumSliceBytes / esize);
  if (count == 0) w.write(ds, dt, shape, dt, data, offset, 0);
  for (int64_t at = 0; at < count; at += step)
    w.write(ds, dt, shape, dt, static_cast<const char*>(data) + at * esize, offset + at, std::min(step, count - at));
}

struct Family {
  const char* name;  // model_family attribute
  const char* stem;  // hub weights file stem
};
constexpr Family kFamilies[] = {{"transformer", "model"}, {"unet", "diffusion_pytorch_model"}};

// nullopt for "keep".
std::optional<DType> parse_dtype(const std::string& s) {
  if (s == "keep") return std::nullopt;
  if (s == "bf16") return DType::BF16;
  if (s == "fp32") return DType::F32;
  if (s == "fp16") return DType::F16;
  throw Error("unknown dtype '" + s + "' (expected keep, bf16, fp16 or fp32)");
}

// Integer tensors (position ids and the like) never change type.
DType target_dtype(DType src, std::optional<DType> want) { return want && dtype_is_float(src) ? *want : src; }

// dst (dst_dt) <- src (src_dt), n elements; both buffers aligned for their types.
void convert_elements(void* dst, DType dst_dt, const void* src, DType src_dt, int64_t n) {
  if (dst_dt == src_dt) std::memcpy(dst, src, size_t(n) * dtype_size(src_dt));
  else kernels::cpu::cast(nullptr, dst_dt, dst, src_dt, src, n);
}

template <class T> void transpose_typed(T* dst, const T* src, int64_t rows, int64_t cols) {
  constexpr int64_t B = 32;  // tiles keep both sides in cache
  for (int64_t r0 = 0; r0 < rows; r0 += B)
    for (int64_t c0 = 0; c0 < cols; c0 += B)
      for (int64_t r = r0; r < std::min(rows, r0 + B); ++r)
        for (int64_t c = c0; c < std::min(cols, c0 + B); ++c) dst[c * rows + r] = src[r * cols + c];
}

// src [rows, cols] -> dst [cols, rows], elements of `esize` bytes.
void transpose(void* dst, const void* src, int64_t rows, int64_t cols, size_t esize) {
  switch (esize) {
    case 1: transpose_typed(static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(src), rows, cols); break;
    case 2: transpose_typed(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(src), rows, cols); break;
    case 4: transpose_typed(static_cast<uint32_t*>(dst), static_cast<const uint32_t*>(src), rows, cols); break;
    case 8: transpose_typed(static_cast<uint64_t*>(dst), static_cast<const uint64_t*>(src), rows, cols); break;
    default: ZP_FATAL("transpose: element size ", esize);
  }
}

// Storage for n elements of the widest type, 8-byte aligned (vector<uint64_t>).
void* reserve(std::vector<uint64_t>& buf, int64_t bytes) {
  buf.resize(size_t((bytes + 7) / 8) + 1);
  return buf.data();
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  ZP_REQUIRE(in, path, ": cannot open: ", std::strerror(errno));
  std::ostringstream s;
  s << in.rdbuf();
  ZP_REQUIRE(!in.bad(), path, ": read failed");
  return s.str();
}

// --- hub folder -> weights file ----------------------------------------------------------------

struct HubFolder {
  std::string dir;
  const Family* family = nullptr;
};

HubFolder find_hub_folder(const std::string& dir) {
  ZP_REQUIRE(fs::is_directory(dir), dir, ": no such folder");
  ZP_REQUIRE(fs::exists(fs::path(dir) / "config.json"), dir, ": no config.json (not a hub model folder)");
  for (const Family& fam : kFamilies) {
    const std::string stem = fam.stem;
    if (fs::exists(fs::path(dir) / (stem + ".safetensors")) || fs::exists(fs::path(dir) / (stem + ".safetensors.index.json")))
      return {dir, &fam};
  }
  throw Error(dir + ": no weights file (model.safetensors[.index.json] or diffusion_pytorch_model.safetensors[.index.json])");
}

void check_file_destination(const std::string& to, bool force) {
  ZP_REQUIRE(!fs::is_directory(to), to, ": is a folder; the destination of a hub folder is an .h5 file");
  ZP_REQUIRE(force || !fs::exists(to), to, ": already exists (use --force to replace it)");
}

// The parameters of the model a hub config describes, in the engine layout (laid out, nothing
// allocated): what a weights file or checkpoint must hold to load.
struct ModelTensor {
  Shape shape;
  bool hub_transposed = false;
  std::string file;  // where a tensor of a source lives, for errors
};
std::map<std::string, ModelTensor> model_tensors(const Family& fam, const json& cfg, const std::string& source) {
  std::map<std::string, ModelTensor> out;
  auto collect = [&](std::vector<nn::ParamBlock*> blocks) {
    for (nn::ParamBlock* b : blocks)
      for (const auto& p : b->params()) out[p->name] = {p->shape, p->file_transposed, ""};
  };
  if (std::string(fam.name) == "transformer") {
    models::Transformer m(models::TransformerConfig::from_hub_json(cfg, source), Device::cpu(), DType::F32, nullptr, 1,
                          /*allocate=*/false);
    collect(m.blocks());
  } else {
    models::UNet m(models::UNetConfig::from_hub_json(cfg, source), Device::cpu(), DType::F32, nullptr, 1,
                   /*allocate=*/false);
    collect(m.blocks());
  }
  return out;
}

// Every parameter of the model is among `have` (name -> engine-layout shape and transposition);
// with `exact`, nothing else is. Errors name `what` and the tensor.
void check_tensor_set(const std::map<std::string, ModelTensor>& model, const std::map<std::string, ModelTensor>& have,
                      bool exact, const std::string& what) {
  for (const auto& [name, t] : model) {
    auto it = have.find(name);
    ZP_REQUIRE(it != have.end(), what, ": tensor '", name, "' of the model its config describes is missing");
    const std::string& file = it->second.file.empty() ? what : it->second.file;
    ZP_REQUIRE(it->second.shape == t.shape, file, ": tensor '", name, "' has shape ", shape_str(it->second.shape),
               " (engine layout), the config needs ", shape_str(t.shape));
    ZP_REQUIRE(it->second.hub_transposed == t.hub_transposed, file, ": tensor '", name, "' is ",
               it->second.hub_transposed ? "" : "not ", "marked hub_transposed; the model expects the opposite");
  }
  if (exact)
    for (const auto& [name, t] : have)
      ZP_REQUIRE(model.count(name), what, ": tensor '", name, "' is not a parameter of the model its config describes");
}

void hub_to_weights(const ConvertOptions& o, std::optional<DType> want) {
  const HubFolder hub = find_hub_folder(o.from);
  const std::string cfg_path = (fs::path(hub.dir) / "config.json").string();
  const std::string cfg_text = read_text(cfg_path);
  const json cfg = io::parse_json_bounded(cfg_text, cfg_path);
  // The engine must understand the config (so the file loads later); the transformer config also
  // says which weights the hub stores transposed.
  const bool is_lm = std::string(hub.family->name) == "transformer";
  models::TransformerConfig tc;
  if (is_lm) tc = models::TransformerConfig::from_hub_json(cfg, cfg_path);
  else models::UNetConfig::from_hub_json(cfg, cfg_path);
  check_file_destination(o.to, o.force);

  const io::SafetensorsCollection st = io::SafetensorsCollection::open_dir(hub.dir, hub.family->stem);
  const std::vector<std::string> names = st.names();
  {  // the folder must hold the model its config describes (hub extras such as buffers may stay)
    std::map<std::string, ModelTensor> have;
    for (const std::string& name : names) {
      const bool t = is_lm && tc.hub_transposed(name);
      Shape shape = st.file_of(name).entry(name).shape;
      if (t && shape.size() == 2) std::swap(shape[0], shape[1]);
      have[name] = {shape, t, st.file_of(name).path()};
    }
    check_tensor_set(model_tensors(*hub.family, cfg, cfg_path), have, /*exact=*/false, hub.dir);
  }
  json metadata = json::object();
  if (!names.empty())
    for (const auto& [k, v] : st.file_of(names.front()).metadata()) metadata[k] = v;

  io::CheckpointWriter w(o.to);
  w.file().set_attr_string("/", "kind", "weights");
  w.file().set_attr_string("/", "model_family", hub.family->name);
  w.file().set_attr_string("/", "config", cfg_text);
  w.file().set_attr_string("/", "safetensors_metadata", metadata.dump());
  w.file().create_group("/model");

  std::vector<uint64_t> raw, converted, transposed;
  // Progress for a big model (a line every 10 s with an ETA; nothing for a quick conversion): the
  // source bytes of the tensors converted so far.
  auto source_size = [&](const std::string& name) {
    const io::SafetensorsEntry& e = st.file_of(name).entry(name);
    return double(e.end - e.begin);
  };
  double source_bytes = 0, converted_bytes = 0;
  for (const std::string& name : names) source_bytes += source_size(name);
  ProgressMeter progress("convert " + o.to, source_bytes, "GB");
  for (const std::string& name : names) {
    const io::SafetensorsFile& f = st.file_of(name);
    progress.update(converted_bytes);
    converted_bytes += source_size(name);
    try {
      ZP_REQUIRE(name.find('/') == std::string::npos, "a tensor name with '/' cannot be an HDF5 dataset name");
      const io::SafetensorsEntry& e = f.entry(name);
      const DType dt = target_dtype(e.dtype, want);
      const size_t src_size = dtype_size(e.dtype), dst_size = dtype_size(dt);
      const int64_t n = shape_numel(e.shape);
      // The mapped data section need not be aligned: copy into an aligned buffer before converting.
      const char* src = static_cast<const char*>(f.view(name).data());
      const std::string ds = "/model/" + name;
      if (is_lm && tc.hub_transposed(name)) {
        ZP_REQUIRE(e.shape.size() == 2, "hub-transposed weight has shape ", shape_str(e.shape), ", expected 2 dimensions");
        void* a = reserve(raw, n * int64_t(src_size));
        std::memcpy(a, src, size_t(n) * src_size);
        void* t = reserve(transposed, n * int64_t(src_size));
        transpose(t, a, e.shape[0], e.shape[1], src_size);
        void* c = reserve(converted, n * int64_t(dst_size));
        convert_elements(c, dt, t, e.dtype, n);
        write_in_checksum_slices(w, ds, dt, {e.shape[1], e.shape[0]}, c, 0, n);
        w.file().set_attr_int(ds, "hub_transposed", 1);
      } else {
        const int64_t piece = std::max<int64_t>(1, kPieceBytes / int64_t(std::max(src_size, dst_size)));
        void* a = reserve(raw, std::min(n, piece) * int64_t(src_size));
        void* c = reserve(converted, std::min(n, piece) * int64_t(dst_size));
        if (n == 0) w.write(ds, dt, e.shape, dt, c, 0, 0);
        for (int64_t off = 0; off < n; off += piece) {
          const int64_t cnt = std::min(piece, n - off);
          std::memcpy(a, src + size_t(off) * src_size, size_t(cnt) * src_size);
          convert_elements(c, dt, a, e.dtype, cnt);
          write_in_checksum_slices(w, ds, dt, e.shape, c, off, cnt);
        }
      }
    } catch (const Error& err) {
      throw Error("converting tensor '" + name + "' of " + f.path() + " to " + o.to + ": " + err.what());
    }
  }
  w.commit();
}

// --- weights file -> hub folder ----------------------------------------------------------------

struct OutTensor {
  std::string name, ds;
  DType file_dt = DType::F32, out_dt = DType::F32;
  Shape file_shape, hub_shape;
  bool transposed = false;
  int64_t bytes = 0;  // in the safetensors file
};

// Files of an earlier conversion that the new one would not overwrite (a single file replacing
// shards, or fewer shards): removed after the new files are in place.
std::vector<fs::path> stale_model_files(const std::string& dir, const std::string& stem) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string n = e.path().filename().string();
    const bool shard = n.starts_with(stem + "-") && n.find("-of-") != std::string::npos && n.ends_with(".safetensors");
    if (shard || n == stem + ".safetensors" || n == stem + ".safetensors.index.json") out.push_back(e.path());
  }
  return out;
}

std::string shard_name(const std::string& stem, size_t i, size_t n) {
  char b[64];
  std::snprintf(b, sizeof b, "-%05zu-of-%05zu.safetensors", i + 1, n);
  return stem + b;
}

// Streams tensor t from the file into `out` in the hub layout and dtype, verified against the file's
// checksums (a mismatch throws; `out` is then never committed).
void copy_tensor(const io::CheckpointReader& r, const OutTensor& t, io::AtomicFile& out, std::vector<uint64_t>& converted,
                 std::vector<uint64_t>& transposed) {
  const size_t dst_size = dtype_size(t.out_dt);
  const int64_t n = shape_numel(t.file_shape);
  if (t.transposed) {
    void* c = reserve(converted, n * int64_t(dst_size));
    r.read(t.ds, t.file_shape, t.out_dt, c, 0, n);
    void* h = reserve(transposed, n * int64_t(dst_size));
    transpose(h, c, t.file_shape[0], t.file_shape[1], dst_size);
    out.write(h, size_t(n) * dst_size);
    return;
  }
  const int64_t piece = std::max<int64_t>(1, kPieceBytes / int64_t(std::max(dtype_size(t.file_dt), dst_size)));
  r.stream(t.ds, t.out_dt, piece, [&](const void* data, int64_t, int64_t count) { out.write(data, size_t(count) * dst_size); });
}

void write_shard(const std::string& path, const json& metadata, const io::CheckpointReader& r,
                 const std::vector<const OutTensor*>& tensors, ProgressMeter& progress, double& done_bytes) {
  json hdr = json::object();
  hdr["__metadata__"] = metadata;
  uint64_t off = 0;
  for (const OutTensor* t : tensors) {
    hdr[t->name] = {{"dtype", io::safetensors_dtype_name(t->out_dt)},
                    {"shape", t->hub_shape},
                    {"data_offsets", {off, off + uint64_t(t->bytes)}}};
    off += uint64_t(t->bytes);
  }
  std::string h = hdr.dump();
  h.append((8 - h.size() % 8) % 8, ' ');  // keeps the data section 8-byte aligned, as the hub's writer does
  io::AtomicFile out(path, io::FileSync::BeforeRename);
  const uint64_t hlen = h.size();
  out.write(&hlen, 8);
  out.write(h.data(), h.size());
  std::vector<uint64_t> converted, transposed;
  for (const OutTensor* t : tensors) {
    progress.update(done_bytes);
    done_bytes += double(t->bytes);
    try {
      copy_tensor(r, *t, out, converted, transposed);
    } catch (const Error& err) {
      throw Error("converting tensor '" + t->name + "' of " + r.path() + " to " + path + ": " + err.what());
    }
  }
  out.commit();
}

// A weights file or a checkpoint, described for export: its model and /model tensors. Checked
// before anything is written: a readable hub config the engine understands, and /model holding that
// model's parameters (exactly them, for a checkpoint).
struct H5Model {
  const Family* family = nullptr;
  std::string config_text;
  json metadata = {{"format", "pt"}};
  std::vector<OutTensor> tensors;
};

H5Model describe_h5_model(const io::CheckpointReader& r, std::optional<DType> want) {
  const io::H5File& f = r.file();
  const std::string& from = r.path();
  const auto string_attr = [&](const std::string& name) -> std::optional<std::string> {
    if (!f.has_attr("/", name) || f.attr_kind("/", name) != io::AttrKind::String) return std::nullopt;
    return f.attr_string("/", name);
  };
  const std::optional<std::string> kind = string_attr("kind");
  ZP_REQUIRE(kind == "weights" || kind == "checkpoint", from, ": not a weights file or checkpoint (",
             kind ? "kind = '" + *kind + "'" : std::string("no 'kind' attribute"), ")");
  const bool checkpoint = kind == "checkpoint";
  H5Model m;
  const std::optional<std::string> family_name = string_attr("model_family");
  for (const Family& x : kFamilies)
    if (family_name == x.name) m.family = &x;
  ZP_REQUIRE(m.family, from, ": model_family ", family_name ? "'" + *family_name + "'" : std::string("missing"),
             " is not transformer or unet");
  // A weights file keeps the hub's config.json byte for byte; a checkpoint its parsed model config.
  const char* cfg_key = checkpoint ? "model_config" : "config";
  const std::optional<std::string> cfg_text = string_attr(cfg_key);
  ZP_REQUIRE(cfg_text, from, ": no '", cfg_key, "' attribute (the hub config.json)");
  const json cfg = io::parse_json_bounded(*cfg_text, from + ": attribute '" + cfg_key + "'");
  m.config_text = checkpoint ? cfg.dump(2) + "\n" : *cfg_text;
  if (auto meta = string_attr("safetensors_metadata")) {
    try {
      json j = io::parse_json_bounded(*meta, from + ": attribute safetensors_metadata");
      if (j.is_object() && !j.empty()) {
        m.metadata = json::object();
        for (auto& [k, v] : j.items()) m.metadata[k] = v.is_string() ? v.get<std::string>() : v.dump();
      }
    } catch (const std::exception& e) {
      throw Error(from + ": attribute safetensors_metadata is not JSON: " + e.what());
    }
  }
  ZP_REQUIRE(f.is_group("/model"), from, ": no /model group");

  std::map<std::string, ModelTensor> have;
  for (const std::string& name : f.children("/model")) {
    OutTensor t;
    t.name = name;
    t.ds = "/model/" + name;
    ZP_REQUIRE(f.is_dataset(t.ds), from, ": ", t.ds, " is not a dataset");
    const io::DatasetInfo info = f.dataset_info(t.ds);
    t.file_dt = info.dtype;
    t.out_dt = target_dtype(info.dtype, want);
    t.file_shape = info.shape;
    t.hub_shape = info.shape;
    t.transposed = f.has_attr(t.ds, "hub_transposed") && f.attr_int(t.ds, "hub_transposed") != 0;
    if (t.transposed) {
      ZP_REQUIRE(info.shape.size() == 2, from, ": ", t.ds, " is marked hub_transposed but has shape ", shape_str(info.shape));
      t.hub_shape = {info.shape[1], info.shape[0]};
    }
    t.bytes = info.numel() * int64_t(dtype_size(t.out_dt));
    have[name] = {t.file_shape, t.transposed, ""};
    m.tensors.push_back(std::move(t));
  }
  check_tensor_set(model_tensors(*m.family, cfg, from + " (" + cfg_key + ")"), have, checkpoint, from);
  return m;
}

// W + scale * B A for one module, W [out, in] in the engine layout (a 1x1 convolution's [out, in, 1,
// 1] alike), in float64, rounded once to `out_dt` into `dst`.
void merge_module(const io::LoraAdapter& a, const std::string& module, const double* w, const Shape& w_shape, void* dst,
                  DType out_dt) {
  std::vector<double> merged(w, w + shape_numel(w_shape));
  io::add_lora_update(a, module, merged.data(), w_shape);
  kernels::cpu::cast(nullptr, out_dt, dst, DType::F64, merged.data(), int64_t(merged.size()));
}

// A weights file or checkpoint -> a weights file (a checkpoint's model without its optimizer state,
// or another dtype), streamed and verified tensor by tensor. With `merge`, the weights of its
// modules become W + scale * B A (checked against the model beforehand: check_adapter_fits).
void h5_to_weights(const ConvertOptions& o, std::optional<DType> want, const io::LoraAdapter* merge = nullptr) {
  const io::CheckpointReader r(o.from);
  const H5Model m = describe_h5_model(r, want);
  check_file_destination(o.to, o.force);
  std::map<std::string, std::string> merged_weight;  // base weight name -> module
  if (merge)
    for (const std::string& mod : merge->modules()) merged_weight[mod + ".weight"] = mod;
  io::CheckpointWriter w(o.to);
  w.file().set_attr_string("/", "kind", "weights");
  w.file().set_attr_string("/", "model_family", m.family->name);
  w.file().set_attr_string("/", "config", m.config_text);
  w.file().set_attr_string("/", "safetensors_metadata", m.metadata.dump());
  if (merge)
    w.file().set_attr_string("/", "merged_lora",
                             json{{"adapter", merge->source}, {"lora", merge->config.to_json()}}.dump());
  w.file().create_group("/model");
  double total_bytes = 0, done_bytes = 0;
  for (const OutTensor& t : m.tensors) total_bytes += double(t.bytes);
  ProgressMeter progress("convert " + o.to, total_bytes, "GB");
  for (const OutTensor& t : m.tensors) {
    progress.update(done_bytes);
    done_bytes += double(t.bytes);
    try {
      if (auto it = merged_weight.find(t.name); it != merged_weight.end()) {
        const int64_t n = shape_numel(t.file_shape);
        std::vector<double> base(static_cast<size_t>(n));
        r.read(t.ds, t.file_shape, DType::F64, base.data(), 0, n);
        std::vector<uint64_t> out;
        void* dst = reserve(out, n * int64_t(dtype_size(t.out_dt)));
        merge_module(*merge, it->second, base.data(), t.file_shape, dst, t.out_dt);
        write_in_checksum_slices(w, t.ds, t.out_dt, t.file_shape, dst, 0, n);
        if (t.transposed) w.file().set_attr_int(t.ds, "hub_transposed", 1);
        merged_weight.erase(it);
        continue;
      }
      const int64_t piece = std::max<int64_t>(1, kPieceBytes / int64_t(std::max(dtype_size(t.file_dt), dtype_size(t.out_dt))));
      if (shape_numel(t.file_shape) == 0) w.write(t.ds, t.out_dt, t.file_shape, t.out_dt, nullptr, 0, 0);
      r.stream(t.ds, t.out_dt, piece, [&](const void* data, int64_t offset, int64_t count) {
        write_in_checksum_slices(w, t.ds, t.out_dt, t.file_shape, data, offset, count);
      });
      if (t.transposed) w.file().set_attr_int(t.ds, "hub_transposed", 1);
    } catch (const Error& err) {
      throw Error("converting tensor '" + t.name + "' of " + o.from + " to " + o.to + ": " + err.what());
    }
  }
  ZP_REQUIRE(merged_weight.empty(), o.from, ": has no tensor '", merged_weight.empty() ? "" : merged_weight.begin()->first,
             "' for the adapter's module '", merged_weight.empty() ? "" : merged_weight.begin()->second, "'");
  w.commit();
}

// A weights file or checkpoint -> a hub folder.
void h5_to_hub(const ConvertOptions& o, std::optional<DType> want) {
  const io::CheckpointReader r(o.from);
  const H5Model m = describe_h5_model(r, want);
  const std::vector<OutTensor>& tensors = m.tensors;
  const json& metadata = m.metadata;
  const Family* fam = m.family;

  // Destination: a new or empty folder, or with force one whose model files get replaced.
  if (fs::exists(o.to)) {
    ZP_REQUIRE(fs::is_directory(o.to), o.to, ": exists and is not a folder");
    ZP_REQUIRE(o.force || fs::is_empty(o.to), o.to, ": already exists and is not empty (use --force to replace its model files)");
  }
  const bool created = !fs::exists(o.to);
  if (created) {
    std::error_code ec;
    fs::create_directories(o.to, ec);
    ZP_REQUIRE(!ec, o.to, ": cannot create folder: ", ec.message());
  }
  const std::string stem = fam->stem;
  std::vector<fs::path> stale = stale_model_files(o.to, stem);

  // Shards in name order, a new one when the next tensor would overflow the current one (a tensor
  // larger than the limit gets a shard of its own), as the hub's save_pretrained does.
  ZP_REQUIRE(o.max_shard_bytes > 0, "max_shard_bytes must be positive");
  std::vector<std::vector<const OutTensor*>> shards(1);
  int64_t in_shard = 0, total = 0;
  for (const OutTensor& t : tensors) {
    if (!shards.back().empty() && in_shard + t.bytes > o.max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(&t);
    in_shard += t.bytes;
    total += t.bytes;
  }

  std::vector<std::string> written;
  ProgressMeter progress("convert " + o.to, double(total), "GB");
  double done_bytes = 0;
  try {
    if (shards.size() == 1) {
      write_shard((fs::path(o.to) / (stem + ".safetensors")).string(), metadata, r, shards[0], progress, done_bytes);
      written.push_back(stem + ".safetensors");
    } else {
      json index = {{"metadata", {{"total_size", total}}}, {"weight_map", json::object()}};
      for (size_t i = 0; i < shards.size(); ++i) {
        const std::string name = shard_name(stem, i, shards.size());
        write_shard((fs::path(o.to) / name).string(), metadata, r, shards[i], progress, done_bytes);
        written.push_back(name);
        for (const OutTensor* t : shards[i]) index["weight_map"][t->name] = name;
      }
      io::write_file_atomically((fs::path(o.to) / (stem + ".safetensors.index.json")).string(), index.dump(2) + "\n",
                                io::FileSync::BeforeRename);
      written.push_back(stem + ".safetensors.index.json");
    }
    io::write_file_atomically((fs::path(o.to) / "config.json").string(), m.config_text, io::FileSync::BeforeRename);
  } catch (...) {
    // Shards already in place are complete files, but a folder missing some is no model: take back
    // what this run wrote (a replaced file of an earlier conversion cannot come back).
    std::error_code ec;
    for (const std::string& n : written) fs::remove(fs::path(o.to) / n, ec);
    if (created) fs::remove(o.to, ec);  // only if empty
    throw;
  }

  for (const fs::path& p : stale) {
    if (std::find(written.begin(), written.end(), p.filename().string()) != written.end()) continue;
    std::error_code ec;
    fs::remove(p, ec);
    if (ec) ZP_LOG_WARN(p.string(), ": cannot remove the previous conversion's file: ", ec.message());
  }
}

// --- LoRA adapters ---------------------------------------------------------------------------------

const Family& family_named(const std::string& name, const std::string& where) {
  for (const Family& f : kFamilies)
    if (name == f.name) return f;
  throw Error(where + ": model_family '" + name + "' is not transformer or unet");
}

// Modules of the model that can carry an adapter: "<module>.weight" of 2 dimensions (a linear map
// in the engine layout [out, in]) or a 1x1 convolution.
std::map<std::string, const ModelTensor*> adaptable_modules(const std::map<std::string, ModelTensor>& model) {
  std::map<std::string, const ModelTensor*> out;
  for (const auto& [name, t] : model) {
    if (!name.ends_with(".weight")) continue;
    if (t.shape.size() == 2 || t.shape.size() == 4) out[name.substr(0, name.size() - 7)] = &t;
  }
  return out;
}

std::vector<std::string> known_adapter_names(const std::map<std::string, ModelTensor>& model) {
  std::vector<std::string> out;
  for (const auto& [module, t] : adaptable_modules(model)) {
    out.push_back(module + io::kLoraASuffix);
    out.push_back(module + io::kLoraBSuffix);
  }
  return out;
}

// Every adapter module is a linear map or convolution of the model with matching sizes: A [r, in],
// B [out, r] for the engine-layout weight [out, in]; A [r, in, kh, kw], B [out, r, 1, 1] for a
// convolution's [out, in, kh, kw] (a 1x1 convolution's may be 2-d). An embedding is refused: PEFT keeps
// an embedding's adapter as lora_embedding_A / _B of other shapes. Errors name the tensor.
void check_adapter_fits(const io::LoraAdapter& a, const std::map<std::string, ModelTensor>& model, const std::string& base) {
  const std::map<std::string, const ModelTensor*> modules = adaptable_modules(model);
  for (const std::string& m : a.modules()) {
    const std::string a_name = m + io::kLoraASuffix, b_name = m + io::kLoraBSuffix;
    const std::string leaf = m.substr(m.rfind('.') + 1);
    ZP_REQUIRE(leaf != "embed_tokens" && leaf != "wte" && leaf != "wpe", a.source, ": tensor '", a_name,
               "' adapts an embedding, which is not supported");
    auto it = modules.find(m);
    if (it == modules.end()) {
      auto t = model.find(m + ".weight");
      ZP_REQUIRE(t == model.end(), a.source, ": tensor '", a_name, "': the base weight '", m, ".weight' has shape ",
                 shape_str(t->second.shape), " (only linear maps and convolutions take a LoRA)");
      throw Error(a.source + ": tensor '" + a_name + "': " + base + " has no weight '" + m + ".weight'");
    }
    const Shape& w = it->second->shape;
    const Tensor &A = a.a(m), &B = a.b(m);
    const bool kernel_fits = A.dim() == 2 ? shape_numel(w) == w[0] * w[1] : w.size() == 4 && A.size(2) == w[2] && A.size(3) == w[3];
    ZP_REQUIRE(A.size(1) == w[1] && kernel_fits, "cannot merge ", a.source, ": tensor '", a_name, "' has shape ", shape_str(A.shape()),
               " but ", base, "'s '", m, ".weight' takes ", w[1], " inputs (its shape ", shape_str(w),
               " in the engine layout [out, in])");
    ZP_REQUIRE(B.size(0) == w[0], "cannot merge ", a.source, ": tensor '", b_name, "' has shape ", shape_str(B.shape()),
               " but ", base, "'s '", m, ".weight' has ", w[0], " outputs (its shape ", shape_str(w),
               " in the engine layout [out, in])");
  }
}

// The target_modules to write: the run's own when PEFT, matching them against the base's modules
// (a module whose path is a target or ends in "." + target), adapts exactly the adapter's modules;
// otherwise the adapter's full module paths, which PEFT matches one for one. The set of module
// paths is every prefix of a parameter name: PEFT also matches container modules, which it refuses.
std::vector<std::string> peft_target_modules(const io::LoraAdapter& a, const std::map<std::string, ModelTensor>& model) {
  std::set<std::string> paths;
  for (const auto& [name, t] : model)
    for (size_t dot = name.find('.'); dot != std::string::npos; dot = name.find('.', dot + 1)) paths.insert(name.substr(0, dot));
  const std::vector<std::string> mods = a.modules();
  const std::set<std::string> want(mods.begin(), mods.end());
  std::set<std::string> matched;
  for (const std::string& p : paths)
    for (const std::string& t : a.config.target_modules)
      if (p == t || p.ends_with("." + t)) matched.insert(p);
  if (matched == want) return a.config.target_modules;
  ZP_LOG_INFO("convert: target_modules ", json(a.config.target_modules).dump(), " would adapt ", matched.size(),
              " modules of the base, the adapter has ", want.size(), "; writing its module paths instead");
  return mods;
}

// The destination folder of an adapter: new, empty, or (with force) one whose files get replaced.
void check_folder_destination(const std::string& to, bool force) {
  ZP_REQUIRE(!io::is_h5_path(to), to, ": an adapter is written as a folder (PEFT's or diffusers' layout); "
             "to merge it into its base weights use --merge-lora");
  if (!fs::exists(to)) return;
  ZP_REQUIRE(fs::is_directory(to), to, ": exists and is not a folder");
  ZP_REQUIRE(force || fs::is_empty(to), to, ": already exists and is not empty (use --force to replace its adapter files)");
}

// A LoRA checkpoint -> PEFT's folder (LMs) or diffusers' (UNets).
void lora_checkpoint_to_adapter(const ConvertOptions& o, std::optional<DType> want) {
  io::LoraCheckpointInfo info;
  io::LoraAdapter a = io::read_lora_checkpoint(o.from, &info);
  const Family& fam = family_named(info.model_family, o.from);
  const std::string cfg_source = o.from + " (model_config)";
  const std::map<std::string, ModelTensor> model = model_tensors(fam, info.model_config, cfg_source);
  check_adapter_fits(a, model, "the base model");
  check_folder_destination(o.to, o.force);
  const DType dt = want.value_or(DType::F32);
  if (std::string(fam.name) == "transformer") {
    const models::TransformerConfig tc = models::TransformerConfig::from_hub_json(info.model_config, cfg_source);
    for (const std::string& m : a.modules()) a.fan_in_fan_out = a.fan_in_fan_out || tc.hub_transposed(m + ".weight");
    a.config.target_modules = peft_target_modules(a, model);
    io::PeftWriteOptions w;
    w.dtype = dt;
    io::write_peft_adapter(o.to, a, w);
  } else {
    // PEFT's adapter on a 1x1 convolution is itself a 1x1 convolution.
    const std::map<std::string, const ModelTensor*> modules = adaptable_modules(model);
    for (const std::string& m : a.modules())
      if (modules.at(m)->shape.size() == 4)
        for (const char* suffix : {io::kLoraASuffix, io::kLoraBSuffix}) {
          Tensor& t = a.tensors[m + suffix];
          if (t.dim() == 2) t = t.view({t.size(0), t.size(1), 1, 1});
        }
    a.config.target_modules = peft_target_modules(a, model);
    io::write_diffusers_lora(o.to, a, dt);
  }
}

// Removes a file when it goes out of scope (the merge's intermediate weights files).
struct ScratchFile {
  std::string path;
  ~ScratchFile() {
    std::error_code ec;
    fs::remove(path, ec);
    fs::remove(io::temporary_path(path), ec);
  }
};

// --merge-lora ADAPTER --from BASE --to OUT: BASE's weights with every adapter module's W + scale * B A.
// A hub folder BASE is first converted to a weights file beside OUT, and a folder OUT is written from
// a merged weights file there, so that the merge itself streams between verified HDF5 files.
void merge_lora(const ConvertOptions& o, std::optional<DType> want) {
  const std::string& adapter_path = o.merge_lora;
  ZP_REQUIRE(fs::exists(adapter_path), adapter_path, ": no such file or folder");
  std::optional<io::LoraAdapter> adapter;
  std::string base = o.from;
  if (io::is_lora_checkpoint(adapter_path)) {
    adapter = io::read_lora_checkpoint(adapter_path);
  } else if (fs::is_directory(adapter_path) && fs::exists(fs::path(adapter_path) / io::kPeftConfigFile)) {
    adapter = io::read_peft_adapter(adapter_path);
  }
  if (base.empty()) {
    ZP_REQUIRE(adapter && !adapter->base_model.empty(), adapter_path,
               ": names no base model; give the base weights with --from");
    base = adapter->base_model;
    ZP_REQUIRE(fs::exists(base), adapter_path, ": its base model '", base,
               "' is not a local folder or file; give the base weights with --from");
  }
  ZP_REQUIRE(fs::exists(base), base, ": no such file or folder (the base weights)");
  ZP_REQUIRE(!io::is_lora_checkpoint(base), base, ": is a LoRA checkpoint; the base of a merge holds the whole model");
  if (io::is_h5_path(o.to)) check_file_destination(o.to, o.force);
  else if (fs::exists(o.to))
    ZP_REQUIRE(fs::is_directory(o.to) && (o.force || fs::is_empty(o.to)), o.to,
               ": already exists and is not an empty folder (use --force to replace its model files)");

  std::string to_stem = o.to;  // "out/" names the folder "out": the scratch files go beside it
  while (to_stem.size() > 1 && to_stem.ends_with('/')) to_stem.pop_back();
  ScratchFile base_h5{to_stem + ".lora-base.h5"}, merged_h5{to_stem + ".lora-merged.h5"};
  std::string base_file = base;
  if (fs::is_directory(base)) {
    ConvertOptions c;
    c.from = base;
    c.to = base_h5.path;
    c.force = true;
    hub_to_weights(c, std::nullopt);
    base_file = base_h5.path;
  }
  std::map<std::string, ModelTensor> model;
  {
    const io::CheckpointReader r(base_file);
    const H5Model m = describe_h5_model(r, want);
    model = model_tensors(*m.family, io::parse_json_bounded(m.config_text, base), base);
  }
  if (!adapter) adapter = io::read_diffusers_lora(adapter_path, known_adapter_names(model));
  check_adapter_fits(*adapter, model, base);

  ConvertOptions c = o;
  c.from = base_file;
  if (io::is_h5_path(o.to)) {
    h5_to_weights(c, want, &*adapter);
    return;
  }
  c.to = merged_h5.path;
  c.force = true;
  h5_to_weights(c, want, &*adapter);
  c.from = merged_h5.path;
  c.to = o.to;
  c.force = o.force;
  h5_to_hub(c, std::nullopt);
}

}  // namespace

int run_convert(const ConvertOptions& o) {
  ZP_REQUIRE((!o.from.empty() || !o.merge_lora.empty()) && !o.to.empty(),
             "convert needs both a source (--from) and a destination (--to)");
  const std::optional<DType> want = parse_dtype(o.dtype);
  try {
    if (!o.merge_lora.empty()) {
      merge_lora(o, want);
      return 0;
    }
    ZP_REQUIRE(fs::exists(o.from), o.from, ": no such file or folder");
    if (io::is_lora_checkpoint(o.from)) lora_checkpoint_to_adapter(o, want);
    else if (fs::is_directory(o.from)) hub_to_weights(o, want);
    else if (io::is_h5_path(o.to)) h5_to_weights(o, want);
    else h5_to_hub(o, want);
  } catch (const fs::filesystem_error& e) {  // e.g. a folder we may not list; its message names the paths
    throw Error(std::string("convert: ") + e.what());
  }
  return 0;
}

}  // namespace zp::app
