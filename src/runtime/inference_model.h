// A language model loaded for inference (`zeropipe generate`, `chat`, `eval`; issue 13): the weights,
// the hub config and, when one is found, the tokenizer.
//
// Where it loads from: a hub folder (config.json, model.safetensors or its shards, and tokenizer.json
// or GPT-2's vocab.json + merges.txt beside them), a ZeRO-Pipe weights file (`zeropipe convert`) or a
// training checkpoint (its /model). An .h5 file carries no tokenizer: `tokenizer` names one (a folder
// or a tokenizer.json), else the model runs on token ids alone. A LoRA checkpoint is refused with
// the command that merges it. The model is built with every block allocated on `device` (no ZeRO
// engine: one rank holds the whole model; ranks of an mpirun each hold their own copy and share the
// requests), unless the weights are streamed or sharded (below). `lora` merges an adapter (a PEFT folder, a LoRA checkpoint, a diffusers or kohya-ss file)
// into the weights as they load (io::LoraMergedWeights), so serving it costs nothing per token.
//
// Weight streaming (offload_param "cpu", ZeRO-Inference): the weights stay in pinned host memory and
// each block (a layer, the embedding, the head) is copied up for its use and freed after, the next
// one prefetched on an upload stream while the current one computes (parallel::ParameterGatherer,
// the parameter tier ZeRO-3 training uses), so the GPU holds two layers, the activations and the KV
// cache. begin_forward() before each forward lets the prefetch follow the previous forward's order.
// With offload_param "nvme" the weights live in a swap file under `nvme_path` instead (created at
// start, already unlinked), and host memory holds a few block-sized buffers that read the next
// blocks ahead (parallel/nvme_parameter_shards.h): the same gatherer, on the NVMe tier.
//
// Sharded weights (shard_weights, `--shard-weights`; ZeRO-3 inference): every rank of the mpirun
// keeps only its 1/N slice of every block, as ZeRO-3 training does, and the gatherer all-gathers each
// block over the world for its use (prefetching the next on a GPU), so the model needs 1/N of its
// weights per rank plus two gathered blocks. Loading reads only this rank's slice of each block from
// the files (io::WeightSource::read_range), so a rank reads about 1/N of the model from the disk and
// never holds more than its shards and one slice. The
// shards live on the device, or with offload_param "cpu" / "nvme" in pinned host memory / a swap file
// per rank, the gathers then copying each shard up first. The ranks still share the requests, but
// every forward is now a collective: each one starts with a vote on a control communicator
// (forward_hook), and a rank done with its own requests calls join_until_every_rank_is_done(), which
// runs empty forwards (the gathers alone) until every rank has voted done.
#pragma once
#include <mpi.h>

#include <functional>
#include <memory>
#include <string>

#include "core/device.h"
#include "io/bpe_tokenizer.h"
#include "models/transformer.h"

namespace zp::comm {
class Communicator;
}  // namespace zp::comm

namespace zp::parallel {
class CollectiveStream;
class ParameterGatherer;
}  // namespace zp::parallel

namespace zp::runtime {

struct InferenceModelOptions {
  std::string model;          // hub folder, weights .h5 or checkpoint .h5
  std::string tokenizer;      // "" = the model folder's, if it has one
  std::string device = "auto";  // cpu | cuda | auto (cuda when there is a GPU)
  std::string dtype = "auto";   // fp32 | bf16 | fp16 | auto (bf16 on a GPU, fp32 on the cpu) (| fp64 on the cpu)
  std::string offload_param = "none";  // none | cpu | nvme (zero_optimization.offload_param.device's names)
  std::string nvme_path;               // the swap file's directory, with offload_param "nvme" (--nvme-path)
  int nvme_buffer_count = 5;           // its block-sized host buffers (offload_param.buffer_count's default)
  std::string lora;                    // "" or a LoRA adapter merged into the weights as they load
  bool shard_weights = false;          // ZeRO-3 shards over MPI_COMM_WORLD (--shard-weights)
};

class InferenceModel {
 public:
  // Throws zp::Error naming the path and what is wrong (no such file, not a language model, a LoRA
  // checkpoint, a bad device or dtype, no GPU for --device cuda).
  explicit InferenceModel(const InferenceModelOptions& options);
  ~InferenceModel();
  InferenceModel(const InferenceModel&) = delete;
  InferenceModel& operator=(const InferenceModel&) = delete;

