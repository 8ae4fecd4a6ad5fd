#include "runtime/loglikelihood_scorer.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"
#include "core/tensor.h"
#include "kernels/cross_entropy.h"

namespace zp::runtime {

LoglikelihoodScorer::LoglikelihoodScorer(models::Transformer& model, StreamHandle s, int64_t max_length,
                                         int64_t max_batch_tokens)
    : model_(model), s_(s), max_length_(max_length), max_batch_tokens_(max_batch_tokens) {
  ZP_REQUIRE(max_length >= 1 && max_length <= model.config().max_positions, "--max-length ", max_length,
             " must be between 1 and the model's ", model.config().max_positions, " positions");
  ZP_REQUIRE(max_batch_tokens >= 1, "--max-batch-tokens must be at least 1, got ", max_batch_tokens);
}

std::vector<LoglikelihoodResult> LoglikelihoodScorer::score(const std::vector<LoglikelihoodRequest>& reqs) {
  for (size_t i = 0; i < reqs.size(); ++i) {
    ZP_CHECK(!reqs[i].context.empty() && !reqs[i].continuation.empty(), "request ", i, " has an empty part");
    ZP_CHECK(int64_t(reqs[i].continuation.size()) <= max_length_, "request ", i, "'s continuation of ",
             reqs[i].continuation.size(), " tokens exceeds max_length ", max_length_);
  }
  // The harness's order: longest context + continuation first, then by the tokens themselves.
  std::vector<size_t> order(reqs.size());
  std::iota(order.begin(), order.end(), size_t(0));
  auto total = [&](size_t i) { return reqs[i].context.size() + reqs[i].continuation.size(); };
  auto tokens_less = [&](size_t a, size_t b) {
    const auto& x = reqs[a];
    const auto& y = reqs[b];
    // Lexicographic over context ++ continuation without building it.
    const size_t n = std::min(total(a), total(b));
    for (size_t k = 0; k < n; ++k) {
      const int32_t u = k < x.context.size() ? x.context[k] : x.continuation[k - x.context.size()];
      const int32_t v = k < y.context.size() ? y.context[k] : y.continuation[k - y.context.size()];
      if (u != v) return u < v;
    }
    return total(a) < total(b);
  };
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (total(a) != total(b)) return total(a) > total(b);
    return tokens_less(a, b);
  });
  std::vector<LoglikelihoodResult> results(reqs.size());
  std::vector<const LoglikelihoodRequest*> batch;
  std::vector<LoglikelihoodResult*> out;
  int64_t T = 0;
  for (size_t i : order) {
    const int64_t len = int64_t(std::min<size_t>(total(i), size_t(max_length_) + 1)) - 1;
    // Sorted longest first: the batch's first request sets its padded length.
    if (!batch.empty() && int64_t(batch.size() + 1) * T > max_batch_tokens_) {
      score_batch(batch, out);
      batch.clear();
      out.clear();
    }
    if (batch.empty()) T = len;
    batch.push_back(&reqs[i]);
    out.push_back(&results[i]);
  }
  if (!batch.empty()) score_batch(batch, out);
  return results;
}

void LoglikelihoodScorer::score_batch(const std::vector<const LoglikelihoodRequest*>& batch,
                                      std::vector<LoglikelihoodResult*>& out) {
  const Device dev = model_.ctx().dev;
  const int64_t B = int64_t(batch.size());
  std::vector<std::vector<int32_t>> inputs;
  int64_t T = 0;
  for (const auto* r : batch) {
    inputs.push_back(model_input(*r, max_length_));
    T = std::max(T, int64_t(inputs.back().size()));
  }
  // Padding ids are 0 (any valid token: causal attention keeps them out of the real positions);
  // their targets are -1 (ignored).
  std::vector<int32_t> ids(size_t(B * T), 0), targets(size_t(B * T), -1);
  for (int64_t b = 0; b < B; ++b) {
    const auto& in = inputs[size_t(b)];
    const auto& cont = batch[size_t(b)]->continuation;
    std::copy(in.begin(), in.end(), ids.begin() + b * T);
    const int64_t inplen = int64_t(in.size()), contlen = int64_t(cont.size());
    for (int64_t j = 0; j < contlen; ++j) targets[size_t(b * T + inplen - contlen + j)] = cont[size_t(j)];
  }
  Tensor ids_d = Tensor::empty({B * T}, DType::I32, dev, "eval-ids", s_);
  Tensor targets_d = Tensor::empty({B * T}, DType::I32, dev, "eval-targets", s_);
  copy_bytes(ids_d.data(), dev, ids.data(), Device::cpu(), ids.size() * sizeof(int32_t), s_);
  copy_bytes(targets_d.data(), dev, targets.data(), Device::cpu(), targets.size() * sizeof(int32_t), s_);

  models::TransformerActivations acts;
  if (before_forward_) before_forward_();
  model_.forward(ids_d.data<int32_t>(), B, T, acts, models::ForwardMode::Inference);
  ++forwards_;
  const int64_t V = model_.config().vocab, ld = model_.padded_vocab();
  const DType dt = acts.logits.dtype();
  Tensor losses_d = Tensor::empty({B * T}, DType::F32, dev, "eval-losses", s_);
  ZP_KERNEL_CALL(dev, cross_entropy_forward, s_, dt, losses_d.data<float>(), nullptr, acts.logits.data(),
                 targets_d.data<int32_t>(), B * T, V, ld);
  const Tensor losses = losses_d.to(Device::cpu(), s_);
  const float* loss = losses.data<float>();

  const size_t row_bytes = size_t(ld) * dtype_size(dt);
  std::vector<char> rows;
  for (int64_t b = 0; b < B; ++b) {
    const auto& cont = batch[size_t(b)]->continuation;
    const int64_t inplen = int64_t(inputs[size_t(b)].size()), contlen = int64_t(cont.size());
    const int64_t first = b * T + inplen - contlen;
    double sum = 0;
    for (int64_t j = 0; j < contlen; ++j) sum -= double(loss[first + j]);
    // The continuation's rows of logits, for the argmax.
    rows.resize(row_bytes * size_t(contlen));
    copy_bytes(rows.data(), Device::cpu(), static_cast<const char*>(acts.logits.data()) + size_t(first) * row_bytes, dev,
               rows.size(), s_);
    bool greedy = true;
    ZP_DISPATCH_FLOAT(dt, E, [&] {
      const E* l = reinterpret_cast<const E*>(rows.data());
      for (int64_t j = 0; j < contlen && greedy; ++j) {
        const E* row = l + j * ld;
        int64_t best = 0;
        double best_v = double(row[0]);
        for (int64_t v = 1; v < V; ++v)
          if (double(row[v]) > best_v) {
            best_v = double(row[v]);
            best = v;
          }
        greedy = best == cont[size_t(j)];
      }
    });
    out[size_t(b)]->logprob = sum;
    out[size_t(b)]->is_greedy = greedy;
  }
}

}  // namespace zp::runtime
