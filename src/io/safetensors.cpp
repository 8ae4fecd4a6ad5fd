#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <climits>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "io/atomic_file.h"
#include "io/config.h"
#include "kernels/elementwise.h"

namespace zp::io {
namespace fs = std::filesystem;
using json = nlohmann::json;

DType safetensors_dtype(const std::string& s) {
  static const std::map<std::string, DType> m = {{"F32", DType::F32}, {"BF16", DType::BF16}, {"F16", DType::F16},
                                                 {"I32", DType::I32}, {"I64", DType::I64}, {"U8", DType::U8},
                                                 {"F64", DType::F64}};
  auto it = m.find(s);
  ZP_REQUIRE(it != m.end(), "unsupported safetensors dtype '", s, "'");
  return it->second;
}

std::string safetensors_dtype_name(DType d) {
  switch (d) {
    case DType::F32: return "F32";
    case DType::BF16: return "BF16";
    case DType::F16: return "F16";
    case DType::I32: return "I32";
    case DType::I64: return "I64";
    case DType::U8: return "U8";
    case DType::F64: return "F64";
  }
  return "?";
}

namespace {

// The reference implementation refuses headers above 100 MB; a real one is a few hundred KB, and a
// larger claim is a damaged length field that would have us parse the tensor data as JSON.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
// Deeper JSON than any real header; bounds the recursion of dumping a nested metadata value.
constexpr int kMaxJsonDepth = 64;
// HDF5's H5S_MAX_RANK: the weights files these tensors go to cannot hold more dimensions.
constexpr size_t kMaxRank = 32;

// A JSON number that is an exact non-negative integer (nlohmann's get<> would silently truncate 2.5
// to 2 and wrap -1 to 2^64-1, and takes true for 1).
bool as_index(const json& v, uint64_t* out) {
  if (v.is_number_unsigned()) { *out = v.get<uint64_t>(); return true; }
  if (v.is_number_integer() && v.get<int64_t>() >= 0) { *out = uint64_t(v.get<int64_t>()); return true; }
  return false;
}

// A JSON value for an error message, cut short: a damaged header can hold megabytes in one value.
std::string brief(const json& v) {
  std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  return s.size() > 80 ? s.substr(0, 77) + "..." : s;
}

}  // namespace

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ZP_REQUIRE(fd_ >= 0, path, ": cannot open: ", std::strerror(errno));
  struct stat st {};
  if (fstat(fd_, &st) != 0) { ::close(fd_); throw Error(path + ": cannot stat"); }
  size_ = size_t(st.st_size);
  auto fail = [&](const std::string& why) {
    release();
    throw Error(path + ": not a valid safetensors file: " + why);
  };
  if (size_ < 8) fail("shorter than the 8-byte header length");
  map_ = mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd_, 0);
  if (map_ == MAP_FAILED) { map_ = nullptr; fail(std::string("mmap failed: ") + std::strerror(errno)); }
  uint64_t hlen = 0;
  std::memcpy(&hlen, map_, 8);  // little-endian on every platform we build for
  if (hlen > size_ - 8) fail("header length " + std::to_string(hlen) + " exceeds the file size " + std::to_string(size_));
  if (hlen > kMaxHeaderBytes)
    fail("header length " + std::to_string(hlen) + " is above the format's limit of " + std::to_string(kMaxHeaderBytes));
  const char* hdr = static_cast<const char*>(map_) + 8;
  data_ = hdr + hlen;
  const uint64_t data_size = size_ - 8 - hlen;
  json j;
  try {
    // Refused while parsing, before a deep document exists: dumping one would recurse that deep.
    const json::parser_callback_t limit_depth = [&](int depth, json::parse_event_t, json&) {
      if (depth > kMaxJsonDepth) throw Error("nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
      return true;
    };
    j = json::parse(hdr, hdr + hlen, limit_depth);
  } catch (const std::exception& e) {
    fail(std::string("header is not JSON: ") + e.what());
  }
  if (!j.is_object()) fail("header is not a JSON object");
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (auto& [name, v] : j.items()) {
    if (name == "__metadata__") {
      if (!v.is_object()) fail("__metadata__ is not a JSON object");
      for (auto& [k, m] : v.items()) metadata_[k] = m.is_string() ? m.get<std::string>() : m.dump(-1, ' ', false, json::error_handler_t::replace);
      continue;
    }
    auto bad = [&](const std::string& why) { fail("tensor '" + name + "': " + why); };
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets"))
      bad("entry needs dtype, shape and data_offsets");
    SafetensorsEntry e;
    e.name = name;
    const json& dtype = v["dtype"];
    if (!dtype.is_string()) bad("dtype is not a string");
    try {
      e.dtype = safetensors_dtype(dtype.get<std::string>());
    } catch (const Error& err) {
      bad(err.what());
    }
    const json& shape = v["shape"];
    if (!shape.is_array()) bad("shape is not an array");
    if (shape.size() > kMaxRank)
      bad("shape has " + std::to_string(shape.size()) + " dimensions, more than " + std::to_string(kMaxRank));
    // Elements and bytes are counted with overflow checks: a wrapped product could match the range.
    uint64_t numel = 1;
    bool overflow = false;
    for (const json& d : shape) {
      uint64_t x = 0;
      if (!as_index(d, &x) || x > uint64_t(INT64_MAX)) bad("shape entry " + brief(d) + " is not a non-negative integer");
      e.shape.push_back(int64_t(x));
      overflow = overflow || __builtin_mul_overflow(numel, x, &numel);
    }
    uint64_t want = 0;
    overflow = overflow || numel > uint64_t(INT64_MAX) || __builtin_mul_overflow(numel, dtype_size(e.dtype), &want);
    if (overflow) bad("shape " + brief(shape) + " has more elements than 64-bit sizes can count");
    const json& off = v["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !as_index(off[0], &e.begin) || !as_index(off[1], &e.end))
      bad("data_offsets must be [begin, end] of non-negative integers, not " + brief(off));
    if (e.begin > e.end || e.end > data_size)
      bad("data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) + ") outside the data section of " +
          std::to_string(data_size) + " bytes");
    if (e.end - e.begin != want)
      bad("holds " + std::to_string(e.end - e.begin) + " bytes but shape x dtype needs " + std::to_string(want));
    if (e.end > e.begin) ranges.emplace_back(e.begin, e.end);
    entries_.emplace(name, std::move(e));
  }
  // Against the furthest end so far, not only the previous range: [0, 16) also contains [8, 12) after [4, 6).
  std::sort(ranges.begin(), ranges.end());
  uint64_t reached = 0;
  for (const auto& [b, e] : ranges) {
    if (b < reached) fail("tensor data ranges overlap at byte " + std::to_string(b) + " of the data section");
    reached = std::max(reached, e);
  }
}

