// The NVMe tier's swap file (io/nvme_swap_file.h): requests of odd sizes at odd offsets, many in
// flight and split into pieces, come back as written, with O_DIRECT and, on a file system that
// refuses it, buffered with a warning; the file is gone from its directory while it is open; bad
// directories, a disk too small and a full disk (the fault injector) fail with messages that name
// the key, the path and the bytes.
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/vfs.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "core/tensor.h"
#include "io/nvme_swap_file.h"
#include "test_util.h"

namespace zp::test {
namespace {

using io::NvmeSwapFile;
constexpr int64_t kPage = NvmeSwapFile::kAlign;
const std::string kKey = "zero_optimization.offload_optimizer.nvme_path";

// Host memory aligned for O_DIRECT.
struct AlignedBytes {
  std::vector<char> raw;
  char* data = nullptr;
  explicit AlignedBytes(int64_t n) : raw(size_t(n + kPage)) {
    const auto at = reinterpret_cast<uintptr_t>(raw.data());
    data = reinterpret_cast<char*>((at + kPage - 1) / kPage * kPage);
  }
};

// A file system mounted for the test, unmounted after; skips the test where mounting is not
// permitted (containers without CAP_SYS_ADMIN).
class Mount {
 public:
  Mount(const ScratchFolder& where, const char* type, const char* options, unsigned long flags = 0)
      : dir_(where / "mnt") {
    std::filesystem::create_directories(dir_);
    mounted_ = ::mount("none", dir_.c_str(), type, flags, options) == 0;
  }
  ~Mount() {
    if (mounted_) ::umount(dir_.c_str());
  }
  bool mounted() const { return mounted_; }
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  bool mounted_ = false;
};

// Writes requests of 1, 3, 5, ... pages at odd page offsets, all in flight at once, then reads them
// back in the reverse order into other memory, again all in flight; every byte must match.
void expect_round_trips(const std::string& dir, int64_t block_size, int queue_depth) {
  constexpr int kRequests = 24;
  std::vector<std::pair<int64_t, int64_t>> req;  // offset, bytes
  int64_t at = kPage;  // an odd first offset: page 1
  for (int r = 0; r < kRequests; ++r) {
    const int64_t bytes = (2 * (r % 7) + 1) * kPage;
    req.push_back({at, bytes});
    at += bytes + ((r % 2) ? 2 * kPage : 0);  // with holes between some
  }
  NvmeSwapFile f(dir, kKey, "roundtrip.swap", at + 3, block_size, queue_depth);
  EXPECT_EQ(f.size(), (at + 3 + kPage - 1) / kPage * kPage) << "rounded up to the alignment";
  AlignedBytes out(at), in(at);
  std::mt19937 g(5);
  for (int64_t i = 0; i < at; ++i) out.data[i] = char(g());
  std::vector<NvmeSwapFile::Ticket> tickets;
  for (const auto& [off, bytes] : req) tickets.push_back(f.write(off, out.data + off, bytes));
  for (NvmeSwapFile::Ticket t : tickets) f.wait(t);
  tickets.clear();
  for (auto it = req.rbegin(); it != req.rend(); ++it)
    tickets.push_back(f.read(it->first, in.data + it->first, it->second));
  f.wait_all();
  for (const auto& [off, bytes] : req)
    ASSERT_EQ(std::memcmp(out.data + off, in.data + off, size_t(bytes)), 0)
        << dir << ": request at " << off << " of " << bytes << " bytes";
  // A hole never written reads as zeros: the preallocation's promise the NVMe store relies on.
  AlignedBytes hole(kPage);
  std::memset(hole.data, 7, size_t(kPage));
  f.wait(f.read(0, hole.data, kPage));
  EXPECT_EQ(std::count(hole.data, hole.data + kPage, 0), kPage) << dir;
}

}  // namespace

TEST(NvmeSwapFile, RoundTripsOddSizesAndOffsetsWithManyRequestsInFlight) {
  ScratchFolder dir("nvme_roundtrip");
  {
    NvmeSwapFile probe(dir.str(), kKey, "probe.swap", kPage, kPage, 1);
    struct statfs fs {};
    ASSERT_EQ(::statfs(dir.str().c_str(), &fs), 0);
    // ext4, xfs and btrfs take O_DIRECT; a /tmp on tmpfs takes it only since Linux 6.6.
    if (fs.f_type == 0xEF53 || fs.f_type == 0x58465342 || fs.f_type == 0x9123683E)
      EXPECT_TRUE(probe.direct()) << dir.str();
  }
  expect_round_trips(dir.str(), 2 * kPage, 8);       // every request in pieces, many in flight
  expect_round_trips(dir.str(), 10000, 1);           // block size rounded down to 8192; one at a time
  expect_round_trips(dir.str(), int64_t(1) << 20, 64);  // whole requests, all in flight
}

TEST(NvmeSwapFile, IsGoneFromItsDirectoryWhileOpen) {
  ScratchFolder dir("nvme_unlinked");
  NvmeSwapFile f(dir.str(), kKey, "gone.swap", 16 * kPage, kPage, 4);
  EXPECT_TRUE(std::filesystem::is_empty(dir.str())) << f.path() << " is still listed";
  EXPECT_EQ(f.path(), dir / "gone.swap");
  AlignedBytes b(kPage);
  std::memset(b.data, 3, size_t(kPage));
  f.wait(f.write(15 * kPage, b.data, kPage));  // and still usable
}

// tmpfs takes O_DIRECT since Linux 6.6, and then gets it; either way the round trips hold, and a
// warning names the path exactly when it does not.
TEST(NvmeSwapFile, WorksOnTmpfs) {
  if (!std::filesystem::is_directory("/dev/shm")) GTEST_SKIP() << "no /dev/shm";
  const std::string dir = "/dev/shm/zp_nvme_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  testing::internal::CaptureStderr();
  bool direct = true;
  {
    NvmeSwapFile f(dir, kKey, "probe.swap", kPage, kPage, 1);
    direct = f.direct();
  }
  const std::string log = testing::internal::GetCapturedStderr();
  EXPECT_EQ(log.find("O_DIRECT") == std::string::npos, direct) << log;
  expect_round_trips(dir, 2 * kPage, 8);
  std::filesystem::remove_all(dir);
}

// ramfs refuses O_DIRECT on every kernel: buffered I/O, one warning naming the path and the key.
TEST(NvmeSwapFile, FallsBackToBufferedIoWithOneWarningWhereODirectIsRefused) {
  ScratchFolder where("nvme_ramfs");
  Mount ramfs(where, "ramfs", "");
  if (!ramfs.mounted()) GTEST_SKIP() << "cannot mount a ramfs here (needs CAP_SYS_ADMIN)";
  testing::internal::CaptureStderr();
  {
    NvmeSwapFile f(ramfs.dir(), kKey, "probe.swap", kPage, kPage, 1);
    EXPECT_FALSE(f.direct());
  }
  const std::string log = testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find(kKey + " '" + ramfs.dir() + "'"), std::string::npos) << log;
  EXPECT_NE(log.find("refuses O_DIRECT"), std::string::npos) << log;
  EXPECT_NE(log.find("buffered"), std::string::npos) << log;
  EXPECT_EQ(std::count(log.begin(), log.end(), '\n'), 1) << "one warning: " << log;
  expect_round_trips(ramfs.dir(), 2 * kPage, 8);
}