  models::Transformer& model() { return *model_; }
  const models::TransformerConfig& config() const { return model_->config(); }
  // nullptr when no tokenizer was found (the model then reads and writes token ids only).
  const io::BpeTokenizer* tokenizer() const { return tokenizer_.get(); }
  Device device() const { return dev_; }
  DType dtype() const { return dt_; }
  StreamHandle stream() const { return s_; }
  const std::string& source() const { return source_; }  // the path it was loaded from
  const std::string& tokenizer_source() const { return tokenizer_source_; }  // "" without one
  bool streams_weights() const { return gatherer_ != nullptr; }
  // The ranks the weights are sharded over (1 unless shard_weights).
  int weight_shards() const { return weight_shards_; }
  // Bytes of weights this rank holds: its shards (on their tier) when streamed or sharded, else the
  // whole model.
  int64_t resident_weight_bytes() const;
  // Bytes of tensor data read from the weight files while loading (io::WeightSource::bytes_read).
  int64_t weight_bytes_read() const { return weight_bytes_read_; }
  // Bytes one forward copies up from host memory (a streamed model's weights; 0 otherwise).
  int64_t streamed_bytes_per_forward() const;
  // Before each forward: a streamed model's prefetch follows the previous forward's block order.
  void begin_forward();
  // begin_forward as the engines' before-forward callback; empty when the weights are resident (so
  // the generation engine may replay decode steps as CUDA graphs). Sharded weights keep decode off
  // CUDA graphs too, and must: a forward's gathers are issued from the host as each block is acquired
  // (reference counts, the learned prefetch order) and each forward begins with the vote below, none
  // of which a replayed graph would do.
  std::function<void()> forward_hook() {
    if (!gatherer_) return {};
    if (control_ != MPI_COMM_NULL)  // sharded
      return [this] {
        any_rank_forwarding(true);
        begin_forward();
      };
    return [this] { begin_forward(); };
  }
  // Sharded weights: after this rank's own last forward (through forward_hook), runs empty forwards
  // with the others' until every rank is past its last one; a no-op otherwise. Every rank calls it
  // the same number of times (after each batch of work the ranks share).
  void join_until_every_rank_is_done();

 private:
  std::string source_, tokenizer_source_;
  Device dev_;
  DType dt_ = DType::F32;
  Stream stream_;  // the compute stream (a CUDA model)
  StreamHandle s_ = nullptr;
  // Whether any rank still runs a forward of its own (an MPI_LOR over control_), this rank's `mine`.
  bool any_rank_forwarding(bool mine);
  int weight_shards_ = 1;
  int64_t weight_bytes_read_ = 0;
  std::unique_ptr<comm::Communicator> world_;  // the weights' data group, with shard_weights
  MPI_Comm control_ = MPI_COMM_NULL;            // the forwards' votes, apart from every other message
  std::unique_ptr<parallel::CollectiveStream> collective_;
  std::unique_ptr<parallel::ParameterGatherer> gatherer_;
  std::unique_ptr<models::Transformer> model_;
  std::unique_ptr<io::BpeTokenizer> tokenizer_;
};

// "cpu" | "cuda" | "auto" -> the device (cuda: the GPU bootstrap picked for this rank, else device 0);
// "fp32" | "bf16" | "fp16" | "fp64" | "auto" -> the dtype. Throws zp::Error naming the option.
Device inference_device(const std::string& name);
DType inference_dtype(const std::string& name, Device dev);

}  // namespace zp::runtime
