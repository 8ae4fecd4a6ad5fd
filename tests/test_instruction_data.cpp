// Instruction data for fine-tuning (issue 14): the chat templates against hand-written renderings,
// loss masks that cover exactly the assistant content and its closing token, the instruction token
// file's round trip and damage, JSONL errors naming FILE:LINE, rows with and without packing
// (segments, positions, targets that never cross a record), an order that does not depend on the
// world size, `zeropipe tokenize --format instruct`, and the data.* keys.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>

#include "app/tokenize_command.h"
#include "io/atomic_file.h"
#include "io/chat_format.h"
#include "io/config.h"
#include "io/instruction_dataset.h"
#include "io/instruction_file.h"
#include "io/tokenizer_files.h"
#include "runtime/train_config.h"
#include "test_util.h"
#include "tiny_llama_config.h"

namespace zp::test {
namespace {

using namespace zp::io;
namespace fs = std::filesystem;
using Ids = std::vector<int32_t>;

const fs::path kUnpacked = ZP_TOKENIZER_UNPACKED_DIR;
const std::string kTinyJsonl = std::string(ZP_SOURCE_DIR) + "/data/instruct-tiny.jsonl";

const BpeTokenizer& gpt2() {
  static const BpeTokenizer t = load_tokenizer((kUnpacked / "gpt2").string());
  return t;
}
const BpeTokenizer& llama3() {
  static const BpeTokenizer t = load_tokenizer((kUnpacked / "llama3").string());
  return t;
}
// Qwen2's tokenizer is not available offline: GPT-2's vocabulary with Qwen2's split pattern and
// ChatML's two special tokens as Qwen2 adds them, and <|endoftext|> as EOS.
const BpeTokenizer& chatml() {
  static const BpeTokenizer t = [] {
    BpeTokenizerParts parts = read_vocab_and_merges((kUnpacked / "gpt2/encoder.json").string(),
                                                    (kUnpacked / "gpt2/vocab.bpe").string());
    parts.split_patterns.clear();
    parts.split_patterns.emplace_back(kQwen2SplitPattern, false, "qwen2 pattern");
    parts.added_tokens.push_back({"<|im_start|>", 50257, true});
    parts.added_tokens.push_back({"<|im_end|>", 50258, true});
    return BpeTokenizer(std::move(parts));
  }();
  return t;
}

std::vector<ChatMessage> conversation() {
  return {{ChatRole::System, "Be brief."},
          {ChatRole::User, "Hi, who are you?"},
          {ChatRole::Assistant, "A helpful assistant."},
          {ChatRole::User, "Thanks!"},
          {ChatRole::Assistant, "You are welcome."}};
}

// The decoded text of each maximal run of trained tokens.
std::vector<std::string> trained_runs(const BpeTokenizer& t, const ChatTokens& c) {
  EXPECT_EQ(c.ids.size(), c.loss.size());
  std::vector<std::string> runs;
  for (size_t i = 0; i < c.ids.size(); ++i) {
    if (!c.loss[i]) continue;
    size_t j = i;
    while (j < c.ids.size() && c.loss[j]) ++j;
    runs.push_back(t.decode(std::span<const int32_t>(c.ids.data() + i, j - i)));
    i = j;
  }
  return runs;
}

// The formatting of `messages` decodes to `expected`, encodes exactly as Hugging Face encodes the
// rendered text (special tokens as their single ids), and trains on exactly `runs`.
void expect_format(const BpeTokenizer& t, ChatTemplate tmpl, const std::vector<ChatMessage>& messages,
                   const std::string& expected, const std::vector<std::string>& runs) {
  const ChatTokens c = ChatFormatter(t, tmpl).format(messages);
  EXPECT_EQ(t.decode(c.ids), expected);
  EXPECT_EQ(c.ids, t.encode(expected)) << "not the tokens of the rendered text";
  EXPECT_EQ(trained_runs(t, c), runs);
}

TEST(ChatFormat, Llama3) {
  expect_format(llama3(), ChatTemplate::Llama3, conversation(),
                "<|begin_of_text|>"
                "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
                "<|start_header_id|>user<|end_header_id|>\n\nHi, who are you?<|eot_id|>"
                "<|start_header_id|>assistant<|end_header_id|>\n\nA helpful assistant.<|eot_id|>"
                "<|start_header_id|>user<|end_header_id|>\n\nThanks!<|eot_id|>"
                "<|start_header_id|>assistant<|end_header_id|>\n\nYou are welcome.<|eot_id|>",
                {"A helpful assistant.<|eot_id|>", "You are welcome.<|eot_id|>"});
  const ChatTokens c = ChatFormatter(llama3(), ChatTemplate::Llama3).format(conversation());
  EXPECT_EQ(c.ids.front(), *llama3().token_to_id("<|begin_of_text|>"));
  EXPECT_EQ(c.ids.back(), *llama3().token_to_id("<|eot_id|>"));
  EXPECT_EQ(std::count(c.ids.begin(), c.ids.end(), *llama3().token_to_id("<|eot_id|>")), 5);
}

TEST(ChatFormat, ChatMl) {
  expect_format(chatml(), ChatTemplate::ChatMl, conversation(),
                "<|im_start|>system\nBe brief.<|im_end|>\n"
                "<|im_start|>user\nHi, who are you?<|im_end|>\n"
                "<|im_start|>assistant\nA helpful assistant.<|im_end|>\n"
                "<|im_start|>user\nThanks!<|im_end|>\n"
                "<|im_start|>assistant\nYou are welcome.<|im_end|>\n",
                {"A helpful assistant.<|im_end|>", "You are welcome.<|im_end|>"});
}

TEST(ChatFormat, Plain) {
  // A prompt/response record is a user and an assistant message: prompt, response, EOS.
  expect_format(gpt2(), ChatTemplate::Plain, {{ChatRole::User, "Q: 2 + 3?\nA:"}, {ChatRole::Assistant, " 5."}},
                "Q: 2 + 3?\nA: 5.<|endoftext|>", {" 5.<|endoftext|>"});
  // Messages: their contents only, each assistant turn closed by EOS.
  expect_format(gpt2(), ChatTemplate::Plain, conversation(),
                "Be brief.Hi, who are you?A helpful assistant.<|endoftext|>Thanks!You are welcome.<|endoftext|>",
                {"A helpful assistant.<|endoftext|>", "You are welcome.<|endoftext|>"});
}

// zeropipe chat's prompt: the conversation, then the assistant's header, encoded as Hugging Face
// encodes apply_chat_template(add_generation_prompt=True)'s text; the reply ends at end_of_turn().
TEST(ChatFormat, GenerationPromptOpensTheAssistantsTurn) {
  const std::vector<ChatMessage> talk = {{ChatRole::System, "Be brief."}, {ChatRole::User, "Hi, who are you?"}};
  struct Case {
    const BpeTokenizer& tok;
    ChatTemplate t;
    std::string text, end;
  };
  const Case cases[] = {
      {llama3(), ChatTemplate::Llama3,
       "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
       "<|start_header_id|>user<|end_header_id|>\n\nHi, who are you?<|eot_id|>"
       "<|start_header_id|>assistant<|end_header_id|>\n\n",
       "<|eot_id|>"},
      {chatml(), ChatTemplate::ChatMl,
       "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi, who are you?<|im_end|>\n"
       "<|im_start|>assistant\n",
       "<|im_end|>"},
      {gpt2(), ChatTemplate::Plain, "Be brief.Hi, who are you?", "<|endoftext|>"},
  };
  for (const Case& c : cases) {
    const ChatFormatter f(c.tok, c.t);
    EXPECT_EQ(f.generation_prompt(talk), c.tok.encode(c.text)) << chat_template_name(c.t);
    EXPECT_EQ(f.end_of_turn(), *c.tok.token_to_id(c.end)) << chat_template_name(c.t);
  }
}

TEST(ChatFormat, TokenAcrossTheResponseStartIsTrained) {
  // "ab" + "cd" is one piece, "abcd": whatever token holds both a prompt byte and a response byte
  // carries response bytes, so it is trained; no token before it is.
  const ChatTokens c =
      ChatFormatter(gpt2(), ChatTemplate::Plain).format(std::vector<ChatMessage>{{ChatRole::User, "ab"}, {ChatRole::Assistant, "cd"}});
  ASSERT_EQ(c.ids, gpt2().encode("abcd<|endoftext|>"));
  size_t first = 0;
  while (first < c.loss.size() && !c.loss[first]) ++first;
  ASSERT_LT(first, c.loss.size());
  for (size_t i = first; i < c.loss.size(); ++i) EXPECT_EQ(c.loss[i], 1) << i;
  const std::string untrained = gpt2().decode(std::span<const int32_t>(c.ids.data(), first));
  EXPECT_LE(untrained.size(), 2u) << "a token holding response bytes is masked";
  EXPECT_EQ(std::string("ab").substr(0, untrained.size()), untrained);
}

TEST(ChatFormat, SpecialTokensInContentAreText) {
  const std::vector<ChatMessage> m = {{ChatRole::User, "Write <|eot_id|> please"}, {ChatRole::Assistant, "<|eot_id|>"}};
  const ChatTokens c = ChatFormatter(llama3(), ChatTemplate::Llama3).format(m);
  const int32_t eot = *llama3().token_to_id("<|eot_id|>");
  EXPECT_EQ(std::count(c.ids.begin(), c.ids.end(), eot), 2) << "only the two turns' closing tokens";
  EXPECT_EQ(trained_runs(llama3(), c), std::vector<std::string>{"<|eot_id|><|eot_id|>"});  // text, then the real one
}

TEST(ChatFormat, AutoPicksFromTheTokenizer) {
  EXPECT_EQ(chat_template_from_name("auto", llama3()), ChatTemplate::Llama3);
  EXPECT_EQ(chat_template_from_name("auto", chatml()), ChatTemplate::ChatMl);
  EXPECT_EQ(chat_template_from_name("auto", gpt2()), ChatTemplate::Plain);
  EXPECT_EQ(chat_template_from_name("chatml", llama3()), ChatTemplate::ChatMl);
  expect_error([] { chat_template_from_name("alpaca", gpt2(), "data.chat_template"); },
               {"data.chat_template", "alpaca", "llama3"});
  // A template whose tokens the tokenizer lacks is refused when the formatter is made.
  expect_error([] { ChatFormatter(gpt2(), ChatTemplate::Llama3); }, {"<|begin_of_text|>", "llama3"});
  expect_error([] { ChatFormatter(gpt2(), ChatTemplate::ChatMl); }, {"<|im_start|>", "chatml"});
}

TEST(ChatFormat, PromptResponseRecordsAreAUserAndAnAssistantMessage) {
  const auto m = parse_chat_record(nlohmann::json::parse(R"({"prompt": "P", "response": "R", "id": 7})"), "f:1");
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m[0].role, ChatRole::User);
  EXPECT_EQ(m[0].content, "P");
  EXPECT_EQ(m[1].role, ChatRole::Assistant);
  EXPECT_EQ(m[1].content, "R");
}

TEST(ChatFormat, BadRecordsNameFileAndLine) {
  ScratchFolder dir("instruct_bad");
  const ChatFormatter f(gpt2(), ChatTemplate::Plain);
  const std::string good = R"({"prompt": "a", "response": "b"})";
  auto expect_bad = [&](const std::string& line, const std::vector<std::string>& fragments) {
    const std::string p = dir / "bad.jsonl";
    std::ofstream(p) << good << "\n\n" << good << "\n" << line << "\n" << good << "\n";
    std::vector<std::string> want = {p + ":4: "};
    want.insert(want.end(), fragments.begin(), fragments.end());
    expect_error([&] { tokenize_instruction_jsonl(p, f); }, want);
  };
  expect_bad(R"({"prompt": "a"})", {"no 'response'"});
  expect_bad(R"({"question": "a", "answer": "b"})", {"neither 'messages' nor 'prompt'"});
  expect_bad(R"({"prompt": "a", "response": 3})", {"'response' must be a string", "3"});
  expect_bad(R"({"prompt": "a", "response": ""})", {"'response' is empty"});
  expect_bad(R"({"prompt": "a", "response": "b", "messages": []})", {"both"});
  expect_bad(R"({"messages": {"role": "user"}})", {"'messages' must be an array"});
  expect_bad(R"({"messages": []})", {"'messages' is empty"});
  expect_bad(R"({"messages": [{"role": "bot", "content": "x"}]})", {"messages[0]", "unknown role 'bot'"});
  expect_bad(R"({"messages": [{"role": "user"}]})", {"messages[0]", "no 'content'"});
  expect_bad(R"({"messages": [{"role": "user", "content": ["x"]}]})", {"messages[0]", "'content' must be a string"});
  expect_bad(R"({"messages": [{"role": "user", "content": "x"}]})", {"no assistant message"});
  expect_bad(R"({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": ""}]})",
             {"messages[1]", "empty assistant message"});
  expect_bad(R"(["prompt", "response"])", {"must be a JSON object"});
  expect_bad(R"({"prompt": "a", "response": "b")", {"not valid JSON"});
  const std::string empty = dir / "empty.jsonl";
  std::ofstream(empty) << "\n  \n";
  expect_error([&] { tokenize_instruction_jsonl(empty, f); }, {empty, "no record"});
}

