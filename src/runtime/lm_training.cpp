#include "runtime/lm_training.h"

#include <algorithm>
#include <map>
#include <memory>
#include <optional>

#include "core/log.h"
#include "io/chat_format.h"
#include "io/instruction_dataset.h"
#include "io/token_dataset.h"
#include "io/tokenizer_files.h"
#include "io/weight_source.h"
#include "models/activation_estimate.h"
#include "models/transformer.h"
#include "parallel/pipeline_partition.h"
#include "runtime/base_fingerprint.h"
#include "runtime/causal_lm_loss.h"
#include "runtime/lora_run.h"
#include "runtime/pipeline_chunks.h"
#include "runtime/training_driver.h"

namespace zp::runtime {

namespace {

// One rank's micro-batch: `rows` rows at consecutive global positions starting at `first`.
struct Batch {
  Tensor ids, targets;  // host int32 [rows * T]; a target < 0 is not trained on
  // Instruction data only (undefined for token files): each token's record within its row (padding
  // -1) and its position within that record, host int32 [rows * T].
  Tensor segments, positions;
};

// A batch's token layout on the device, for the attention of every model chunk: instruction data's
// segments and positions (undefined for token files, whose rows are one stream each).
struct DeviceLayout {
  Tensor segments, positions;  // int32 [rows * T]
  bool defined() const { return segments.defined(); }
};

// The rows of one split (training or validation): windows of token files, or instruction records
// (issue 14; io/instruction_dataset.h).
class LmRows {
 public:
  LmRows(const std::vector<std::string>& files, int64_t T, double from, double to)
      : tokens_(std::make_unique<io::TokenDataset>(files, T, from, to)) {}
  LmRows(const TrainConfig& cfg, const std::vector<std::string>& files, const io::ChatFormatter* formatter,
         std::optional<uint64_t> packing_seed, double from, double to) {
    io::InstructionRowsOptions o;
    o.seq_len = cfg.seq_len;
    o.packing = cfg.packing;
    o.packing_seed = packing_seed;
    o.from = from;
    o.to = to;
    instructions_ = formatter ? std::make_unique<io::InstructionDataset>(files, *formatter, o)
                              : std::make_unique<io::InstructionDataset>(files, o);
    if (!formatter && cfg.chat_template != "auto")
      ZP_REQUIRE(cfg.chat_template == io::chat_template_name(instructions_->chat_template()), files[0],
                 ": records in the ", io::chat_template_name(instructions_->chat_template()),
                 " chat template, but data.chat_template is \"", cfg.chat_template, "\"");
  }

  int64_t size() const { return tokens_ ? tokens_->num_windows() : instructions_->num_rows(); }
  int32_t declared_vocab() const { return tokens_ ? tokens_->max_token_seen_bound() : instructions_->declared_vocab(); }
  void check_vocab(int64_t vocab) const { tokens_ ? tokens_->check_vocab(vocab) : instructions_->check_vocab(vocab); }
  const io::InstructionDataset* instructions() const { return instructions_.get(); }
  std::string describe(const char* split) const {
    if (tokens_) return detail::cat(size(), " ", split, " windows");
    const io::InstructionDataset& d = *instructions_;
    return detail::cat(size(), " ", split, " rows (", d.num_records(), " ", io::chat_template_name(d.chat_template()),
                       " records", d.packing() ? ", packed" : "", ", ", d.truncated_records(), " cut to the row)");
  }

  Batch batch(uint64_t seed, bool shuffle, int64_t first, int64_t rows) const {
    const int64_t T = tokens_ ? tokens_->seq_len() : instructions_->seq_len();
    auto host = [&] { return Tensor::empty({rows * T}, DType::I32, Device::cpu(), "batch"); };
    Batch b;
    b.ids = host();
    b.targets = host();
    if (instructions_) {
      b.segments = host();
      b.positions = host();
    }
    for (int64_t i = 0; i < rows; ++i) {
      const int64_t r = row_at(seed, shuffle, first + i);
      if (tokens_)
        tokens_->window(r, b.ids.data<int32_t>() + i * T, b.targets.data<int32_t>() + i * T);
      else
        instructions_->row(r, {b.ids.data<int32_t>() + i * T, b.targets.data<int32_t>() + i * T,
                               b.segments.data<int32_t>() + i * T, b.positions.data<int32_t>() + i * T});
    }
    return b;
  }

