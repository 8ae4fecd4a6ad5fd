#include "parallel/nvme_parameter_shards.h"

#include <unistd.h>

#include <atomic>
#include <cstring>

#include "core/log.h"
#include "parallel/host_buffer.h"

namespace zp::parallel {

namespace {

constexpr int64_t kAlign = io::NvmeSwapFile::kAlign;

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// "zeropipe-params-rank3-pid1234-0.swap": unique per tier even where one process builds several.
std::string swap_file_name() {
  static std::atomic<int> tiers{0};
  return "zeropipe-params-rank" + std::to_string(process_info().rank) + "-pid" + std::to_string(::getpid()) + "-" +
         std::to_string(tiers.fetch_add(1)) + ".swap";
}

}  // namespace

NvmeParameterShards::NvmeParameterShards(const NvmeSettings& nvme, bool gpu, bool& pinned)
    : nvme_(nvme), gpu_(gpu) {
  ZP_REQUIRE(nvme.buffer_count >= 1, "zero_optimization.offload_param.buffer_count must be at least 1, got ",
             nvme.buffer_count);
  pinned = pinned && gpu;  // pinning serves copies to and from a GPU
  pinned_ = pinned;
  buffers_.resize(size_t(nvme.buffer_count));
  file_ = std::make_unique<io::NvmeSwapFile>(nvme.path, nvme.path_key, swap_file_name(), 0, nvme.block_size,
                                             nvme.queue_depth);
}

NvmeParameterShards::~NvmeParameterShards() {
  if (!file_) return;
  try {
    file_->wait_all();
  } catch (const Error&) {
    // Reported by the wait that failed first; the buffers may go now.
  }
  for (Buffer& b : buffers_)
    if (b.copying) b.copied->synchronize();
}

int64_t NvmeParameterShards::file_bytes_for(std::span<const int64_t> shard_bytes) {
  int64_t total = 0;
  for (int64_t b : shard_bytes) total += round_up(b, kAlign);
  return total;
}

size_t NvmeParameterShards::buffer_bytes_for(int64_t largest, int buffer_count) {
  return size_t(buffer_count) * size_t(round_up(largest, kAlign) + kAlign);
}

int64_t NvmeParameterShards::file_bytes() const { return file_->size(); }

size_t NvmeParameterShards::buffer_bytes() const {
  size_t n = 0;
  for (const Buffer& b : buffers_) n += b.memory.nbytes();
  return n;
}

void NvmeParameterShards::grow_buffers(int64_t bytes) {
  const int64_t need = round_up(bytes, kAlign);
  if (need <= buffer_bytes_) return;
  for (Buffer& b : buffers_) {
    settle(b);
    // The shard it held is in the file (its write ended above): it is read again when needed.
    b.shard = -1;
    b.memory = Tensor();
    b.memory = host_buffer(need + kAlign, DType::U8, pinned_, "nvme_param_buffers", "the NVMe parameter tier's buffers");
    const auto at = reinterpret_cast<uintptr_t>(b.memory.data());
    b.at = reinterpret_cast<char*>((at + uintptr_t(kAlign) - 1) / uintptr_t(kAlign) * uintptr_t(kAlign));
    if (gpu_ && !b.copied) b.copied = std::make_unique<Event>();
  }
  buffer_bytes_ = need;
}

size_t NvmeParameterShards::add(const std::string& name, const void* src, Device src_dev, int64_t elements, DType dt,
                                StreamHandle s) {
  // DeepSpeed's offload_param.buffer_size: elements per buffer, which must hold the largest shard.
  ZP_REQUIRE(nvme_.buffer_size <= 0 || elements <= nvme_.buffer_size, nvme_.buffer_size_key, " = ", nvme_.buffer_size,
             " elements is smaller than block ", name, "'s parameter shard of ", elements,
             " elements on this rank: raise it to at least ", elements, " (or shard over more ranks)");
  const int64_t bytes = elements * int64_t(dtype_size(dt));
  grow_buffers(bytes);
  const size_t i = shards_.size();
  shards_.push_back({file_->extend(bytes), bytes});
  Buffer& b = free_buffer();
  std::memset(b.at, 0, size_t(buffer_bytes_));
  copy_bytes(b.at, Device::cpu(), src, src_dev, size_t(bytes), s);  // waits: the caller frees `src` next
  b.shard = int64_t(i);
  b.last_use = ++clock_;
  b.writing = file_->write(shards_[i].offset, b.at, round_up(bytes, kAlign));
  return i;
}

NvmeParameterShards::Buffer* NvmeParameterShards::holding(size_t shard) {
  for (Buffer& b : buffers_)
    if (b.shard == int64_t(shard)) return &b;
  return nullptr;
}

void NvmeParameterShards::settle(Buffer& b) {
  if (b.reading) {
    const auto t = b.reading;
    b.reading = 0;
    file_->wait(t);
  }
  if (b.writing) {
    const auto t = b.writing;
    b.writing = 0;
    file_->wait(t);
  }
  if (b.copying) {
    b.copied->synchronize();
    b.copying = false;
  }
}

NvmeParameterShards::Buffer& NvmeParameterShards::free_buffer() {
  Buffer* lru = nullptr;
  for (Buffer& b : buffers_)
    if (!b.held && (!lru || b.last_use < lru->last_use)) lru = &b;
  ZP_CHECK(lru, "NVMe parameter tier: all ", buffers_.size(), " buffers are in use at once");
  settle(*lru);
  lru->shard = -1;
  return *lru;
}

void NvmeParameterShards::read_ahead(size_t i) {
  ZP_CHECK(i < shards_.size(), "NVMe parameter tier: shard ", i, " of ", shards_.size());
  if (Buffer* b = holding(i)) {
    b->last_use = ++clock_;  // needed soon: not the next one reused
    return;
  }
  Buffer& b = free_buffer();
  b.shard = int64_t(i);
  b.last_use = ++clock_;
  b.reading = file_->read(shards_[i].offset, b.at, round_up(shards_[i].bytes, kAlign));
}

const void* NvmeParameterShards::take(size_t i) {
  read_ahead(i);
  Buffer& b = *holding(i);
  ZP_CHECK(!b.held, "NVMe parameter tier: shard ", i, " taken twice");
  if (b.reading) {
    const auto t = b.reading;
    b.reading = 0;
    file_->wait(t);
  }
  b.held = true;
  return b.at;
}

void NvmeParameterShards::release(size_t i, StreamHandle s) {
  Buffer* b = holding(i);
  ZP_CHECK(b && b->held, "NVMe parameter tier: shard ", i, " released without take()");
  b->held = false;
  if (gpu_) {
    b->copied->record(s);
    b->copying = true;
  }
}

void* NvmeParameterShards::begin_write(size_t i) {
  ZP_CHECK(i < shards_.size(), "NVMe parameter tier: shard ", i, " of ", shards_.size());
  Buffer* b = holding(i);
  ZP_CHECK(!b || !b->held, "NVMe parameter tier: shard ", i, " written while in use");
  if (b) {
    settle(*b);  // its old values may still be going to the file or up to the GPU
  } else {
    b = &free_buffer();
    b->shard = int64_t(i);
  }
  std::memset(b->at, 0, size_t(buffer_bytes_));
  b->held = true;
  b->last_use = ++clock_;
  return b->at;
}

void NvmeParameterShards::commit(std::span<const size_t> shards, StreamHandle s) {
  if (gpu_ && !shards.empty()) {  // the update fills the buffers on the stream: the file gets what it wrote
    Event filled;
    filled.record(s);
    filled.synchronize();
  }
  for (size_t i : shards) {
    Buffer* b = holding(i);
    ZP_CHECK(b && b->held, "NVMe parameter tier: shard ", i, " committed without begin_write()");
    b->held = false;
    b->writing = file_->write(shards_[i].offset, b->at, round_up(shards_[i].bytes, kAlign));
  }
}

void NvmeParameterShards::flush() {
  for (Buffer& b : buffers_)
    if (b.writing) {
      const auto t = b.writing;
      b.writing = 0;
      file_->wait(t);
    }
}

}  // namespace zp::parallel
