#include "io/weight_source.h"

#include <filesystem>
#include <optional>

#include "core/error.h"
#include "io/bounded_json.h"
#include "io/checkpoint_file.h"
#include "io/safetensors.h"
#include "kernels/nchw.h"

namespace zp::io {
namespace fs = std::filesystem;

namespace {

Shape swapped(Shape s) {
  if (s.size() == 2) std::swap(s[0], s[1]);
  return s;
}

class SafetensorsWeights final : public WeightSource {
 public:
  SafetensorsWeights(const std::string& dir, const std::string& stem)
      : WeightSource(dir), files_(SafetensorsCollection::open_dir(dir, stem)) {}
  json config() const override { return hub_config_of(path_); }
  std::vector<std::string> names() const override { return files_.names(); }
  bool contains(const std::string& name) const override { return files_.contains(name); }
  Shape shape(const std::string& name, bool hub_transposed) const override {
    const Shape s = files_.file_of(name).entry(name).shape;
    return hub_transposed ? swapped(s) : s;
  }
  Tensor read(const std::string& name, DType dt, bool hub_transposed) const override {
    Tensor t = files_.file_of(name).read_as(name, dt);
    if (!hub_transposed) return t;
    ZP_REQUIRE(t.dim() == 2, files_.file_of(name).path(), ": tensor '", name, "' is stored transposed but has shape ",
               shape_str(t.shape()));
    Tensor out = Tensor::empty(swapped(t.shape()), dt, Device::cpu(), "load");
    kernels::cpu::transpose_batched(nullptr, dt, out.data(), t.data(), 1, t.size(0), t.size(1));
    return out;
  }

 private:
  SafetensorsCollection files_;
};

// /model of a weights file (hub names, the hub config in "config") or of a checkpoint (the engine's
// parameter names, which are the hub's, and the hub config in "model_config").
class H5Weights final : public WeightSource {
 public:
  explicit H5Weights(const std::string& path) : WeightSource(path), reader_(path) {
    const H5File& f = reader_.file();
    const std::string kind = string_attr("kind");
    ZP_REQUIRE(kind == "weights" || kind == "checkpoint", path, ": kind '", kind,
               "': a weights file (zeropipe convert) or a training checkpoint was expected");
    config_key_ = kind == "weights" ? "config" : "model_config";
    string_attr(config_key_);
    ZP_REQUIRE(f.is_group("/model"), path, ": no /model group");
    names_ = f.children("/model");
  }
  json config() const override {
    return parse_json_bounded(string_attr(config_key_), path_ + ": attribute '" + config_key_ + "'");
  }
  std::vector<std::string> names() const override { return names_; }
  bool contains(const std::string& name) const override { return reader_.contains("/model/" + name); }
  Shape shape(const std::string& name, bool hub_transposed) const override {
    check_layout(name, hub_transposed);
    return reader_.info("/model/" + name).shape;
  }
  Tensor read(const std::string& name, DType dt, bool hub_transposed) const override {
    check_layout(name, hub_transposed);
    const std::string ds = "/model/" + name;
    const DatasetInfo info = reader_.info(ds);
    Tensor t = Tensor::empty(info.shape, dt, Device::cpu(), "load");
    reader_.read(ds, info.shape, dt, t.data(), 0, info.numel());
    return t;
  }

 private:
  std::string string_attr(const std::string& name) const {
    const H5File& f = reader_.file();
    ZP_REQUIRE(f.has_attr("/", name) && f.attr_kind("/", name) == AttrKind::String, path_,
               ": no string attribute '", name, "' on the root group");
    return f.attr_string("/", name);
  }
  // The file records which tensors it holds transposed from the hub's layout; the model says which
  // it expects. A disagreement means the file belongs to another model.
  void check_layout(const std::string& name, bool hub_transposed) const {
    const std::string ds = "/model/" + name;
    const H5File& f = reader_.file();
    const bool marked = f.has_attr(ds, "hub_transposed") && f.attr_int(ds, "hub_transposed") != 0;
    ZP_REQUIRE(marked == hub_transposed, path_, ": dataset '", ds, "' is ", marked ? "" : "not ",
               "marked hub_transposed, but this model ", hub_transposed ? "transposes" : "does not transpose", " it");
  }

  CheckpointReader reader_;
  std::string config_key_;
  std::vector<std::string> names_;
};

}  // namespace

bool is_h5_path(const std::string& path) {
  std::error_code ec;
  return !fs::is_directory(path, ec) && (path.ends_with(".h5") || path.ends_with(".hdf5"));
}

std::unique_ptr<WeightSource> WeightSource::open(const std::string& path, const std::string& stem) {
  if (is_h5_path(path)) return std::make_unique<H5Weights>(path);
  std::error_code ec;
  ZP_REQUIRE(fs::is_directory(path, ec), path, ": neither a hub folder nor an .h5 weights file or checkpoint");
  return std::make_unique<SafetensorsWeights>(path, stem);
}

json hub_config_of(const std::string& path) {
  if (is_h5_path(path)) return H5Weights(path).config();
  return read_json_file((fs::path(path) / "config.json").string(), " (model.hub_dir)");
}

}  // namespace zp::io