  // What the rows at positions [first, first + rows) hold, counted without reading them: their
  // trained targets (>= 0: every one of a token window's, the unmasked ones of instruction rows) and
  // their tokens that are not padding.
  struct Counts {
    int64_t trained_targets = 0, tokens = 0;
  };
  Counts count(uint64_t seed, bool shuffle, int64_t first, int64_t rows) const {
    if (tokens_) return {rows * tokens_->seq_len(), rows * tokens_->seq_len()};
    Counts c;
    for (int64_t i = 0; i < rows; ++i) {
      const int64_t r = row_at(seed, shuffle, first + i);
      c.trained_targets += instructions_->trained_targets(r);
      c.tokens += instructions_->tokens(r);
    }
    return c;
  }

 private:
  // The window or row at global position `p` of the seeded order (epochs one after the other).
  int64_t row_at(uint64_t seed, bool shuffle, int64_t p) const {
    const int64_t n = size(), epoch = p / n;
    return tokens_ ? tokens_->epoch_order(seed, epoch, p % n, shuffle)
                   : instructions_->epoch_order(seed, epoch, p % n, shuffle);
  }

  std::unique_ptr<io::TokenDataset> tokens_;
  std::unique_ptr<io::InstructionDataset> instructions_;
};

// Every forward of the task: from ids (the first chunk) or from the previous chunk's output, with
// instruction data's token layout (each record attends within itself, positions restart) and the
// micro-batch's dropout draw.
void forward_chunk(models::Transformer& m, const int32_t* ids, Tensor input, const DeviceLayout& layout, int64_t B,
                   int64_t T, models::TransformerActivations& acts, models::ForwardMode mode, nn::DropoutDraw dropout) {
  const nn::TokenLayout tokens = layout.defined()
                                     ? nn::TokenLayout{layout.segments.data<int32_t>(), layout.positions.data<int32_t>()}
                                     : nn::TokenLayout{};
  if (ids)
    m.forward(ids, B, T, acts, mode, dropout, tokens);
  else
    m.forward_hidden(std::move(input), B, T, acts, mode, dropout, tokens);
}

class LmTask final : public TrainingTask, public PipelineStageModel {
 public:
  LmTask(const TrainConfig& cfg, const TrainingPlace& at) : cfg_(cfg), at_(at) {
    // Data first: a missing or bad file is reported before any model memory is allocated.
    if (cfg.data_format == "jsonl") {
      tokenizer_.emplace(io::load_tokenizer(cfg.tokenizer));
      formatter_.emplace(*tokenizer_, io::chat_template_from_name(cfg.chat_template, *tokenizer_, "data.chat_template"));
    }
    const io::ChatFormatter* formatter = formatter_ ? &*formatter_ : nullptr;
    auto rows = [&](const std::vector<std::string>& files, bool training, double from, double to) {
      if (!cfg.instruction_data()) return std::make_unique<LmRows>(files, cfg.seq_len, from, to);
      // Validation rows keep file order, as validation windows do.
      return std::make_unique<LmRows>(cfg, files, formatter,
                                      training && cfg.shuffle ? std::optional<uint64_t>(cfg.seed) : std::nullopt, from,
                                      to);
    };
    train_ds_ = rows(cfg.train_files, true, 0.0, 1.0 - cfg.val_fraction);
    if (!cfg.val_files.empty())
      val_ds_ = rows(cfg.val_files, false, 0.0, 1.0);
    else if (cfg.val_fraction > 0)
      val_ds_ = rows(cfg.train_files, false, 1.0 - cfg.val_fraction, 1.0);
    if (const io::InstructionDataset* d = train_ds_->instructions(); d && d->truncated_records() > 0)
      log_line(LogLevel::Warn, /*all_ranks=*/false,
               detail::cat(cfg.train_files[0], (cfg.train_files.size() > 1 ? " (and the other files)" : ""), ": ",
                           d->truncated_records(), " of ", d->num_records(), " records are longer than data.seq_len ",
                           cfg.seq_len, " and are cut", d->untrained_records() > 0
                               ? detail::cat(" (", d->untrained_records(), " of them keep no response token to train on)")
                               : std::string()));
    std::string source;
    hub_ = cfg.hub_config_json(source);
    mcfg_ = models::TransformerConfig::from_hub_json(hub_, source);
    ZP_REQUIRE(cfg.seq_len <= mcfg_.max_positions || !mcfg_.learned_positions, "data.seq_len ", cfg.seq_len,
               " exceeds the model's ", mcfg_.max_positions, " positions");
    const int32_t file_vocab = train_ds_->declared_vocab();
    // A tokenizer may hold more ids than the model embeds (unused added tokens): its ids are checked
    // one by one instead.
    ZP_REQUIRE(file_vocab == 0 || file_vocab <= mcfg_.vocab || cfg.data_format == "jsonl", cfg.train_files[0],
               ": the token file's vocabulary (", file_vocab, ") is larger than the model's (", mcfg_.vocab, ")");
    // Every id, once, now: an id past the embedding would otherwise stop the run when its window is
    // first drawn, possibly hours in.
    train_ds_->check_vocab(mcfg_.vocab);
    if (!cfg.val_files.empty()) val_ds_->check_vocab(mcfg_.vocab);
    layout_ = lm_chunks(cfg, mcfg_, at.stage(), at.stages());
    lora_ = lora_spec_of(cfg);
  }

