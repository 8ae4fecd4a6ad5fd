#include "io/chat_format.h"

#include "core/error.h"
#include "io/bounded_json.h"

namespace zp::io {

namespace {

constexpr const char* kLlama3Tokens[] = {"<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"};
constexpr const char* kChatMlTokens[] = {"<|im_start|>", "<|im_end|>"};

template <size_t N> bool has_all(const BpeTokenizer& t, const char* const (&names)[N]) {
  for (const char* n : names)
    if (!t.token_to_id(n)) return false;
  return true;
}

const char* role_name(ChatRole r) {
  switch (r) {
    case ChatRole::System: return "system";
    case ChatRole::User: return "user";
    case ChatRole::Assistant: return "assistant";
  }
  return "?";
}

}  // namespace

const char* chat_template_name(ChatTemplate t) {
  switch (t) {
    case ChatTemplate::Plain: return "plain";
    case ChatTemplate::Llama3: return "llama3";
    case ChatTemplate::ChatMl: return "chatml";
  }
  return "?";
}

ChatTemplate chat_template_from_name(const std::string& name, const BpeTokenizer& tokenizer, const std::string& key) {
  if (name == "llama3") return ChatTemplate::Llama3;
  if (name == "chatml") return ChatTemplate::ChatMl;
  if (name == "plain") return ChatTemplate::Plain;
  ZP_REQUIRE(name == "auto", key, " '", name, "' is not one of auto, llama3, chatml, plain");
  if (has_all(tokenizer, kLlama3Tokens)) return ChatTemplate::Llama3;
  if (has_all(tokenizer, kChatMlTokens)) return ChatTemplate::ChatMl;
  ZP_REQUIRE(tokenizer.eos_id().has_value(), tokenizer.source(), ": ", key,
             " auto finds neither Llama 3's header tokens, nor ChatML's <|im_start|> and <|im_end|>, nor an EOS "
             "token to close responses with (tokenizer_config.json's eos_token)");
  return ChatTemplate::Plain;
}

std::vector<ChatMessage> parse_chat_record(const nlohmann::json& record, const std::string& where) {
  ZP_REQUIRE(record.is_object(), where, ": a record must be a JSON object, got ", json_excerpt(record));
  const bool has_messages = record.contains("messages");
  const bool has_pair = record.contains("prompt") || record.contains("response");
  ZP_REQUIRE(has_messages || has_pair, where, ": the record has neither 'messages' nor 'prompt' and 'response'");
  ZP_REQUIRE(!(has_messages && has_pair), where,
             ": the record has both 'messages' and 'prompt'/'response'; give one form");
  auto string_at = [&](const nlohmann::json& object, const char* key, const std::string& what) -> const std::string& {
    auto it = object.find(key);
    ZP_REQUIRE(it != object.end(), where, ": ", what, " has no '", key, "'");
    ZP_REQUIRE(it->is_string(), where, ": ", what, "'s '", key, "' must be a string, got ", json_excerpt(*it));
    return it->get_ref<const std::string&>();
  };
  std::vector<ChatMessage> messages;
  if (has_pair) {
    messages.push_back({ChatRole::User, string_at(record, "prompt", "the record")});
    messages.push_back({ChatRole::Assistant, string_at(record, "response", "the record")});
    ZP_REQUIRE(!messages.back().content.empty(), where, ": the record's 'response' is empty (nothing to train on)");
    return messages;
  }
  const nlohmann::json& list = record["messages"];
  ZP_REQUIRE(list.is_array(), where, ": 'messages' must be an array, got ", json_excerpt(list));
  ZP_REQUIRE(!list.empty(), where, ": 'messages' is empty");
  bool any_assistant = false;
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string what = "messages[" + std::to_string(i) + "]";
    ZP_REQUIRE(list[i].is_object(), where, ": ", what, " must be an object, got ", json_excerpt(list[i]));
    const std::string& role = string_at(list[i], "role", what);
    ChatMessage m;
    if (role == "system") m.role = ChatRole::System;
    else if (role == "user") m.role = ChatRole::User;
    else if (role == "assistant") m.role = ChatRole::Assistant;
    else throw Error(where + ": " + what + " has the unknown role '" + text_excerpt(role, 40) +
                     "' (system, user or assistant)");
    m.content = string_at(list[i], "content", what);
    if (m.role == ChatRole::Assistant) {
      ZP_REQUIRE(!m.content.empty(), where, ": ", what, " is an empty assistant message (nothing to train on)");
      any_assistant = true;
    }
    messages.push_back(std::move(m));
  }
  ZP_REQUIRE(any_assistant, where, ": 'messages' has no assistant message (nothing to train on)");
  return messages;
}

int32_t ChatFormatter::special_id(const char* name) const {
  const std::optional<int32_t> id = tokenizer_.token_to_id(name);
  ZP_REQUIRE(id.has_value(), tokenizer_.source(), ": the ", chat_template_name(template_), " chat template needs the token ",
             name, ", which the tokenizer does not have");
  return *id;
}

