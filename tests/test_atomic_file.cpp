// io/atomic_file.h: a file appears under its name only when complete, and an older file under that
// name survives a writer that fails half-way.
#include "io/atomic_file.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "core/error.h"
#include "test_util.h"

namespace fs = std::filesystem;

namespace zp::test {
namespace {

struct ScratchFile {
  ScratchFolder dir{"atomic_file"};
  std::string path = dir / "out.bin";
};

std::string read_all(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

}  // namespace

TEST(AtomicFile, CommitReplacesTheOldFileWhole) {
  ScratchFile sf;
  io::write_file_atomically(sf.path, "old contents", io::FileSync::None);
  {
    io::AtomicFile f(sf.path, io::FileSync::BeforeRename);
    f.write("new ", 4);
    EXPECT_EQ(read_all(sf.path), "old contents") << "the name keeps the old file until commit";
    EXPECT_TRUE(fs::exists(io::temporary_path(sf.path)));
    f.write("contents", 8);
    f.commit();
  }
  EXPECT_EQ(read_all(sf.path), "new contents");
  EXPECT_FALSE(fs::exists(io::temporary_path(sf.path)));
}

TEST(AtomicFile, AWriterThatFailsLeavesTheOldFileAndNoTemporary) {
  ScratchFile sf;
  io::write_file_atomically(sf.path, "kept", io::FileSync::None);
  {
    io::AtomicFile f(sf.path, io::FileSync::None);
    f.write("half", 4);
  }  // destroyed without commit, as when an exception unwinds the writer
  EXPECT_EQ(read_all(sf.path), "kept");
  EXPECT_FALSE(fs::exists(io::temporary_path(sf.path)));

  EXPECT_THROW(io::write_file_atomically(sf.path,
                                         [](const std::string& tmp) {
                                           std::ofstream(tmp) << "partial";
                                           throw std::runtime_error("writer failed");
                                         }),
               std::runtime_error);
  EXPECT_EQ(read_all(sf.path), "kept");
  EXPECT_FALSE(fs::exists(io::temporary_path(sf.path)));
}

TEST(AtomicFile, UnwritableFolderIsAnErrorNamingTheFile) {
  expect_error([] { io::AtomicFile f("/nonexistent-zp-dir/out.bin", io::FileSync::None); },
               {"/nonexistent-zp-dir/out.bin.tmp: cannot create"});
}

}  // namespace zp::test