  std::vector<nn::ParamBlock*> lay_out_model(int64_t pad_multiple) override {
    std::vector<nn::ParamBlock*> blocks;
    for (const models::LayerSpan& span : layout_.local) {
      chunks_.push_back(std::make_unique<models::Transformer>(mcfg_, at_.dev, cfg_.dtype, at_.s(), pad_multiple,
                                                              /*allocate=*/false, span, lora_));
      for (nn::ParamBlock* b : chunks_.back()->blocks()) blocks.push_back(b);
    }
    if (cfg_.init == "hub") hub_weights_ = io::WeightSource::open(cfg_.hub_dir, "model");
    if (!cfg_.lora_init_from.empty())
      initial_adapter_.emplace(cfg_.lora_init_from, lora_, blocks);
    return blocks;
  }
  // Any chunk initialises or loads any block: values depend on the parameter's name only.
  // LoRA's adapters start from lora.init_from's values, else from PEFT's initialisation, whatever
  // the base came from; the base's fingerprint is taken as its blocks are filled (a tied head's
  // replica is the embedding again).
  void fill_block(nn::ParamBlock& b) override {
    const bool adapters = lora_.r > 0 && !b.frozen();
    if (adapters && initial_adapter_)
      initial_adapter_->fill(b, at_.s());
    else if (hub_weights_ && !adapters)
      chunks_[0]->load_block(*hub_weights_, b);
    else
      chunks_[0]->init_block_random(b, cfg_.seed, cfg_.init_std);
    bool replica = false;
    for (auto& c : chunks_) replica = replica || c->embedding_replica() == &b;
    if (lora_.r > 0 && b.frozen() && !replica) fingerprint_.add(b, at_.s());
  }
  void set_block_access(nn::BlockAccess* access) override {
    for (auto& c : chunks_) c->set_block_access(access);
  }
  PipelineStageModel* pipeline_stage() override { return this; }
  SharedBlock shared_block() override {
    if (!has_shared_blocks()) return {};
    for (auto& c : chunks_) {
      if (nn::ParamBlock* r = c->embedding_replica()) return {r, true};
      if (c->span().embedding) return {c->blocks().front(), false};
    }
    return {};
  }
  // A frozen tied embedding (LoRA) takes no gradients, so its copies need no summing.
  bool has_shared_blocks() const override { return mcfg_.tied && at_.stages() > 1 && lora_.r == 0; }
  int64_t model_position(const nn::ParamBlock& b) const override {
    if (b.name() == "embed") return -1;
    if (b.name() == "head") return mcfg_.layers;
    return std::stoll(b.name().substr(std::string("layer").size()));
  }

