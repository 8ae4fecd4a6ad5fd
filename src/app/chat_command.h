// `zeropipe chat` (issue 13): a conversation on stdin and stdout. Each input line is the user's turn
// (a line "/reset" forgets the conversation, "/exit" or the end of input ends it); the reply streams
// to stdout token by token as it is generated, in the model family's chat format
// (io/chat_format.h: Llama 3, ChatML, or plain text for GPT-2), and ends at the format's end of turn.
// One rank: a conversation is one sequence.
#pragma once
#include <iosfwd>
#include <string>

#include "app/generate_command.h"

namespace zp::app {

struct ChatOptions {
  runtime::InferenceModelOptions model;
  std::string chat_template = "auto";  // auto | llama3 | chatml | plain
  std::string system;                  // a system message to start every conversation with
  SamplingDefaults sampling;
  runtime::GenerationOptions engine;
};

// Reads turns from `in` and writes replies to `out` (each followed by a blank line); returns 0.
int run_chat(const ChatOptions& o, std::istream& in, std::ostream& out);

}  // namespace zp::app
