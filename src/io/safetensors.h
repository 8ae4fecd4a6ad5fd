// safetensors files: an 8-byte little-endian header length, a JSON header mapping each tensor name to
// {dtype, shape, data_offsets [begin, end)} relative to the byte after the header, then the raw data.
// The reader memory-maps the file and validates every entry (known dtype, offsets inside the file,
// sizes matching shape x dtype, no overlaps) before handing out views, so a corrupt file is an error
// naming the file and the tensor instead of a read past the end.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"

namespace zp::io {

struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
  uint64_t begin = 0, end = 0;  // byte offsets into the data section
};

class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);  // throws zp::Error on a bad file
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  bool contains(const std::string& name) const { return entries_.count(name) != 0; }
  const SafetensorsEntry& entry(const std::string& name) const;  // throws naming file and tensor
  std::vector<std::string> names() const;                         // sorted
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // A CPU tensor viewing the mapped bytes (valid while this object lives). The data section is not
  // guaranteed to be aligned for the dtype, so use read() when alignment matters.
  Tensor view(const std::string& name) const;
  // A fresh CPU tensor holding a copy of the data, converted to `as` when given (float types only).
  Tensor read(const std::string& name) const;
  Tensor read_as(const std::string& name, DType as) const;
  // Elements [first, first + count) of the stored (row-major) data, converted to `as` as read_as
  // does, into `out`: only those bytes of the mapping are touched. Throws naming file and tensor for
  // a range outside the tensor.
  void read_range_as(const std::string& name, DType as, int64_t first, int64_t count, void* out) const;

 private:
  void release();  // unmaps and closes (also on a failed constructor)
  std::string path_;
  int fd_ = -1;
  void* map_ = nullptr;
  size_t size_ = 0;
  const char* data_ = nullptr;  // start of the data section
  std::map<std::string, SafetensorsEntry> entries_;
  std::map<std::string, std::string> metadata_;
};

// Several files of one model: a single `.safetensors`, or the shards listed by an index JSON
// (`model.safetensors.index.json` with a "weight_map" of name -> shard file).
class SafetensorsCollection {
 public:
  // `dir` holds either `<stem>.safetensors` or `<stem>.safetensors.index.json`.
  static SafetensorsCollection open_dir(const std::string& dir, const std::string& stem);
  bool contains(const std::string& name) const { return where_.count(name) != 0; }
  const SafetensorsFile& file_of(const std::string& name) const;
  std::vector<std::string> names() const;

 private:
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, size_t> where_;
};

// Writes tensors (any devices; copied to the host) to `path` with optional metadata. Writes to a
// temporary name first and renames, so a failed write never leaves a half file under `path`.
void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

DType safetensors_dtype(const std::string& s);  // "F32" -> DType::F32; throws on unknown
std::string safetensors_dtype_name(DType d);

}  // namespace zp::io
