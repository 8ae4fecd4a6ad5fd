#include "nn/res_block.h"

#include "core/copy_rows.h"
#include "kernels/elementwise.h"
#include "kernels/nhwc.h"

namespace zp::nn {
using namespace zp::kernels;

ResBlock::ResBlock(GroupNorm norm1, Conv2d conv1, Linear time_emb_proj, GroupNorm norm2, Conv2d conv2,
                   Conv2d shortcut, float output_scale)
    : norm1_(norm1), norm2_(norm2), conv1_(conv1), conv2_(conv2), shortcut_(shortcut), temb_proj_(time_emb_proj),
      out_scale_(output_scale) {
  ZP_CHECK(norm1_.channels() == conv1_.in() && temb_proj_.out() == conv1_.out() &&
               norm2_.channels() == conv1_.out() && conv2_.in() == conv1_.out() && conv2_.out() == conv1_.out(),
           "ResBlock: the widths of its layers disagree");
  ZP_CHECK(shortcut_.defined() ? shortcut_.in() == conv1_.in() && shortcut_.out() == conv1_.out()
                               : conv1_.in() == conv1_.out(),
           "ResBlock: ", conv1_.in(), " -> ", conv1_.out(), " channels needs a matching 1x1 shortcut, and only then");
}

namespace {

// y[p] = [a[p] | b[p]] along channels (torch.cat(dim=1)) for channels-last a[N, H, W, Ca], b[N, H, W, Cb]:
// each pixel's row is a's row then b's.
void concat_channels(const Ctx& c, Tensor& y, const Tensor& a, const Tensor& b) {
  const int64_t N = a.size(0), H = a.size(1), W = a.size(2), Ca = a.size(3), Cb = b.size(3);
  ZP_CHECK(b.size(0) == N && b.size(1) == H && b.size(2) == W, "concat of ", a.str(), " and ", b.str());
  y = c.saved({N, H, W, Ca + Cb});
  const size_t esz = dtype_size(c.dt), sa = size_t(Ca) * esz, sb = size_t(Cb) * esz;
  char* dst = static_cast<char*>(y.data());
  copy_rows(dst, sa + sb, c.dev, a.data(), sa, c.dev, sa, N * H * W, c.s);
  copy_rows(dst + sa, sa + sb, c.dev, b.data(), sb, c.dev, sb, N * H * W, c.s);
}

// The inverse: da[N, H, W, Ca] and db[N, H, W, Cb] from dy[N, H, W, Ca + Cb].
void split_channels(const Ctx& c, const Tensor& dy, Tensor& da, Tensor& db, int64_t Ca) {
  const int64_t N = dy.size(0), H = dy.size(1), W = dy.size(2), Cb = dy.size(3) - Ca;
  da = c.act({N, H, W, Ca});
  db = c.act({N, H, W, Cb});
  const size_t esz = dtype_size(c.dt), sa = size_t(Ca) * esz, sb = size_t(Cb) * esz;
  const char* src = static_cast<const char*>(dy.data());
  copy_rows(da.data(), sa, c.dev, src, sa + sb, c.dev, sa, N * H * W, c.s);
  copy_rows(db.data(), sb, c.dev, src + sa, sa + sb, c.dev, sb, N * H * W, c.s);
}

void add_into(const Ctx& c, Tensor& y, const Tensor& x) {
  ZP_CHECK(y.numel() == x.numel(), "add ", x.str(), " into ", y.str());
  ZP_KERNEL_CALL(c.dev, add, c.s, c.dt, y.data(), y.data(), x.data(), y.numel());
}

}  // namespace

Tensor ResBlock::forward(const Ctx& c, const Tensor& in, const Tensor& skip, int64_t H, int64_t W, const Tensor& temb,
                         Saved& saved, bool checkpoint) const {
  const int64_t B = in.size(0), Ci = conv1_.in(), Co = conv1_.out(), HW = H * W;
  Saved& sv = saved;
  sv = {};
  if (skip.defined())
    concat_channels(c, sv.x, in, skip);
  else
    sv.x = in;
  ZP_CHECK(sv.x.size(3) == Ci, "ResBlock with ", Ci, " input channels given ", sv.x.str());
  const Tensor& x = sv.x;
  sv.a1 = c.saved({B, H, W, Ci});
  norm1_.forward(c, sv.a1.data(), x.data(), B, HW, sv.n1);
  sv.h1 = c.saved({B, H, W, Co});
  conv1_.forward(c, sv.h1.data(), sv.a1.data(), B, H, W);
  Tensor t = c.act({B, Co});
  temb_proj_.forward(c, t.data(), temb.data(), B);
  ZP_KERNEL_CALL(c.dev, channel_add, c.s, c.dt, sv.h1.data(), t.data(), B, Co, HW);
  sv.a2 = c.saved({B, H, W, Co});
  norm2_.forward(c, sv.a2.data(), sv.h1.data(), B, HW, sv.n2);
  Tensor y = c.act({B, H, W, Co});
  conv2_.forward(c, y.data(), sv.a2.data(), B, H, W);
  if (shortcut_.defined()) {
    Tensor s = c.act({B, H, W, Co});
    shortcut_.forward(c, s.data(), x.data(), B, H, W);
    add_into(c, y, s);
  } else {
    add_into(c, y, x);
  }
  if (out_scale_ != 1.f) ZP_KERNEL_CALL(c.dev, scale, c.s, c.dt, y.data(), y.data(), 1.f / out_scale_, y.numel());
  if (checkpoint) {
    sv = {};
    sv.in = in;
    sv.skip = skip;
    sv.checkpointed = true;
  }
  sv.skip_channels = skip.defined() ? skip.size(3) : 0;
  return y;
}

Tensor ResBlock::backward(const Ctx& c, const Tensor& dy, int64_t H, int64_t W, const Tensor& temb, Tensor& dtemb,
                          Saved& saved, Tensor* dskip, DeferredWeightGrads* later) const {
  Saved& sv = saved;
  if (sv.checkpointed) {
    const Tensor in = sv.in, skip = sv.skip;  // forward() starts by clearing sv
    forward(c, in, skip, H, W, temb, sv, false);
  }
  const int64_t B = dy.size(0), Ci = conv1_.in(), Co = conv1_.out(), HW = H * W;
  Tensor g = dy;
  if (out_scale_ != 1.f) {
    g = c.act(dy.shape());
    ZP_KERNEL_CALL(c.dev, scale, c.s, c.dt, g.data(), dy.data(), 1.f / out_scale_, g.numel());
  }
  Tensor da2 = c.act({B, H, W, Co});
  conv2_.backward(c, da2.data(), g, sv.a2, B, H, W, false, later);
  Tensor dh1 = c.act({B, H, W, Co});
  norm2_.backward(c, dh1.data(), da2.data(), sv.h1.data(), B, HW, sv.n2, later);
  Tensor dt = c.act({B, Co});
  ZP_KERNEL_CALL(c.dev, channel_sum, c.s, c.dt, dt.data(), dh1.data(), B, Co, HW);
  temb_proj_.backward(c, dtemb.data(), dt, temb, B, /*accumulate_dx=*/true, later);
  Tensor da1 = c.act({B, H, W, Ci});
  conv1_.backward(c, da1.data(), dh1, sv.a1, B, H, W, false, later);
  Tensor dx = c.act({B, H, W, Ci});
  norm1_.backward(c, dx.data(), da1.data(), sv.x.data(), B, HW, sv.n1, later);
  if (shortcut_.defined())
    shortcut_.backward(c, dx.data(), g, sv.x, B, H, W, /*accumulate_dx=*/true, later);
  else
    add_into(c, dx, g);
  const int64_t Cs = sv.skip_channels;
  sv = {};
  if (Cs == 0) return dx;
  ZP_CHECK(dskip, "ResBlock backward: the forward had a skip connection, its gradient has nowhere to go");
  Tensor din;
  split_channels(c, dx, din, *dskip, Ci - Cs);
  return din;
}

}  // namespace zp::nn