InstructionTokens tiny(const BpeTokenizer& t = gpt2(), ChatTemplate tmpl = ChatTemplate::Plain) {
  return tokenize_instruction_jsonl(kTinyJsonl, ChatFormatter(t, tmpl));
}

TEST(InstructionFile, RoundTrip) {
  ScratchFolder dir("instruct_file");
  for (const auto& [t, tmpl] : {std::pair{&gpt2(), ChatTemplate::Plain}, std::pair{&llama3(), ChatTemplate::Llama3}}) {
    const InstructionTokens data = tiny(*t, tmpl);
    EXPECT_EQ(data.records(), 36);
    const std::string p = dir / "tiny.zpin";
    write_instruction_file(p, data, t->vocab_size(), *t->eos_id(), tmpl);
    EXPECT_FALSE(fs::exists(temporary_path(p)));
    const InstructionFile f(p);
    EXPECT_EQ(f.records(), 36);
    EXPECT_EQ(f.tokens(), int64_t(data.ids.size()));
    EXPECT_EQ(f.vocab_size(), t->vocab_size());
    EXPECT_EQ(f.pad_id(), *t->eos_id());
    EXPECT_EQ(f.chat_template(), tmpl);
    const InstructionTokens back = f.read_all();
    EXPECT_EQ(back.ids, data.ids);
    EXPECT_EQ(back.loss, data.loss);
    EXPECT_EQ(back.record_starts, data.record_starts);
  }
}

