#include "io/instruction_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/bounded_json.h"

namespace zp::io {

namespace {
constexpr size_t kHeaderInts = 256;
constexpr size_t kHeaderBytes = kHeaderInts * sizeof(int32_t);

int64_t join64(int32_t low, int32_t high) { return int64_t(uint64_t(uint32_t(low)) | (uint64_t(uint32_t(high)) << 32)); }
}  // namespace

InstructionTokens tokenize_instruction_jsonl(const std::string& path, const ChatFormatter& formatter) {
  std::ifstream in(path, std::ios::binary);
  ZP_REQUIRE(in.good(), path, ": cannot open");
  InstructionTokens data;
  ChatTokens tokens;
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(n);
    const std::vector<ChatMessage> messages = parse_chat_record(parse_json_bounded(std::string_view(line), where), where);
    tokens.ids.clear();
    tokens.loss.clear();
    formatter.format(messages, tokens);
    data.ids.insert(data.ids.end(), tokens.ids.begin(), tokens.ids.end());
    data.loss.insert(data.loss.end(), tokens.loss.begin(), tokens.loss.end());
    data.record_starts.push_back(int64_t(data.ids.size()));
  }
  ZP_REQUIRE(!in.bad(), path, ": read error");
  ZP_REQUIRE(data.records() > 0, path, ": holds no record");
  return data;
}

void write_instruction_file(const std::string& path, const InstructionTokens& data, int32_t vocab_size,
                            int32_t pad_id, ChatTemplate chat_template) {
  const int64_t n = int64_t(data.ids.size()), records = data.records();
  ZP_REQUIRE(vocab_size >= 0, path, ": vocabulary size ", vocab_size, " is negative (0 means unknown)");
  ZP_REQUIRE(data.loss.size() == data.ids.size(), path, ": ", data.loss.size(), " loss flags for ", n, " tokens");
  ZP_REQUIRE(records >= 1 && data.record_starts.front() == 0 && data.record_starts.back() == n, path,
             ": the record starts must run from 0 to the token count ", n);
  for (int64_t r = 0; r < records; ++r)
    ZP_REQUIRE(data.record_starts[size_t(r) + 1] - data.record_starts[size_t(r)] >= 2, path, ": record ", r,
               " has fewer than 2 tokens (nothing to predict)");
  ZP_REQUIRE(pad_id >= 0 && (vocab_size == 0 || pad_id < vocab_size), path, ": pad id ", pad_id,
             " is outside the vocabulary of ", vocab_size);
  bool small = true;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t t = data.ids[size_t(i)];
    ZP_REQUIRE(t >= 0 && (vocab_size == 0 || t < vocab_size), path, ": token ", i, " has id ", t,
               ", outside the vocabulary of ", vocab_size);
    if (t > 65535) small = false;
  }
  int32_t h[kHeaderInts] = {0};
  h[0] = kInstructionFileMagic;
  h[1] = 1;
  h[2] = small ? 2 : 4;
  h[3] = int32_t(uint32_t(uint64_t(n) & 0xffffffffu));
  h[4] = int32_t(uint32_t(uint64_t(n) >> 32));
  h[5] = int32_t(uint32_t(uint64_t(records) & 0xffffffffu));
  h[6] = int32_t(uint32_t(uint64_t(records) >> 32));
  h[7] = vocab_size;
  h[8] = pad_id;
  h[9] = int32_t(chat_template);
  AtomicFile f(path, FileSync::None);
  f.write(h, sizeof(h));
  f.write(data.record_starts.data(), data.record_starts.size() * sizeof(int64_t));
  if (small) {
    std::vector<uint16_t> v(data.ids.begin(), data.ids.end());
    f.write(v.data(), v.size() * 2);
  } else {
    f.write(data.ids.data(), data.ids.size() * 4);
  }
  f.write(data.loss.data(), data.loss.size());
  f.commit();
}

