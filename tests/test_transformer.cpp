// The transformer's per-call activations and the causal-LM objective (models/transformer.h,
// runtime/causal_lm_loss.h): micro-batches in flight at once (forward A, forward B, backward B,
// backward A) give the gradients of running them one after the other, with and without activation
// checkpointing; an inference forward keeps nothing for a backward (the allocator's
// "saved" tag, nn::kSavedTag, never rises) and gives the training forward's logits; the objective is
// the mean next-token cross-entropy and writes its gradient over the logits.
#include <cmath>
#include <map>
#include <optional>

#include "core/allocator.h"
#include "models/activation_estimate.h"
#include "models/transformer.h"
#include "runtime/causal_lm_loss.h"
#include "test_util.h"
#include "tiny_llama_config.h"

namespace zp::test {
using models::ForwardMode;
using models::Transformer;
using models::TransformerActivations;

namespace {

constexpr int64_t kB = 2, kT = 12;

models::TransformerConfig tiny_config(const std::string& type) {
  // GPT-2: tied head, learned positions, LayerNorm, GELU; Llama: untied, RoPE, grouped-query heads,
  // RMSNorm, SwiGLU. Both vocabularies are padded (100 and 70 -> 128).
  const nlohmann::json hub = type == "gpt2"
                                 ? nlohmann::json{{"model_type", "gpt2"}, {"vocab_size", 100}, {"n_positions", 32},
                                                  {"n_embd", 32}, {"n_layer", 2}, {"n_head", 2}}
                                 : tiny_llama();
  return models::TransformerConfig::from_hub_json(hub, type);
}

// One micro-batch on the device: ids, their next tokens as targets (the last position of each
// sequence and a few others ignored) and how many targets count.
struct Batch {
  Tensor ids, targets;
  int64_t valid = 0;
};

Batch make_batch(uint64_t seed, int64_t vocab, Device dev) {
  std::mt19937_64 g(seed);
  std::vector<float> ids(size_t(kB * kT)), tgt(ids.size());
  for (auto& x : ids) x = float(g() % uint64_t(vocab));
  Batch b;
  for (int64_t s = 0; s < kB; ++s)
    for (int64_t t = 0; t < kT; ++t) {
      const size_t i = size_t(s * kT + t);
      const bool ignored = t + 1 == kT || g() % 5 == 0;
      tgt[i] = ignored ? -1.f : ids[i + 1];
      b.valid += !ignored;
    }
  b.ids = upload(ids, DType::I32, dev);
  b.targets = upload(tgt, DType::I32, dev);
  return b;
}

std::unique_ptr<Transformer> make_model(const std::string& type, Device dev, DType dt) {
  auto m = std::make_unique<Transformer>(tiny_config(type), dev, dt);
  m->init_random(7, 0.2);  // large enough weights that every gradient is far from zero
  return m;
}

// What one schedule of forwards and backwards produced: every block's fp32 gradient buffer (from
// zero) and each micro-batch's mean loss.
struct Grads {
  std::vector<std::string> blocks;
  std::vector<std::vector<float>> grads;
  std::vector<double> losses;
};

// steps: "f0" forwards micro-batch 0 in modes[0], "b0" runs its objective's and the model's backward;
// split (ZB-H1), "i0" runs the backward leaving the layers' weight gradients, "w0" computes them.
Grads run_schedule(Transformer& m, const std::vector<Batch>& batches, const std::vector<ForwardMode>& modes,
                   const std::vector<std::string>& steps) {
  for (nn::ParamBlock* b : m.blocks()) b->zero_grad(m.ctx().s);
  std::vector<TransformerActivations> acts(batches.size());
  std::vector<models::TransformerWeightGrads> later(batches.size());
  std::vector<std::optional<runtime::CausalLmLoss>> losses(batches.size());
  for (const std::string& step : steps) {
    const size_t i = size_t(step[1] - '0');
    if (step[0] == 'f') {
      m.forward(batches[i].ids.data<int32_t>(), kB, kT, acts[i], modes[i]);
      EXPECT_TRUE(acts[i].awaiting_backward());
      losses[i].emplace(acts[i].logits, m.config().vocab, batches[i].targets.data<int32_t>(), batches[i].valid,
                        m.ctx().s);
    } else if (step[0] == 'w') {
      EXPECT_TRUE(later[i].pending());
      m.backward_weights(later[i]);
      EXPECT_FALSE(later[i].pending());
    } else {
      m.backward(acts[i], losses[i]->backward(acts[i].logits, 2.f), step[0] == 'i' ? &later[i] : nullptr);
      EXPECT_FALSE(acts[i].awaiting_backward());
      EXPECT_FALSE(acts[i].logits.defined()) << "the backward consumes the activations";
    }
  }
  for (const auto& l : later) EXPECT_FALSE(l.pending()) << "a split backward's weight gradients were left";
  Grads r;
  for (auto& l : losses) r.losses.push_back(l->mean());
  for (nn::ParamBlock* b : m.blocks()) {
    r.blocks.push_back(b->name());
    r.grads.push_back(download(b->grads()));
  }
  return r;
}

// tol = 0: bit for bit (the CPU); else the relative error of each block's gradient.
void expect_same_grads(const Grads& got, const Grads& want, double tol, const std::string& what) {
  ASSERT_EQ(got.grads.size(), want.grads.size()) << what;
  for (size_t k = 0; k < want.grads.size(); ++k) {
    ASSERT_EQ(got.grads[k].size(), want.grads[k].size());
    double norm = 0;
    for (float g : want.grads[k]) norm += double(g) * g;
    EXPECT_GT(norm, 0.0) << what << ": block " << want.blocks[k] << " got no gradient";
    if (tol == 0)
      EXPECT_EQ(got.grads[k], want.grads[k]) << what << ": gradient of block " << want.blocks[k];
    else
      EXPECT_LE(rel_error(got.grads[k], want.grads[k]), tol) << what << ": gradient of block " << want.blocks[k];
  }
}

// Gradients accumulate in the order the backwards run, so the interleaved schedule (backward B, then
// A) is compared bit for bit with "B then A" one after the other, and with "A then B" to the
// rounding of adding two micro-batches' gradients in the other order. tol: see expect_same_grads.
void expect_interleaving_changes_nothing(Device dev, DType dt, double tol) {
  for (const std::string type : {"gpt2", "llama"}) {
    auto m = make_model(type, dev, dt);
    const std::vector<Batch> batches = {make_batch(1, m->config().vocab, dev), make_batch(2, m->config().vocab, dev)};
    const std::vector<ForwardMode> plain = {ForwardMode::Train, ForwardMode::Train};
    const Grads a_then_b = run_schedule(*m, batches, plain, {"f0", "b0", "f1", "b1"});
    const Grads b_then_a = run_schedule(*m, batches, plain, {"f1", "b1", "f0", "b0"});
    const std::string where = type + " " + dev.str() + " " + std::string(dtype_name(dt));
    expect_same_grads(b_then_a, a_then_b, dt == DType::F32 ? 1e-6 : 1e-5, where + " B then A vs A then B");
    const std::vector<std::pair<std::string, std::vector<ForwardMode>>> cases = {
        {"plain", plain},
        {"checkpointed", {ForwardMode::TrainCheckpointed, ForwardMode::TrainCheckpointed}},
        {"A checkpointed, B plain", {ForwardMode::TrainCheckpointed, ForwardMode::Train}}};
    for (const auto& [name, modes] : cases) {
      const std::string what = where + " " + name;
      const Grads inter = run_schedule(*m, batches, modes, {"f0", "f1", "b1", "b0"});
      EXPECT_EQ(inter.losses, a_then_b.losses) << what << ": each micro-batch's loss";
      expect_same_grads(inter, b_then_a, tol, what + " interleaved vs B then A");
      expect_same_grads(inter, a_then_b, std::max(tol, dt == DType::F32 ? 1e-6 : 1e-5),
                        what + " interleaved vs A then B");
    }
  }
}

// ZB-H1's split backward: B ("i") computes the input gradient, the head's and the embedding's
// gradients and leaves every layer block's untouched; W ("w") adds the layers' weight gradients.
// Split, in any order of the W passes and mixed with whole backwards, the gradients are the whole
// backward's (to the rounding of adding the norms' weight gradients from scratch), and so are the
// losses; bit for bit where a micro-batch's gradients reach zeroed buffers (the CPU; on the GPU the
// embedding's backward adds with atomics, in an order that varies).
void expect_split_backward_is_the_backward(Device dev, DType dt) {
  const double tol = dt == DType::F32 ? 1e-6 : 1e-5, exact = dev.is_cuda() ? tol : 0;
  for (const std::string type : {"gpt2", "llama"}) {
    auto m = make_model(type, dev, dt);
    const std::vector<Batch> batches = {make_batch(1, m->config().vocab, dev), make_batch(2, m->config().vocab, dev)};
    const std::vector<ForwardMode> plain = {ForwardMode::Train, ForwardMode::Train};
    const std::string where = type + " " + std::string(dtype_name(dt));
    // Only B: the layers' blocks hold no gradient yet.
    {
      for (nn::ParamBlock* b : m->blocks()) b->zero_grad(m->ctx().s);
      TransformerActivations acts;
      models::TransformerWeightGrads later;
      m->forward(batches[0].ids.data<int32_t>(), kB, kT, acts);
      runtime::CausalLmLoss loss(acts.logits, m->config().vocab, batches[0].targets.data<int32_t>(), batches[0].valid,
                                 m->ctx().s);
      m->backward(acts, loss.backward(acts.logits, 2.f), &later);
      ASSERT_TRUE(later.pending());
      for (nn::ParamBlock* b : m->blocks()) {
        double norm = 0;
        for (float g : download(b->grads())) norm += double(g) * g;
        if (b->name().rfind("layer", 0) == 0)
          EXPECT_EQ(norm, 0.0) << where << ": B wrote block " << b->name() << "'s gradients";
        else
          EXPECT_GT(norm, 0.0) << where << ": B left block " << b->name() << "'s gradients (the head and embedding's stay in B)";
      }
      m->backward_weights(later);
    }
    const Grads one = run_schedule(*m, {batches[0]}, plain, {"f0", "b0"});
    expect_same_grads(run_schedule(*m, {batches[0]}, plain, {"f0", "i0", "w0"}), one, exact, where + " one micro-batch");
    const Grads whole = run_schedule(*m, batches, plain, {"f0", "f1", "b1", "b0"});
    const std::vector<std::pair<std::string, std::vector<std::string>>> orders = {
        {"B B W W", {"f0", "f1", "i1", "i0", "w1", "w0"}},
        {"W in 1F1B order", {"f0", "f1", "i1", "w1", "i0", "w0"}},
        {"W of the first micro-batch last", {"f0", "i0", "f1", "i1", "w1", "w0"}},
        {"a whole backward between B and W", {"f0", "i0", "f1", "b1", "w0"}}};
    for (const auto& [name, steps] : orders) {
      const Grads got = run_schedule(*m, batches, plain, steps);
      EXPECT_EQ(got.losses, whole.losses) << where << " " << name;
      expect_same_grads(got, whole, tol, where + " " + name);
    }
    const std::vector<ForwardMode> checkpointed = {ForwardMode::TrainCheckpointed, ForwardMode::Train};
    expect_same_grads(run_schedule(*m, batches, checkpointed, {"f0", "f1", "i1", "i0", "w1", "w0"}), whole, tol,
                      where + " checkpointed, split");
  }
}

// Bytes under `tag` now, and the most since the peak was reset.
size_t current(const Allocator& a, const std::string& tag) {
  const MemoryStats s = a.stats();
  auto it = s.current_by_tag.find(tag);
  return it == s.current_by_tag.end() ? 0 : it->second;
}
size_t peak(const Allocator& a, const std::string& tag) {
  const MemoryStats s = a.stats();
  auto it = s.peak_by_tag.find(tag);
  return it == s.peak_by_tag.end() ? 0 : it->second;
}

// An inference forward never allocates under the saved tag and leaves only the logits behind; its
// logits are the training forward's, bit for bit. A training forward keeps memory under the saved
// tag (less with checkpointing) until its backward, which frees all of it.
void expect_inference_saves_nothing(Device dev, DType dt) {
  const std::string saved = nn::kSavedTag;
  for (const std::string type : {"gpt2", "llama"}) {
    const std::string what = type + " " + dev.str() + " " + std::string(dtype_name(dt));
    auto m = make_model(type, dev, dt);
    const Batch b = make_batch(3, m->config().vocab, dev);
    Allocator& alloc = allocator_for(dev);
    const size_t saved0 = current(alloc, saved), act0 = current(alloc, "activations");

    alloc.reset_peak();
    TransformerActivations inf;
    m->forward(b.ids.data<int32_t>(), kB, kT, inf, ForwardMode::Inference);
    EXPECT_EQ(peak(alloc, saved), saved0) << what << ": the inference forward allocated saved activations";
    EXPECT_EQ(current(alloc, "activations") - act0, inf.logits.nbytes()) << what << ": only the logits remain";
    EXPECT_FALSE(inf.awaiting_backward());
    const size_t inference_peak = peak(alloc, "activations") - act0;

    std::vector<size_t> kept;
    for (ForwardMode mode : {ForwardMode::Train, ForwardMode::TrainCheckpointed}) {
      alloc.reset_peak();
      TransformerActivations train;
      m->forward(b.ids.data<int32_t>(), kB, kT, train, mode);
      kept.push_back(current(alloc, saved) - saved0);
      EXPECT_GT(peak(alloc, saved), saved0) << what << ": a training forward keeps activations";
      EXPECT_LT(inference_peak, peak(alloc, saved) - saved0 + peak(alloc, "activations") - act0) << what;
      EXPECT_EQ(download(inf.logits), download(train.logits)) << what << ": inference and training logits";
      runtime::CausalLmLoss loss(train.logits, m->config().vocab, b.targets.data<int32_t>(), b.valid, m->ctx().s);
      m->backward(train, loss.backward(train.logits));
      EXPECT_EQ(current(alloc, saved), saved0) << what << ": the backward frees what the forward kept";
    }
    EXPECT_LT(kept[1], kept[0]) << what << ": checkpointing keeps less";
    EXPECT_GT(kept[1], 0u) << what << ": checkpointing keeps the layer inputs";
  }
}

}  // namespace

// A model cut into pipeline stages (models::LayerSpan), each stage's output fed to the next and the
// input gradients back, computes the whole model's logits bit for bit and its gradients; a tied
// embedding's two copies (first stage, last stage's replica) sum to the whole model's gradient.
TEST(TransformerStages, StagesChainedAreTheWholeModel) {
  const Device dev = Device::cpu();
  for (const std::string type : {"gpt2", "llama"}) {
    auto whole = make_model(type, dev, DType::F32);
    const models::TransformerConfig cfg = whole->config();
    // Uneven: the embedding and layer 0; layer 1; no layer, only the head.
    const std::vector<models::LayerSpan> spans = {{0, 1, true, false}, {1, 2, false, false}, {2, 2, false, true}};
    std::vector<std::unique_ptr<Transformer>> stages;
    for (const auto& sp : spans) {
      stages.push_back(std::make_unique<Transformer>(cfg, dev, DType::F32, nullptr, 1, true, sp));
      stages.back()->init_random(7, 0.2);
      for (nn::ParamBlock* b : stages.back()->blocks()) b->zero_grad(nullptr);
    }
    EXPECT_EQ(stages[2]->embedding_replica() != nullptr, cfg.tied) << type;
    EXPECT_EQ(stages[0]->embedding_replica(), nullptr);
    EXPECT_EQ(stages[1]->blocks().size(), 1u) << "a middle stage holds its layers only";
    const Batch b = make_batch(5, cfg.vocab, dev);

    const Grads want = run_schedule(*whole, {b}, {ForwardMode::Train}, {"f0", "b0"});
    std::vector<TransformerActivations> acts(3);
    stages[0]->forward(b.ids.data<int32_t>(), kB, kT, acts[0], ForwardMode::Train);
    ASSERT_TRUE(acts[0].hidden.defined());
    EXPECT_FALSE(acts[0].logits.defined());
    stages[1]->forward_hidden(acts[0].hidden, kB, kT, acts[1], ForwardMode::TrainCheckpointed);
    stages[2]->forward_hidden(acts[1].hidden, kB, kT, acts[2], ForwardMode::Train);
    runtime::CausalLmLoss loss(acts[2].logits, cfg.vocab, b.targets.data<int32_t>(), b.valid, nullptr);
    EXPECT_EQ(loss.mean(), want.losses[0]) << type;
    Tensor d = stages[2]->backward(acts[2], loss.backward(acts[2].logits, 2.f));
    d = stages[1]->backward(acts[1], d);
    ASSERT_TRUE(d.defined());
    EXPECT_FALSE(stages[0]->backward(acts[0], d).defined()) << "the first stage has no input gradient";

    std::map<std::string, std::vector<float>> got;
    for (auto& st : stages)
      for (nn::ParamBlock* blk : st->blocks()) {
        std::vector<float> g = download(blk->grads());
        auto [it, fresh] = got.emplace(blk->name(), g);
        if (!fresh)  // the tied embedding's replica: the runtime sums the two copies
          for (size_t i = 0; i < g.size(); ++i) it->second[i] += g[i];
      }
    ASSERT_EQ(got.size(), want.blocks.size()) << type;
    for (size_t k = 0; k < want.blocks.size(); ++k)
      EXPECT_LE(rel_error(got[want.blocks[k]], want.grads[k]), 1e-6) << type << ": block " << want.blocks[k];
  }
}

TEST(TransformerActivations, InterleavedMicroBatchesMatchSequentialCpu) {
  expect_interleaving_changes_nothing(Device::cpu(), DType::F32, 0);
  expect_interleaving_changes_nothing(Device::cpu(), DType::BF16, 0);
}

// On the GPU the embedding's backward adds rows with fp32 atomics, whose order (and so the last bits)
// varies from run to run.
TEST(TransformerActivationsGpu, InterleavedMicroBatchesMatchSequential) {
  ZP_SKIP_WITHOUT_GPU();
  expect_interleaving_changes_nothing(Device::cuda(0), DType::F32, 1e-6);
  expect_interleaving_changes_nothing(Device::cuda(0), DType::BF16, 1e-5);
}

TEST(TransformerActivations, SplitBackwardIsTheBackwardCpu) {
  expect_split_backward_is_the_backward(Device::cpu(), DType::F32);
  expect_split_backward_is_the_backward(Device::cpu(), DType::BF16);
}

TEST(TransformerActivationsGpu, SplitBackwardIsTheBackward) {
  ZP_SKIP_WITHOUT_GPU();
  expect_split_backward_is_the_backward(Device::cuda(0), DType::F32);
  expect_split_backward_is_the_backward(Device::cuda(0), DType::BF16);
}

TEST(TransformerActivations, InferenceSavesNothingCpu) {
  expect_inference_saves_nothing(Device::cpu(), DType::F32);
  expect_inference_saves_nothing(Device::cpu(), DType::BF16);
}

TEST(TransformerActivationsGpu, InferenceSavesNothing) {
  ZP_SKIP_WITHOUT_GPU();
  expect_inference_saves_nothing(Device::cuda(0), DType::F32);
  expect_inference_saves_nothing(Device::cuda(0), DType::BF16);
}

TEST(TransformerActivations, BackwardNeedsATrainingForward) {
  auto m = make_model("llama", Device::cpu(), DType::F32);
  const Batch b = make_batch(4, m->config().vocab, Device::cpu());
  TransformerActivations inf;
  m->forward(b.ids.data<int32_t>(), kB, kT, inf, ForwardMode::Inference);
  EXPECT_DEATH(m->backward(inf, inf.logits), "inference forward");
  TransformerActivations none;
  EXPECT_DEATH(m->backward(none, inf.logits), "without a training forward");
}

// The objective by hand in double: mean over the valid targets of logsumexp(row[:V]) - row[target],
// and dlogits = scale / num_valid * (softmax - onehot) over the real columns, 0 elsewhere.
TEST(CausalLmLoss, MeanNextTokenCrossEntropyAndItsGradientInPlace) {
  const int64_t N = 6, V = 5, ld = 8;
  const std::vector<float> x = randn(size_t(N * ld), 11, 2.f);
  const std::vector<int32_t> targets = {3, -1, 0, 4, -1, 1};
  const int64_t valid = 4;
  Tensor logits = Tensor::empty({N, ld}, DType::F32, Device::cpu());
  std::copy(x.begin(), x.end(), logits.data<float>());
  Tensor tgt = Tensor::empty({N}, DType::I32, Device::cpu());
  std::copy(targets.begin(), targets.end(), tgt.data<int32_t>());

  runtime::CausalLmLoss lm(logits, V, tgt.data<int32_t>(), valid);
  double want = 0;
  std::vector<double> lse(static_cast<size_t>(N));
  for (int64_t n = 0; n < N; ++n) {
    double mx = -INFINITY, s = 0;
    for (int64_t c = 0; c < V; ++c) mx = std::max(mx, double(x[size_t(n * ld + c)]));
    for (int64_t c = 0; c < V; ++c) s += std::exp(double(x[size_t(n * ld + c)]) - mx);
    lse[size_t(n)] = mx + std::log(s);
    if (targets[size_t(n)] >= 0) want += lse[size_t(n)] - double(x[size_t(n * ld + targets[size_t(n)])]);
  }
  want /= double(valid);
  EXPECT_NEAR(lm.mean(), want, 1e-6 * std::abs(want));
  EXPECT_EQ(download(lm.losses())[1], 0.f) << "an ignored target";

  const float scale = 3.f;
  Tensor d = lm.backward(logits, scale);
  EXPECT_EQ(d.data(), logits.data()) << "in place";
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < ld; ++c) {
      const int32_t t = targets[size_t(n)];
      double g = 0;
      if (t >= 0 && c < V)
        g = scale / double(valid) * (std::exp(double(x[size_t(n * ld + c)]) - lse[size_t(n)]) - (c == t ? 1.0 : 0.0));
      EXPECT_NEAR(d.data<float>()[n * ld + c], g, 1e-6) << "row " << n << " column " << c;
    }
  EXPECT_DEATH(lm.backward(logits, scale), "second backward");
}

