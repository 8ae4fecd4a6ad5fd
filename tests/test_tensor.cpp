#include "core/tensor.h"
#include "test_util.h"

namespace zp::test {

TEST(Tensor, ViewsShareStorage) {
  Tensor t = Tensor::zeros({4, 3}, DType::F32, Device::cpu(), "test");
  EXPECT_EQ(t.numel(), 12);
  EXPECT_EQ(t.stride(0), 3);
  Tensor rows = t.slice(1, 3);
  EXPECT_EQ(rows.shape(), (Shape{2, 3}));
  rows.data<float>()[0] = 5.f;
  EXPECT_EQ(t.data<float>()[3], 5.f);
  Tensor v = t.view({-1, 6});
  EXPECT_EQ(v.shape(), (Shape{2, 6}));
  Tensor f = t.flat(3, 4);
  EXPECT_EQ(f.data<float>()[0], 5.f);
  EXPECT_EQ(f.storage().get(), t.storage().get());
}

TEST(Tensor, AllocatorStatsTrackTags) {
  Allocator& a = host_allocator();
  size_t before = a.stats().current_by_tag["unit-test-tag"];
  {
    Tensor t = Tensor::empty({1000}, DType::F32, Device::cpu(), "unit-test-tag");
    EXPECT_EQ(a.stats().current_by_tag["unit-test-tag"], before + 4000);
    EXPECT_GE(a.stats().peak_by_tag["unit-test-tag"], before + 4000);
  }
  EXPECT_EQ(a.stats().current_by_tag["unit-test-tag"], before);
}

TEST(TensorDeathTest, BadViewAborts) {
  Tensor t = Tensor::zeros({4, 3}, DType::F32, Device::cpu());
  EXPECT_DEATH(t.view({5, 3}), "numel differs");
  EXPECT_DEATH(t.data<bf16>(), "accessed as bf16");
}

TEST(TensorGpu, RoundTripAndStats) {
  ZP_SKIP_WITHOUT_GPU();
  auto v = randn(1001, 3);
  Tensor d = upload(v, DType::F32);
  EXPECT_EQ(download(d), v);
  MemoryStats st = device_allocator(0).stats();
  EXPECT_GE(st.current, 1001u * 4);
  EXPECT_GE(st.peak, st.current);
}

}  // namespace zp::test
