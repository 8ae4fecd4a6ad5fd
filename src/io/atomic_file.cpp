#include "io/atomic_file.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace zp::io {

std::string temporary_path(const std::string& path) { return path + ".tmp"; }

void rename_into_place(const std::string& tmp, const std::string& path) {
  ZP_REQUIRE(std::rename(tmp.c_str(), path.c_str()) == 0, path, ": cannot rename ", tmp, " to it: ",
             std::strerror(errno));
}

AtomicFile::AtomicFile(std::string path, FileSync sync)
    : path_(std::move(path)), tmp_(temporary_path(path_)), sync_(sync) {
  f_ = std::fopen(tmp_.c_str(), "wb");
  ZP_REQUIRE(f_, tmp_, ": cannot create: ", std::strerror(errno));
}

AtomicFile::~AtomicFile() {
  if (f_) std::fclose(f_);
  if (!committed_) std::remove(tmp_.c_str());
}

void AtomicFile::fail(int err) const { throw Error(path_ + ": write failed: " + std::strerror(err)); }

void AtomicFile::write(const void* data, size_t bytes) {
  if (bytes && std::fwrite(data, 1, bytes, f_) != bytes) fail(errno);
}

void AtomicFile::commit() {
  if (std::fflush(f_) != 0 || (sync_ == FileSync::BeforeRename && fsync(fileno(f_)) != 0)) fail(errno);
  FILE* f = f_;
  f_ = nullptr;
  if (std::fclose(f) != 0) fail(errno);
  rename_into_place(tmp_, path_);
  committed_ = true;
}

void write_file_atomically(const std::string& path, std::string_view bytes, FileSync sync) {
  AtomicFile f(path, sync);
  f.write(bytes.data(), bytes.size());
  f.commit();
}

void write_file_atomically(const std::string& path, const std::function<void(const std::string& tmp)>& write) {
  const std::string tmp = temporary_path(path);
  try {
    write(tmp);
    rename_into_place(tmp, path);
  } catch (...) {
    std::remove(tmp.c_str());
    throw;
  }
}

}  // namespace zp::io
