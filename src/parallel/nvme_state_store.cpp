#include "parallel/nvme_state_store.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>

#include "core/log.h"
#include "kernels/elementwise.h"
#include "parallel/host_buffer.h"

namespace zp::parallel {
using namespace zp::kernels;

namespace {

constexpr int64_t kAlign = io::NvmeSwapFile::kAlign;
constexpr int64_t kAlignFloats = kAlign / int64_t(sizeof(float));
constexpr const char* kPathKey = "zero_optimization.offload_optimizer.nvme_path";

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// No buffer larger than the largest range needs: a small model does not pay for 16 MiB chunks.
int64_t chunk_for(int64_t chunk, int64_t largest) {
  return std::min(chunk, std::max(kAlignFloats, round_up(largest, kAlignFloats)));
}

// Host memory of `n` floats starting at a multiple of kAlign (O_DIRECT transfers to and from it):
// pinned when asked and possible, else pageable with a warning.
Tensor aligned_floats(int64_t n, bool& pinned, float*& aligned) {
  Tensor t = host_buffer(n + kAlignFloats, DType::F32, pinned, "nvme_buffers", "the NVMe tier's buffers");
  const auto at = reinterpret_cast<uintptr_t>(t.data());
  aligned = reinterpret_cast<float*>((at + uintptr_t(kAlign) - 1) / uintptr_t(kAlign) * uintptr_t(kAlign));
  return t;
}

// "zeropipe-optimizer-rank3-pid1234-0.swap": unique per store even where one process builds several
// (tests); the name matters only until the file is unlinked, a moment after it is created.
std::string swap_file_name() {
  static std::atomic<int> stores{0};
  return "zeropipe-optimizer-rank" + std::to_string(process_info().rank) + "-pid" + std::to_string(::getpid()) + "-" +
         std::to_string(stores.fetch_add(1)) + ".swap";
}

}  // namespace

NvmeStateStore::NvmeStateStore(std::vector<OwnedRange> ranges, const InitialValues& initial,
                               StreamHandle s, const NvmeSettings& nvme, bool pinned, int threads,
                               bool weights_on_host, int64_t chunk)
    : OptimizerStateStore(std::move(ranges)), nvme_(nvme), pinned_(pinned), adamw_(threads) {
  ZP_CHECK(chunk > 0 && chunk % kAlignFloats == 0, "NvmeStateStore: chunks of ", chunk, " elements");
  ZP_REQUIRE(nvme.buffer_count >= 1, "zero_optimization.offload_optimizer.buffer_count must be at least 1, got ",
             nvme.buffer_count);
  if (ranges_.empty()) return;
  dev_ = ranges_[0].block->device();
  dt_ = ranges_[0].block->dtype();
  if (dev_.is_cpu()) pinned_ = false;  // pinning serves copies to and from a GPU
  int64_t total = 0, largest = 0;
  for (const OwnedRange& r : ranges_) {
    ZP_CHECK(r.block->device() == dev_ && r.block->dtype() == dt_, "NvmeStateStore: blocks on one device in one dtype");
    base_.push_back(total);
    padded_.push_back(round_up(r.size() * int64_t(sizeof(float)), kAlign));
    total += 3 * padded_.back();
    largest = std::max(largest, r.size());
  }
  chunk_ = chunk_for(chunk, largest);
  buffers_.resize(size_t(nvme.buffer_count));
  for (Buffer& b : buffers_) {
    float* at = nullptr;
    b.memory = aligned_floats(3 * chunk_, pinned_, at);
    for (int k = 0; k < 3; ++k) b.state[k] = at + k * chunk_;
  }
  file_ = std::make_unique<io::NvmeSwapFile>(nvme.path, kPathKey, swap_file_name(), total, nvme.block_size,
                                             nvme.queue_depth);
  ring_ = std::make_unique<StagingRing>(dev_, dt_, chunk_, nvme.buffer_count, pinned_, weights_on_host);
  // The master weights start from the compute values, widened to fp32. The moments start at zero,
  // which is what a preallocated (or sized) file reads as where nothing was written.
  float* stage = buffers_[0].state[0];
  for (size_t i = 0; i < ranges_.size(); ++i)
    ring_->download(initial(i), ranges_[i].size(), s, [&](const void* piece, int64_t off, int64_t n) {
      cpu::cast(nullptr, DType::F32, stage, dt_, piece, n);
      const int64_t padded = round_up(n, kAlignFloats);
      std::fill(stage + n, stage + padded, 0.f);
      file_->wait(file_->write(offset_of(i, OptimizerState::Master, off), stage, padded * int64_t(sizeof(float))));
    });
}

NvmeStateStore::~NvmeStateStore() { drain(); }

int64_t NvmeStateStore::file_bytes(const std::vector<int64_t>& range_sizes) {
  int64_t total = 0;
  for (int64_t n : range_sizes) total += 3 * round_up(n * int64_t(sizeof(float)), kAlign);
  return total;
}

size_t NvmeStateStore::buffer_bytes_for(int64_t largest, DType dt, int buffer_count, bool gpu, int64_t chunk) {
  const int64_t c = chunk_for(chunk, largest);
  const size_t buffers = size_t(buffer_count) * size_t(3 * c + kAlignFloats) * sizeof(float);
  return buffers + (gpu ? size_t(buffer_count) * size_t(c) * (sizeof(float) + dtype_size(dt)) : 0);
}

size_t NvmeStateStore::state_bytes() const { return file_ ? size_t(file_->size()) : 0; }

size_t NvmeStateStore::buffer_bytes() const {
  size_t b = ring_ ? ring_->bytes() : 0;
  for (const Buffer& buf : buffers_) b += buf.memory.nbytes();
  return b;
}

int64_t NvmeStateStore::offset_of(size_t i, OptimizerState which, int64_t element) const {
  return base_[i] + int64_t(which) * padded_[i] + element * int64_t(sizeof(float));
}

void NvmeStateStore::start_reads(Buffer& b, size_t range, int64_t begin, int64_t end) {
  const int64_t bytes = round_up((end - begin) * int64_t(sizeof(float)), kAlign);
  for (int k = 0; k < 3; ++k) b.reads[k] = file_->read(offset_of(range, OptimizerState(k), begin), b.state[k], bytes);
}

void NvmeStateStore::start_writes(Buffer& b, size_t range, int64_t begin, int64_t end) {
  const int64_t bytes = round_up((end - begin) * int64_t(sizeof(float)), kAlign);
  for (int k = 0; k < 3; ++k) b.writes[k] = file_->write(offset_of(range, OptimizerState(k), begin), b.state[k], bytes);
}

void NvmeStateStore::wait(io::NvmeSwapFile& f, io::NvmeSwapFile::Ticket (&tickets)[3]) {
  for (auto& t : tickets)
    if (t) {
      const io::NvmeSwapFile::Ticket mine = t;
      t = 0;
      f.wait(mine);
    }
}

void NvmeStateStore::drain() noexcept {
  if (!file_) return;
  try {
    file_->wait_all();
  } catch (const Error&) {
    // Already reported by the wait that failed first.
  }
  for (Buffer& b : buffers_)
    for (int k = 0; k < 3; ++k) b.reads[k] = b.writes[k] = 0;
}

void NvmeStateStore::update(std::span<const RangeUpdate> updates, const AdamWHyper& h, const AdamWConfig& cfg,
                            StreamHandle s) {
  for (const RangeUpdate& u : updates)
    ZP_CHECK(u.range < ranges_.size(), "update of range ", u.range, " of ", ranges_.size());
  if (updates.empty()) return;
  const std::vector<UpdateChunk> chunks = split_into_chunks(updates, ranges_, chunk_);
  const size_t k = buffers_.size(), n = chunks.size();
  auto buffer_of = [&](size_t j) -> Buffer& { return buffers_[j % k]; };
  auto range_of = [&](size_t j) { return updates[chunks[j].update].range; };
  try {
    for (size_t j = 0; j < std::min(k, n); ++j) start_reads(buffer_of(j), range_of(j), chunks[j].begin, chunks[j].end);
    ring_->walk(chunks, updates, s, [&](size_t j, const float* grad, void* weights_out, bool staged) {
      const UpdateChunk& c = chunks[j];
      Buffer& b = buffer_of(j);
      wait(*file_, b.reads);
      table_.clear();
      add_range_params(ranges_[range_of(j)], c.begin, c.end, {b.state[0], b.state[1], b.state[2]}, grad, weights_out,
                       h, table_, staged);
      if (!table_.empty()) adamw_.step(table_.data(), int(table_.size()), cfg, dt_);
      start_writes(b, range_of(j), c.begin, c.end);
      // The buffer that frees up next is the previous chunk's, whose write went out while this chunk
      // was updated (with a single buffer, this chunk's own): once written, it reads the first chunk
      // not yet read. So with K buffers, K - 2 chunks are read ahead and one is written behind.
      if (k > 1 && j == 0) return;
      const size_t freed = k == 1 ? j : j - 1;
      wait(*file_, buffer_of(freed).writes);
      if (freed + k < n) start_reads(buffer_of(freed + k), range_of(freed + k), chunks[freed + k].begin,
                                     chunks[freed + k].end);
    });
    for (Buffer& b : buffers_) wait(*file_, b.writes);
  } catch (...) {
    drain();
    throw;
  }
}

void NvmeStateStore::through_buffer(size_t i, OptimizerState which, int64_t offset, int64_t count, bool write,
                                    const std::function<void(float*, int64_t, int64_t)>& visit) {
  ZP_CHECK(offset >= 0 && count >= 0 && offset + count <= ranges_.at(i).size(), write ? "write" : "read", " of [",
           offset, ", ", offset + count, ") of ", ranges_[i].size(), " elements");
  if (count == 0) return;
  // Buffer 0's three states are one aligned run of 3 * chunk_ floats; nothing else uses it outside update().
  float* mem = buffers_[0].state[0];
  const int64_t span = 3 * chunk_, end = offset + count, padded_end = round_up(end, kAlignFloats);
  try {
    for (int64_t a = offset / kAlignFloats * kAlignFloats; a < end; a += span) {
      const int64_t b = std::min(a + span, padded_end), first = std::max(a, offset), last = std::min(b, end);
      const int64_t bytes = (b - a) * int64_t(sizeof(float)), at = offset_of(i, which, a);
      if (!write || first > a || last < b) file_->wait(file_->read(at, mem, bytes));
      visit(mem + (first - a), first, last - first);
      if (write) file_->wait(file_->write(at, mem, bytes));
    }
  } catch (...) {
    drain();
    throw;
  }
}

void NvmeStateStore::read(size_t i, OptimizerState which, int64_t offset, int64_t count, float* host,
                          StreamHandle s) {
  through_buffer(i, which, offset, count, false,
                 [&](float* piece, int64_t first, int64_t n) { std::copy_n(piece, n, host + (first - offset)); });
}

void NvmeStateStore::write(size_t i, OptimizerState which, int64_t offset, int64_t count, const float* host,
                           StreamHandle s) {
  through_buffer(i, which, offset, count, true,
                 [&](float* piece, int64_t first, int64_t n) { std::copy_n(host + (first - offset), n, piece); });
}

void NvmeStateStore::write_weights(size_t i, void* weights_out, StreamHandle s) {
  const size_t esz = dtype_size(dt_);
  ring_->upload(weights_out, ranges_.at(i).size(), s, [&](void* piece, int64_t off, int64_t n) {
    through_buffer(i, OptimizerState::Master, off, n, false, [&](float* master, int64_t first, int64_t count) {
      cpu::cast(nullptr, dt_, static_cast<char*>(piece) + size_t(first - off) * esz, DType::F32, master, count);
    });
  });
}

}  // namespace zp::parallel
