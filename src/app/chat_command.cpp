#include "app/chat_command.h"

#include <istream>
#include <ostream>

#include "core/error.h"
#include "io/chat_format.h"

namespace zp::app {

int run_chat(const ChatOptions& o, std::istream& in, std::ostream& out) {
  ZP_REQUIRE(!o.model.shard_weights, "--shard-weights does not apply to chat: chat is one conversation on one "
             "rank, and sharded weights need every rank of an mpirun in each forward; for a model larger than "
             "the GPU use --offload-param cpu or nvme");
  runtime::InferenceModel model(o.model);
  ZP_REQUIRE(model.tokenizer(), o.model.model, ": chat needs a tokenizer (the model folder has none; give --tokenizer)");
  const io::BpeTokenizer& tok = *model.tokenizer();
  const io::ChatFormatter formatter(tok, io::chat_template_from_name(o.chat_template, tok, "--chat-template"));
  runtime::GenerationEngine engine(model.model(), &tok, o.engine);
  engine.set_before_forward(model.forward_hook());
  std::vector<io::ChatMessage> messages;
  auto reset = [&] {
    messages.clear();
    if (!o.system.empty()) messages.push_back({io::ChatRole::System, o.system});
  };
  reset();
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line == "/exit") break;
    if (line == "/reset") {
      reset();
      out << "(conversation reset)\n\n" << std::flush;
      continue;
    }
    messages.push_back({io::ChatRole::User, line});
    runtime::GenerationRequest r;
    r.prompt = formatter.generation_prompt(messages);
    for (int32_t id : r.prompt)
      ZP_REQUIRE(id < model.config().vocab, "the chat format made token ", id, ", past the model's vocabulary of ",
                 model.config().vocab);
    const int64_t room = model.config().max_positions - int64_t(r.prompt.size());
    ZP_REQUIRE(room > 0, "the conversation (", r.prompt.size(), " tokens) fills the model's ",
               model.config().max_positions, " positions; /reset to start again");
    r.max_new_tokens = std::min(o.sampling.max_new_tokens, room);
    r.sampling = o.sampling.params;
    r.sampling.seed += messages.size();  // a new draw sequence each turn
    const int32_t eot = formatter.end_of_turn();
    r.stop_tokens = {eot};
    if (tok.eos_id() && *tok.eos_id() != eot) r.stop_tokens.push_back(*tok.eos_id());
    const int64_t id = engine.submit(std::move(r));
    engine.run([&](int64_t rid, int32_t token) {
      if (rid == id && !tok.is_special(token)) out << tok.token_bytes(token) << std::flush;
    });
    out << "\n\n" << std::flush;
    const runtime::GenerationOutput reply = engine.output(id);
    messages.push_back({io::ChatRole::Assistant, tok.decode(reply.ids, /*skip_special=*/true)});
  }
  return 0;
}

}  // namespace zp::app
