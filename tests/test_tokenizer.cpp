// The byte-level BPE tokenizer (io/bpe_tokenizer.h, io/tokenizer_files.h) against reference
// tokenizations of tests/data/tokenizers/corpus.json: the npm packages' own JS encoders
// (expected_js.json) and, once committed, Hugging Face tokenizers (expected_hf.json); see that
// folder's NOTICE.md. Also: round trips of any bytes, special tokens, the files' forms and errors,
// and `zeropipe tokenize`.
#include <filesystem>
#include <fstream>
#include <random>

#include "app/tokenize_command.h"
#include "io/bounded_json.h"
#include "io/bpe_tokenizer.h"
#include "io/byte_level_alphabet.h"
#include "io/token_dataset.h"
#include "io/tokenizer_files.h"
#include "test_util.h"

namespace zp::test {
namespace {

using namespace zp::io;
namespace fs = std::filesystem;
using Ids = std::vector<int32_t>;

const fs::path kData = ZP_TOKENIZER_DATA_DIR;
const fs::path kUnpacked = ZP_TOKENIZER_UNPACKED_DIR;

nlohmann::json read_json(const fs::path& p) {
  std::ifstream in(p);
  if (!in.good()) throw std::runtime_error(p.string() + ": missing (see tests/data/tokenizers/NOTICE.md)");
  return parse_json_bounded(in, p.string());
}

const std::vector<std::string>& corpus() {
  static const std::vector<std::string> c = read_json(kData / "corpus.json").get<std::vector<std::string>>();
  return c;
}

const BpeTokenizer& gpt2() {
  static const BpeTokenizer t = load_tokenizer((kUnpacked / "gpt2").string());
  return t;
}
const BpeTokenizer& llama3() {
  static const BpeTokenizer t = load_tokenizer((kUnpacked / "llama3").string());
  return t;
}
// GPT-2's vocabulary with Qwen2's split pattern (Qwen2's own vocabulary is not available offline).
const BpeTokenizer& gpt2_qwen2_pattern() {
  static const BpeTokenizer t = [] {
    BpeTokenizerParts parts = read_vocab_and_merges((kUnpacked / "gpt2/encoder.json").string(),
                                                    (kUnpacked / "gpt2/vocab.bpe").string());
    parts.split_patterns.clear();
    parts.split_patterns.emplace_back(kQwen2SplitPattern, false, "qwen2 pattern");
    return BpeTokenizer(std::move(parts));
  }();
  return t;
}

std::string show(const std::string& s) { return nlohmann::json(s).dump(); }

// Every corpus string encodes to its expected ids; one failure line per string that does not.
void expect_matches(const BpeTokenizer& t, const nlohmann::json& expected, const EncodeOptions& o, const char* name) {
  ASSERT_EQ(expected.size(), corpus().size()) << name << ": the expectations do not cover the corpus";
  int bad = 0;
  for (size_t i = 0; i < corpus().size(); ++i) {
    const Ids want = expected[i].get<Ids>();
    const Ids got = t.encode(corpus()[i], o);
    if (got != want) {
      ++bad;
      ADD_FAILURE() << name << ": corpus[" << i << "] " << show(corpus()[i]) << "\n  expected " << nlohmann::json(want).dump()
                    << "\n  got      " << nlohmann::json(got).dump();
    }
  }
  EXPECT_EQ(bad, 0) << name;
}

TEST(Tokenizer, Gpt2MatchesItsJsEncoder) {
  const nlohmann::json e = read_json(kData / "expected_js.json");
  ASSERT_FALSE(e.at("special_tokens_in_text").at("gpt2").get<bool>());
  EncodeOptions o;
  o.split_special = true;  // gpt-3-encoder reads <|endoftext|> as text
  expect_matches(gpt2(), e.at("gpt2"), o, "gpt2");
}

TEST(Tokenizer, Llama3MatchesItsJsEncoder) {
  const nlohmann::json e = read_json(kData / "expected_js.json");
  ASSERT_TRUE(e.at("special_tokens_in_text").at("llama3").get<bool>());
  expect_matches(llama3(), e.at("llama3"), {}, "llama3");
}

// Hugging Face tokenizers' ids, from tests/reference/tokenizers_reference.py on a host that has the
// library; special tokens in text are special, no BOS (add_special_tokens=False).
TEST(Tokenizer, MatchesHuggingFaceTokenizersWhenTheirIdsAreCommitted) {
  const fs::path p = kData / "expected_hf.json";
  if (!fs::exists(p)) {
    std::cout << "[ NOTE     ] " << p << " is not committed yet; the JS encoders' ids are the reference\n";
    return;
  }
  const nlohmann::json e = read_json(p);
  expect_matches(gpt2(), e.at("gpt2"), {}, "gpt2 (tokenizers)");
  expect_matches(llama3(), e.at("llama3"), {}, "llama3 (tokenizers)");
  expect_matches(gpt2_qwen2_pattern(), e.at("gpt2_qwen2_pattern"), {}, "gpt2 vocabulary, qwen2 pattern (tokenizers)");
}

TEST(Tokenizer, DecodeGivesBackTheBytes) {
  std::vector<std::string> texts = corpus();
  // Not UTF-8: lone continuation bytes, a truncated sequence, an overlong form, a surrogate, 0xFF.
  for (const char* s : {"\xff", "\x80\x80", "abc\x80" "def", "caf\xc3", "\xc0\xaf", "\xed\xa0\x80", "\xf4\x90\x80\x80",
                        "ok \xfe\xff ok", "\xe2\x82", " \xf0\x9f\x98 space"})
    texts.push_back(s);
  std::mt19937_64 g(13);
  for (int k = 0; k < 300; ++k) {
    std::string s(g() % 48, '\0');
    for (char& c : s) c = char(g() % 256);
    texts.push_back(s);
  }
  for (const BpeTokenizer* t : {&gpt2(), &llama3(), &gpt2_qwen2_pattern()})
    for (const std::string& s : texts) {
      EXPECT_EQ(t->decode(t->encode(s)), s) << t->source() << ": " << show(s);
      EncodeOptions o;
      o.split_special = true;
      EXPECT_EQ(t->decode(t->encode(s, o)), s) << t->source() << " (special tokens as text): " << show(s);
    }
  // A token can hold part of a character; decoding one token gives its bytes as they are.
  const Ids euro = gpt2().encode("\xe2\x82\xac");  // U+20AC, several byte-level tokens in GPT-2
  std::string joined;
  for (int32_t id : euro) joined += gpt2().decode(Ids{id});
  EXPECT_EQ(joined, "\xe2\x82\xac");
}

TEST(Tokenizer, SpecialTokens) {
  const BpeTokenizer& g = gpt2();
  EXPECT_EQ(g.vocab_size(), 50257);
  EXPECT_EQ(g.bos_id(), 50256);
  EXPECT_EQ(g.eos_id(), 50256);
  EXPECT_FALSE(g.adds_bos());
  EXPECT_EQ(g.encode("<|endoftext|>"), Ids{50256});
  EXPECT_EQ(g.encode("Hello<|endoftext|>World"), (Ids{15496, 50256, 10603}));
  EncodeOptions as_text;
  as_text.split_special = true;
  EXPECT_EQ(g.encode("<|endoftext|>", as_text), (Ids{27, 91, 437, 1659, 5239, 91, 29}));
  EXPECT_EQ(g.encode("Hi", EncodeOptions{.add_special = true}), g.encode("Hi"));
  EXPECT_EQ(g.decode(Ids{15496, 50256, 10603}), "Hello<|endoftext|>World");
  EXPECT_EQ(g.decode(Ids{15496, 50256, 10603}, /*skip_special=*/true), "HelloWorld");
  EXPECT_EQ(g.token_to_id("Ġthe"), 262);
  EXPECT_EQ(g.id_to_token(262), "Ġthe");
  EXPECT_EQ(g.token_to_id("no such token"), std::nullopt);
  EXPECT_THROW(g.id_to_token(50257), Error);
  EXPECT_THROW(g.decode(Ids{1, -1}), Error);

  const BpeTokenizer& l = llama3();
  EXPECT_EQ(l.vocab_size(), 128256);
  EXPECT_EQ(l.bos_id(), 128000);
  EXPECT_EQ(l.eos_id(), 128001);
  EXPECT_TRUE(l.adds_bos());
  EXPECT_EQ(l.encode("Hello world!", EncodeOptions{.add_special = true}), (Ids{128000, 9906, 1917, 0}));
  EXPECT_EQ(l.token_to_id("<|eot_id|>"), 128009);
  EXPECT_EQ(l.id_to_token(128000), "<|begin_of_text|>");
  EXPECT_TRUE(l.is_special(128009));
  EXPECT_FALSE(l.is_special(9906));
  // As text, a special token is its pieces; it decodes to the same text either way.
  const Ids special = l.encode("<|eot_id|>");
  const Ids text = l.encode("<|eot_id|>", as_text);
  EXPECT_EQ(special, Ids{128009});
  EXPECT_GT(text.size(), 1u);
  EXPECT_EQ(l.decode(text), l.decode(special));
}

TEST(Tokenizer, SplitPatterns) {
  auto pieces = [](const BpeTokenizer& t, const std::string& s) {
    std::vector<std::string> r;
    for (int32_t id : t.encode(s)) r.push_back(t.decode(Ids{id}));
    return r;
  };
  using V = std::vector<std::string>;
  // Digits: GPT-2 runs, Llama 3 at most three, Qwen2 one by one.
  EXPECT_EQ(pieces(llama3(), "1234567"), (V{"123", "456", "7"}));
  EXPECT_EQ(pieces(gpt2_qwen2_pattern(), "2024"), (V{"2", "0", "2", "4"}));
  EXPECT_EQ(pieces(gpt2(), " 2024").size(), 1u);
  // Contractions in capitals are one piece for Llama 3, not for GPT-2.
  auto split = [](const char* pattern, std::string_view text) {
    std::vector<std::string_view> r;
    SplitPattern(pattern, false, "test").split(text, r);
    return std::vector<std::string>(r.begin(), r.end());
  };
  EXPECT_EQ(split(kLlama3SplitPattern, "WE'LL we'll"), (V{"WE", "'LL", " we", "'ll"}));
  EXPECT_EQ(split(kGpt2SplitPattern, "WE'LL we'll"), (V{"WE", "'", "LL", " we", "'ll"}));
  // Not UTF-8: the bad bytes fall between matches and stay pieces of their own.
  EXPECT_EQ(split(kGpt2SplitPattern, "ab\xff cd"), (V{"ab", "\xff", " cd"}));
  // Text PCRE2's JIT might struggle with: a long whitespace run (\s+(?!\S) backtracks) and a long word.
  for (const BpeTokenizer* t : {&gpt2(), &llama3()}) {
    const std::string spaces = "a" + std::string(200000, ' ') + "b\n";
    EXPECT_EQ(t->decode(t->encode(spaces)), spaces);
    const std::string word(100000, 'x');
    EXPECT_EQ(t->decode(t->encode(word)), word);
  }
}

// A tokenizer over the 256 single bytes (ids 0-255, in the byte-level alphabet) and a few merges,
// for the merge order and added tokens.
BpeTokenizerParts byte_parts() {
  BpeTokenizerParts p;
  p.source = "test parts";
  for (int b = 0; b < 256; ++b) p.vocab.emplace_back(byte_level_alphabet().char_of(uint8_t(b)), b);
  p.split_patterns.emplace_back(kGpt2SplitPattern, false, p.source);
  return p;
}

TEST(Tokenizer, MergesByRankLeftmostFirst) {
  BpeTokenizerParts p = byte_parts();
  p.vocab.insert(p.vocab.end(), {{"bc", 256}, {"ab", 257}, {"aa", 258}, {"aaaa", 259}});
  p.merges = {{"b", "c"}, {"a", "b"}, {"a", "a"}, {"aa", "aa"}};
  BpeTokenizer t(std::move(p));
  EXPECT_EQ(t.encode("abc"), (Ids{'a', 256}));  // b c ranks before a b
  EXPECT_EQ(t.encode("ab"), (Ids{257}));
  EXPECT_EQ(t.encode("aaa"), (Ids{258, 'a'}));  // equal ranks: leftmost first
  EXPECT_EQ(t.encode("aaaaa"), (Ids{259, 'a'}));
}

TEST(Tokenizer, AddedTokensLongestFirstAndBeforeSplitting) {
  BpeTokenizerParts p = byte_parts();
  p.added_tokens = {{"<x>", 300, true}, {"<x><y>", 301, true}, {"word", 302, false}};
  BpeTokenizer t(std::move(p));
  EXPECT_EQ(t.encode("<x><y>"), (Ids{301}));
  EXPECT_EQ(t.encode("<x><z>"), (Ids{300, '<', 'z', '>'}));
  EXPECT_EQ(t.encode("a<x>b"), (Ids{'a', 300, 'b'}));
  EXPECT_EQ(t.encode("swordfish"), (Ids{'s', 302, 'f', 'i', 's', 'h'}));  // inside a word, before splitting
  EncodeOptions as_text;
  as_text.split_special = true;
  EXPECT_EQ(t.encode("<x>word", as_text), (Ids{'<', 'x', '>', 302}));  // only special tokens become text
  EXPECT_EQ(t.vocab_size(), 303);
}

// Writes `text` to `dir`/`name` and returns the path.
std::string write_file(const ScratchFolder& dir, const std::string& name, const std::string& text) {
  const std::string p = dir / name;
  fs::create_directories(fs::path(p).parent_path());
  std::ofstream(p, std::ios::binary) << text;
  return p;
}

nlohmann::json small_tokenizer_json() {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_level_alphabet().char_of(uint8_t(b))] = b;
  vocab["Ġt"] = 256;
  vocab["Ġth"] = 257;
  vocab["Ġthe"] = 258;
  return {{"version", "1.0"},
          {"added_tokens", {{{"id", 259}, {"content", "<|eos|>"}, {"special", true}}}},
          {"normalizer", nullptr},
          {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
          {"post_processor", {{"type", "ByteLevel"}}},
          {"decoder", {{"type", "ByteLevel"}}},
          {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", {"Ġ t", "Ġt h", "Ġth e"}}}}};
}

TEST(Tokenizer, FileForms) {
  ScratchFolder tmp("tokenizer_forms");
  // The two merge forms give the same tokenizer.
  nlohmann::json j = small_tokenizer_json();
  const BpeTokenizer strings = load_tokenizer(write_file(tmp, "strings.json", j.dump()));
  j["model"]["merges"] = nlohmann::json::array({nlohmann::json::array({"Ġ", "t"}), nlohmann::json::array({"Ġt", "h"}),
                                               nlohmann::json::array({"Ġth", "e"})});
  const BpeTokenizer arrays = load_tokenizer(write_file(tmp, "arrays.json", j.dump()));
  EXPECT_EQ(strings.encode(" the<|eos|>"), (Ids{258, 259}));
  EXPECT_EQ(arrays.encode(" the<|eos|>"), (Ids{258, 259}));
  // GPT-2 as vocab.json + merges.txt, and as a tokenizer.json with ByteLevel's own pattern, encode as
  // encoder.json + vocab.bpe do.
  const fs::path dir = tmp / "gpt2-hub";
  fs::create_directories(dir);
  fs::copy_file(kUnpacked / "gpt2/encoder.json", dir / "vocab.json");
  fs::copy_file(kUnpacked / "gpt2/vocab.bpe", dir / "merges.txt");
  const BpeTokenizer hub = load_tokenizer(dir.string());
  nlohmann::json tj = small_tokenizer_json();
  tj["model"]["vocab"] = read_json(kUnpacked / "gpt2/encoder.json");
  std::vector<std::string> merges;
  std::ifstream m(kUnpacked / "gpt2/vocab.bpe");
  std::string line;
  std::getline(m, line);  // "#version: 0.2"; later lines may start with '#' too ("# $")
  while (std::getline(m, line))
    if (!line.empty()) merges.push_back(line);
  tj["model"]["merges"] = merges;
  tj["added_tokens"] = {{{"id", 50256}, {"content", "<|endoftext|>"}, {"special", true}}};
  const BpeTokenizer json_form = load_tokenizer(write_file(tmp, "gpt2.json", tj.dump()));
  for (const std::string& s : corpus()) {
    EXPECT_EQ(hub.encode(s), gpt2().encode(s)) << show(s);
    EXPECT_EQ(json_form.encode(s), gpt2().encode(s)) << show(s);
  }
  // tokenizer_config.json: add_bos_token, eos_token as an AddedToken object.
  write_file(tmp, "configured/tokenizer.json", small_tokenizer_json().dump());
  write_file(tmp, "configured/tokenizer_config.json",
             R"({"bos_token": "<|eos|>", "eos_token": {"content": "<|eos|>", "__type": "AddedToken"}, "add_bos_token": true})");
  const BpeTokenizer configured = load_tokenizer(tmp / "configured");
  EXPECT_EQ(configured.eos_id(), 259);
  EXPECT_TRUE(configured.adds_bos());
  EXPECT_EQ(configured.encode(" the", EncodeOptions{.add_special = true}), (Ids{259, 258}));
}

TEST(Tokenizer, BadFilesAreErrorsNamingTheFile) {
  ScratchFolder tmp("tokenizer_errors");
  // Loads `j` written as `name`, expecting an error naming the file and each of `fragments`.
  auto expect_load_error = [&](const std::string& name, const std::string& text, std::vector<std::string> fragments) {
    const std::string p = write_file(tmp, name, text);
    fragments.insert(fragments.begin(), p);
    expect_error([&] { load_tokenizer(p); }, fragments);
  };
  expect_error([&] { load_tokenizer(tmp / "nowhere"); }, {tmp / "nowhere", "no such file"});
  expect_load_error("corrupt.json", small_tokenizer_json().dump().substr(0, 500), {"not valid JSON"});

  nlohmann::json j = small_tokenizer_json();
  j["model"]["type"] = "WordPiece";
  expect_load_error("wordpiece.json", j.dump(), {"model type 'WordPiece' is not supported"});
  j["model"] = {{"type", "Unigram"}, {"vocab", {{"a", 0.0}}}};
  expect_load_error("unigram.json", j.dump(), {"model type 'Unigram' is not supported"});

  j = small_tokenizer_json();
  j["model"]["merges"] = {"Ġ t", "Ġt hx"};
  expect_load_error("unknown_merge.json", j.dump(), {"merge 1", "'hx'", "not in the vocabulary"});
  j["model"]["merges"] = {"Ġ t", "Ġt"};
  expect_load_error("bad_merge.json", j.dump(), {"model.merges[1]", "two tokens"});
  j["model"]["merges"] = {"Ġ t", "t h"};
  expect_load_error("merge_result.json", j.dump(), {"merge 1", "makes 'th'", "not in the vocabulary"});

  j = small_tokenizer_json();
  j["normalizer"] = {{"type", "NFKC"}};
  expect_load_error("normalizer.json", j.dump(), {"normalizer", "NFKC", "not supported"});
  j = small_tokenizer_json();
  j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}};
  expect_load_error("regex.json", j.dump(), {"pre_tokenizer.pattern", "does not compile"});
  j = small_tokenizer_json();
  j["pre_tokenizer"] = {{"type", "Whitespace"}};
  expect_load_error("whitespace.json", j.dump(), {"'Whitespace' is not supported"});
  j = small_tokenizer_json();
  j["added_tokens"][0]["lstrip"] = true;
  expect_load_error("lstrip.json", j.dump(), {"added_tokens[0]", "lstrip"});

  write_file(tmp, "bad-merges-txt/vocab.json", R"({"a": 0, "b": 1, "ab": 2})");
  write_file(tmp, "bad-merges-txt/merges.txt", "#version: 0.2\na b\na b c\n");
  expect_error([&] { load_tokenizer(tmp / "bad-merges-txt"); }, {tmp / "bad-merges-txt/merges.txt:3", "two tokens"});
  fs::create_directories(tmp / "empty");
  expect_error([&] { load_tokenizer(tmp / "empty"); }, {tmp / "empty", "holds no tokenizer.json"});
}

TEST(TokenizeCommand, WritesATokenFileTrainReads) {
  ScratchFolder dir("tokenize_command");
  const std::vector<std::string> docs = {"First document, with ünïcödé.", "Second: 12345 😀", "Third\nhas\nlines."};
  {
    std::ofstream j(dir / "in.jsonl");
    for (const auto& d : docs) j << nlohmann::json{{"id", 1}, {"body", d}}.dump() << "\n";
  }
  app::TokenizeOptions o;
  o.tokenizer = (kUnpacked / "llama3").string();
  o.in = dir / "in.jsonl";
  o.out = dir / "out.bin";
  o.field = "body";
  o.append_eos = true;
  const app::TokenizeReport r = app::tokenize_file(o);
  Ids want;
  for (const auto& d : docs) {
    const Ids ids = llama3().encode(d);
    want.insert(want.end(), ids.begin(), ids.end());
    want.push_back(128001);
  }
  EXPECT_EQ(r.documents, 3);
  EXPECT_EQ(r.tokens, int64_t(want.size()));
  TokenFile f(o.out);
  EXPECT_EQ(f.vocab_size(), 128256);
  Ids got(size_t(f.size()));
  f.copy(0, f.size(), got.data());
  EXPECT_EQ(got, want);
  TokenDataset ds({o.out}, 4);
  Ids x(4), y(4);
  ds.window(0, x.data(), y.data());
  EXPECT_EQ(x, Ids(want.begin(), want.begin() + 4));

  // Text, one document per line, BOS from the tokenizer, no EOS after the last.
  std::ofstream(dir / "in.txt") << "line one\r\n\nline two\n";
  o.in = dir / "in.txt";
  o.per_line = true;
  o.append_eos = false;
  o.add_special = true;
  app::tokenize_file(o);
  TokenFile t(o.out);
  Ids lines(size_t(t.size()));
  t.copy(0, t.size(), lines.data());
  Ids expect = llama3().encode("line one", EncodeOptions{.add_special = true});
  expect.push_back(128001);
  const Ids two = llama3().encode("line two", EncodeOptions{.add_special = true});
  expect.insert(expect.end(), two.begin(), two.end());
  EXPECT_EQ(lines, expect);

  // A record without the field names the file and line.
  std::ofstream(dir / "bad.jsonl") << "{\"body\": \"ok\"}\n{\"text\": \"no body\"}\n";
  o.in = dir / "bad.jsonl";
  expect_error([&] { app::tokenize_file(o); }, {o.in + ":2", "'body'"});
}

}  // namespace
}  // namespace zp::test
