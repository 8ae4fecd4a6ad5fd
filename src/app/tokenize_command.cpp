#include "app/tokenize_command.h"

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <algorithm>
#include <vector>

#include "core/error.h"
#include "io/bounded_json.h"
#include "io/chat_format.h"
#include "io/instruction_file.h"
#include "io/tokenizer_files.h"
#include "io/token_dataset.h"

namespace zp::app {

namespace {

using Clock = std::chrono::steady_clock;

bool ends_with(const std::string& s, const char* suffix) {
  const std::string t(suffix);
  return s.size() >= t.size() && s.compare(s.size() - t.size(), t.size(), t) == 0;
}

// Calls `document` with each document of the input, in order.
void for_each_document(const TokenizeOptions& o, const std::function<void(std::string_view)>& document) {
  std::ifstream in(o.in, std::ios::binary);
  ZP_REQUIRE(in.good(), o.in, ": cannot open");
  const bool jsonl = ends_with(o.in, ".jsonl") || ends_with(o.in, ".ndjson");
  if (!jsonl && !o.per_line) {
    std::string all;
    in.seekg(0, std::ios::end);
    all.resize(size_t(std::max<std::streamoff>(in.tellg(), 0)));
    in.seekg(0);
    in.read(all.data(), std::streamsize(all.size()));
    ZP_REQUIRE(!in.fail() || all.empty(), o.in, ": read error");
    document(all);
    return;
  }
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    if (!jsonl) {
      document(line);
      continue;
    }
    const std::string where = o.in + ":" + std::to_string(n);
    const nlohmann::json record = io::parse_json_bounded(std::string_view(line), where);
    ZP_REQUIRE(record.is_object(), where, ": a record must be a JSON object, got ", io::json_excerpt(record));
    auto it = record.find(o.field);
    ZP_REQUIRE(it != record.end(), where, ": the record has no '", o.field, "' (choose the field with --field)");
    ZP_REQUIRE(it->is_string(), where, ": '", o.field, "' must be a string, got ", io::json_excerpt(*it));
    document(it->get_ref<const std::string&>());
  }
  ZP_REQUIRE(!in.bad(), o.in, ": read error");
}

}  // namespace

TokenizeReport tokenize_file(const TokenizeOptions& o) {
  ZP_REQUIRE(o.format == "text" || o.format == "instruct", "--format '", o.format, "' is not one of text, instruct");
  ZP_REQUIRE(o.format == "instruct" || o.chat_template == "auto", "--chat-template needs --format instruct");
  TokenizeReport r;
  const auto t0 = Clock::now();
  const io::BpeTokenizer tokenizer = io::load_tokenizer(o.tokenizer);
  const auto t1 = Clock::now();
  r.load_seconds = std::chrono::duration<double>(t1 - t0).count();
  r.vocab_size = tokenizer.vocab_size();
  if (o.format == "instruct") {
    ZP_REQUIRE(o.field == "text" && !o.per_line && !o.append_eos && !o.add_special,
               "--field, --per-line, --append-eos and --add-special are for --format text: instruction records are "
               "formatted by their chat template");
    const io::ChatFormatter formatter(tokenizer, io::chat_template_from_name(o.chat_template, tokenizer, "--chat-template"));
    // The same function data.format "jsonl" tokenises with at start-up, so both give the same rows.
    const io::InstructionTokens data = io::tokenize_instruction_jsonl(o.in, formatter);
    r.documents = data.records();
    r.tokens = int64_t(data.ids.size());
    for (uint8_t l : data.loss) r.trained_tokens += l;
    r.bytes = int64_t(std::filesystem::file_size(o.in));
    r.chat_template = io::chat_template_name(formatter.chat_template());
    r.encode_seconds = std::chrono::duration<double>(Clock::now() - t1).count();
    io::write_instruction_file(o.out, data, r.vocab_size, formatter.pad_id(), formatter.chat_template());
    return r;
  }
  const std::optional<int32_t> eos = tokenizer.eos_id();
  io::EncodeOptions options;
  options.add_special = o.add_special;
  std::vector<int32_t> tokens;
  for_each_document(o, [&](std::string_view text) {
    if (r.documents > 0 || o.append_eos) ZP_REQUIRE(eos.has_value(), o.tokenizer, ": the tokenizer has no EOS token to separate documents with "
                                                                       "(tokenizer_config.json's eos_token)");
    if (r.documents > 0) tokens.push_back(*eos);
    tokenizer.encode(text, options, tokens);
    r.bytes += int64_t(text.size());
    ++r.documents;
  });
  ZP_REQUIRE(r.documents > 0, o.in, ": holds no document");
  if (o.append_eos) tokens.push_back(*eos);
  r.encode_seconds = std::chrono::duration<double>(Clock::now() - t1).count();
  r.tokens = int64_t(tokens.size());
  io::write_token_file(o.out, tokens, r.vocab_size);
  return r;
}

int run_tokenize(const TokenizeOptions& o) {
  const TokenizeReport r = tokenize_file(o);
  if (o.format == "instruct") {
    std::printf("%s: %lld records in the %s chat template, %lld tokens (%lld trained on) in %.2f s "
                "(tokenizer loaded in %.2f s), vocabulary %d\n",
                o.out.c_str(), (long long)r.documents, r.chat_template.c_str(), (long long)r.tokens,
                (long long)r.trained_tokens, r.encode_seconds, r.load_seconds, r.vocab_size);
    return 0;
  }
  std::printf("%s: %lld tokens from %lld documents (%lld bytes, %.2f bytes per token) in %.2f s (%.1f MB/s; "
              "tokenizer loaded in %.2f s), vocabulary %d\n",
              o.out.c_str(), (long long)r.tokens, (long long)r.documents, (long long)r.bytes,
              r.tokens ? double(r.bytes) / double(r.tokens) : 0.0, r.encode_seconds,
              r.encode_seconds > 0 ? double(r.bytes) / r.encode_seconds / 1e6 : 0.0, r.load_seconds, r.vocab_size);
  return 0;
}

}  // namespace zp::app