SafetensorsFile::~SafetensorsFile() { release(); }

void SafetensorsFile::release() {
  if (map_) munmap(map_, size_);
  if (fd_ >= 0) ::close(fd_);
  map_ = nullptr;
  fd_ = -1;
}

const SafetensorsEntry& SafetensorsFile::entry(const std::string& name) const {
  auto it = entries_.find(name);
  ZP_REQUIRE(it != entries_.end(), path_, ": no tensor named '", name, "'");
  return it->second;
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> n;
  for (auto& [k, v] : entries_) n.push_back(k);
  return n;
}

Tensor SafetensorsFile::view(const std::string& name) const {
  const SafetensorsEntry& e = entry(name);
  return Tensor::from_blob(const_cast<char*>(data_ + e.begin), e.shape, e.dtype, Device::cpu());
}

Tensor SafetensorsFile::read(const std::string& name) const {
  const SafetensorsEntry& e = entry(name);
  Tensor t = Tensor::empty(e.shape, e.dtype, Device::cpu(), "safetensors");
  std::memcpy(t.data(), data_ + e.begin, e.end - e.begin);
  return t;
}

Tensor SafetensorsFile::read_as(const std::string& name, DType as) const {
  const SafetensorsEntry& e = entry(name);
  if (e.dtype == as) return read(name);
  ZP_REQUIRE(dtype_is_float(e.dtype) && dtype_is_float(as), path_, ": tensor '", name, "' is ",
             dtype_name(e.dtype), " and cannot be converted to ", dtype_name(as));
  Tensor src = read(name);  // aligned copy first
  Tensor t = Tensor::empty(e.shape, as, Device::cpu(), "safetensors");
  kernels::cpu::cast(nullptr, as, t.data(), e.dtype, src.data(), t.numel());
  return t;
}

