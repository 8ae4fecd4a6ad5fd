// Writes Llama 3's tokenizer as a Hugging Face tokenizer.json (and tokenizer_config.json) from the npm
// package llama3-tokenizer-js (MIT), which bakes the vocabulary and merges into its bundle: the
// vocabulary as base64 of the newline-joined byte-level token strings in id order, the merges as
// 17-bit pairs of vocabulary positions in rank order, the 256 special tokens appended from id 128000.
// We read them through the package's own decoder rather than re-implementing its bit packing.
//
//   cd /tmp && npm pack llama3-tokenizer-js && tar xzf llama3-tokenizer-js-*.tgz
//   node tests/reference/extract_llama3_tokenizer.js /tmp/package OUT_DIR
//
// The pre-tokenizer, decoder and post-processor are those of Meta's Llama 3 tokenizer.json
// (Sequence[Split(pattern, Isolated), ByteLevel(use_regex=false)], ByteLevel decoder, BOS template),
// with ignore_merges on as there; merges are written in the [a, b] array form that tokenizers >= 0.20
// saves, so the loader's second merge form is tested on real data.
'use strict';
const fs = require('fs');
const path = require('path');

const [pkg, out] = process.argv.slice(2);
if (!pkg || !out) {
  console.error('usage: node extract_llama3_tokenizer.js PACKAGE_DIR OUT_DIR');
  process.exit(2);
}
const { llama3Tokenizer: t } = require(path.resolve(pkg, 'bundle/commonjs-llama3-tokenizer-with-baked-data.cjs'));

const kBase = 128000;
if (t.vocabById.length !== kBase + 256) throw new Error(`expected ${kBase + 256} tokens, found ${t.vocabById.length}`);
const vocab = Object.create(null);  // no prototype: "toString" is a token
for (let id = 0; id < kBase; ++id) {
  const s = t.vocabById[id];
  if (s in vocab) throw new Error(`token ${JSON.stringify(s)} appears twice (ids ${vocab[s]} and ${id})`);
  vocab[s] = id;
}
// t.merges maps "a b" -> 2 * rank + 1 (the package keeps 0 free as "no merge"), in rank order.
// The 17-bit packing may leave an odd count of ids (its padding can hold 17 bits): the last "pair"
// then has no second token and is no merge.
const merges = [];
for (const [key, prio] of t.merges) {
  if (prio !== 2 * merges.length + 1) throw new Error(`merge ${key} has priority ${prio}, expected ${2 * merges.length + 1}`);
  const sp = key.indexOf(' ');
  const pair = [key.slice(0, sp), key.slice(sp + 1)];
  if (!(pair[0] in vocab) || !(pair[1] in vocab)) {
    if (prio === 2 * (t.merges.size - 1) + 1) break;  // the padding's half pair
    throw new Error(`merge ${key} names a token outside the vocabulary`);
  }
  merges.push(pair);
}
const added = [];
for (let id = kBase; id < t.vocabById.length; ++id)
  added.push({ id, content: t.vocabById[id], single_word: false, lstrip: false, rstrip: false, normalized: false,
               special: true });

const pattern = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const tokenizer = {
  version: '1.0',
  truncation: null,
  padding: null,
  added_tokens: added,
  normalizer: null,
  pre_tokenizer: {
    type: 'Sequence',
    pretokenizers: [
      { type: 'Split', pattern: { Regex: pattern }, behavior: 'Isolated', invert: false },
      { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: false },
    ],
  },
  post_processor: {
    type: 'TemplateProcessing',
    single: [{ SpecialToken: { id: '<|begin_of_text|>', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } }],
    pair: [{ SpecialToken: { id: '<|begin_of_text|>', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } },
           { SpecialToken: { id: '<|begin_of_text|>', type_id: 1 } }, { Sequence: { id: 'B', type_id: 1 } }],
    special_tokens: { '<|begin_of_text|>': { id: '<|begin_of_text|>', ids: [kBase], tokens: ['<|begin_of_text|>'] } },
  },
  decoder: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true },
  model: {
    type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: null, end_of_word_suffix: null,
    fuse_unk: false, byte_fallback: false, ignore_merges: true, vocab, merges,
  },
};
fs.mkdirSync(out, { recursive: true });
fs.writeFileSync(path.join(out, 'tokenizer.json'), JSON.stringify(tokenizer));
fs.writeFileSync(path.join(out, 'tokenizer_config.json'),
                 JSON.stringify({ bos_token: '<|begin_of_text|>', eos_token: '<|end_of_text|>',
                                  model_max_length: 131072, tokenizer_class: 'PreTrainedTokenizerFast' }, null, 2) + '\n');
if (merges.length !== 280147) throw new Error(`expected Llama 3's 280147 merges, found ${merges.length}`);
console.log(`${out}: ${kBase} tokens, ${merges.length} merges, ${added.length} special tokens`);