TEST(NvmeSwapFile, BadDirectoriesFailNamingTheKeyAndThePath) {
  ScratchFolder dir("nvme_bad");
  expect_error([&] { NvmeSwapFile(dir / "missing", kKey, "x.swap", kPage, kPage, 1); },
               {kKey + " '" + dir / "missing" + "'", "does not exist"});
  // A path under a regular file: no one, root included, can create anything there.
  expect_error([&] { NvmeSwapFile("/etc/hostname/x", kKey, "x.swap", kPage, kPage, 1); },
               {kKey + " '/etc/hostname/x'", "not a directory"});
  {
    std::ofstream(dir / "file") << "x";
    expect_error([&] { NvmeSwapFile(dir / "file", kKey, "x.swap", kPage, kPage, 1); },
                 {kKey + " '" + dir / "file" + "'", "is not a directory"});
  }
  expect_error([&] { NvmeSwapFile("", kKey, "x.swap", kPage, kPage, 1); }, {kKey, "is empty"});
}

// Root writes through chmod 555; a read-only mount stops everyone.
TEST(NvmeSwapFile, ReadOnlyDirectoryIsNotWritable) {
  ScratchFolder where("nvme_ro");
  Mount ro(where, "tmpfs", "size=1m", MS_RDONLY);
  if (!ro.mounted()) GTEST_SKIP() << "cannot mount a read-only tmpfs here (needs CAP_SYS_ADMIN)";
  expect_error([&] { NvmeSwapFile(ro.dir(), kKey, "x.swap", kPage, kPage, 1); },
               {kKey + " '" + ro.dir() + "'", "not writable", ro.dir() + "/x.swap", "Read-only file system"});
}

// Preallocation: a disk too small fails when the file is made, naming the bytes needed and free.
TEST(NvmeSwapFile, DiskTooSmallFailsAtCreationNamingTheBytes) {
  ScratchFolder where("nvme_small");
  Mount small(where, "tmpfs", "size=1m");
  if (!small.mounted()) GTEST_SKIP() << "cannot mount a small tmpfs here (needs CAP_SYS_ADMIN)";
  const std::string m = error_message([&] { NvmeSwapFile(small.dir(), kKey, "big.swap", 4 << 20, kPage, 1); });
  EXPECT_NE(m.find(kKey + " '" + small.dir() + "'"), std::string::npos) << m;
  EXPECT_NE(m.find("needs 4194304 bytes"), std::string::npos) << m;
  EXPECT_NE(m.find("1048576 bytes are free"), std::string::npos) << m;
  EXPECT_NE(m.find("No space left on device"), std::string::npos) << m;
  EXPECT_TRUE(std::filesystem::is_empty(small.dir())) << "nothing left behind";
}

// A write that meets a full disk (ZP_FAULT=write:2: the second write request) fails at its wait,
// naming the key, the directory, the offset and the bytes; the other requests are unaffected. The
// injector reads ZP_FAULT once per process, so this runs in a fresh one (a death test re-executes
// the binary for just this test).
TEST(NvmeSwapFile, FullDiskAtAWriteFailsNamingOffsetAndBytes) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  ScratchFolder dir("nvme_enospc");
  EXPECT_EXIT(
      {
        ::setenv("ZP_FAULT", "write:2", 1);
        NvmeSwapFile f(dir.str(), kKey, "full.swap", 64 * kPage, 4 * kPage, 4);
        AlignedBytes b(8 * kPage);
        const NvmeSwapFile::Ticket first = f.write(0, b.data, 8 * kPage);
        const NvmeSwapFile::Ticket second = f.write(16 * kPage, b.data, 8 * kPage);
        f.wait(first);
        const std::string m = error_message([&] { f.wait(second); });
        std::fprintf(stderr, "%s\n", m.c_str());
        std::exit(m.empty() ? 1 : 0);
      },
      testing::ExitedWithCode(0),
      "zero_optimization.offload_optimizer.nvme_path '.*nvme_enospc.*': writing 32768 bytes at offset 65536 of the "
      "swap file .*full.swap failed: No space left on device \\(injected by ZP_FAULT\\)");
}

}  // namespace zp::test
