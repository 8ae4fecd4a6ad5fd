#include "runtime/until_generator.h"

#include "core/error.h"
#include "runtime/generation_engine.h"

namespace zp::runtime {

std::vector<std::string> generate_greedy_until(models::Transformer& model, const io::BpeTokenizer& tok,
                                               int64_t max_length, const std::vector<GenerationAsk>& asks,
                                               const std::function<void()>& before_forward) {
  std::vector<std::string> out(asks.size());
  GenerationEngine engine(model, &tok, GenerationOptions{});
  if (before_forward) engine.set_before_forward(before_forward);
  std::vector<std::pair<size_t, int64_t>> submitted;  // (ask, request id)
  for (size_t i = 0; i < asks.size(); ++i) {
    const GenerationAsk& a = asks[i];
    ZP_CHECK(!a.context.empty(), "a generation without context");
    const int64_t room = std::min(a.max_new_tokens, max_length - int64_t(a.context.size()));
    if (room <= 0) continue;  // the context fills max_length: nothing is made
    GenerationRequest r;
    r.prompt = a.context;
    r.max_new_tokens = room;
    for (const std::string& u : a.until)
      if (!u.empty()) r.stop_strings.push_back(u);
    if (tok.eos_id()) r.stop_tokens.push_back(*tok.eos_id());
    submitted.emplace_back(i, engine.submit(std::move(r)));
  }
  engine.run();
  for (const auto& [i, id] : submitted) {
    std::vector<int32_t> ids = engine.output(id).ids;
    if (!ids.empty() && tok.eos_id() && ids.back() == *tok.eos_id()) ids.pop_back();
    out[i] = tok.decode(ids, /*skip_special=*/true);
  }
  return out;
}

}  // namespace zp::runtime
