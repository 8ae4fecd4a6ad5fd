#include "io/tokenizer_files.h"

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "io/bounded_json.h"
#include "io/config.h"

namespace zp::io {

namespace fs = std::filesystem;

namespace {

// Where in a file a value sits, for messages: "tokenizer.json: model.merges[17]: ...".
struct Place {
  const std::string& file;
  std::string key;
  Place at(const std::string& k) const { return {file, key.empty() ? k : key + "." + k}; }
  Place at(size_t i) const { return {file, key + "[" + std::to_string(i) + "]"}; }
  template <class... A> [[noreturn]] void fail(const A&... what) const {
    throw Error(detail::cat(file, ": ", key.empty() ? "" : key + ": ", what...));
  }
};

const json& member(const json& obj, const char* key, const Place& where) {
  if (!obj.is_object()) where.fail("must be an object, got ", json_excerpt(obj));
  auto it = obj.find(key);
  if (it == obj.end()) where.fail("has no '", key, "'");
  return *it;
}

const std::string& as_string(const json& v, const Place& where) {
  if (!v.is_string()) where.fail("must be a string, got ", json_excerpt(v));
  return v.get_ref<const std::string&>();
}

bool as_bool(const json& v, const Place& where) {
  if (!v.is_boolean()) where.fail("must be true or false, got ", json_excerpt(v));
  return v.get<bool>();
}

int32_t as_id(const json& v, const Place& where) {
  if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX)
    where.fail("must be a token id (an integer from 0 to 2^31-1), got ", json_excerpt(v));
  return int32_t(v.get<int64_t>());
}

// `obj[key]` when present and not null.
const json* optional_member(const json& obj, const char* key) {
  auto it = obj.find(key);
  return it == obj.end() || it->is_null() ? nullptr : &*it;
}

std::string type_of(const json& component, const Place& where) {
  return as_string(member(component, "type", where), where.at("type"));
}

void read_model(const json& model, const Place& where, BpeTokenizerParts& parts) {
  if (!model.is_object()) where.fail("must be an object, got ", json_excerpt(model));
  // Files written by old versions of tokenizers name no type; a BPE model is the one with merges.
  const std::string type = model.contains("type") ? type_of(model, where) : model.contains("merges") ? "BPE" : "?";
  if (type != "BPE")
    where.fail("model type '", type, "' is not supported: only byte-level BPE models are (GPT-2, Llama 3, Qwen2)");
  if (const json* v = optional_member(model, "byte_fallback"); v && as_bool(*v, where.at("byte_fallback")))
    where.fail("byte_fallback (a SentencePiece-style BPE) is not supported: only byte-level BPE is");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (const json* v = optional_member(model, key); v && !as_string(*v, where.at(key)).empty())
      where.fail(key, " '", v->get<std::string>(), "' is not supported (byte-level BPE has none)");
  if (const json* v = optional_member(model, "dropout"); v && !(v->is_number() && v->get<double>() == 0.0))
    where.fail("BPE dropout ", json_excerpt(*v), " is not supported (it makes encoding random)");
  if (const json* v = optional_member(model, "ignore_merges")) parts.ignore_merges = as_bool(*v, where.at("ignore_merges"));

  const Place vocab_at = where.at("vocab");
  const json& vocab = member(model, "vocab", where);
  if (!vocab.is_object()) vocab_at.fail("must be an object of token: id, got ", json_excerpt(vocab));
  parts.vocab.reserve(vocab.size());
  for (auto& [name, id] : vocab.items()) parts.vocab.emplace_back(name, as_id(id, vocab_at.at(name)));

  const Place merges_at = where.at("merges");
  const json& merges = member(model, "merges", where);
  if (!merges.is_array()) merges_at.fail("must be an array, got ", json_excerpt(merges));
  parts.merges.reserve(merges.size());
  for (size_t i = 0; i < merges.size(); ++i) {
    const json& m = merges[i];
    // Two forms: "a b" (tokenizers before 0.20) and ["a", "b"] (since; it allows spaces in tokens).
    if (m.is_string()) {
      const std::string& s = m.get_ref<const std::string&>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || sp == 0 || sp + 1 == s.size() || s.find(' ', sp + 1) != std::string::npos)
        merges_at.at(i).fail("must be two tokens separated by one space, got ", json_excerpt(m));
      parts.merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
    } else if (m.is_array() && m.size() == 2) {
      parts.merges.emplace_back(as_string(m[0], merges_at.at(i)), as_string(m[1], merges_at.at(i)));
    } else {
      merges_at.at(i).fail("must be \"a b\" or [\"a\", \"b\"], got ", json_excerpt(m));
    }
  }
}

