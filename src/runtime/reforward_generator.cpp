#include "runtime/reforward_generator.h"

#include "core/error.h"
#include "core/tensor.h"
#include "kernels/kernel.h"

namespace zp::runtime {

namespace {

// The argmax (lowest id on ties) of the last position's logits.
int32_t last_argmax(models::Transformer& model, StreamHandle s, const std::vector<int32_t>& ids) {
  const Device dev = model.ctx().dev;
  const int64_t T = int64_t(ids.size());
  Tensor ids_d = Tensor::empty({T}, DType::I32, dev, "gen-ids", s);
  copy_bytes(ids_d.data(), dev, ids.data(), Device::cpu(), ids.size() * sizeof(int32_t), s);
  models::TransformerActivations acts;
  model.forward(ids_d.data<int32_t>(), 1, T, acts, models::ForwardMode::Inference);
  const int64_t V = model.config().vocab, ld = model.padded_vocab();
  const DType dt = acts.logits.dtype();
  const size_t row_bytes = size_t(ld) * dtype_size(dt);
  std::vector<char> row(row_bytes);
  copy_bytes(row.data(), Device::cpu(), static_cast<const char*>(acts.logits.data()) + size_t(T - 1) * row_bytes, dev,
             row_bytes, s);
  int32_t best = 0;
  ZP_DISPATCH_FLOAT(dt, E, [&] {
    const E* l = reinterpret_cast<const E*>(row.data());
    double best_v = double(l[0]);
    for (int64_t v = 1; v < V; ++v)
      if (double(l[v]) > best_v) {
        best_v = double(l[v]);
        best = int32_t(v);
      }
  });
  return best;
}

}  // namespace

std::vector<std::string> generate_greedy_reforward(models::Transformer& model, StreamHandle s,
                                                   const io::BpeTokenizer& tok, int64_t max_length,
                                                   const std::vector<GenerationAsk>& asks) {
  std::vector<std::string> out;
  for (const GenerationAsk& a : asks) {
    ZP_CHECK(!a.context.empty(), "a generation without context");
    std::vector<int32_t> ids = a.context, made;
    std::string text;
    for (int64_t k = 0; k < a.max_new_tokens && int64_t(ids.size()) < max_length; ++k) {
      const int32_t next = last_argmax(model, s, ids);
      if (tok.eos_id() && next == *tok.eos_id()) break;
      ids.push_back(next);
      made.push_back(next);
      text = tok.decode(made, /*skip_special=*/true);
      bool stop = false;
      for (const auto& u : a.until) stop |= !u.empty() && text.find(u) != std::string::npos;
      if (stop) break;
    }
    out.push_back(std::move(text));
  }
  return out;
}

}  // namespace zp::runtime