  // PipelineStageModel: one micro-batch through one local chunk.
  // Every cut carries the hidden state.
  Tensor boundary_buffer(int /*chunk*/) override {
    return Tensor::empty({cfg_.micro_batch * cfg_.seq_len, mcfg_.hidden}, cfg_.dtype, at_.dev, "activations", at_.s());
  }
  Tensor forward(int chunk, int micro, int64_t step, int64_t first, Tensor input, bool train, float loss_scale) override {
    models::Transformer& m = *chunks_[size_t(chunk)];
    InFlight& f = in_flight_[{micro, chunk}];
    f.loss_scale = loss_scale;
    using models::ForwardMode;
    const ForwardMode mode = !train                           ? ForwardMode::Inference
                             : cfg_.activation_checkpointing ? ForwardMode::TrainCheckpointed
                                                             : ForwardMode::Train;
    const bool first_chunk = m.span().embedding, last_chunk = m.span().head;
    // Every chunk's attention needs instruction data's layout; token files' only the ends need.
    if (first_chunk || last_chunk || cfg_.instruction_data()) {
      const Batch b =
          train ? timed_read([&] { return train_ds_->batch(cfg_.seed, cfg_.shuffle, first, cfg_.micro_batch); })
                : val_ds_->batch(cfg_.seed, false, first, cfg_.micro_batch);
      if (first_chunk) f.ids = b.ids.to(at_.dev, at_.s());
      if (last_chunk) f.targets = b.targets.to(at_.dev, at_.s());
      f.layout = upload_layout(b);
    }
    forward_chunk(m, first_chunk ? f.ids.data<int32_t>() : nullptr, std::move(input), f.layout, cfg_.micro_batch,
                  cfg_.seq_len, f.acts, mode, dropout_draw(step, first));
    if (!last_chunk) {
      Tensor out = f.acts.hidden;
      if (!train) in_flight_.erase({micro, chunk});
      return out;
    }
    f.loss.emplace(f.acts.logits, mcfg_.vocab, f.targets.data<int32_t>(), loss_divisor(train), at_.s());
    return Tensor();
  }
  Tensor backward(int chunk, int micro, Tensor output_grad) override {
    models::Transformer& m = *chunks_[size_t(chunk)];
    InFlight& f = in_flight_.at({micro, chunk});
    if (m.span().head) output_grad = f.loss->backward(f.acts.logits, f.loss_scale);
    Tensor din = m.backward(f.acts, std::move(output_grad));
    if (!m.span().head) in_flight_.erase({micro, chunk});  // the last chunk's loss is read later
    return din;
  }
  // ZB-H1: B leaves the layers' weight gradients in the micro-batch's state (the head's and the
  // embedding's are computed in B: models::Transformer::backward), W computes them.
  Tensor backward_input(int chunk, int micro, Tensor output_grad) override {
    models::Transformer& m = *chunks_[size_t(chunk)];
    InFlight& f = in_flight_.at({micro, chunk});
    if (m.span().head) output_grad = f.loss->backward(f.acts.logits, f.loss_scale);
    return m.backward(f.acts, std::move(output_grad), &f.later);
  }
  void backward_weight(int chunk, int micro) override {
    models::Transformer& m = *chunks_[size_t(chunk)];
    InFlight& f = in_flight_.at({micro, chunk});
    m.backward_weights(f.later);
    if (!m.span().head) in_flight_.erase({micro, chunk});  // the last chunk's loss is read later
  }
  double loss(int micro) override {
    const std::pair<int, int> key{micro, int(chunks_.size()) - 1};
    const double mean = in_flight_.at(key).loss->mean();
    in_flight_.erase(key);
    return mean;
  }