void read_added_tokens(const json& added, const Place& where, BpeTokenizerParts& parts) {
  if (!added.is_array()) where.fail("must be an array, got ", json_excerpt(added));
  for (size_t i = 0; i < added.size(); ++i) {
    const Place at = where.at(i);
    const json& t = added[i];
    AddedToken a;
    a.id = as_id(member(t, "id", at), at.at("id"));
    a.content = as_string(member(t, "content", at), at.at("content"));
    if (const json* v = optional_member(t, "special")) a.special = as_bool(*v, at.at("special"));
    // These change what text an added token takes with it; no tokenizer we target uses them.
    for (const char* key : {"single_word", "lstrip", "rstrip"})
      if (const json* v = optional_member(t, key); v && as_bool(*v, at.at(key)))
        at.fail("added token '", text_excerpt(a.content, 60), "' has ", key, " true, which is not supported");
    parts.added_tokens.push_back(std::move(a));
  }
}

// Returns whether a ByteLevel pre-tokenizer was seen.
bool read_pre_tokenizer(const json& p, const Place& where, BpeTokenizerParts& parts) {
  const std::string type = type_of(p, where);
  if (type == "Sequence") {
    const Place list_at = where.at("pretokenizers");
    const json& list = member(p, "pretokenizers", where);
    if (!list.is_array()) list_at.fail("must be an array, got ", json_excerpt(list));
    bool byte_level = false;
    for (size_t i = 0; i < list.size(); ++i) byte_level |= read_pre_tokenizer(list[i], list_at.at(i), parts);
    return byte_level;
  }
  if (type == "ByteLevel") {
    if (const json* v = optional_member(p, "add_prefix_space"); v && as_bool(*v, where.at("add_prefix_space")))
      where.fail("ByteLevel with add_prefix_space true is not supported");
    // use_regex defaults to true: GPT-2's pattern, after whatever split came before.
    const json* v = optional_member(p, "use_regex");
    if (!v || as_bool(*v, where.at("use_regex"))) parts.split_patterns.emplace_back(kGpt2SplitPattern, false, where.file);
    return true;
  }
  if (type == "Split") {
    const Place pattern_at = where.at("pattern");
    const json& pattern = member(p, "pattern", where);
    const bool regex = pattern.is_object() && pattern.contains("Regex");
    if (!regex && !(pattern.is_object() && pattern.contains("String")))
      pattern_at.fail("must be {\"Regex\": ...} or {\"String\": ...}, got ", json_excerpt(pattern));
    const std::string& text = as_string(pattern.at(regex ? "Regex" : "String"), pattern_at);
    const std::string behavior = as_string(member(p, "behavior", where), where.at("behavior"));
    if (behavior != "Isolated") where.fail("Split behavior '", behavior, "' is not supported (only Isolated)");
    if (const json* v = optional_member(p, "invert"); v && as_bool(*v, where.at("invert")))
      where.fail("Split with invert true is not supported");
    parts.split_patterns.emplace_back(text, !regex, where.file + ": " + pattern_at.key);
    return false;
  }
  where.fail("pre-tokenizer '", type, "' is not supported (ByteLevel, Split and Sequence are)");
}

