// Expected token ids for tests/data/tokenizers/corpus.json from the npm packages' own JS encoders:
// gpt-3-encoder (GPT-2; it never treats <|endoftext|> in text as the special token) and
// llama3-tokenizer-js (Llama 3; it matches its special tokens in text). No BOS or EOS is added.
//
//   cd /tmp && npm pack gpt-3-encoder llama3-tokenizer-js
//   mkdir gpt2 llama3 && tar xzf gpt-3-encoder-*.tgz -C gpt2 && tar xzf llama3-tokenizer-js-*.tgz -C llama3
//   node tests/reference/js_reference_ids.js /tmp/gpt2/package /tmp/llama3/package \
//        tests/data/tokenizers/corpus.json tests/data/tokenizers/expected_js.json
'use strict';
const fs = require('fs');
const path = require('path');

const [gpt2Dir, llama3Dir, corpusPath, outPath] = process.argv.slice(2);
if (!outPath) {
  console.error('usage: node js_reference_ids.js GPT3_ENCODER_DIR LLAMA3_TOKENIZER_JS_DIR CORPUS_JSON OUT_JSON');
  process.exit(2);
}
const gpt2 = require(path.resolve(gpt2Dir, 'Encoder.js'));
const { llama3Tokenizer: llama3 } = require(path.resolve(llama3Dir, 'bundle/commonjs-llama3-tokenizer-with-baked-data.cjs'));
const corpus = JSON.parse(fs.readFileSync(corpusPath, 'utf-8'));

const out = { source: 'gpt-3-encoder 1.1.4 and llama3-tokenizer-js 1.2.0 (tests/reference/js_reference_ids.js)',
              special_tokens_in_text: { gpt2: false, llama3: true }, gpt2: [], llama3: [] };
for (const s of corpus) {
  out.gpt2.push(gpt2.encode(s));
  out.llama3.push(llama3.encode(s, { bos: false, eos: false }));
}
// One line per string keeps the committed file diffable.
const lines = (ids) => '[\n' + ids.map((v) => '  ' + JSON.stringify(v)).join(',\n') + '\n]';
fs.writeFileSync(outPath, `{\n"source": ${JSON.stringify(out.source)},\n` +
                 `"special_tokens_in_text": ${JSON.stringify(out.special_tokens_in_text)},\n` +
                 `"gpt2": ${lines(out.gpt2)},\n"llama3": ${lines(out.llama3)}\n}\n`);
console.log(`${outPath}: ${corpus.length} strings`);