ChatFormatter::ChatFormatter(const BpeTokenizer& tokenizer, ChatTemplate chat_template)
    : tokenizer_(tokenizer), template_(chat_template) {
  int32_t closing = -1;
  switch (template_) {
    case ChatTemplate::Llama3:
      begin_of_text_ = special_id("<|begin_of_text|>");
      start_header_ = special_id("<|start_header_id|>");
      end_header_ = special_id("<|end_header_id|>");
      closing = eot_ = special_id("<|eot_id|>");
      break;
    case ChatTemplate::ChatMl:
      im_start_ = special_id("<|im_start|>");
      closing = im_end_ = special_id("<|im_end|>");
      break;
    case ChatTemplate::Plain:
      ZP_REQUIRE(tokenizer.eos_id().has_value(), tokenizer.source(),
                 ": the plain chat template closes each response with EOS, and the tokenizer has none "
                 "(tokenizer_config.json's eos_token)");
      closing = eos_ = *tokenizer.eos_id();
      break;
  }
  pad_ = tokenizer.eos_id().value_or(closing);
}

void ChatFormatter::encode_parts(std::span<const Part> parts, ChatTokens& out) const {
  EncodeOptions options;
  options.split_special = true;  // content is text, never a template token (chat_format.h)
  std::string run;
  struct Span { size_t begin, end; };
  std::vector<Span> trained;  // byte ranges of `run` that the loss covers
  std::vector<int32_t> ids;
  auto flush = [&] {
    if (run.empty()) return;
    ids.clear();
    tokenizer_.encode(run, options, ids);
    size_t at = 0, k = 0;  // byte offset of the token; the first trained span that may overlap it
    for (int32_t id : ids) {
      const size_t end = at + tokenizer_.token_bytes(id).size();
      while (k < trained.size() && trained[k].end <= at) ++k;
      out.ids.push_back(id);
      out.loss.push_back(k < trained.size() && trained[k].begin < end ? 1 : 0);
      at = end;
    }
    ZP_CHECK(at == run.size(), "the tokens of a chat turn decode to ", at, " bytes, not ", run.size());
    run.clear();
    trained.clear();
  };
  for (const Part& p : parts) {
    if (p.special >= 0) {
      flush();
      out.ids.push_back(p.special);
      out.loss.push_back(p.loss ? 1 : 0);
      continue;
    }
    if (p.loss && !p.text.empty()) trained.push_back({run.size(), run.size() + p.text.size()});
    run += p.text;
  }
  flush();
}

void ChatFormatter::format(std::span<const ChatMessage> messages, ChatTokens& out) const {
  std::vector<Part> parts;
  if (template_ == ChatTemplate::Llama3) parts.push_back({begin_of_text_, {}, false});
  for (const ChatMessage& m : messages) {
    const bool trained = m.role == ChatRole::Assistant;
    switch (template_) {
      case ChatTemplate::Llama3:
        parts.push_back({start_header_, {}, false});
        parts.push_back({-1, role_name(m.role), false});
        parts.push_back({end_header_, {}, false});
        parts.push_back({-1, "\n\n", false});
        parts.push_back({-1, m.content, trained});
        parts.push_back({eot_, {}, trained});
        break;
      case ChatTemplate::ChatMl:
        parts.push_back({im_start_, {}, false});
        parts.push_back({-1, role_name(m.role), false});
        parts.push_back({-1, "\n", false});
        parts.push_back({-1, m.content, trained});
        parts.push_back({im_end_, {}, trained});
        parts.push_back({-1, "\n", false});
        break;
      case ChatTemplate::Plain:
        parts.push_back({-1, m.content, trained});
        if (trained) parts.push_back({eos_, {}, true});
        break;
    }
  }
  encode_parts(parts, out);
}

std::vector<int32_t> ChatFormatter::generation_prompt(std::span<const ChatMessage> messages) const {
  ChatTokens t;
  format(messages, t);
  std::vector<Part> parts;
  switch (template_) {
    case ChatTemplate::Llama3:
      parts = {{start_header_, {}, false}, {-1, "assistant", false}, {end_header_, {}, false}, {-1, "\n\n", false}};
      break;
    case ChatTemplate::ChatMl:
      parts = {{im_start_, {}, false}, {-1, "assistant", false}, {-1, "\n", false}};
      break;
    case ChatTemplate::Plain:
      break;
  }
  encode_parts(parts, t);
  return t.ids;
}

int32_t ChatFormatter::end_of_turn() const {
  switch (template_) {
    case ChatTemplate::Llama3: return eot_;
    case ChatTemplate::ChatMl: return im_end_;
    default: return eos_;
  }
}

ChatTokens ChatFormatter::format(std::span<const ChatMessage> messages) const {
  ChatTokens t;
  format(messages, t);
  return t;
}

}  // namespace zp::io