void require_byte_level_decoder(const json& d, const Place& where) {
  const std::string type = type_of(d, where);
  if (type == "ByteLevel") return;
  if (type == "Sequence") {
    const json& list = member(d, "decoders", where);
    if (list.is_array() && list.size() == 1) return require_byte_level_decoder(list[0], where.at("decoders").at(0));
  }
  where.fail("decoder '", type, "' is not supported: a byte-level BPE tokenizer decodes with ByteLevel");
}

void read_post_processor(const json& p, const Place& where, BpeTokenizerParts& parts) {
  const std::string type = type_of(p, where);
  if (type == "ByteLevel") return;  // only moves offsets, which we do not report
  if (type == "Sequence") {
    const Place list_at = where.at("processors");
    const json& list = member(p, "processors", where);
    if (!list.is_array()) list_at.fail("must be an array, got ", json_excerpt(list));
    for (size_t i = 0; i < list.size(); ++i) read_post_processor(list[i], list_at.at(i), parts);
    return;
  }
  if (type != "TemplateProcessing")
    where.fail("post-processor '", type, "' is not supported (TemplateProcessing, ByteLevel and Sequence are)");
  const Place single_at = where.at("single");
  const json& single = member(p, "single", where);
  if (!single.is_array()) single_at.fail("must be an array, got ", json_excerpt(single));
  const json& specials = member(p, "special_tokens", where);
  bool seen_text = false;
  for (size_t i = 0; i < single.size(); ++i) {
    const json& item = single[i];
    if (item.is_object() && item.contains("Sequence")) {
      seen_text = true;
      continue;
    }
    const Place item_at = single_at.at(i);
    const std::string& name = as_string(member(member(item, "SpecialToken", item_at), "id", item_at.at("SpecialToken")),
                                        item_at.at("SpecialToken.id"));
    const Place special_at = where.at("special_tokens").at(name);
    const json& ids = member(member(specials, name.c_str(), where.at("special_tokens")), "ids", special_at);
    if (!ids.is_array()) special_at.at("ids").fail("must be an array, got ", json_excerpt(ids));
    for (size_t k = 0; k < ids.size(); ++k)
      (seen_text ? parts.template_suffix : parts.template_prefix).push_back(as_id(ids[k], special_at.at("ids").at(k)));
  }
}

// A config's bos_token / eos_token: a string, {"content": ...} (an AddedToken written by
// transformers), or null.
std::optional<std::string> token_name(const json& config, const char* key, const Place& where) {
  const json* v = optional_member(config, key);
  if (!v) return std::nullopt;
  if (v->is_object()) return as_string(member(*v, "content", where.at(key)), where.at(key).at("content"));
  return as_string(*v, where.at(key));
}

}  // namespace

BpeTokenizerParts read_tokenizer_json(const std::string& path) {
  const json j = read_json_file(path);
  const Place root{path, ""};
  if (!j.is_object()) root.fail("not a tokenizer.json: the document is not an object");
  if (!j.contains("model"))
    root.fail("not a tokenizer.json: it has no 'model' (for GPT-2's vocab.json and merges.txt, give their folder)");
  BpeTokenizerParts parts;
  parts.source = path;
  read_model(j.at("model"), root.at("model"), parts);
  if (const json* v = optional_member(j, "added_tokens")) read_added_tokens(*v, root.at("added_tokens"), parts);
  if (const json* v = optional_member(j, "normalizer")) {
    const bool empty_sequence = v->is_object() && v->value("type", "") == "Sequence" &&
                                v->contains("normalizers") && v->at("normalizers").empty();
    if (!empty_sequence)
      root.at("normalizer").fail("normalizer ", json_excerpt(*v), " is not supported (only none)");
  }
  const json* pre = optional_member(j, "pre_tokenizer");
  if (!pre || !read_pre_tokenizer(*pre, root.at("pre_tokenizer"), parts))
    root.at("pre_tokenizer").fail("has no ByteLevel pre-tokenizer: only byte-level BPE tokenizers are supported");
  const json* decoder = optional_member(j, "decoder");
  if (!decoder) root.fail("has no decoder: a byte-level BPE tokenizer decodes with ByteLevel");
  require_byte_level_decoder(*decoder, root.at("decoder"));
  if (const json* v = optional_member(j, "post_processor")) read_post_processor(*v, root.at("post_processor"), parts);
  return parts;
}