InstructionFile::InstructionFile(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ZP_REQUIRE(fd_ >= 0, path, ": cannot open instruction token file: ", std::strerror(errno));
  auto fail = [&](const std::string& why) {
    if (map_) munmap(map_, map_size_);
    ::close(fd_);
    map_ = nullptr;
    fd_ = -1;
    throw Error(path + ": not a valid instruction token file: " + why);
  };
  struct stat st {};
  if (fstat(fd_, &st) != 0) fail(std::string("cannot stat: ") + std::strerror(errno));
  map_size_ = size_t(st.st_size);
  if (map_size_ < kHeaderBytes) fail("shorter than the 1024-byte header");
  map_ = mmap(nullptr, map_size_, PROT_READ, MAP_SHARED, fd_, 0);
  if (map_ == MAP_FAILED) {
    map_ = nullptr;
    fail(std::string("mmap: ") + std::strerror(errno));
  }
  const auto* h = static_cast<const int32_t*>(map_);
  if (h[0] != kInstructionFileMagic)
    fail("unknown magic " + std::to_string(h[0]) +
         (h[0] == 0x5A50544B ? " (a plain token file: use data.format \"tokens\")" : ""));
  if (h[1] != 1) fail("unsupported version " + std::to_string(h[1]));
  if (h[2] != 2 && h[2] != 4) fail("bytes per token must be 2 or 4, header says " + std::to_string(h[2]));
  token_bytes_ = h[2];
  const int64_t n = join64(h[3], h[4]), records = join64(h[5], h[6]);
  if (n < 0 || records < 1) fail("header says " + std::to_string(n) + " tokens in " + std::to_string(records) + " records");
  if (h[7] < 0) fail("the header's vocabulary size " + std::to_string(h[7]) + " is negative (0 means unknown)");
  if (h[9] < 0 || h[9] > 2) fail("unknown chat template " + std::to_string(h[9]));
  vocab_ = h[7];
  pad_ = h[8];
  template_ = ChatTemplate(h[9]);
  if (pad_ < 0 || (vocab_ > 0 && pad_ >= vocab_)) fail("pad id " + std::to_string(pad_) + " is outside the vocabulary");
  // Divided rather than multiplied: hostile counts must not wrap around to the file's size.
  const uint64_t body = map_size_ - kHeaderBytes;
  const uint64_t per_token = uint64_t(token_bytes_) + 1;
  if (uint64_t(records) + 1 > body / 8 ||
      (body - (uint64_t(records) + 1) * 8) % per_token != 0 ||
      (body - (uint64_t(records) + 1) * 8) / per_token != uint64_t(n))
    fail("header says " + std::to_string(n) + " tokens of " + std::to_string(token_bytes_) + " bytes in " +
         std::to_string(records) + " records, but the file holds " + std::to_string(body) + " bytes after the header");
  n_tokens_ = n;
  n_records_ = records;
  const char* p = static_cast<const char*>(map_) + kHeaderBytes;
  starts_ = reinterpret_cast<const int64_t*>(p);
  ids_ = p + (records + 1) * 8;
  loss_ = reinterpret_cast<const uint8_t*>(p + (records + 1) * 8 + n * token_bytes_);
  if (starts_[0] != 0 || starts_[records] != n)
    fail("the record starts run from " + std::to_string(starts_[0]) + " to " + std::to_string(starts_[records]) +
         ", not from 0 to the token count " + std::to_string(n));
  // starts_[0] is 0, so by induction every start compared is >= 0 and the difference cannot overflow.
  for (int64_t r = 0; r < records; ++r)
    if (starts_[r + 1] < starts_[r] || starts_[r + 1] - starts_[r] < 2)
      fail("record " + std::to_string(r) + " starts at token " + std::to_string(starts_[r]) + " and has " +
           std::to_string(starts_[r + 1] - starts_[r]) + " tokens (at least 2)");
  for (int64_t i = 0; i < n; ++i) {
    if (loss_[i] > 1) fail("token " + std::to_string(i) + " has the loss flag " + std::to_string(loss_[i]) + " (0 or 1)");
    if (vocab_ > 0 && id(i) >= vocab_)
      fail("token " + std::to_string(i) + " has id " + std::to_string(id(i)) + ", outside the vocabulary of " +
           std::to_string(vocab_) + " that the header declares");
  }
}

InstructionFile::~InstructionFile() {
  if (map_) munmap(map_, map_size_);
  if (fd_ >= 0) ::close(fd_);
}

InstructionTokens InstructionFile::read_all() const {
  InstructionTokens t;
  t.record_starts.assign(starts_, starts_ + n_records_ + 1);
  t.ids.resize(size_t(n_tokens_));
  for (int64_t i = 0; i < n_tokens_; ++i) t.ids[size_t(i)] = id(i);
  t.loss.assign(loss_, loss_ + n_tokens_);
  return t;
}

}  // namespace zp::io
