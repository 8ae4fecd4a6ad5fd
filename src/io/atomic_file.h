// Files that appear under their name only when complete: written to <path>.tmp, then renamed over
// <path>. A reader, or a crash half-way, never sees half a file, and a file already at <path> stays
// as it was until the new one is whole. The collective HDF5 checkpoint writer (io/checkpoint_file.h)
// keeps its own sequence (every rank writes, rank 0 renames after a barrier) but the same names
// and rename.
#pragma once
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <string_view>

namespace zp::io {

// Whether the bytes are forced to the disk (fsync) before the rename: for files a user keeps
// (weights, a converted model), so that after a power loss the name never points at a file whose
// data did not reach the disk. Scratch and test files skip it.
enum class FileSync : uint8_t { None, BeforeRename };

// <path>.tmp: where the file is written until it is complete.
std::string temporary_path(const std::string& path);

// Renames the complete temporary file `tmp` over `path`; throws zp::Error
// "<path>: cannot rename <tmp> to it: <reason>".
void rename_into_place(const std::string& tmp, const std::string& path);

// A byte stream into <path>.tmp. commit() flushes (and with FileSync::BeforeRename fsyncs), closes
// and renames it over `path`; destroyed without a commit (an error on the way) it removes <path>.tmp.
// Errors throw zp::Error naming the file: "<tmp>: cannot create: <reason>", "<path>: write failed:
// <reason>", or rename_into_place's.
class AtomicFile {
 public:
  AtomicFile(std::string path, FileSync sync);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, size_t bytes);
  void commit();

 private:
  [[noreturn]] void fail(int err) const;
  std::string path_, tmp_;
  FileSync sync_;
  FILE* f_ = nullptr;
  bool committed_ = false;
};

// `bytes` as the whole file at `path`.
void write_file_atomically(const std::string& path, std::string_view bytes, FileSync sync);
// For writers that open the file themselves (HDF5): `write` creates and completes the file at the
// temporary path it is given, which is then renamed over `path`. When `write` or the rename throws,
// whatever is left at the temporary path is removed and the error goes on.
void write_file_atomically(const std::string& path, const std::function<void(const std::string& tmp)>& write);

}  // namespace zp::io
