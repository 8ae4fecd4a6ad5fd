// Instruction records as the model families' chat formats, tokenised, with the tokens the loss trains
// on marked (issue 14). A record is a conversation of system, user and assistant messages; a
// {"prompt", "response"} record is a user message and an assistant message.
//
//   llama3  <|begin_of_text|> then per message <|start_header_id|>ROLE<|end_header_id|>\n\nCONTENT<|eot_id|>
//   chatml  per message <|im_start|>ROLE\nCONTENT<|im_end|>\n                     (Qwen2; no default system message)
//   plain   the messages' contents one after the other, each assistant turn closed by EOS (GPT-2)
//
// The loss is on each assistant message's content and the token that closes its turn (<|eot_id|>,
// <|im_end|>, EOS), as the families' SFT trainers train; everything else is masked.
//
// Tokenisation matches Hugging Face's apply_chat_template followed by encoding the rendered text:
// the template's special tokens are single ids and the text between two of them is encoded as one
// piece ("\n\nCONTENT" for Llama 3, "ROLE\nCONTENT" for ChatML). A token that straddles the start or
// end of an assistant's content (merged across the boundary) is trained on: it holds bytes of the
// response. One deliberate difference: special tokens written inside a message's content are
// encoded as ordinary text (split_special), so a record cannot end a turn or forge a header by
// containing "<|eot_id|>".
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/bpe_tokenizer.h"

namespace zp::io {

enum class ChatTemplate : uint8_t { Plain = 0, Llama3 = 1, ChatMl = 2 };

const char* chat_template_name(ChatTemplate t);  // "plain", "llama3", "chatml"
// "llama3", "chatml", "plain", or "auto": the template whose special tokens the tokenizer has
// (llama3's header and <|eot_id|> tokens, else ChatML's <|im_start|> and <|im_end|>, else plain when
// it has an EOS). Throws zp::Error naming `key` (where the name came from) or the tokenizer.
ChatTemplate chat_template_from_name(const std::string& name, const BpeTokenizer& tokenizer,
                                     const std::string& key = "chat template");

enum class ChatRole : uint8_t { System, User, Assistant };

struct ChatMessage {
  ChatRole role = ChatRole::User;
  std::string content;
};

// A JSONL record -> its messages. Accepted: {"prompt": STRING, "response": STRING} or
// {"messages": [{"role": "system"|"user"|"assistant", "content": STRING}, ...]}; other keys are
// ignored (datasets carry ids and sources). Throws zp::Error starting with `where` (FILE:LINE) for a
// record that is not an object, has neither form or both, a value of the wrong type, an unknown role,
// an empty response or assistant message, or no assistant message at all.
std::vector<ChatMessage> parse_chat_record(const nlohmann::json& record, const std::string& where);

// Token ids with a loss flag each: loss[i] = 1 when ids[i] is a token the model learns to produce.
struct ChatTokens {
  std::vector<int32_t> ids;
  std::vector<uint8_t> loss;
};

class ChatFormatter {
 public:
  // Throws zp::Error naming the tokenizer when it lacks a special token the template needs.
  ChatFormatter(const BpeTokenizer& tokenizer, ChatTemplate chat_template);

  // Appends the conversation's tokens and loss flags to `out`.
  void format(std::span<const ChatMessage> messages, ChatTokens& out) const;
  ChatTokens format(std::span<const ChatMessage> messages) const;

  // Generation (zeropipe chat): the conversation so far, then the opening of the assistant's turn
  // (Hugging Face's apply_chat_template with add_generation_prompt=True); the model writes the rest
  // and ends it with end_of_turn().
  std::vector<int32_t> generation_prompt(std::span<const ChatMessage> messages) const;
  // The token that closes an assistant's turn: <|eot_id|>, <|im_end|>, or EOS (plain).
  int32_t end_of_turn() const;

  ChatTemplate chat_template() const { return template_; }
  const BpeTokenizer& tokenizer() const { return tokenizer_; }
  // What fills a row after its records: the tokenizer's EOS, else the template's closing token.
  // Padding is never trained on and never attended to, so its value only has to be a valid id.
  int32_t pad_id() const { return pad_; }

 private:
  // A template is a run of parts: special tokens (single ids) and text; consecutive text parts are
  // encoded together.
  struct Part {
    int32_t special = -1;  // the id, or -1 for text
    std::string_view text;
    bool loss = false;
  };
  void encode_parts(std::span<const Part> parts, ChatTokens& out) const;
  int32_t special_id(const char* name) const;

  const BpeTokenizer& tokenizer_;
  ChatTemplate template_;
  int32_t pad_ = 0;
  int32_t begin_of_text_ = -1, start_header_ = -1, end_header_ = -1, eot_ = -1;  // llama3
  int32_t im_start_ = -1, im_end_ = -1;                                          // chatml
  int32_t eos_ = -1;                                                             // plain
};

}  // namespace zp::io