// Masked data's weighting across micro-batches: cut one batch of 16 positions (8 valid targets) into
// two micro-batches holding 1 and 7 of them. Each divided by the step's average per micro-batch (4),
// and backward at 1/2 of the scale as the driver gives each of 2 micro-steps, the two means average
// to the whole batch's mean and their dlogits are the whole batch's, row for row. Each divided by its
// own count instead, the one-token micro-batch would weigh as much as the other seven.
TEST(CausalLmLoss, StepDivisorWeighsEveryValidTargetAlikeAcrossMicroBatches) {
  const int64_t N = 16, V = 5, ld = 5;
  const std::vector<float> x = randn(size_t(N * ld), 12, 2.f);
  const std::vector<int32_t> targets = {-1, -1, -1, 2, -1, -1, -1, -1,  // 1 valid
                                        0, 4, 1, -1, 3, 3, 2, 1};       // 7 valid
  auto host = [](const float* p, int64_t n, int64_t cols) {
    Tensor t = Tensor::empty({n, cols}, DType::F32, Device::cpu());
    std::copy(p, p + n * cols, t.data<float>());
    return t;
  };
  Tensor whole = host(x.data(), N, ld), first = host(x.data(), N / 2, ld), second = host(x.data() + N / 2 * ld, N / 2, ld);
  runtime::CausalLmLoss lm(whole, V, targets.data(), 8);
  runtime::CausalLmLoss a(first, V, targets.data(), 8 / 2.0), b(second, V, targets.data() + N / 2, 8 / 2.0);
  EXPECT_NEAR((a.mean() + b.mean()) / 2, lm.mean(), 1e-6 * lm.mean());
  const double own_counts = (runtime::CausalLmLoss(first, V, targets.data(), 1).mean() +
                             runtime::CausalLmLoss(second, V, targets.data() + N / 2, 7).mean()) / 2;
  EXPECT_GT(std::abs(own_counts - lm.mean()), 1e-3) << "the test's micro-batches must tell the weightings apart";
  const float scale = 3.f;
  lm.backward(whole, scale);
  a.backward(first, scale / 2);
  b.backward(second, scale / 2);
  for (int64_t i = 0; i < N * ld; ++i) {
    const float got = i < N / 2 * ld ? first.data<float>()[i] : second.data<float>()[i - N / 2 * ld];
    EXPECT_NEAR(got, whole.data<float>()[i], 1e-6) << "element " << i;
  }
}

}  // namespace zp::test

