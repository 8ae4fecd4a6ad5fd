#include "io/weight_source.h"

#include <cstring>
#include <filesystem>
#include <optional>

#include "core/error.h"
#include "io/bounded_json.h"
#include "io/checkpoint_file.h"
#include "io/safetensors.h"
#include "kernels/nhwc.h"

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
    bytes_read_ += int64_t(entry(name).end - entry(name).begin);
    if (!hub_transposed) return t;
    ZP_REQUIRE(t.dim() == 2, files_.file_of(name).path(), ": tensor '", name, "' is stored transposed but has shape ",
               shape_str(t.shape()));
    Tensor out = Tensor::empty(swapped(t.shape()), dt, Device::cpu(), "load");
    kernels::cpu::transpose_batched(nullptr, dt, out.data(), t.data(), 1, t.size(0), t.size(1));
    return out;
  }
  void read_range(const std::string& name, DType dt, bool hub_transposed, int64_t first, int64_t count,
                  void* out) const override {
    const SafetensorsFile& f = files_.file_of(name);
    const SafetensorsEntry& e = entry(name);
    const int64_t stored_element = int64_t(dtype_size(e.dtype));
    if (!hub_transposed) {
      f.read_range_as(name, dt, first, count, out);
      bytes_read_ += count * stored_element;
      return;
    }
    ZP_REQUIRE(e.shape.size() == 2, f.path(), ": tensor '", name, "' is stored transposed but has shape ",
               shape_str(e.shape));
    // Engine row r (of `cols` elements) is stored column r: read the stored columns of the engine
    // rows the range touches, [rows, cols) of them, and transpose that block back.
    const int64_t rows = e.shape[1], cols = e.shape[0];
    ZP_REQUIRE(first >= 0 && count >= 0 && first <= rows * cols - count, f.path(), ": tensor '", name,
               "': elements [", first, ", ", first + count, ") outside its ", rows * cols);
    if (count == 0) return;
    const int64_t r0 = first / cols, r1 = (first + count - 1) / cols + 1, nr = r1 - r0;
    const size_t esize = dtype_size(dt);
    std::vector<char> stored(size_t(cols * nr) * esize), engine(stored.size());
    for (int64_t c = 0; c < cols; ++c) f.read_range_as(name, dt, c * rows + r0, nr, stored.data() + size_t(c * nr) * esize);
    bytes_read_ += cols * nr * stored_element;
    kernels::cpu::transpose_batched(nullptr, dt, engine.data(), stored.data(), 1, cols, nr);
    std::memcpy(out, engine.data() + size_t(first - r0 * cols) * esize, size_t(count) * esize);
  }
  int64_t bytes_read() const override { return bytes_read_; }

 private:
  const SafetensorsEntry& entry(const std::string& name) const { return files_.file_of(name).entry(name); }
  SafetensorsCollection files_;
  mutable int64_t bytes_read_ = 0;
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
  // An HDF5 file holds every tensor in the engine layout: the flat range is the dataset's.
  void read_range(const std::string& name, DType dt, bool hub_transposed, int64_t first, int64_t count,
                  void* out) const override {
    check_layout(name, hub_transposed);
    const std::string ds = "/model/" + name;
    reader_.read(ds, reader_.info(ds).shape, dt, out, first, count);
  }
  int64_t bytes_read() const override { return reader_.bytes_read(); }

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

void WeightSource::read_range(const std::string& name, DType dt, bool hub_transposed, int64_t first, int64_t count,
                              void* out) const {
  const Tensor whole = read(name, dt, hub_transposed);
  ZP_REQUIRE(first >= 0 && count >= 0 && first <= whole.numel() - count, path_, ": tensor '", name, "': elements [",
             first, ", ", first + count, ") outside its ", whole.numel());
  const size_t esize = dtype_size(dt);
  std::memcpy(out, static_cast<const char*>(whole.data()) + size_t(first) * esize, size_t(count) * esize);
}

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