BpeTokenizerParts read_vocab_and_merges(const std::string& vocab_path, const std::string& merges_path) {
  BpeTokenizerParts parts;
  parts.source = vocab_path + " and " + merges_path;
  const json vocab = read_json_file(vocab_path);
  const Place vocab_at{vocab_path, ""};
  if (!vocab.is_object()) vocab_at.fail("must be an object of token: id, got ", json_excerpt(vocab));
  parts.vocab.reserve(vocab.size());
  for (auto& [name, id] : vocab.items()) parts.vocab.emplace_back(name, as_id(id, vocab_at.at(name)));

  std::ifstream in(merges_path);
  ZP_REQUIRE(in.good(), merges_path, ": cannot open");
  std::string line;
  for (size_t n = 1; std::getline(in, line); ++n) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || (n == 1 && line.rfind("#version", 0) == 0)) continue;
    const size_t sp = line.find(' ');
    ZP_REQUIRE(sp != std::string::npos && sp != 0 && sp + 1 < line.size() && line.find(' ', sp + 1) == std::string::npos,
               merges_path, ":", n, ": a merge must be two tokens separated by one space, got '",
               text_excerpt(line, 60), "'");
    parts.merges.emplace_back(line.substr(0, sp), line.substr(sp + 1));
  }
  ZP_REQUIRE(!in.bad(), merges_path, ": read error");
  parts.split_patterns.emplace_back(kGpt2SplitPattern, false, parts.source);
  const std::string eot = "<|endoftext|>";
  for (const auto& [name, id] : parts.vocab)
    if (name == eot) {
      parts.added_tokens.push_back({eot, id, true});
      parts.bos_token = parts.eos_token = eot;
    }
  return parts;
}

void read_tokenizer_config(const std::string& path, BpeTokenizerParts& parts) {
  const json j = read_json_file(path);
  const Place root{path, ""};
  if (!j.is_object()) root.fail("must be a JSON object");
  if (j.contains("bos_token")) parts.bos_token = token_name(j, "bos_token", root);
  if (j.contains("eos_token")) parts.eos_token = token_name(j, "eos_token", root);
  if (const json* v = optional_member(j, "add_bos_token")) parts.add_bos_token = as_bool(*v, root.at("add_bos_token"));
  if (const json* v = optional_member(j, "add_eos_token")) parts.add_eos_token = as_bool(*v, root.at("add_eos_token"));
  parts.source += " (with " + path + ")";
}

BpeTokenizer load_tokenizer(const std::string& path) {
  std::error_code ec;
  const fs::path p(path);
  ZP_REQUIRE(fs::exists(p, ec), path, ": no such file or folder (a tokenizer: tokenizer.json, or a folder holding it "
                                      "or vocab.json + merges.txt)");
  const fs::path dir = fs::is_directory(p, ec) ? p : p.parent_path();
  BpeTokenizerParts parts;
  auto both = [&](const char* a, const char* b) { return fs::exists(dir / a, ec) && fs::exists(dir / b, ec); };
  if (!fs::is_directory(p, ec)) parts = read_tokenizer_json(path);
  else if (fs::exists(dir / "tokenizer.json", ec)) parts = read_tokenizer_json((dir / "tokenizer.json").string());
  else if (both("vocab.json", "merges.txt")) parts = read_vocab_and_merges((dir / "vocab.json").string(), (dir / "merges.txt").string());
  else if (both("encoder.json", "vocab.bpe")) parts = read_vocab_and_merges((dir / "encoder.json").string(), (dir / "vocab.bpe").string());
  else throw Error(path + ": holds no tokenizer.json, vocab.json + merges.txt or encoder.json + vocab.bpe");
  if (fs::exists(dir / "tokenizer_config.json", ec)) read_tokenizer_config((dir / "tokenizer_config.json").string(), parts);
  return BpeTokenizer(std::move(parts));
}

}  // namespace zp::io