void SafetensorsFile::read_range_as(const std::string& name, DType as, int64_t first, int64_t count, void* out) const {
  const SafetensorsEntry& e = entry(name);
  const int64_t n = shape_numel(e.shape);
  ZP_REQUIRE(first >= 0 && count >= 0 && first <= n - count, path_, ": tensor '", name, "': elements [", first, ", ",
             first + count, ") outside its ", n);
  ZP_REQUIRE(e.dtype == as || (dtype_is_float(e.dtype) && dtype_is_float(as)), path_, ": tensor '", name, "' is ",
             dtype_name(e.dtype), " and cannot be converted to ", dtype_name(as));
  const size_t esize = dtype_size(e.dtype);
  const char* src = data_ + e.begin + size_t(first) * esize;
  if (e.dtype == as) {
    std::memcpy(out, src, size_t(count) * esize);
    return;
  }
  std::vector<char> aligned(size_t(count) * esize);  // the data section need not be aligned for the dtype
  std::memcpy(aligned.data(), src, aligned.size());
  kernels::cpu::cast(nullptr, as, out, e.dtype, aligned.data(), count);
}

SafetensorsCollection SafetensorsCollection::open_dir(const std::string& dir, const std::string& stem) {
  SafetensorsCollection c;
  fs::path single = fs::path(dir) / (stem + ".safetensors");
  fs::path index = fs::path(dir) / (stem + ".safetensors.index.json");
  if (fs::exists(single)) {
    c.files_.push_back(std::make_unique<SafetensorsFile>(single.string()));
  } else if (fs::exists(index)) {
    const json j = read_json_file(index.string());
    ZP_REQUIRE(j.contains("weight_map") && j["weight_map"].is_object(), index.string(), ": no \"weight_map\" object");
    std::map<std::string, size_t> file_ids;
    for (auto& [name, f] : j["weight_map"].items()) {
      ZP_REQUIRE(f.is_string(), index.string(), ": weight_map entry '", name, "' is not a file name: ", brief(f));
      std::string fname = f.get<std::string>();
      ZP_REQUIRE(fname.find('/') == std::string::npos, index.string(), ": shard name '", fname, "' is not a plain file name");
      auto it = file_ids.find(fname);
      if (it == file_ids.end()) {
        c.files_.push_back(std::make_unique<SafetensorsFile>((fs::path(dir) / fname).string()));
        it = file_ids.emplace(fname, c.files_.size() - 1).first;
      }
      ZP_REQUIRE(c.files_[it->second]->contains(name), index.string(), ": lists '", name, "' in ", fname,
                 " but that shard does not hold it");
    }
  } else {
    throw Error(dir + ": neither " + single.filename().string() + " nor " + index.filename().string() + " exists");
  }
  for (size_t i = 0; i < c.files_.size(); ++i)
    for (auto& n : c.files_[i]->names()) {
      ZP_REQUIRE(!c.where_.count(n), dir, ": tensor '", n, "' appears in two shards");
      c.where_[n] = i;
    }
  return c;
}

const SafetensorsFile& SafetensorsCollection::file_of(const std::string& name) const {
  auto it = where_.find(name);
  ZP_REQUIRE(it != where_.end(), "no tensor named '", name, "' in the model's safetensors files");
  return *files_[it->second];
}

std::vector<std::string> SafetensorsCollection::names() const {
  std::vector<std::string> n;
  for (auto& [k, v] : where_) n.push_back(k);
  return n;
}

void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  json hdr = json::object();
  if (!metadata.empty()) hdr["__metadata__"] = metadata;
  uint64_t off = 0;
  for (auto& [name, t] : tensors) {
    ZP_REQUIRE(!hdr.contains(name), path, ": duplicate tensor name '", name, "'");
    hdr[name] = {{"dtype", safetensors_dtype_name(t.dtype())}, {"shape", t.shape()}, {"data_offsets", {off, off + t.nbytes()}}};
    off += t.nbytes();
  }
  std::string h = hdr.dump();
  h.append((8 - h.size() % 8) % 8, ' ');  // keep the data section 8-byte aligned
  AtomicFile f(path, FileSync::BeforeRename);
  const uint64_t hlen = h.size();
  f.write(&hlen, 8);
  f.write(h.data(), h.size());
  for (auto& [name, t] : tensors) {
    Tensor host = t.device().is_cpu() ? t : t.to(Device::cpu());
    f.write(host.data(), host.nbytes());
  }
  f.commit();
}

}  // namespace zp::io