namespace zp::test {

// The plan's activation estimate against the memory one training micro-batch really takes at its
// peak, forward, objective and backward (the checkpointed backward's re-run included), above what
// was held before: within a factor of two either way.
TEST(ActivationEstimate, TransformerIsWithinTwiceWhatAStepTakes) {
  for (const std::string type : {"gpt2", "llama"})
    for (ForwardMode mode : {ForwardMode::Train, ForwardMode::TrainCheckpointed}) {
      const bool checkpoint = mode == ForwardMode::TrainCheckpointed;
      const std::string what = type + (checkpoint ? " checkpointed" : "");
      auto m = make_model(type, Device::cpu(), DType::F32);
      const Batch b = make_batch(3, m->config().vocab, Device::cpu());
      Allocator& alloc = allocator_for(Device::cpu());
      const size_t held = alloc.stats().current;
      alloc.reset_peak();
      {
        TransformerActivations acts;
        m->forward(b.ids.data<int32_t>(), kB, kT, acts, mode);
        runtime::CausalLmLoss loss(acts.logits, m->config().vocab, b.targets.data<int32_t>(), b.valid, m->ctx().s);
        m->backward(acts, loss.backward(acts.logits));
      }
      const double measured = double(alloc.stats().peak - held);
      const double estimate = models::transformer_activation_bytes(m->config(), kB, kT, DType::F32, checkpoint);
      expect_estimate_within_twice(what, estimate, measured);
    }
}

}  // namespace zp::test

