// zeropipe tokenize: text or JSONL in, a token file out (io/token_dataset.h's layout, which `train`
// reads), through a tokenizer read by io::load_tokenizer. Documents are separated by the tokenizer's
// EOS: the whole text file is one document (one per line with per_line), a JSONL file's records are
// one each (their `field`). With format "instruct", JSONL instruction records in, an instruction
// token file out (io/instruction_file.h; train's data.format "instruct").
#pragma once
#include <cstdint>
#include <string>

namespace zp::app {

struct TokenizeOptions {
  std::string tokenizer;  // a tokenizer.json, or a folder with it or with GPT-2's vocab.json + merges.txt
  std::string in;         // *.jsonl / *.ndjson: JSONL; anything else: text
  std::string out;
  std::string field = "text";  // the JSONL records' text
  bool per_line = false;       // text: each non-empty line is a document
  bool append_eos = false;     // EOS after the last document too (files concatenated stay separated)
  bool add_special = false;    // the tokenizer's own tokens around each document (Llama 3: BOS)
  // "text": documents -> a token file (above). "instruct": JSONL instruction records
  // ({"prompt", "response"} or {"messages": [...]}) in `chat_template`'s format -> an instruction
  // token file (io/instruction_file.h), for data.format "instruct".
  std::string format = "text";
  std::string chat_template = "auto";  // auto | llama3 | chatml | plain (io/chat_format.h)
};

struct TokenizeReport {
  int64_t documents = 0, bytes = 0, tokens = 0;  // documents: records for "instruct"
  int64_t trained_tokens = 0;                     // "instruct": tokens the loss trains on
  std::string chat_template;                      // "instruct": the template used
  int32_t vocab_size = 0;
  double load_seconds = 0, encode_seconds = 0;
};

// Writes o.out; throws zp::Error naming the file (and line, for JSONL) on bad input, a tokenizer
// without EOS when one is needed, or an empty input.
TokenizeReport tokenize_file(const TokenizeOptions& o);

// tokenize_file, then the counts on stdout; returns 0.
int run_tokenize(const TokenizeOptions& o);

}  // namespace zp::app
