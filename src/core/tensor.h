// Tensor: a contiguous n-d array (row-major) of one dtype on one device, viewing shared storage.
// Views (reshape, slices along the first dimension, flat ranges) share storage and copy nothing;
// the storage goes back to its allocator, on the stream it was allocated on, when the last view dies.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/device.h"
#include "core/dtype.h"
#include "core/error.h"

namespace zp {

using Shape = std::vector<int64_t>;
int64_t shape_numel(const Shape& s);
std::string shape_str(const Shape& s);

struct Storage {
  void* ptr = nullptr;
  size_t bytes = 0;
  Device device;
  Allocator* allocator = nullptr;  // nullptr: borrowed memory, not freed
  std::string tag;
  StreamHandle stream = nullptr;
  ~Storage();
};

class Tensor {
 public:
  Tensor() = default;
  // Uninitialised memory from the allocator of `dev`. `pinned` is for CPU tensors used in copies.
  static Tensor empty(const Shape& shape, DType dt, Device dev, const std::string& tag = "tensor",
                      StreamHandle s = nullptr, bool pinned = false);
  static Tensor zeros(const Shape& shape, DType dt, Device dev, const std::string& tag = "tensor",
                      StreamHandle s = nullptr);
  // Wraps memory the tensor does not own.
  static Tensor from_blob(void* ptr, const Shape& shape, DType dt, Device dev);

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  int64_t dim() const { return int64_t(shape_.size()); }
  int64_t size(int64_t d) const { return shape_.at(size_t(d < 0 ? d + dim() : d)); }
  int64_t stride(int64_t d) const;
  int64_t numel() const { return shape_numel(shape_); }
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype_); }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_ ? storage_->device : Device::cpu(); }
  const std::shared_ptr<Storage>& storage() const { return storage_; }

  void* data() const { return static_cast<char*>(storage_->ptr) + offset_; }
  template <class T> T* data() const {
    ZP_CHECK(dtype_of<T>() == dtype_, "tensor is ", dtype_name(dtype_), ", accessed as ",
             dtype_name(dtype_of<T>()));
    return static_cast<T*>(data());
  }

  // Same data, new shape (same numel); one dimension may be -1.
  Tensor view(Shape shape) const;
  // Rows [begin, end) of the first dimension.
  Tensor slice(int64_t begin, int64_t end) const;
  // Elements [offset, offset+count) of the flattened tensor, as a 1-d tensor.
  Tensor flat(int64_t offset, int64_t count) const;

  // Copies `src` (same numel and dtype, any devices) into this tensor, ordered on `s`.
  void copy_from(const Tensor& src, StreamHandle s = nullptr);
  Tensor to(Device dev, StreamHandle s = nullptr) const;
  void zero_(StreamHandle s = nullptr);
  // The storage will go back to its allocator ordered on `s` rather than on the stream it was
  // allocated on: for a buffer whose last users run on another stream (a collective on a
  // communication stream), so the memory is not reused before they finish.
  void free_on(StreamHandle s) const { if (storage_) storage_->stream = s; }

  std::string str() const;  // "bf16[4, 8] cuda:0"

 private:
  std::shared_ptr<Storage> storage_;
  size_t offset_ = 0;  // bytes
  Shape shape_;
  DType dtype_ = DType::F32;
};

// Copies bytes between any two devices (host, pinned or device memory), ordered on `s`.
void copy_bytes(void* dst, Device dst_dev, const void* src, Device src_dev, size_t bytes, StreamHandle s);
// The same copy without the wait: a copy into host memory is complete only when `s` gets there (the
// caller orders its reads with an event). Host memory on the other side should be pinned, or CUDA
// copies it synchronously anyway.
void copy_bytes_async(void* dst, Device dst_dev, const void* src, Device src_dev, size_t bytes, StreamHandle s);

}  // namespace zp