namespace zp::test {

// Instruction data packs several records in a row (issue 14): with their segments and positions the
// model computes each record's logits, and the parameter gradients, as if it ran them one at a time.
TEST(TransformerPacking, PackedRecordsEqualRecordsRunAloneCpu) {
  for (const std::string type : {"gpt2", "llama"}) {
    auto m = make_model(type, Device::cpu(), DType::F64);
    const int64_t V = m->config().vocab, P = m->padded_vocab(), T = 12;
    const std::vector<int64_t> lengths = {5, 4};  // then 3 padding tokens
    std::vector<float> ids(static_cast<size_t>(T)), seg(static_cast<size_t>(T), -1.f), pos(static_cast<size_t>(T), 0.f);
    for (int64_t t = 0, r = 0, at = 0; t < T; ++t) {
      ids[size_t(t)] = float((t * 13 + 5) % V);
      if (r < int64_t(lengths.size())) {
        seg[size_t(t)] = float(r);
        pos[size_t(t)] = float(at);
        if (++at == lengths[size_t(r)]) ++r, at = 0;
      }
    }
    Tensor tid = upload(ids, DType::I32, Device::cpu()), tseg = upload(seg, DType::I32, Device::cpu()),
           tpos = upload(pos, DType::I32, Device::cpu());
    const nn::TokenLayout layout{tseg.data<int32_t>(), tpos.data<int32_t>()};
    const std::vector<float> g = randn(size_t(T * P), 3);
    std::vector<float> G(g.size(), 0.f);  // the records' rows only, real columns only
    for (int64_t t = 0; t < 9; ++t)
      for (int64_t v = 0; v < V; ++v) G[size_t(t * P + v)] = g[size_t(t * P + v)];

    for (nn::ParamBlock* b : m->blocks()) b->zero_grad();
    TransformerActivations packed;
    m->forward(tid.data<int32_t>(), 1, T, packed, ForwardMode::TrainCheckpointed, {}, layout);
    const std::vector<float> packed_logits = download(packed.logits);
    m->backward(packed, upload(G, DType::F64, Device::cpu()).view({T, P}));
    std::vector<std::vector<float>> packed_grads;
    for (nn::ParamBlock* b : m->blocks()) packed_grads.push_back(download(b->grads()));

    for (nn::ParamBlock* b : m->blocks()) b->zero_grad();
    int64_t start = 0;
    for (int64_t len : lengths) {
      const std::vector<float> rec_ids(ids.begin() + start, ids.begin() + start + len);
      Tensor rid = upload(rec_ids, DType::I32, Device::cpu());
      TransformerActivations alone;
      m->forward(rid.data<int32_t>(), 1, len, alone, ForwardMode::Train);
      const std::vector<float> logits = download(alone.logits);
      const std::vector<float> want(logits.begin(), logits.end());
      const std::vector<float> got(packed_logits.begin() + start * P, packed_logits.begin() + (start + len) * P);
      EXPECT_LE(rel_error(got, want), 1e-6) << type << ": record at " << start;
      const std::vector<float> rec_g(G.begin() + start * P, G.begin() + (start + len) * P);
      m->backward(alone, upload(rec_g, DType::F64, Device::cpu()).view({len, P}));
      start += len;
    }
    const std::vector<nn::ParamBlock*> blocks = m->blocks();
    for (size_t i = 0; i < blocks.size(); ++i)
      EXPECT_LE(rel_error(packed_grads[i], download(blocks[i]->grads())), 1e-6) << type << " " << blocks[i]->name();
  }
}

}  // namespace zp::test
