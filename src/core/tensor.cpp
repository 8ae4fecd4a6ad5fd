#include "core/tensor.h"

#include <cstring>
#include <sstream>

#include "core/fault_injection.h"
#ifdef ZP_WITH_CUDA
#include "core/cuda_check.h"
#endif

namespace zp {

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

std::string shape_str(const Shape& s) {
  std::ostringstream o;
  o << '[';
  for (size_t i = 0; i < s.size(); ++i) o << (i ? ", " : "") << s[i];
  o << ']';
  return o.str();
}

Storage::~Storage() {
  if (allocator && ptr) allocator->deallocate(ptr, bytes, tag, stream);
}

Tensor Tensor::empty(const Shape& shape, DType dt, Device dev, const std::string& tag, StreamHandle s,
                     bool pinned) {
  for (int64_t d : shape) ZP_CHECK(d >= 0, "negative dimension in shape ", shape_str(shape));
  if (fault::hit(fault::Site::Alloc))
    ZP_FATAL("out of memory on ", dev.str(), " allocating ", shape_numel(shape) * int64_t(dtype_size(dt)),
             " bytes for '", tag, "'", fault::kInjected);
  Tensor t;
  t.shape_ = shape;
  t.dtype_ = dt;
  auto st = std::make_shared<Storage>();
  st->bytes = size_t(shape_numel(shape)) * dtype_size(dt);
  st->device = dev;
  st->allocator = &allocator_for(dev, pinned);
  st->tag = tag;
  st->stream = s;
  st->ptr = st->allocator->allocate(st->bytes, tag, s);
  t.storage_ = std::move(st);
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dt, Device dev, const std::string& tag, StreamHandle s) {
  Tensor t = empty(shape, dt, dev, tag, s);
  t.zero_(s);
  return t;
}

Tensor Tensor::from_blob(void* ptr, const Shape& shape, DType dt, Device dev) {
  Tensor t;
  t.shape_ = shape;
  t.dtype_ = dt;
  auto st = std::make_shared<Storage>();
  st->ptr = ptr;
  st->bytes = size_t(shape_numel(shape)) * dtype_size(dt);
  st->device = dev;
  t.storage_ = std::move(st);
  return t;
}

int64_t Tensor::stride(int64_t d) const {
  if (d < 0) d += dim();
  int64_t s = 1;
  for (int64_t i = dim() - 1; i > d; --i) s *= shape_[size_t(i)];
  return s;
}

Tensor Tensor::view(Shape shape) const {
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      ZP_CHECK(infer < 0, "view ", shape_str(shape), ": more than one -1");
      infer = int64_t(i);
    } else {
      known *= shape[i];
    }
  }
  if (infer >= 0) {
    ZP_CHECK(known > 0 && numel() % known == 0, "view ", shape_str(shape), " of ", str());
    shape[size_t(infer)] = numel() / known;
  }
  ZP_CHECK(shape_numel(shape) == numel(), "view ", shape_str(shape), " of ", str(), ": numel differs");
  Tensor t = *this;
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::slice(int64_t begin, int64_t end) const {
  ZP_CHECK(dim() >= 1 && 0 <= begin && begin <= end && end <= shape_[0], "slice [", begin, ", ", end,
           ") of ", str());
  Tensor t = *this;
  t.shape_[0] = end - begin;
  t.offset_ += size_t(begin * stride(0)) * dtype_size(dtype_);
  return t;
}

Tensor Tensor::flat(int64_t offset, int64_t count) const {
  ZP_CHECK(offset >= 0 && count >= 0 && offset + count <= numel(), "flat(", offset, ", ", count, ") of ",
           str());
  Tensor t = *this;
  t.shape_ = {count};
  t.offset_ += size_t(offset) * dtype_size(dtype_);
  return t;
}

void copy_bytes(void* dst, Device dst_dev, const void* src, Device src_dev, size_t bytes, StreamHandle s) {
  const bool download = bytes > 0 && dst_dev.is_cpu() && !src_dev.is_cpu();
  // A download into pageable memory returns only when it is done, so it would block on the stream's
  // earlier work without a limit: that is waited for first, bounded (core/host_wait.h).
  if (download) stream_synchronize(s);
  copy_bytes_async(dst, dst_dev, src, src_dev, bytes, s);
  if (download) stream_synchronize(s);  // host code reads a download next
}

void copy_bytes_async(void* dst, Device dst_dev, const void* src, Device src_dev, size_t bytes, StreamHandle s) {
  if (bytes == 0) return;
  if (dst_dev.is_cpu() && src_dev.is_cpu()) {
    std::memcpy(dst, src, bytes);
    return;
  }
#ifdef ZP_WITH_CUDA
  ZP_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s));
#else
  ZP_FATAL("device copy in a CPU-only build");
#endif
}

void Tensor::copy_from(const Tensor& src, StreamHandle s) {
  ZP_CHECK(src.numel() == numel() && src.dtype() == dtype_, "copy_from: ", src.str(), " into ", str());
  copy_bytes(data(), device(), src.data(), src.device(), nbytes(), s);
}

Tensor Tensor::to(Device dev, StreamHandle s) const {
  Tensor t = empty(shape_, dtype_, dev, storage_ ? storage_->tag : "tensor", s);
  t.copy_from(*this, s);
  return t;
}

void Tensor::zero_(StreamHandle s) {
  if (nbytes() == 0) return;
  if (device().is_cpu()) {
    std::memset(data(), 0, nbytes());
    return;
  }
#ifdef ZP_WITH_CUDA
  ZP_CUDA_CHECK(cudaMemsetAsync(data(), 0, nbytes(), s));
#endif
}

std::string Tensor::str() const {
  return std::string(dtype_name(dtype_)) + shape_str(shape_) + " " + device().str();
}

}  // namespace zp