  CheckpointModel checkpoint_model() const override {
    CheckpointModel m;
    m.config_json = cfg_.config_json;
    m.model_config = hub_;
    m.model_family = "transformer";
    set_lora_identity(m, lora_, cfg_, hub_weights_ != nullptr, lora_.r > 0 ? base_fingerprint() : "");
    return m;
  }
  ProgressUnit progress() override { return {"tok", cfg_.seq_len, chunks_[0]->flops_per_token(cfg_.seq_len)}; }
  double activation_bytes() override {
    std::vector<double> chunk_bytes;
    for (const models::LayerSpan& span : layout_.local)
      chunk_bytes.push_back(models::transformer_activation_bytes(mcfg_, cfg_.micro_batch, cfg_.seq_len, cfg_.dtype,
                                                                 cfg_.activation_checkpointing, span));
    return stage_activation_bytes(cfg_, at_.stage(), at_.stages(), chunk_bytes);
  }
  std::string describe() override {
    std::string stages;
    if (at_.stages() > 1)
      stages = detail::cat(" | ", at_.stages(), " pipeline stages (", cfg_.pipeline_schedule, ", ",
                           parallel::partition_str(layout_.bounds), ") x ", at_.data_size(), " data-parallel");
    return detail::cat("model ", mcfg_.model_type, " ", mcfg_.num_parameters() / 1e6, "M parameters, ", mcfg_.layers,
                       " layers, d=", mcfg_.hidden, stages, " | ", at_.world(), " rank(s) on ", at_.dev.str(), " | ",
                       dtype_name(cfg_.dtype), " | global batch ", at_.global_batch, " x ", cfg_.seq_len,
                       " tokens (micro ", cfg_.micro_batch, ", accum ", cfg_.grad_accum, ") | ",
                       train_ds_->describe("training"), lora_summary(lora_, all_blocks()));
  }

  // The step's trained targets over its micro-batches (every data rank's): each micro-batch's loss
  // sum is divided by their average per micro-batch, so the driver's mean over micro-batches and
  // ranks is the mean over every trained target of the step, however the batch is cut. Token
  // windows have the same count in every micro-batch (micro x T: what each divided by before).
  // Instruction rows' tokens that are not padding are the step's throughput.
  std::optional<int64_t> begin_step(int64_t first, int64_t samples) override {
    ZP_CHECK(samples % cfg_.micro_batch == 0, "a step of ", samples, " samples in micro-batches of ", cfg_.micro_batch);
    const LmRows::Counts c = train_ds_->count(cfg_.seed, cfg_.shuffle, first, samples);
    train_divisor_ = double(c.trained_targets) / double(samples / cfg_.micro_batch);
    if (!cfg_.instruction_data()) return std::nullopt;
    return c.tokens;
  }
  double micro_step(int64_t step, int64_t first, float loss_scale) override {
    return forward_backward(
        timed_read([&] { return train_ds_->batch(cfg_.seed, cfg_.shuffle, first, cfg_.micro_batch); }), true,
        loss_scale, dropout_draw(step, first));
  }
  bool has_validation() const override { return val_ds_ != nullptr; }
  double validation_loss(int64_t first) override {
    return forward_backward(val_ds_->batch(cfg_.seed, false, first, cfg_.micro_batch), false, 1.f, {});
  }

 private:
  nn::DropoutDraw dropout_draw(int64_t step, int64_t first) const {
    return lora_dropout_draw(lora_, cfg_.seed, step, first, cfg_.micro_batch);
  }
  std::vector<nn::ParamBlock*> all_blocks() const {
    std::vector<nn::ParamBlock*> b;
    for (const auto& c : chunks_)
      for (nn::ParamBlock* x : c->blocks()) b.push_back(x);
    return b;
  }
  // The fingerprint of the whole base: every stage's part (each fingerprints the blocks it filled).
  // Collective over the pipeline group on the first call, which every rank makes at the same point
  // (the driver's first checkpoint_model(), after the engine filled every block).
  std::string base_fingerprint() const {
    if (fingerprint_hex_) return *fingerprint_hex_;
    fingerprint_hex_ = at_.stages() > 1
                           ? fingerprint_.combined_over(at_.topology->mpi_comm(comm::Group::Pipeline)).hex()
                           : fingerprint_.hex();
    return *fingerprint_hex_;
  }

