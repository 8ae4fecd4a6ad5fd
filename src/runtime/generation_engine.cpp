#include "runtime/generation_engine.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "kernels/row_linear.h"
#include "kernels/sampling.h"

namespace zp::runtime {

namespace {

constexpr int64_t kGiB = int64_t(1) << 30;

// Packs the step's arrays into one host buffer, each 16-byte aligned, so one copy moves them all.
class ArgPacker {
 public:
  template <class T>
  size_t add(const std::vector<T>& v) {
    const size_t at = (bytes_.size() + 15) / 16 * 16;
    bytes_.resize(at + v.size() * sizeof(T));
    if (!v.empty()) std::memcpy(bytes_.data() + at, v.data(), v.size() * sizeof(T));
    return at;
  }
  const std::vector<char>& bytes() const { return bytes_; }

 private:
  std::vector<char> bytes_;
};

}  // namespace

namespace {

// Bytes of one block of `o.block_size` tokens' keys and values over every layer of `model`.
int64_t kv_block_bytes(const models::Transformer& model, const GenerationOptions& o) {
  const models::TransformerConfig& m = model.config();
  return nn::PagedKvCache::bytes_for(m.layers, 1, o.block_size, m.kv_heads, m.head_dim, model.ctx().dt);
}

}  // namespace

int64_t kv_cache_blocks(const models::Transformer& model, const GenerationOptions& o) {
  const models::TransformerConfig& m = model.config();
  const nn::Ctx c = model.ctx();
  const int64_t per_block = kv_block_bytes(model, o);
  int64_t bytes = o.kv_cache_bytes;
  if (bytes <= 0 && c.dev.is_cuda()) {
    size_t free = 0, total = 0;
    cuda_memory_info(c.dev.index, free, total);
    // A full step's working memory: the projections and MLP of max_batch_tokens tokens, and the
    // logits of max_seqs rows (fp32 for the sampler's worst case), with a margin for the caching
    // allocator and cuBLAS.
    const int64_t esz = int64_t(dtype_size(c.dt));
    const int64_t per_token = ((m.heads + 2 * m.kv_heads) * m.head_dim + 4 * m.hidden + 3 * m.ffn) * esz;
    const int64_t headroom = o.max_batch_tokens * per_token + o.max_seqs * model.padded_vocab() * 4 + kGiB;
    bytes = std::max<int64_t>(0, int64_t(double(int64_t(free) - headroom) * 0.9));
  } else if (bytes <= 0) {
    bytes = std::min(kGiB, o.max_seqs * m.max_positions * (per_block / o.block_size));
  }
  const int64_t blocks = bytes / per_block;
  ZP_REQUIRE(blocks >= 1, "generation: ", bytes, " bytes of KV cache do not hold one block of ", o.block_size,
             " tokens (", per_block, " bytes); give the cache more memory");
  return blocks;
}

int64_t kv_swap_blocks(const models::Transformer& model, const GenerationOptions& o) {
  ZP_REQUIRE(o.kv_swap_bytes >= 0, "generation: the KV swap space must be >= 0 bytes, got ", o.kv_swap_bytes);
  const int64_t per_block = kv_block_bytes(model, o);
  ZP_REQUIRE(o.kv_swap_bytes == 0 || o.kv_swap_bytes >= per_block, "generation: ", o.kv_swap_bytes,
             " bytes of KV swap space (--kv-swap-memory) do not hold one block of ", o.block_size, " tokens (",
             per_block, " bytes)");
  return o.kv_swap_bytes / per_block;
}

GenerationEngine::GenerationEngine(models::Transformer& model, const io::BpeTokenizer* tokenizer,
                                   const GenerationOptions& o)
    : GenerationEngine(model, tokenizer, o, kv_cache_blocks(model, o)) {}

namespace {

// GenerationOptions::max_graphs, 0 derived: two per power of two up to max_graph_seqs.
int64_t decode_graph_capacity(const GenerationOptions& o) {
  ZP_REQUIRE(o.max_graphs >= 0, "max_graphs ", o.max_graphs, " must be >= 0 (0: derived from max_graph_seqs)");
  if (o.max_graphs > 0) return o.max_graphs;
  int64_t row_counts = 1;
  for (int64_t p = 1; p < o.max_graph_seqs; p *= 2) ++row_counts;
  return 2 * row_counts;
}

}  // namespace

// The block count is worked out once, before the cache takes its memory.
GenerationEngine::GenerationEngine(models::Transformer& model, const io::BpeTokenizer* tokenizer,
                                   const GenerationOptions& o, int64_t blocks)
    : model_(model),
      cache_(model.config().layers, blocks, o.block_size, model.config().kv_heads, model.config().head_dim,
             model.ctx().dt, model.ctx().dev, model.ctx().s, kv_swap_blocks(model, o)),
      sched_({o.block_size, blocks, o.max_batch_tokens, o.max_seqs, model.config().max_positions,
              cache_.host_blocks()},
             tokenizer),
      graphs_(decode_graph_capacity(o)),
      max_graph_seqs_(model.ctx().dev.is_cuda() && model.ctx().s ? o.max_graph_seqs : 0) {}

GenerationEngine::~GenerationEngine() = default;

int64_t GenerationEngine::submit(GenerationRequest r) {
  const int64_t id = sched_.submit(std::move(r));
  submitted_.push_back(Clock::now());
  first_token_ms_.push_back(0);
  total_ms_.push_back(0);
  return id;
}

namespace {

int64_t next_pow2(int64_t n) {
  int64_t p = 1;
  while (p < n) p *= 2;
  return p;
}

}  // namespace

void GenerationEngine::enqueue_step(const StepPlan& p, int64_t rows, char* d, const ArgOffsets& o) {
  const nn::Ctx c = model_.ctx();
  // Resident weights never change during a step: the products may read them ahead of their inputs.
  const kernels::ConstantWeightsScope constant_weights(!before_forward_);
  auto i32 = [&](size_t off) { return reinterpret_cast<int32_t*>(d + off); };
  nn::CachedBatch b;
  b.num_tokens = rows - p.num_prefill_seqs + p.num_prefill_tokens();
  b.num_prefill_tokens = p.num_prefill_tokens();
  b.positions = i32(o.pos);
  b.slots = i32(o.slots);
  b.segments = i32(o.seg);
  b.num_decode_seqs = rows - p.num_prefill_seqs;
  b.block_tables = i32(o.bt);
  b.max_blocks = p.max_blocks;
  b.context_lens = i32(o.ctx);
  b.query_starts = i32(o.qs);
  b.max_context_len = p.max_context_len;
  b.output_rows = i32(o.rows);
  b.num_outputs = rows;
  Tensor logits = model_.forward_cached(i32(o.ids), b, cache_);
  const bool penalty = !p.history_starts.empty();
  ZP_KERNEL_CALL(c.dev, sample_tokens, c.s, c.dt, i32(o.out), nullptr, logits.data(), rows, model_.config().vocab,
                 model_.padded_vocab(), reinterpret_cast<const kernels::SamplingParams*>(d + o.par),
                 penalty ? i32(o.hist) : nullptr, penalty ? reinterpret_cast<const int64_t*>(d + o.hs) : nullptr);
}

std::vector<int64_t> GenerationEngine::step(const TokenCallback& on_token) {
  const auto t0 = Clock::now();
  StepPlan p = sched_.plan();
  if (p.empty()) return sched_.commit(p, {});
  const nn::Ctx c = model_.ctx();
  const int64_t S = int64_t(p.seqs.size());
  if (c.dev.is_cuda() && !step_begin_) step_begin_ = std::make_unique<Event>(), step_end_ = std::make_unique<Event>();
  if (step_begin_) step_begin_->record(c.s);
  if (!p.swap_out.empty() || !p.swap_in.empty()) cache_.swap(p.swap_out, p.swap_in, c.s);
  stats_.swapped_out_blocks += int64_t(p.swap_out.size());
  stats_.swapped_in_blocks += int64_t(p.swap_in.size());

  // A small decode step replays a graph captured for its shape: rows padded up to a power of two
  // (a padding row decodes a dummy token at position 0 whose key and value are written nowhere,
  // slot -1), block tables padded to a power-of-two width, and the attention sized for that width.
  // Everything the graph reads is in its own argument buffer, refilled each step.
  const bool graph = max_graph_seqs_ > 0 && p.num_prefill_seqs == 0 && p.history_starts.empty() &&
                     !before_forward_ && S <= max_graph_seqs_;
  int64_t rows = S;
  if (graph) {
    rows = next_pow2(S);
    const int64_t width = next_pow2(p.max_blocks);
    std::vector<int32_t> bt(static_cast<size_t>(rows * width), 0);
    for (int64_t r = 0; r < S; ++r)
      std::copy(p.block_tables.begin() + r * p.max_blocks, p.block_tables.begin() + (r + 1) * p.max_blocks,
                bt.begin() + r * width);
    p.block_tables = std::move(bt);
    p.max_blocks = width;
    p.max_context_len = width * cache_.block_size();
    for (int64_t r = S; r < rows; ++r) {
      p.ids.push_back(0);
      p.positions.push_back(0);
      p.slots.push_back(-1);
      p.context_lens.push_back(1);
      p.query_starts.push_back(p.query_starts.back() + 1);
      p.output_rows.push_back(int32_t(r));
      p.sampling.push_back({});
    }
  }

  ArgPacker pack;
  ArgOffsets o;
  o.ids = pack.add(p.ids);
  o.pos = pack.add(p.positions);
  o.slots = pack.add(p.slots);
  o.seg = pack.add(p.segments);
  o.bt = pack.add(p.block_tables);
  o.ctx = pack.add(p.context_lens);
  o.qs = pack.add(p.query_starts);
  o.rows = pack.add(p.output_rows);
  o.par = pack.add(p.sampling);
  o.hist = pack.add(p.history);
  o.hs = pack.add(p.history_starts);
  o.out = pack.add(std::vector<int32_t>(static_cast<size_t>(rows)));
  const size_t bytes = pack.bytes().size();
  if (!host_args_.defined() || host_args_.nbytes() < bytes) {
    const int64_t cap = int64_t(std::max(bytes, host_args_.defined() ? 2 * host_args_.nbytes() : size_t(1) << 16));
    host_args_ = Tensor::empty({cap}, DType::U8, Device::cpu(), "generation", nullptr, /*pinned=*/c.dev.is_cuda());
    dev_args_ = c.dev.is_cuda() ? Tensor::empty({cap}, DType::U8, c.dev, "generation", c.s) : host_args_;
  }
  std::memcpy(host_args_.data(), pack.bytes().data(), bytes);
  char* d = static_cast<char*>(dev_args_.data());
  if (graph) {
    // Evicting a graph here is safe: the previous step ended waiting for its tokens, so no replay
    // is in flight.
    DecodeGraph& g = graphs_.get({rows, p.max_blocks});
    stats_.graphs_evicted = graphs_.evictions();
    if (!g.args.defined()) g.args = Tensor::empty({int64_t(bytes)}, DType::U8, c.dev, "generation", c.s);
    d = static_cast<char*>(g.args.data());
    copy_bytes_async(d, c.dev, host_args_.data(), Device::cpu(), bytes, c.s);
    // The first use runs eagerly (cuBLAS and the allocator settle their workspaces), the second
    // captures, every later one replays.
    if (g.uses++ == 0) {
      enqueue_step(p, rows, d, o);
    } else {
      if (!g.graph.ready()) {
        g.graph = CudaGraph::capture(c.s, [&] { enqueue_step(p, rows, d, o); });
        ++stats_.graphs_captured;
      }
      g.graph.launch(c.s);
      ++stats_.graph_steps;
    }
  } else {
    if (c.dev.is_cuda()) copy_bytes_async(d, c.dev, host_args_.data(), Device::cpu(), bytes, c.s);
    if (before_forward_) before_forward_();
    enqueue_step(p, rows, d, o);
  }
  if (step_end_) step_end_->record(c.s);
  std::vector<int32_t> tokens(static_cast<size_t>(rows));
  copy_bytes(tokens.data(), Device::cpu(), d + o.out, c.dev, size_t(rows) * sizeof(int32_t), c.s);
  tokens.resize(static_cast<size_t>(S));

  const auto t1 = Clock::now();
  const double ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
  ++stats_.steps;
  stats_.prefill_tokens += p.num_prefill_tokens();
  stats_.decode_tokens += S - p.num_prefill_seqs;
  (p.num_prefill_seqs > 0 ? stats_.prefill_step_ms : stats_.decode_step_ms) += ms;
  if (step_end_ && p.num_prefill_seqs == 0) stats_.decode_device_ms += step_end_->elapsed_ms_since(*step_begin_);
  stats_.occupancy_sum += double(S) / double(sched_.limits().max_seqs);
  stats_.peak_blocks_used = std::max(stats_.peak_blocks_used, cache_.num_blocks() - sched_.free_blocks());
  for (int64_t r = 0; r < S; ++r) {
    const int64_t id = p.seqs[size_t(r)];
    if (sched_.output(id).empty())
      first_token_ms_[size_t(id)] = std::chrono::duration<double, std::milli>(t1 - submitted_[size_t(id)]).count();
  }
  std::vector<int64_t> done = sched_.commit(p, tokens);
  stats_.preemptions = sched_.preemptions();
  stats_.swaps = sched_.swaps();
  if (on_token)
    for (int64_t r = 0; r < S; ++r) on_token(p.seqs[size_t(r)], tokens[size_t(r)]);
  for (int64_t id : done)
    total_ms_[size_t(id)] = std::chrono::duration<double, std::milli>(t1 - submitted_[size_t(id)]).count();
  return done;
}

void GenerationEngine::run(const TokenCallback& on_token) {
  while (!sched_.idle()) step(on_token);
}

GenerationOutput GenerationEngine::output(int64_t id) const {
  GenerationOutput o;
  o.ids = sched_.output(id);
  o.finish = sched_.finish_reason(id);
  o.prompt_tokens = int64_t(sched_.request(id).prompt.size());
  o.first_token_ms = first_token_ms_[size_t(id)];
  o.total_ms = total_ms_[size_t(id)];
  return o;
}

}  // namespace zp::runtime