TEST(InstructionFile, DamageIsNamed) {
  ScratchFolder dir("instruct_damage");
  const InstructionTokens data = tiny();
  const std::string p = dir / "good.zpin";
  write_instruction_file(p, data, gpt2().vocab_size(), *gpt2().eos_id(), ChatTemplate::Plain);
  std::string bytes;
  {
    std::ifstream in(p, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  auto damaged = [&](const std::string& name, const std::function<void(std::string&)>& edit) {
    std::string b = bytes;
    edit(b);
    const std::string q = dir / name;
    std::ofstream(q, std::ios::binary) << b;
    return q;
  };
  auto at32 = [](std::string& b, size_t i) { return reinterpret_cast<int32_t*>(b.data() + 4 * i); };
  const size_t R = size_t(data.records()), N = data.ids.size();
  const size_t starts = 1024, ids = starts + 8 * (R + 1), loss = ids + 2 * N;
  std::string q = damaged("short.zpin", [](std::string& b) { b.resize(b.size() - 1); });
  expect_error([&] { InstructionFile f(q); }, {q, "file holds"});
  q = damaged("magic.zpin", [&](std::string& b) { *at32(b, 0) = 0x5A50544B; });
  expect_error([&] { InstructionFile f(q); }, {q, "magic", "data.format \"tokens\""});
  q = damaged("version.zpin", [&](std::string& b) { *at32(b, 1) = 2; });
  expect_error([&] { InstructionFile f(q); }, {q, "version 2"});
  q = damaged("count.zpin", [&](std::string& b) { *at32(b, 5) = int32_t(R + 1); });
  expect_error([&] { InstructionFile f(q); }, {q, "records"});
  q = damaged("flag.zpin", [&](std::string& b) { b[loss + 3] = 2; });
  expect_error([&] { InstructionFile f(q); }, {q, "token 3", "loss flag 2"});
  q = damaged("start.zpin", [&](std::string& b) { reinterpret_cast<int64_t*>(b.data() + starts)[2] = 
                                                       reinterpret_cast<int64_t*>(b.data() + starts)[1] + 1; });
  expect_error([&] { InstructionFile f(q); }, {q, "record 1", "has 1 tokens"});
  q = damaged("id.zpin", [&](std::string& b) { reinterpret_cast<uint16_t*>(b.data() + ids)[5] = 60000; });
  expect_error([&] { InstructionFile f(q); }, {q, "token 5", "60000", "vocabulary of 50257"});
  // The writer refuses what the reader would.
  InstructionTokens bad = data;
  bad.ids[7] = 50257;
  expect_error([&] { write_instruction_file(dir / "w.zpin", bad, 50257, 0, ChatTemplate::Plain); }, {"token 7", "50257"});
  bad = data;
  bad.loss.pop_back();
  expect_error([&] { write_instruction_file(dir / "w.zpin", bad, 50257, 0, ChatTemplate::Plain); }, {"loss flags"});
}

struct RowData {
  Ids ids, targets, segments, positions;
};
RowData row_of(const InstructionDataset& d, int64_t r) {
  const size_t T = size_t(d.seq_len());
  RowData x{Ids(T), Ids(T), Ids(T), Ids(T)};
  d.row(r, {x.ids.data(), x.targets.data(), x.segments.data(), x.positions.data()});
  return x;
}

TEST(InstructionDataset, UnpackedRowIsOneRecordWithMaskedTargets) {
  const InstructionTokens data = tiny();
  InstructionRowsOptions o;
  o.seq_len = 64;
  const InstructionDataset d({kTinyJsonl}, ChatFormatter(gpt2(), ChatTemplate::Plain), o);
  ASSERT_EQ(d.num_rows(), data.records());
  EXPECT_EQ(d.pad_id(), *gpt2().eos_id());
  int64_t longest = 0;
  for (int64_t r = 0; r < d.num_rows(); ++r) {
    const int64_t b = data.record_starts[size_t(r)], L = data.record_starts[size_t(r) + 1] - b;
    longest = std::max(longest, L);
    ASSERT_LE(L, 64) << "the test wants whole records";
    const RowData x = row_of(d, r);
    for (int64_t i = 0; i < 64; ++i) {
      const bool token = i < L;
      EXPECT_EQ(x.ids[size_t(i)], token ? data.ids[size_t(b + i)] : d.pad_id());
      EXPECT_EQ(x.segments[size_t(i)], token ? 0 : -1);
      EXPECT_EQ(x.positions[size_t(i)], token ? i : 0);
      const bool trained = i + 1 < L && data.loss[size_t(b + i + 1)];
      EXPECT_EQ(x.targets[size_t(i)], trained ? data.ids[size_t(b + i + 1)] : -1) << "row " << r << " token " << i;
    }
  }
  EXPECT_EQ(d.truncated_records(), 0);
  // Shorter rows cut the longer records to T + 1 tokens: the last one is still a target.
  o.seq_len = 12;
  const InstructionDataset cut({kTinyJsonl}, ChatFormatter(gpt2(), ChatTemplate::Plain), o);
  int64_t expected_cut = 0;
  for (int64_t r = 0; r < data.records(); ++r) expected_cut += data.record_starts[size_t(r) + 1] - data.record_starts[size_t(r)] > 13;
  EXPECT_GT(expected_cut, 0);
  EXPECT_EQ(cut.truncated_records(), expected_cut);
  for (int64_t r = 0; r < cut.num_rows(); ++r) {
    const int64_t b = data.record_starts[size_t(r)], L = data.record_starts[size_t(r) + 1] - b;
    if (L <= 13) continue;
    const RowData x = row_of(cut, r);
    EXPECT_EQ(x.targets[11], data.loss[size_t(b + 12)] ? data.ids[size_t(b + 12)] : -1);
    EXPECT_EQ(x.segments[11], 0);
  }
}

// Packed rows: every row's segments are records, whole (or cut to T), in order 0, 1, 2, ...;
// positions restart with each; no target crosses into another record or into padding; and the
// segments, over all rows, are exactly the unpacked rows' records, each once.
void check_packed(const InstructionDataset& packed, const InstructionDataset& unpacked) {
  const int64_t T = packed.seq_len();
  std::map<Ids, int> expected;  // each record's ids followed by its targets, as unpacked rows hold them
  for (int64_t r = 0; r < unpacked.num_rows(); ++r) {
    const RowData x = row_of(unpacked, r);
    int64_t L = 0;
    while (L < T && x.segments[size_t(L)] == 0) ++L;
    Ids key(x.ids.begin(), x.ids.begin() + L);
    key.insert(key.end(), x.targets.begin(), x.targets.begin() + L);
    if (L == T) key.back() = -1;  // packed, a record's last token in the row predicts nothing
    ++expected[key];
  }
  int64_t records = 0;
  for (int64_t r = 0; r < packed.num_rows(); ++r) {
    const RowData x = row_of(packed, r);
    int64_t i = 0;
    for (int32_t seg = 0; i < T && x.segments[size_t(i)] >= 0; ++seg) {
      ASSERT_EQ(x.segments[size_t(i)], seg) << "row " << r << " token " << i;
      const int64_t start = i;
      while (i < T && x.segments[size_t(i)] == seg) {
        EXPECT_EQ(x.positions[size_t(i)], i - start) << "row " << r << " token " << i;
        ++i;
      }
      EXPECT_EQ(x.targets[size_t(i - 1)], -1) << "row " << r << ": the last token of record " << seg << " has a target";
      for (int64_t k = start; k + 1 < i; ++k) {
        if (x.targets[size_t(k)] >= 0) {
          EXPECT_EQ(x.targets[size_t(k)], x.ids[size_t(k + 1)]) << "row " << r << " token " << k;
        }
      }
      Ids key(x.ids.begin() + start, x.ids.begin() + i);
      key.insert(key.end(), x.targets.begin() + start, x.targets.begin() + i);
      auto it = expected.find(key);
      ASSERT_TRUE(it != expected.end() && it->second > 0) << "row " << r << " segment " << seg << " is no record (or twice)";
      --it->second;
      ++records;
    }
    ASSERT_GT(i, 0) << "row " << r << " is empty";
    for (; i < T; ++i) {
      EXPECT_EQ(x.segments[size_t(i)], -1);
      EXPECT_EQ(x.targets[size_t(i)], -1);
      EXPECT_EQ(x.ids[size_t(i)], packed.pad_id());
    }
  }
  EXPECT_EQ(records, unpacked.num_records());
  EXPECT_EQ(packed.num_records(), unpacked.num_records());
}

TEST(InstructionDataset, PackingKeepsRecordsApart) {
  const ChatFormatter f(llama3(), ChatTemplate::Llama3);
  for (int64_t T : {48, 128, 512}) {
    InstructionRowsOptions o;
    o.seq_len = T;
    const InstructionDataset unpacked({kTinyJsonl}, f, o);
    o.packing = true;
    o.packing_seed = 7;
    const InstructionDataset packed({kTinyJsonl}, f, o);
    SCOPED_TRACE("T = " + std::to_string(T));
    check_packed(packed, unpacked);
    // A step's loss divides by its rows' trained targets, and its throughput counts their tokens,
    // both counted without assembling the rows.
    for (const InstructionDataset* d : {&unpacked, &packed})
      for (int64_t r = 0; r < d->num_rows(); ++r) {
        const RowData x = row_of(*d, r);
        EXPECT_EQ(d->trained_targets(r), std::count_if(x.targets.begin(), x.targets.end(), [](int32_t t) { return t >= 0; }))
            << "row " << r;
        EXPECT_EQ(d->tokens(r), std::count_if(x.segments.begin(), x.segments.end(), [](int32_t s) { return s >= 0; }))
            << "row " << r << ": the tokens throughput counts are those not padding";
      }
    EXPECT_LT(packed.num_rows(), unpacked.num_rows());
    if (T == 512) {
      // Every record fits with room: rows are full but for less than the next record.
      int64_t tokens = 0;
      for (int64_t r = 0; r < packed.num_rows(); ++r) {
        const RowData x = row_of(packed, r);
        tokens += std::count_if(x.segments.begin(), x.segments.end(), [](int32_t s) { return s >= 0; });
      }
      const InstructionTokens data = tiny(llama3(), ChatTemplate::Llama3);
      EXPECT_EQ(tokens, int64_t(data.ids.size()));
    }
  }
}

TEST(InstructionDataset, RowsDependOnlyOnFileLengthPackingAndSeed) {
  ScratchFolder dir("instruct_rows");
  const ChatFormatter f(gpt2(), ChatTemplate::Plain);
  const std::string p = dir / "tiny.zpin";
  write_instruction_file(p, tiny(), gpt2().vocab_size(), f.pad_id(), ChatTemplate::Plain);
  InstructionRowsOptions o;
  o.seq_len = 40;
  o.packing = true;
  o.packing_seed = 3;
  // The file and the JSONL it was made from give the same rows: one code path.
  const InstructionDataset a({p}, o), b({kTinyJsonl}, f, o);
  ASSERT_EQ(a.num_rows(), b.num_rows());
  for (int64_t r = 0; r < a.num_rows(); ++r) {
    const RowData x = row_of(a, r), y = row_of(b, r);
    EXPECT_EQ(x.ids, y.ids);
    EXPECT_EQ(x.targets, y.targets);
    EXPECT_EQ(x.segments, y.segments);
    EXPECT_EQ(x.positions, y.positions);
  }
  // Another packing seed packs differently (the test can tell orders apart).
  o.packing_seed = 4;
  const InstructionDataset c({p}, o);
  bool differs = c.num_rows() != a.num_rows();
  for (int64_t r = 0; !differs && r < a.num_rows(); ++r) differs = row_of(a, r).ids != row_of(c, r).ids;
  EXPECT_TRUE(differs);
}

TEST(InstructionDataset, OrderIsTheSameAtEveryWorldSize) {
  InstructionRowsOptions o;
  o.seq_len = 32;
  o.packing = true;
  o.packing_seed = 11;
  const ChatFormatter f(gpt2(), ChatTemplate::Plain);
  const uint64_t seed = 11;
  const int64_t micro = 2, steps = 9;
  // One rank's order: global positions 0, 1, 2, ... across epochs.
  const InstructionDataset one({kTinyJsonl}, f, o);
  const int64_t n = one.num_rows();
  auto row_at = [&](const InstructionDataset& d, int64_t p) { return d.epoch_order(seed, p / n, p % n); };
  for (int world : {2, 3, 5}) {
    // Each rank builds its own dataset and reads micro rows at its place in the global batch.
    std::vector<std::unique_ptr<InstructionDataset>> ranks;
    for (int k = 0; k < world; ++k) ranks.push_back(std::make_unique<InstructionDataset>(std::vector<std::string>{kTinyJsonl}, f, o));
    for (int64_t step = 0; step < steps; ++step) {
      const int64_t global = micro * world;
      for (int k = 0; k < world; ++k)
        for (int64_t i = 0; i < micro; ++i) {
          const int64_t p = step * global + k * micro + i;
          ASSERT_EQ(ranks[size_t(k)]->num_rows(), n);
          EXPECT_EQ(row_at(*ranks[size_t(k)], p), row_at(one, p)) << "world " << world << " rank " << k << " step " << step;
          EXPECT_EQ(row_of(*ranks[size_t(k)], row_at(*ranks[size_t(k)], p)).ids, row_of(one, row_at(one, p)).ids);
        }
    }
  }
  // Epochs are shuffled differently, and every row comes once an epoch.
  std::vector<int64_t> e0, e1;
  for (int64_t i = 0; i < n; ++i) {
    e0.push_back(one.epoch_order(seed, 0, i));
    e1.push_back(one.epoch_order(seed, 1, i));
  }
  EXPECT_NE(e0, e1);
  std::sort(e0.begin(), e0.end());
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(e0[size_t(i)], i);
}

TEST(InstructionDataset, ValidationFractionSplitsRecords) {
  InstructionRowsOptions o;
  o.seq_len = 64;
  const ChatFormatter f(gpt2(), ChatTemplate::Plain);
  o.to = 0.75;
  const InstructionDataset train({kTinyJsonl}, f, o);
  o.from = 0.75;
  o.to = 1.0;
  const InstructionDataset val({kTinyJsonl}, f, o);
  EXPECT_EQ(train.num_records(), 27);
  EXPECT_EQ(val.num_records(), 9);
  const InstructionTokens data = tiny();
  EXPECT_EQ(row_of(val, 0).ids[0], data.ids[size_t(data.record_starts[27])]);
  EXPECT_NO_THROW(train.check_vocab(50257));
  expect_error([&] { train.check_vocab(1000); }, {kTinyJsonl, "outside the model's vocabulary of 1000"});
}

TEST(InstructionDataset, TokenizeCommandWritesTheFile) {
  ScratchFolder dir("instruct_cmd");
  app::TokenizeOptions o;
  o.tokenizer = (kUnpacked / "llama3").string();
  o.in = kTinyJsonl;
  o.out = dir / "tiny.zpin";
  o.format = "instruct";
  const app::TokenizeReport r = app::tokenize_file(o);
  EXPECT_EQ(r.documents, 36);
  EXPECT_EQ(r.chat_template, "llama3");
  const InstructionFile f(o.out);
  EXPECT_EQ(f.chat_template(), ChatTemplate::Llama3);
  const InstructionTokens want = tiny(llama3(), ChatTemplate::Llama3);
  EXPECT_EQ(f.read_all().ids, want.ids);
  EXPECT_EQ(f.read_all().loss, want.loss);
  int64_t trained = 0;
  for (uint8_t l : want.loss) trained += l;
  EXPECT_EQ(r.trained_tokens, trained);
  o.chat_template = "chatml";
  expect_error([&] { app::tokenize_file(o); }, {"<|im_start|>", "chatml"});
  o.chat_template = "auto";
  o.format = "text";
  o.chat_template = "llama3";
  expect_error([&] { app::tokenize_file(o); }, {"--chat-template needs --format instruct"});
}

// A valid LM config with instruction data (parsing only: no file is read).
runtime::TrainConfig config_with(const nlohmann::json& data) {
  nlohmann::json user = {{"train_micro_batch_size_per_gpu", 2},
                         {"model", {{"config", tiny_llama()}}},
                         {"data", {{"train_files", {"unused.jsonl"}}, {"seq_len", 16}}},
                         {"training", {{"device", "cpu"}}}};
  user["data"].update(data);
  return runtime::TrainConfig::from(io::Config(runtime::train_config_schema(), user, "t.json"));
}

TEST(InstructionDataset, ConfigKeys) {
  const runtime::TrainConfig d = config_with(nlohmann::json::object());
  EXPECT_EQ(d.data_format, "tokens");
  EXPECT_FALSE(d.instruction_data());
  EXPECT_EQ(d.chat_template, "auto");
  EXPECT_FALSE(d.packing);
  const runtime::TrainConfig j =
      config_with({{"format", "jsonl"}, {"tokenizer", "tok/"}, {"chat_template", "chatml"}, {"packing", true}});
  EXPECT_TRUE(j.instruction_data());
  EXPECT_EQ(j.tokenizer, "tok/");
  EXPECT_EQ(j.chat_template, "chatml");
  EXPECT_TRUE(j.packing);
  expect_error([] { config_with({{"format", "parquet"}}); }, {"data.format", "parquet", "instruct"});
  expect_error([] { config_with({{"format", "jsonl"}}); }, {"data.format \"jsonl\" needs data.tokenizer"});
  expect_error([] { config_with({{"packing", true}}); }, {"data.packing", "instruction data"});
  expect_error([] { config_with({{"format", "instruct"}, {"chat_template", "alpaca"}}); }, {"data.chat_template", "alpaca"});
  expect_error([] { config_with({{"chat_template", "llama3"}}); }, {"data.chat_template", "instruction data"});
  expect_error([] { config_with({{"packing", "yes"}}); }, {"data.packing"});
}

}  // namespace
}  // namespace zp::test