  // What a micro-batch's loss sum is divided by (CausalLmLoss): in training the step's average of
  // trained targets per micro-batch (begin_step); in validation the same over the validation
  // micro-batches the driver averages (training.eval_batches on every data rank, from position 0).
  double loss_divisor(bool train) {
    if (train) {
      ZP_CHECK(train_divisor_ >= 0, "a training micro-batch before its step began");
      return train_divisor_;
    }
    if (val_divisor_ < 0) {
      const int64_t micro_batches = cfg_.eval_batches * at_.data_size();
      val_divisor_ = double(val_ds_->count(cfg_.seed, false, 0, micro_batches * cfg_.micro_batch).trained_targets) /
                     double(micro_batches);
    }
    return val_divisor_;
  }

  // The model's part of a micro-batch: forward, the next-token loss, and the backward when training.
  double forward_backward(const Batch& b, bool train_step, float loss_scale, nn::DropoutDraw dropout) {
    const Device dev = at_.dev;
    const StreamHandle s = at_.s();
    Tensor ids = b.ids.to(dev, s), tgt = b.targets.to(dev, s);
    const DeviceLayout layout = upload_layout(b);
    using models::ForwardMode;
    models::Transformer& model = *chunks_[0];
    models::TransformerActivations acts;
    if (train_step) forward_begins(s);
    forward_chunk(model, ids.data<int32_t>(), Tensor(), layout, cfg_.micro_batch, cfg_.seq_len, acts,
                  !train_step                     ? ForwardMode::Inference
                  : cfg_.activation_checkpointing ? ForwardMode::TrainCheckpointed
                                                  : ForwardMode::Train,
                  dropout);
    CausalLmLoss lm(acts.logits, mcfg_.vocab, tgt.data<int32_t>(), loss_divisor(train_step), s);
    if (train_step) forward_ends(s);
    if (train_step) model.backward(acts, lm.backward(acts.logits, loss_scale));
    return lm.mean();  // read after the backward is queued, so the GPU never waits for the host
  }

  DeviceLayout upload_layout(const Batch& b) const {
    if (!b.segments.defined()) return {};
    return {b.segments.to(at_.dev, at_.s()), b.positions.to(at_.dev, at_.s())};
  }

  const TrainConfig& cfg_;
  const TrainingPlace& at_;
  // data.format "jsonl": the records are tokenised at start-up with these (the formatter refers to
  // the tokenizer, so it is declared after it).
  std::optional<io::BpeTokenizer> tokenizer_;
  std::optional<io::ChatFormatter> formatter_;
  std::unique_ptr<LmRows> train_ds_, val_ds_;
  io::json hub_;
  models::TransformerConfig mcfg_;
  LmChunks layout_;
  std::vector<std::unique_ptr<models::Transformer>> chunks_;  // one without a pipeline
  std::unique_ptr<io::WeightSource> hub_weights_;
  models::LoraSpec lora_;
  std::optional<models::LoraInitialAdapter> initial_adapter_;
  double train_divisor_ = -1, val_divisor_ = -1;  // loss_divisor(); -1: not counted yet
  BaseFingerprint fingerprint_;  // LoRA: of the frozen blocks this rank filled
  mutable std::optional<std::string> fingerprint_hex_;
  // A pipeline's micro-batches between their forward and backward, by (micro, local chunk).
  struct InFlight {
    Tensor ids, targets;  // device: the first chunk's input, the last chunk's targets
    DeviceLayout layout;  // device, instruction data: every chunk's
    float loss_scale = 1.f;
    models::TransformerActivations acts;
    std::optional<CausalLmLoss> loss;
    models::TransformerWeightGrads later;  // ZB-H1: from the micro-batch's B to its W
  };
  std::map<std::pair<int, int>, InFlight> in_flight_;
};

}  // namespace

std::unique_ptr<TrainingTask> make_lm_task(const TrainConfig& cfg, const TrainingPlace& at) {
  return std::make_unique<LmTask>(cfg, at);
}

TrainResult train(const TrainConfig& cfg, comm::Runtime& rt, MPI_Comm group, bool return_params) {
  return run_training(cfg, rt, group, return_params,
                      [](const TrainConfig& placed, const TrainingPlace& at) { return make_lm_task(placed, at); });
}

}  // namespace zp::runtime
