// Generation with a paged KV cache and continuous batching (issue 13): requests are submitted, each
// step runs every running sequence's next token and the prompts of those joining as one batch
// (runtime/generation_scheduler.h decides), the model's cached forward writes keys and values into
// the cache (models::Transformer::forward_cached), and one token per sequence is sampled on the
// device (kernels/sampling.h). A request's tokens depend on its prompt, its settings and its seed;
// with a fixed batch layout the results are bitwise reproducible.
#pragma once
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "core/cuda_graph.h"
#include "core/lru_cache.h"
#include "models/transformer.h"
#include "nn/paged_kv_cache.h"
#include "runtime/generation_scheduler.h"

namespace zp::runtime {

struct GenerationOptions {
  int64_t block_size = 16;
  // Bytes of KV cache; 0: on a GPU, what is free after the weights less the activations of a full
  // step; on the CPU, enough for max_seqs sequences of the model's full context, at most 1 GiB.
  int64_t kv_cache_bytes = 0;
  // Bytes of host memory (pinned on a GPU) that preempted sequences' keys and values are swapped to,
  // so they resume without prefilling again; 0: they are recomputed.
  int64_t kv_swap_bytes = 0;
  int64_t max_batch_tokens = 8192;
  int64_t max_seqs = 256;
  // Decode steps of up to max_graph_seqs sequences (padded up to a power of two) replay a captured
  // CUDA graph instead of launching their kernels one by one (core/cuda_graph.h); 0 turns it off.
  // Not with streamed or sharded weights (a before-forward hook) or a repetition penalty, and never
  // for steps with prompts.
  int64_t max_graph_seqs = 64;
  // How many decode graphs stay cached (each holds its executable and its argument buffer on the
  // GPU); beyond it the least recently used shape's graph is dropped, to be captured again if the
  // shape comes back. 0: two per row count (a power of two up to max_graph_seqs), so each row count
  // keeps its current block-table width and the next one up as contexts grow into it.
  int64_t max_graphs = 0;
};

struct GenerationOutput {
  std::vector<int32_t> ids;
  FinishReason finish = FinishReason::None;
  int64_t prompt_tokens = 0;
  double first_token_ms = 0, total_ms = 0;  // from submission
};

// What the engine did so far (telemetry).
struct GenerationStats {
  int64_t steps = 0, prefill_tokens = 0, decode_tokens = 0, preemptions = 0;
  int64_t swaps = 0;                     // preemptions whose blocks went to the swap space
  int64_t swapped_out_blocks = 0, swapped_in_blocks = 0;
  int64_t peak_blocks_used = 0;
  int64_t graph_steps = 0, graphs_captured = 0;  // decode steps replayed from CUDA graphs
  int64_t graphs_evicted = 0;                    // graphs dropped for the cache's capacity
  double prefill_step_ms = 0, decode_step_ms = 0;  // wall time of steps with / without prompts
  // GPUs: the decode steps' device time, from the upload of their arguments to their sampled tokens
  // (events on the stream); what decode_step_ms has beyond it is the host's share of a step (planning,
  // launching, and reading the tokens back) while the GPU waits.
  double decode_device_ms = 0;
  double occupancy_sum = 0;                        // sum over steps of running sequences / max_seqs
};

class GenerationEngine {
 public:
  // The model's blocks are resident, or streamed or gathered by an InferenceModel (whose forward_hook
  // goes to set_before_forward). Throws zp::Error when the cache cannot hold one block.
  GenerationEngine(models::Transformer& model, const io::BpeTokenizer* tokenizer, const GenerationOptions& options);
  ~GenerationEngine();

  int64_t submit(GenerationRequest request);
  // Called before each step's forward (a streamed model's InferenceModel::begin_forward).
  void set_before_forward(std::function<void()> f) { before_forward_ = std::move(f); }
  // One step; on_token(id, token) is called for each sampled token in row order. Returns the
  // requests that finished in it.
  using TokenCallback = std::function<void(int64_t id, int32_t token)>;
  std::vector<int64_t> step(const TokenCallback& on_token = {});
  // Steps until every submitted request is done.
  void run(const TokenCallback& on_token = {});
  bool idle() const { return sched_.idle(); }
  GenerationOutput output(int64_t id) const;
  const GenerationStats& stats() const { return stats_; }
  const GenerationScheduler& scheduler() const { return sched_; }
  int64_t cache_blocks() const { return cache_.num_blocks(); }
  int64_t cache_bytes() const { return cache_.bytes_per_token() * cache_.block_size() * cache_.num_blocks(); }
  int64_t swap_blocks() const { return cache_.host_blocks(); }
  // Decode graphs cached now (at most GenerationOptions::max_graphs, as derived).
  int64_t cached_graphs() const { return graphs_.size(); }
  int64_t graph_capacity() const { return graphs_.capacity(); }

 private:
  using Clock = std::chrono::steady_clock;
  GenerationEngine(models::Transformer& model, const io::BpeTokenizer* tokenizer, const GenerationOptions& options,
                   int64_t blocks);
  models::Transformer& model_;
  nn::PagedKvCache cache_;
  GenerationScheduler sched_;
  GenerationStats stats_;
  Tensor host_args_, dev_args_;  // one upload per step
  std::unique_ptr<Event> step_begin_, step_end_;  // GPUs: around each step's device work
  // Runs the step's forward and sampling from the arguments at `d` (laid out as `o`).
  struct ArgOffsets {
    size_t ids, pos, slots, seg, bt, ctx, qs, rows, par, hist, hs, out;
  };
  void enqueue_step(const StepPlan& p, int64_t rows, char* d, const ArgOffsets& o);
  // A decode graph: for `rows` padded rows and block tables `max_blocks` wide, its own argument
  // buffer (the graph reads its arguments there) and, from its second use on, the graph.
  struct DecodeGraph {
    Tensor args;
    CudaGraph graph;
    int64_t uses = 0;
  };
  LruCache<std::pair<int64_t, int64_t>, DecodeGraph> graphs_;  // by (rows, block-table width)
  int64_t max_graph_seqs_ = 0;
  std::function<void()> before_forward_;
  std::vector<Clock::time_point> submitted_;
  std::vector<double> first_token_ms_, total_ms_;
};

// The KV cache blocks `options` gives `model` on its device (see GenerationOptions::kv_cache_bytes).
int64_t kv_cache_blocks(const models::Transformer& model, const GenerationOptions& options);
// The blocks of swap space GenerationOptions::kv_swap_bytes holds.
int64_t kv_swap_blocks(const models::Transformer& model, const GenerationOptions& options);

}  // namespace zp::runtime
