// LoRA (issue 14): nn::Linear's low-rank adapters and the transformer's LoRA mode.
//  - A packed q/k/v Linear with adapters on some of its modules gives the output, input gradient
//    and parameter gradients of the dense formulation, the merged weight W + scale * B A, in f64;
//    the adapters' gradients match finite differences; a frozen base gets none.
//  - Dropout: the forward is the dense formula with the counter-hash mask, the backward its exact
//    gradient (finite differences with the mask fixed by its key).
//  - A Transformer (GPT-2 and Llama, every target module kind) with LoRA computes the logits of the
//    plain model with merged weights, its adapter gradients match finite differences, with and
//    without activation checkpointing, and the base blocks take no gradient.
//  - A Conv2d with a LoRA adapter (PEFT's LoRA Conv2d: A with the base's kernel, stride and padding,
//    B 1x1), 3x3 with padding, strided, and 1x1: the output and input gradient of the merged weight
//    W + scale * B A, the adapters' gradients against finite differences, with and without dropout.
//  - The SDXL-layout UNet with adapters on every linear module kind (attn1/attn2 to_q, to_k, to_v,
//    to_out.0, ff.net.0.proj, ff.net.2, proj_in, proj_out) gives the merged model's output, exact
//    adapter gradients, and no gradient to its frozen blocks; so does the SD 1.x UNet with adapters
//    on every convolution kind (ResBlocks' conv1, conv2, conv_shortcut, the 1x1 proj_in / proj_out,
//    the samplers' conv), merged by io::add_lora_update; a target the model lacks is refused.
//  - On the golden models (tests/golden/*-tiny/lora: PEFT's own LoRA layers in float64, in
//    transformers' LMs and diffusers' UNets) the outputs, the loss and every adapter gradient meet
//    the parity criterion, fp32 on the CPU, bf16 on a GPU.
//  - On a GPU the bf16 adapters follow the CPU reference, and the dropout masks are the same.
#include <cmath>
#include <functional>

#include "app/parity.h"
#include "io/config.h"
#include "io/lora_adapter_files.h"
#include "kernels/dropout.h"
#include "models/transformer.h"
#include "models/unet.h"
#include "nn/conv2d.h"
#include "nn/init.h"
#include "nn/linear.h"
#include "test_util.h"
#include "tiny_llama_config.h"
#include "tiny_unet_config.h"

namespace zp::test {
namespace {

void fill(nn::Parameter& p, uint64_t seed, double scale) {
  const std::vector<float> v = randn(size_t(p.numel()), seed, float(scale));
  p.value.copy_from(upload(v, p.value.dtype(), p.value.device()));
}

// f64 tensors exactly; others through float.
std::vector<double> values(const Tensor& t) {
  if (t.dtype() == DType::F64) {
    const Tensor h = t.device().is_cpu() ? t : t.to(Device::cpu());
    return {h.data<double>(), h.data<double>() + h.numel()};
  }
  const std::vector<float> f = download(t);
  return {f.begin(), f.end()};
}

// A q/k/v-style packed Linear (rows 6 + 4 + 4, in 5, with bias) with adapters on q (cols 0..6) and
// v (cols 10..14), in f64 on the CPU, and everything the dense formulation needs.
struct PackedCase {
  static constexpr int64_t kIn = 5, kN = 7, kR = 2;
  nn::ParamBlock base{"base"}, adapters{"adapters"};
  nn::Parameter *q, *k, *v, *bq, *bk, *bv, *aq, *av, *bbq, *bbv;
  nn::Linear lin;
  float scale = 1.5f;

  explicit PackedCase(bool frozen, float dropout = 0.f) {
    q = base.add("q.weight", {6, kIn}, true);
    k = base.add("k.weight", {4, kIn}, true, true);
    v = base.add("v.weight", {4, kIn}, true, true);
    bq = base.add("q.bias", {6}, false);
    bk = base.add("k.bias", {4}, false, true);
    bv = base.add("v.bias", {4}, false, true);
    if (frozen) base.freeze();
    base.allocate(Device::cpu(), DType::F64);
    aq = adapters.add("q.lora_A.weight", {kR, kIn}, true);
    av = adapters.add("v.lora_A.weight", {kR, kIn}, true, true);
    bbq = adapters.add("q.lora_B.weight", {6, kR}, true);
    bbv = adapters.add("v.lora_B.weight", {4, kR}, true);
    adapters.allocate(Device::cpu(), DType::F64);
    uint64_t seed = 1;
    for (nn::Parameter* p : {q, k, v, bq, bk, bv, aq, av, bbq, bbv}) fill(*p, seed++, 0.5);
    lin = nn::Linear({q, k, v}, {bq, bk, bv});
    lin.set_adapters({{aq, bbq, 0}, {av, bbv, 10}}, scale, dropout);
  }
  // The merged [14, 5] weight.
  std::vector<double> merged() const {
    std::vector<double> w(14 * kIn);
    const std::vector<double> W = values(base.values());
    for (int64_t o = 0; o < 14; ++o)
      for (int64_t i = 0; i < kIn; ++i) w[size_t(o * kIn + i)] = W[size_t(q->offset + o * kIn + i)];
    auto add = [&](const nn::Parameter* A, const nn::Parameter* B, int64_t col) {
      const double* a = A->value.data<double>();
      const double* b = B->value.data<double>();
      for (int64_t o = 0; o < B->shape[0]; ++o)
        for (int64_t i = 0; i < kIn; ++i) {
          double s = 0;
          for (int64_t r = 0; r < kR; ++r) s += b[o * kR + r] * a[r * kIn + i];
          w[size_t((col + o) * kIn + i)] += scale * s;
        }
    };
    add(aq, bbq, 0);
    add(av, bbv, 10);
    return w;
  }
};

// Central differences of `loss` with respect to n values in place at `v` (every `stride`-th), the
// values restored afterwards.
std::vector<double> central_differences(double* v, int64_t n, const std::function<double()>& loss,
                                        int64_t stride = 1) {
  std::vector<double> fd;
  for (int64_t i = 0; i < n; i += stride) {
    const double keep = v[i];
    v[i] = keep + 1e-6;
    const double lp = loss();
    v[i] = keep - 1e-6;
    const double lm = loss();
    v[i] = keep;
    fd.push_back((lp - lm) / 2e-6);
  }
  return fd;
}

nn::Ctx cpu64() {
  nn::Ctx c;
  c.dt = DType::F64;
  return c;
}

}  // namespace

TEST(LoraLinear, AdaptersEqualTheMergedWeightAndTheirGradientsAreExact) {
  for (bool frozen : {true, false}) {
    PackedCase pc(frozen);
    const nn::Ctx c = cpu64();
    const int64_t N = PackedCase::kN, in = PackedCase::kIn;
    Tensor x = upload(randn(size_t(N * in), 21), DType::F64, Device::cpu());
    Tensor y = Tensor::zeros({N, 14}, DType::F64, Device::cpu());
    pc.lin.forward(c, y.data(), x.data(), N);
    // Dense: y = x W'^T + b.
    const std::vector<double> w = pc.merged(), X = values(x), Y = values(y), bias = values(pc.base.values().flat(pc.bq->offset, 14));
    std::vector<double> want(size_t(N * 14));
    for (int64_t n = 0; n < N; ++n)
      for (int64_t o = 0; o < 14; ++o) {
        double s = bias[size_t(o)];
        for (int64_t i = 0; i < in; ++i) s += X[size_t(n * in + i)] * w[size_t(o * in + i)];
        want[size_t(n * 14 + o)] = s;
      }
    EXPECT_LE(rel_error(Y, want), 1e-13) << "forward, frozen " << frozen;

    // L = sum(y * g): dx = g W', the adapters' gradients against finite differences.
    const std::vector<float> g = randn(size_t(N * 14), 22);
    Tensor dy = upload(g, DType::F64, Device::cpu());
    Tensor dx = Tensor::zeros({N, in}, DType::F64, Device::cpu());
    pc.base.zero_grad();
    pc.adapters.zero_grad();
    pc.lin.backward(c, dx.data(), dy.data(), x.data(), N);
    std::vector<double> want_dx(size_t(N * in), 0.0);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t i = 0; i < in; ++i)
        for (int64_t o = 0; o < 14; ++o) want_dx[size_t(n * in + i)] += g[size_t(n * 14 + o)] * w[size_t(o * in + i)];
    EXPECT_LE(rel_error(values(dx), want_dx), 1e-13) << "input gradient, frozen " << frozen;

    auto loss = [&] {
      Tensor out = Tensor::zeros({N, 14}, DType::F64, Device::cpu());
      pc.lin.forward(c, out.data(), x.data(), N);
      double s = 0;
      for (int64_t i = 0; i < N * 14; ++i) s += out.data<double>()[i] * g[size_t(i)];
      return s;
    };
    for (nn::Parameter* p : {pc.aq, pc.av, pc.bbq, pc.bbv}) {
      const std::vector<double> an = values(p->grad), fd = central_differences(p->value.data<double>(), p->numel(), loss);
      EXPECT_LE(rel_error(an, fd), 1e-7) << p->name;
    }
    // The base: no gradient when frozen, dW = g^T x otherwise.
    double base_grad = 0;
    for (float v : download(pc.base.grads())) base_grad += std::abs(v);
    if (frozen)
      EXPECT_EQ(base_grad, 0.0) << "a frozen base took a gradient";
    else
      EXPECT_GT(base_grad, 0.0) << "a trained base took no gradient";
  }
}

TEST(LoraLinear, DropoutIsTheDenseFormulaWithTheHashedMaskAndItsExactGradient) {
  const float p = 0.3f;
  PackedCase pc(true, p);
  nn::Ctx c = cpu64();
  c.dropout = {0x1234, 40, PackedCase::kN};  // a row a sample
  const int64_t N = PackedCase::kN, in = PackedCase::kIn;
  Tensor x = upload(randn(size_t(N * in), 31), DType::F64, Device::cpu());
  Tensor y = Tensor::zeros({N, 14}, DType::F64, Device::cpu());
  pc.lin.forward(c, y.data(), x.data(), N);

  // The same Linear without adapters on the inputs, plus the adapters on the masked inputs by hand.
  nn::Ctx plain = cpu64();
  Tensor base_y = Tensor::zeros({N, 14}, DType::F64, Device::cpu());
  nn::Linear({pc.q, pc.k, pc.v}, {pc.bq, pc.bk, pc.bv}).forward(plain, base_y.data(), x.data(), N);
  // The mask: find the Linear's key by matching kept/dropped counts is not possible from outside, so
  // draw it the way the kernel documents: key = ctx key ^ FNV-1a of the first A's name.
  uint64_t id = 0xCBF29CE484222325ull;
  for (unsigned char ch : pc.aq->name) id = (id ^ ch) * 0x100000001B3ull;
  const std::vector<double> X = values(x);
  std::vector<double> xd(X.size());
  int dropped = 0;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t i = 0; i < in; ++i) {
      const bool keep = kernels::dropout_keep_draw(0x1234 ^ id, uint64_t((40 + n) * in + i)) >= p;
      dropped += !keep;
      xd[size_t(n * in + i)] = keep ? X[size_t(n * in + i)] / (1.0 - p) : 0.0;
    }
  EXPECT_GT(dropped, 0);
  EXPECT_LT(dropped, N * in);
  std::vector<double> want = values(base_y);
  auto add = [&](const nn::Parameter* A, const nn::Parameter* B, int64_t col) {
    for (int64_t n = 0; n < N; ++n)
      for (int64_t o = 0; o < B->shape[0]; ++o) {
        double s = 0;
        for (int64_t r = 0; r < 2; ++r) {
          double u = 0;
          for (int64_t i = 0; i < in; ++i) u += xd[size_t(n * in + i)] * A->value.data<double>()[r * in + i];
          s += u * B->value.data<double>()[o * 2 + r];
        }
        want[size_t(n * 14 + col + o)] += pc.scale * s;
      }
  };
  add(pc.aq, pc.bbq, 0);
  add(pc.av, pc.bbv, 10);
  EXPECT_LE(rel_error(values(y), want), 1e-13);

  // The backward with the same draw: input and adapter gradients against finite differences.
  const std::vector<float> g = randn(size_t(N * 14), 32);
  Tensor dy = upload(g, DType::F64, Device::cpu());
  Tensor dx = Tensor::zeros({N, in}, DType::F64, Device::cpu());
  pc.adapters.zero_grad();
  pc.lin.backward(c, dx.data(), dy.data(), x.data(), N);
  auto loss = [&] {
    Tensor out = Tensor::zeros({N, 14}, DType::F64, Device::cpu());
    pc.lin.forward(c, out.data(), x.data(), N);
    double s = 0;
    for (int64_t i = 0; i < N * 14; ++i) s += out.data<double>()[i] * g[size_t(i)];
    return s;
  };
  for (const Tensor* t : {&x, &pc.aq->value, &pc.bbv->value}) {
    const std::vector<double> an = t == &x ? values(dx) : values(t == &pc.aq->value ? pc.aq->grad : pc.bbv->grad);
    const std::vector<double> fd = central_differences(t->data<double>(), t->numel(), loss);
    EXPECT_LE(rel_error(an, fd), 1e-7) << (t == &x ? "dx" : t == &pc.aq->value ? "dA_q" : "dB_v");
  }
}


namespace {

// A Conv2d (Cin 3 -> Cout 4, k x k, stride, padding, bias) with a rank-2 adapter, f64 on the CPU.
struct ConvCase {
  static constexpr int64_t kCin = 3, kCout = 4, kR = 2, kN = 2, kH = 5, kW = 6;
  int64_t k, stride, pad;
  nn::ParamBlock base{"base"}, adapters{"adapters"};
  nn::Parameter *w, *bias, *a, *b;
  nn::Conv2d conv;
  float scale = 1.5f;

  ConvCase(int64_t k_, int64_t stride_, int64_t pad_, float dropout = 0.f) : k(k_), stride(stride_), pad(pad_) {
    w = base.add("conv.weight", {kCout, kCin, k, k}, true);
    bias = base.add("conv.bias", {kCout}, false);
    base.freeze();
    base.allocate(Device::cpu(), DType::F64);
    a = adapters.add("conv.lora_A.weight", {kR, kCin, k, k}, true);
    b = adapters.add("conv.lora_B.weight", {kCout, kR, 1, 1}, true);
    adapters.allocate(Device::cpu(), DType::F64);
    uint64_t seed = 41;
    for (nn::Parameter* p : {w, bias, a, b}) fill(*p, seed++, 0.5);
    conv = nn::Conv2d(w, bias, stride, pad);
    conv.set_adapter(a, b, scale, dropout);
  }
  kernels::Conv2dShape shape() const { return conv.shape(kN, kH, kW); }
  // L = sum(conv(x) * g).
  double loss(const nn::Ctx& c, const Tensor& x, const std::vector<float>& g) const {
    const kernels::Conv2dShape s = shape();
    Tensor out = Tensor::zeros({s.y_numel()}, DType::F64, Device::cpu());
    conv.forward(c, out.data(), x.data(), s.N, s.H, s.W);
    double sum = 0;
    for (int64_t i = 0; i < s.y_numel(); ++i) sum += out.data<double>()[i] * g[size_t(i)];
    return sum;
  }
  // The base conv with the merged weight W + scale * B A (A and B flattened to [r, Cin k k], [Cout, r]).
  std::vector<double> merged() const {
    std::vector<double> m = values(w->value);
    const int64_t K = kCin * k * k;
    for (int64_t o = 0; o < kCout; ++o)
      for (int64_t i = 0; i < K; ++i)
        for (int64_t r = 0; r < kR; ++r)
          m[size_t(o * K + i)] += scale * b->value.data<double>()[o * kR + r] * a->value.data<double>()[r * K + i];
    return m;
  }
};

}  // namespace

TEST(LoraConv2d, AdaptersEqualTheMergedWeightAndTheirGradientsAreExact) {
  const nn::Ctx c = cpu64();
  for (auto [k, stride, pad] : {std::tuple<int64_t, int64_t, int64_t>{3, 1, 1}, {3, 2, 1}, {1, 1, 0}}) {
    ConvCase cc(k, stride, pad);
    const kernels::Conv2dShape s = cc.shape();
    const std::string what = std::to_string(k) + "x" + std::to_string(k) + " stride " + std::to_string(stride);
    Tensor x = upload(randn(size_t(s.x_numel()), 51), DType::F64, Device::cpu());
    Tensor y = Tensor::zeros({s.y_numel()}, DType::F64, Device::cpu());
    cc.conv.forward(c, y.data(), x.data(), s.N, s.H, s.W);
    // The dense formulation: the base kernel over the merged weight.
    Tensor wm = upload(std::vector<float>(size_t(s.w_numel())), DType::F64, Device::cpu());
    const std::vector<double> m = cc.merged();
    std::copy(m.begin(), m.end(), wm.data<double>());
    Tensor want = Tensor::zeros({s.y_numel()}, DType::F64, Device::cpu());
    kernels::cpu::conv2d_forward(nullptr, DType::F64, want.data(), x.data(), wm.data(), cc.bias->v(), s);
    EXPECT_LE(rel_error(values(y), values(want)), 1e-13) << what;

    const std::vector<float> g = randn(size_t(s.y_numel()), 52);
    Tensor dy = upload(g, DType::F64, Device::cpu());
    Tensor dx = Tensor::zeros({s.x_numel()}, DType::F64, Device::cpu());
    cc.adapters.zero_grad();
    cc.base.zero_grad();
    cc.conv.backward(c, dx.data(), dy.data(), x.data(), s.N, s.H, s.W);
    Tensor want_dx = Tensor::zeros({s.x_numel()}, DType::F64, Device::cpu());
    kernels::cpu::conv2d_backward_data(nullptr, DType::F64, want_dx.data(), dy.data(), wm.data(), s);
    EXPECT_LE(rel_error(values(dx), values(want_dx)), 1e-13) << what << ": input gradient";
    double base_grad = 0;
    for (float v : download(cc.base.grads())) base_grad += std::abs(v);
    EXPECT_EQ(base_grad, 0.0) << what << ": the frozen base took a gradient";

    auto loss = [&] { return cc.loss(c, x, g); };
    for (nn::Parameter* p : {cc.a, cc.b}) {
      const std::vector<double> an = values(p->grad), fd = central_differences(p->value.data<double>(), p->numel(), loss);
      EXPECT_LE(rel_error(an, fd), 1e-7) << what << ": " << p->name;
    }
  }
}

TEST(LoraConv2d, DropoutIsTheDenseFormulaWithTheHashedMaskAndItsExactGradient) {
  const float p = 0.3f;
  for (auto [k, stride, pad] : {std::tuple<int64_t, int64_t, int64_t>{3, 2, 1}, {1, 1, 0}}) {
    ConvCase cc(k, stride, pad, p);
    nn::Ctx c = cpu64();
    c.dropout = {0x5678, 9, ConvCase::kN};
    const kernels::Conv2dShape s = cc.shape();
    Tensor x = upload(randn(size_t(s.x_numel()), 61), DType::F64, Device::cpu());
    Tensor y = Tensor::zeros({s.y_numel()}, DType::F64, Device::cpu());
    cc.conv.forward(c, y.data(), x.data(), s.N, s.H, s.W);
    // By hand: base(x) + scale * B(A(mask(x))), the mask one row per sample, keyed by the A's name.
    const uint64_t key = 0x5678 ^ nn::fnv1a(cc.a->name);
    const int64_t cols = s.Cin * s.H * s.W;
    Tensor xd = Tensor::zeros({s.x_numel()}, DType::F64, Device::cpu());
    int dropped = 0;
    for (int64_t n = 0; n < s.N; ++n)
      for (int64_t i = 0; i < cols; ++i) {
        const bool keep = kernels::dropout_keep_draw(key, uint64_t((9 + n) * cols + i)) >= p;
        dropped += !keep;
        xd.data<double>()[n * cols + i] = keep ? x.data<double>()[n * cols + i] / (1.0 - p) : 0.0;
      }
    EXPECT_GT(dropped, 0);
    EXPECT_LT(dropped, s.x_numel());
    kernels::Conv2dShape sa = s;
    sa.Cout = ConvCase::kR;
    Tensor u = Tensor::zeros({sa.y_numel()}, DType::F64, Device::cpu());
    kernels::cpu::conv2d_forward(nullptr, DType::F64, u.data(), xd.data(), cc.a->v(), nullptr, sa);
    Tensor want = Tensor::zeros({s.y_numel()}, DType::F64, Device::cpu());
    kernels::cpu::conv2d_forward(nullptr, DType::F64, want.data(), x.data(), cc.w->v(), cc.bias->v(), s);
    const int64_t P = s.oh() * s.ow();
    for (int64_t n = 0; n < s.N; ++n)
      for (int64_t o = 0; o < s.Cout; ++o)
        for (int64_t q = 0; q < P; ++q)
          for (int64_t r = 0; r < ConvCase::kR; ++r)
            want.data<double>()[(n * P + q) * s.Cout + o] +=  // channels-last: pixel (n, q), channel o
                cc.scale * cc.b->value.data<double>()[o * ConvCase::kR + r] * u.data<double>()[(n * P + q) * ConvCase::kR + r];
    EXPECT_LE(rel_error(values(y), values(want)), 1e-13) << k << "x" << k;

    const std::vector<float> g = randn(size_t(s.y_numel()), 62);
    Tensor dy = upload(g, DType::F64, Device::cpu());
    Tensor dx = Tensor::zeros({s.x_numel()}, DType::F64, Device::cpu());
    cc.adapters.zero_grad();
    cc.conv.backward(c, dx.data(), dy.data(), x.data(), s.N, s.H, s.W);
    auto loss = [&] { return cc.loss(c, x, g); };
    EXPECT_LE(rel_error(values(dx), central_differences(x.data<double>(), x.numel(), loss)), 1e-7) << "dx";
    EXPECT_LE(rel_error(values(cc.a->grad), central_differences(cc.a->value.data<double>(), cc.a->numel(), loss)), 1e-7)
        << "dA";
    EXPECT_LE(rel_error(values(cc.b->grad), central_differences(cc.b->value.data<double>(), cc.b->numel(), loss)), 1e-7)
        << "dB";
  }
}

// A sample's dropout masks depend on its global index only: the Linear's rows (3 tokens a sample)
// and the convolution's samples drawn in one forward of two samples equal those drawn one sample
// at a time, as another world size or accumulation cuts the batch, forward and input gradient.
TEST(LoraDropout, MasksFollowTheSampleNotTheMicroBatch) {
  const float p = 0.3f;
  const uint64_t key = 0x9ABC;
  {
    PackedCase pc(true, p);
    const int64_t tokens = 3, N = 2 * tokens, in = PackedCase::kIn;
    Tensor x = upload(randn(size_t(N * in), 71), DType::F64, Device::cpu());
    Tensor dy = upload(randn(size_t(N * 14), 72), DType::F64, Device::cpu());
    nn::Ctx both = cpu64(), one = cpu64();
    both.dropout = {key, 10, 2};
    Tensor y = Tensor::zeros({N, 14}, DType::F64, Device::cpu()), ys = Tensor::zeros({N, 14}, DType::F64, Device::cpu());
    Tensor dx = Tensor::zeros({N, in}, DType::F64, Device::cpu()), dxs = Tensor::zeros({N, in}, DType::F64, Device::cpu());
    pc.lin.forward(both, y.data(), x.data(), N);
    pc.lin.backward(both, dx.data(), dy.data(), x.data(), N);
    for (int64_t n = 0; n < 2; ++n) {
      one.dropout = {key, 10 + n, 1};
      pc.lin.forward(one, ys.data<double>() + n * tokens * 14, x.data<double>() + n * tokens * in, tokens);
      pc.lin.backward(one, dxs.data<double>() + n * tokens * in, dy.data<double>() + n * tokens * 14,
                      x.data<double>() + n * tokens * in, tokens);
    }
    EXPECT_LE(rel_error(values(ys), values(y)), 1e-14) << "Linear forward";
    EXPECT_LE(rel_error(values(dxs), values(dx)), 1e-14) << "Linear dx";
  }
  ConvCase cc(3, 1, 1, p);
  const kernels::Conv2dShape s = cc.shape();
  ASSERT_EQ(s.N, 2);
  const int64_t xn = s.x_numel() / 2, yn = s.y_numel() / 2;
  Tensor x = upload(randn(size_t(s.x_numel()), 73), DType::F64, Device::cpu());
  Tensor dy = upload(randn(size_t(s.y_numel()), 74), DType::F64, Device::cpu());
  nn::Ctx both = cpu64(), one = cpu64();
  both.dropout = {key, 20, 2};
  Tensor y = Tensor::zeros({s.y_numel()}, DType::F64, Device::cpu()), ys = Tensor::zeros({s.y_numel()}, DType::F64, Device::cpu());
  Tensor dx = Tensor::zeros({s.x_numel()}, DType::F64, Device::cpu()), dxs = Tensor::zeros({s.x_numel()}, DType::F64, Device::cpu());
  cc.conv.forward(both, y.data(), x.data(), 2, s.H, s.W);
  cc.conv.backward(both, dx.data(), dy.data(), x.data(), 2, s.H, s.W);
  for (int64_t n = 0; n < 2; ++n) {
    one.dropout = {key, 20 + n, 1};
    cc.conv.forward(one, ys.data<double>() + n * yn, x.data<double>() + n * xn, 1, s.H, s.W);
    cc.conv.backward(one, dxs.data<double>() + n * xn, dy.data<double>() + n * yn, x.data<double>() + n * xn, 1, s.H, s.W);
  }
  EXPECT_LE(rel_error(values(ys), values(y)), 1e-14) << "Conv2d forward";
  EXPECT_LE(rel_error(values(dxs), values(dx)), 1e-14) << "Conv2d dx";
  // And the draw is a real one: another sample's mask differs.
  one.dropout = {key, 21, 1};
  Tensor other = Tensor::zeros({yn}, DType::F64, Device::cpu());
  cc.conv.forward(one, other.data(), x.data(), 1, s.H, s.W);
  const std::vector<double> all = values(y);
  EXPECT_GT(rel_error(values(other), std::vector<double>(all.begin(), all.begin() + yn)), 1e-6);
}

namespace {

// plain's weights += scale * B A for every adapter of `with_lora` (same model without LoRA; both f64
// on the CPU): the dense formulation the adapters must equal.
template <class Model>
void merge_adapters(Model& with_lora, Model& plain, const models::LoraSpec& lora) {
  for (nn::Parameter* a : with_lora.parameters()) {
    if (!a->name.ends_with(".lora_A.weight")) continue;
    const std::string module = a->name.substr(0, a->name.size() - std::string(".lora_A.weight").size());
    nn::Parameter* b = with_lora.find(module + ".lora_B.weight");
    nn::Parameter* w = plain.find(module + ".weight");
    ASSERT_TRUE(b && w) << module;
    const int64_t out = w->shape[0], in = w->shape[1];
    for (int64_t o = 0; o < out; ++o)
      for (int64_t i = 0; i < in; ++i) {
        double sum = 0;
        for (int64_t r = 0; r < lora.r; ++r) sum += b->value.data<double>()[o * lora.r + r] * a->value.data<double>()[r * in + i];
        w->value.data<double>()[o * in + i] += lora.scale_for(lora.r, lora.alpha) * sum;
      }
  }
}

models::TransformerConfig tiny(const std::string& type) {
  const nlohmann::json hub = type == "gpt2" ? nlohmann::json{{"model_type", "gpt2"}, {"vocab_size", 50}, {"n_positions", 16},
                                                             {"n_embd", 16}, {"n_layer", 2}, {"n_head", 2}}
                                            : [] {
                                                nlohmann::json j = tiny_llama();
                                                j["hidden_size"] = 16;
                                                j["intermediate_size"] = 24;
                                                j["vocab_size"] = 50;
                                                return j;
                                              }();
  return models::TransformerConfig::from_hub_json(hub, type);
}

models::LoraSpec every_module(const std::string& type) {
  models::LoraSpec l;
  l.r = 2;
  l.alpha = 3;
  l.target_modules = type == "gpt2" ? std::vector<std::string>{"c_attn", "c_proj", "c_fc"}
                                    : std::vector<std::string>{"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                               "up_proj", "down_proj"};
  return l;
}

}  // namespace

TEST(LoraTransformer, MergedWeightsGiveTheSameLogitsAndAdapterGradientsAreExact) {
  for (const std::string type : {"gpt2", "llama"}) {
    const models::TransformerConfig cfg = tiny(type);
    const models::LoraSpec lora = every_module(type);
    models::Transformer m(cfg, Device::cpu(), DType::F64, nullptr, 1, true, {}, lora), plain(cfg, Device::cpu(), DType::F64);
    m.init_random(5, 0.3);
    plain.init_random(5, 0.3);
    // PEFT starts B at zero (output = base); the test gives B values so every path is exercised.
    size_t adapters = 0;
    for (nn::Parameter* p : m.parameters())
      if (p->name.ends_with(".lora_B.weight")) {
        fill(*p, 100 + adapters++, 0.3);
      }
    EXPECT_EQ(adapters, size_t(cfg.layers) * lora.target_modules.size() + (type == "gpt2" ? 2u : 0u))
        << type << ": c_proj names both attn.c_proj and mlp.c_proj";
    // Merge into the plain model: W += scale B A (the engine layout [out, in] for GPT-2 too).
    merge_adapters(m, plain, lora);
    const int64_t B = 2, T = 6, N = B * T;
    std::vector<float> ids_f(static_cast<size_t>(N));
    for (size_t i = 0; i < ids_f.size(); ++i) ids_f[i] = float((i * 7 + 3) % 50);
    Tensor ids = upload(ids_f, DType::I32, Device::cpu());
    models::TransformerActivations a, b;
    m.forward(ids.data<int32_t>(), B, T, a, models::ForwardMode::Inference);
    plain.forward(ids.data<int32_t>(), B, T, b, models::ForwardMode::Inference);
    EXPECT_LE(rel_error(values(a.logits), values(b.logits)), 1e-12) << type << ": LoRA logits vs merged weights";

    // Gradients of L = sum(logits * G) (G zero in the padding columns).
    std::vector<float> G(size_t(N * m.padded_vocab()), 0.f);
    const std::vector<float> r = randn(G.size(), 9);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t v = 0; v < cfg.vocab; ++v) G[size_t(n * m.padded_vocab() + v)] = r[size_t(n * m.padded_vocab() + v)];
    auto loss = [&] {
      models::TransformerActivations x;
      m.forward(ids.data<int32_t>(), B, T, x, models::ForwardMode::Inference);
      double s = 0;
      for (size_t i = 0; i < G.size(); ++i) s += x.logits.data<double>()[i] * G[i];
      return s;
    };
    for (models::ForwardMode mode : {models::ForwardMode::Train, models::ForwardMode::TrainCheckpointed}) {
      for (nn::ParamBlock* blk : m.blocks()) blk->zero_grad();
      models::TransformerActivations x;
      m.forward(ids.data<int32_t>(), B, T, x, mode);
      m.backward(x, upload(G, DType::F64, Device::cpu()).view({N, m.padded_vocab()}));
      for (nn::ParamBlock* blk : m.frozen_blocks()) {
        double sum = 0;
        for (float v : download(blk->grads())) sum += std::abs(v);
        EXPECT_EQ(sum, 0.0) << type << ": frozen block " << blk->name() << " took a gradient";
      }
      if (mode == models::ForwardMode::TrainCheckpointed) continue;  // same gradients below, checked once
      for (nn::Parameter* p : m.parameters()) {
        if (!p->name.ends_with(".lora_A.weight") && !p->name.ends_with(".lora_B.weight")) continue;
        const std::vector<double> an = values(p->grad);
        const std::vector<double> fd = central_differences(p->value.data<double>(), p->numel(), loss, 3);
        std::vector<double> got;
        for (int64_t i = 0; i < p->numel(); i += 3) got.push_back(an[size_t(i)]);
        EXPECT_LE(rel_error(got, fd), 1e-6) << type << " " << p->name;
      }
    }
    EXPECT_EQ(m.trainable_blocks().size(), size_t(cfg.layers)) << type;
  }
}

TEST(LoraTransformer, TrainingFlopsCountTheFrozenBaseFourTimesAndTheAdaptersSixTimes) {
  const int64_t T = 8;
  // tiny llama: C 16, F 24, 4 heads of 4, 2 key/value heads, 2 layers, vocab 50, untied head.
  // One layer's weights: q 16x16, k 8x16, v 8x16, o 16x16, gate, up 24x16, down 16x24 = 1920;
  // attention 6 T C = 768; the head 50x16 = 800.
  const models::TransformerConfig llama = tiny("llama");
  models::Transformer full(llama, Device::cpu(), DType::F32, nullptr, 1, false);
  EXPECT_DOUBLE_EQ(full.flops_per_token(T), 2 * (6.0 * 1920 + 768) + 6.0 * 800);
  // q_proj and v_proj only, r 2: A and B of q 2x(16+16) = 64, of v 2x(16+8) = 48 per layer.
  const models::LoraSpec qv{2, 4, 0, {"q_proj", "v_proj"}, false};
  models::Transformer lora(llama, Device::cpu(), DType::F32, nullptr, 1, false, {}, qv);
  EXPECT_DOUBLE_EQ(lora.flops_per_token(T), 2 * (4.0 * 1920 + 6.0 * (64 + 48) + 768) + 4.0 * 800);
  int64_t adapter_params = 0;
  for (nn::Parameter* p : nn::parameters_of(lora.trainable_blocks())) adapter_params += p->numel();
  EXPECT_EQ(adapter_params, 2 * (64 + 48)) << "the count's adapters are the model's";
  // A pipeline stage holding one layer counts the whole model.
  models::Transformer stage(llama, Device::cpu(), DType::F32, nullptr, 1, false, {1, 2, false, true}, qv);
  EXPECT_DOUBLE_EQ(stage.flops_per_token(T), lora.flops_per_token(T));

  // tiny GPT-2: C 16, F 64, tied head. One layer: c_attn 48x16, attn.c_proj 16x16, c_fc 64x16,
  // mlp.c_proj 16x64 = 3072. "c_proj" adapts both projections: 2x(16+16) + 2x(64+16) = 224.
  const models::TransformerConfig gpt2 = tiny("gpt2");
  const models::LoraSpec proj{2, 4, 0, {"c_proj"}, false};
  models::Transformer g(gpt2, Device::cpu(), DType::F32, nullptr, 1, false, {}, proj);
  EXPECT_DOUBLE_EQ(g.flops_per_token(T), 2 * (4.0 * 3072 + 6.0 * 224 + 768) + 4.0 * 800);
}

TEST(LoraTransformer, TargetsThatNameNoModuleAreRefused) {
  models::LoraSpec l;
  l.r = 4;
  l.target_modules = {"q_proj", "qkv_proj"};
  try {
    models::Transformer m(tiny("llama"), Device::cpu(), DType::F32, nullptr, 1, false, {}, l);
    ADD_FAILURE() << "an unknown target was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'qkv_proj' names no module of a llama layer"), std::string::npos) << e.what();
  }
}

namespace {

// A UNet with LoRA (`m`, f64) against the same UNet with its adapters merged into the weights
// (`plain`) on inputs `x` (B samples of S x S): the outputs agree, a checkpointed training backward
// (the re-forward sees the adapters too) gives the frozen blocks no gradient, and every adapter
// tensor's gradient (with `convolutions_only`, every 4-d one's), at `per_tensor` of its elements,
// matches fourth-order central differences (the UNet's depth makes the second-order ones' error ~1e-6).
void expect_merged_and_exact(models::UNet& m, models::UNet& plain, const models::UNetInputs& x, int64_t per_tensor,
                             bool convolutions_only = false) {
  const models::UNetConfig& cfg = m.config();
  const int64_t B = x.sample.size(0), S = x.sample.size(2);
  auto infer = models::UNetActivations::inference();
  auto infer2 = models::UNetActivations::inference();
  EXPECT_LE(rel_error(values(m.forward(x, infer)), values(plain.forward(x, infer2))), 1e-12) << "LoRA vs merged";

  const std::vector<float> g = randn(size_t(B * cfg.out_channels * S * S), 4);
  Tensor dout = upload(g, DType::F64, Device::cpu()).view({B, cfg.out_channels, S, S});
  auto loss = [&] {
    auto a = models::UNetActivations::inference();
    const std::vector<double> y = values(m.forward(x, a));
    double sum = 0;
    for (size_t i = 0; i < y.size(); ++i) sum += y[i] * g[i];
    return sum;
  };
  for (nn::ParamBlock* blk : m.blocks()) blk->zero_grad();
  auto acts = models::UNetActivations::training(true);
  m.forward(x, acts);
  m.backward(dout, acts);
  for (nn::ParamBlock* blk : m.frozen_blocks()) {
    double sum = 0;
    for (float v : download(blk->grads())) sum += std::abs(v);
    EXPECT_EQ(sum, 0.0) << "frozen block " << blk->name() << " took a gradient";
  }
  for (nn::Parameter* p : m.parameters()) {
    if (!p->name.ends_with(".lora_A.weight") && !p->name.ends_with(".lora_B.weight")) continue;
    if (convolutions_only && p->shape.size() != 4) continue;
    const std::vector<double> an = values(p->grad);
    std::vector<double> got, fd;
    double* pv = p->value.data<double>();
    for (int64_t i = 0; i < p->numel(); i += std::max<int64_t>(1, p->numel() / per_tensor)) {
      const double keep = pv[i], h = 1e-4;
      double f[4];
      const double at[4] = {2 * h, h, -h, -2 * h};
      for (int k = 0; k < 4; ++k) {
        pv[i] = keep + at[k];
        f[k] = loss();
      }
      pv[i] = keep;
      fd.push_back((-f[0] + 8 * f[1] - 8 * f[2] + f[3]) / (12 * h));
      got.push_back(an[size_t(i)]);
    }
    EXPECT_LE(rel_error(got, fd), 1e-6) << p->name;
  }
}

}  // namespace

TEST(LoraUNet, MergedWeightsGiveTheSameOutputAndAdapterGradientsAreExact) {
  const models::UNetConfig cfg = models::UNetConfig::from_hub_json(tiny_unet_config(true), "tiny_unet_config");
  models::LoraSpec lora{2, 3, 0, {"to_q", "to_k", "to_v", "to_out.0", "ff.net.0.proj", "ff.net.2", "proj_in", "proj_out"}, false};
  models::UNet m(cfg, Device::cpu(), DType::F64, nullptr, 1, true, lora), plain(cfg, Device::cpu(), DType::F64);
  for (nn::Parameter* p : plain.parameters()) nn::init_normal(*p, 11, 0.2);
  size_t adapters = 0;
  for (nn::Parameter* p : m.parameters()) {
    if (p->name.ends_with(".lora_A.weight") || p->name.ends_with(".lora_B.weight"))
      fill(*p, 300 + adapters++, 0.3);
    else
      nn::init_normal(*p, 11, 0.2);
  }
  // 12 modules (attn1 and attn2 q, k, v, out; ff in and out; proj_in and proj_out) x (A, B) in each of
  // the four Transformer2D: down block 0's one, the mid block's, up block 1's two.
  EXPECT_EQ(adapters, 4u * 12u * 2u);
  merge_adapters(m, plain, lora);
  const int64_t B = 2, S = 8, L = 3;
  models::UNetInputs x;
  x.sample = upload(randn(size_t(B * cfg.in_channels * S * S), 1), DType::F64, Device::cpu()).view({B, cfg.in_channels, S, S});
  x.timesteps = {10.f, 700.f};
  x.encoder_hidden_states = upload(randn(size_t(B * L * cfg.cross_dim[0]), 2), DType::F64, Device::cpu()).view({B, L, cfg.cross_dim[0]});
  x.text_embeds = upload(randn(size_t(B * cfg.text_embeds_dim()), 3), DType::F64, Device::cpu()).view({B, cfg.text_embeds_dim()});
  for (int64_t b = 0; b < B; ++b)
    for (float v : {64.f, 64.f, 0.f, 0.f, 64.f, 64.f}) x.time_ids.push_back(v);
  EXPECT_EQ(m.trainable_blocks().size(), 3u);  // down 0, mid, up 1
  expect_merged_and_exact(m, plain, x, 3);  // three elements of each of the 96 tensors
}

namespace {

// The f64 inputs of a tiny UNet forward (SD layout: no added conditioning).
models::UNetInputs unet_inputs(const models::UNetConfig& cfg, int64_t B, int64_t S, int64_t L) {
  models::UNetInputs x;
  x.sample = upload(randn(size_t(B * cfg.in_channels * S * S), 1), DType::F64, Device::cpu()).view({B, cfg.in_channels, S, S});
  x.timesteps = std::vector<float>(size_t(B), 0.f);
  for (int64_t b = 0; b < B; ++b) x.timesteps[size_t(b)] = 10.f + 690.f * float(b);
  x.encoder_hidden_states = upload(randn(size_t(B * L * cfg.cross_dim[0]), 2), DType::F64, Device::cpu()).view({B, L, cfg.cross_dim[0]});
  return x;
}

}  // namespace

namespace {

// The tiny SD 1.x UNet of the golden models.
models::UNetConfig sd_tiny() {
  return models::UNetConfig::from_hub_json(io::read_json_file(golden_path("unet-sd-tiny/config.json")),
                                           "unet-sd-tiny/config.json");
}

// `m`'s adapters filled with non-zero values (B too, so that they change the output) and its other
// weights with `plain`'s values, then the adapters merged into `plain` (io::add_lora_update: W +=
// scale B A, a convolution's A flattened): the dense formulation `m` must equal. Returns how many
// adapter tensors there are and how many of them are 4-d.
std::pair<size_t, size_t> fill_and_merge(models::UNet& m, models::UNet& plain, const models::LoraSpec& lora) {
  for (nn::Parameter* p : plain.parameters()) nn::init_normal(*p, 11, 0.2);
  io::LoraAdapter adapter;
  adapter.config = lora;
  adapter.source = "the model's adapters";
  size_t filled = 0, convs = 0;
  for (nn::Parameter* p : m.parameters()) {
    if (!p->name.ends_with(io::kLoraASuffix) && !p->name.ends_with(io::kLoraBSuffix)) {
      nn::init_normal(*p, 11, 0.2);
      continue;
    }
    fill(*p, 500 + filled++, 0.3);
    adapter.tensors[p->name] = p->value;
    convs += p->shape.size() == 4;
  }
  for (const std::string& module : adapter.modules()) {
    nn::Parameter* w = plain.find(module + ".weight");
    EXPECT_TRUE(w) << module;
    if (w) io::add_lora_update(adapter, module, w->value.data<double>(), w->shape);
  }
  return {filled, convs};
}

}  // namespace

TEST(LoraUNet, ConvolutionAdaptersEqualTheMergedWeightsAndTheirGradientsAreExact) {
  const models::UNetConfig cfg = sd_tiny();
  // Every convolution kind of the blocks, the 1x1 projections among them, and one linear module.
  const models::LoraSpec lora{2, 3, 0, {"conv1", "conv2", "conv_shortcut", "proj_in", "proj_out", "downsamplers.0.conv",
                                        "upsamplers.0.conv", "to_q"}, false};
  models::UNet m(cfg, Device::cpu(), DType::F64, nullptr, 1, true, lora), plain(cfg, Device::cpu(), DType::F64);
  const auto [filled, convs] = fill_and_merge(m, plain, lora);
  // down 0: resnet conv1, conv2, proj_in, proj_out, downsampler, to_q x 2 (attn1, attn2); down 1: conv1,
  // conv2, conv_shortcut; mid: 2 x (conv1, conv2), proj_in, proj_out, 2 x to_q; up 0: 2 x (conv1, conv2,
  // conv_shortcut), upsampler; up 1: 2 x (conv1, conv2, conv_shortcut, proj_in, proj_out, 2 x to_q).
  EXPECT_EQ(filled, 2u * (7 + 3 + 8 + 7 + 14));
  EXPECT_EQ(convs, 2u * (5 + 3 + 6 + 7 + 10));
  EXPECT_EQ(m.trainable_blocks().size(), 5u);  // the adapters of every down and up block and the mid block
  const int64_t B = 2, S = 8, L = 3;
  const models::UNetInputs x = unet_inputs(cfg, B, S, L);
  // The gradients of the convolution adapters: SD's attn1.to_q adapter gradients here are ~1e-6, at
  // the central differences' rounding floor (LoraGolden checks them against PEFT's float64 ones).
  expect_merged_and_exact(m, plain, x, 2, /*convolutions_only=*/true);
}

// conv_in and conv_out, which kohya-ss and some diffusers files adapt: 3x3 convolutions from and to
// the latent channels, their adapters in blocks of their own beside the frozen stem and head.
TEST(LoraUNet, StemAndHeadConvolutionAdaptersEqualTheMergedWeightsAndTheirGradientsAreExact) {
  const models::UNetConfig cfg = sd_tiny();
  const models::LoraSpec lora{2, 3, 0, {"conv_in", "conv_out"}, false};
  models::UNet m(cfg, Device::cpu(), DType::F64, nullptr, 1, true, lora), plain(cfg, Device::cpu(), DType::F64);
  const auto [filled, convs] = fill_and_merge(m, plain, lora);
  EXPECT_EQ(filled, 4u);
  EXPECT_EQ(convs, 4u);
  ASSERT_TRUE(m.find("conv_in.lora_A.weight") && m.find("conv_out.lora_B.weight"));
  EXPECT_EQ(m.find("conv_in.lora_A.weight")->shape, (Shape{2, cfg.in_channels, 3, 3}));
  EXPECT_EQ(m.find("conv_in.lora_B.weight")->shape, (Shape{cfg.block_out[0], 2, 1, 1}));
  EXPECT_EQ(m.find("conv_out.lora_A.weight")->shape, (Shape{2, cfg.block_out[0], 3, 3}));
  EXPECT_EQ(m.find("conv_out.lora_B.weight")->shape, (Shape{cfg.out_channels, 2, 1, 1}));
  std::vector<std::string> trained;
  for (nn::ParamBlock* b : m.trainable_blocks()) trained.push_back(b->name());
  EXPECT_EQ(trained, (std::vector<std::string>{"stem.lora", "head.lora"}));
  // The blocks' order is the forward's (the stem's adapters after the stem, the head's after the head),
  // and the adapter blocks belong to the stem's and the head's places in a pipeline.
  const std::vector<nn::ParamBlock*> all = m.blocks();
  EXPECT_EQ(all[1]->name(), "stem.lora");
  EXPECT_EQ(all.back()->name(), "head.lora");
  EXPECT_EQ(cfg.unit_of_block("stem.lora"), -1);
  EXPECT_EQ(cfg.unit_of_block("head.lora"), cfg.num_units());
  expect_merged_and_exact(m, plain, unet_inputs(cfg, 2, 8, 3), 8);

  // Pipeline chunks: the first holds the stem's adapters, the last the head's.
  models::UNet first(cfg, Device::cpu(), DType::F64, nullptr, 1, false, lora, {0, 1});
  models::UNet last(cfg, Device::cpu(), DType::F64, nullptr, 1, false, lora, {1, cfg.num_units()});
  EXPECT_TRUE(first.find("conv_in.lora_A.weight") && !first.find("conv_out.lora_A.weight"));
  EXPECT_TRUE(last.find("conv_out.lora_A.weight") && !last.find("conv_in.lora_A.weight"));
}

TEST(LoraUNet, TargetsTheModelLacksAreRefusedNamingThem) {
  const models::UNetConfig sd = models::UNetConfig::from_hub_json(tiny_unet_config(false), "tiny_unet_config");
  models::LoraSpec lora{4, 4, 0, {"to_q", "linear_1"}, false};  // the time embedding trains no adapters
  expect_error([&] { models::UNet m(sd, Device::cpu(), DType::F32, nullptr, 1, false, lora); },
               {"'linear_1' names no module of a UNet block"});
  // One block: no downsampler, no upsampler, so a sampler conv names nothing in this model.
  nlohmann::json one = tiny_unet_config(false);
  one["block_out_channels"] = {16};
  one["down_block_types"] = {"CrossAttnDownBlock2D"};
  one["up_block_types"] = {"CrossAttnUpBlock2D"};
  const models::UNetConfig single = models::UNetConfig::from_hub_json(one, "one block");
  lora.target_modules = {"conv1", "downsamplers.0.conv"};
  expect_error([&] { models::UNet m(single, Device::cpu(), DType::F32, nullptr, 1, false, lora); },
               {"'downsamplers.0.conv' names no module of this UNet"});
  // ... and so does a chunk of a pipeline that holds only part of the model.
  expect_error([&] { models::UNet m(single, Device::cpu(), DType::F32, nullptr, 1, false, lora, {0, 1}); },
               {"'downsamplers.0.conv' names no module of this UNet"});
  lora.target_modules = {"conv1", "proj_in"};
  models::UNet ok(single, Device::cpu(), DType::F32, nullptr, 1, false, lora);
  EXPECT_EQ(ok.trainable_blocks().size(), 3u);
  // A convolution name in a language model.
  models::LoraSpec lm{4, 4, 0, {"q_proj", "conv1"}, false};
  expect_error([&] { models::Transformer t(tiny("llama"), Device::cpu(), DType::F32, nullptr, 1, false, {}, lm); },
               {"'conv1' names no module of a llama layer"});
}

namespace {

// Adapter gradients each dump holds: the LMs' (2 layers x 7 or 3 modules x A, B) and the UNets'
// (every adapted linear module of every transformer block x A, B; SD 1.x without the convolution
// projections).
size_t adapter_grads(const std::string& model) {
  if (model == "gpt2-tiny") return 16;
  if (model == "unet-sd-tiny") return 80;
  if (model == "unet-sdxl-tiny") return 176;
  return 28;
}

void expect_lora_parity(const std::vector<std::string>& models, const std::string& device, const std::string& dtype) {
  for (const std::string& model : models) {
    app::ParityReport r = app::run_parity({golden_path(model + "/lora"), device, dtype}, /*print=*/false);
    size_t adapters = 0;
    for (const app::ParityEntry& e : r.entries()) {
      adapters += e.name.starts_with("grad.") && e.name.find(".lora_") != std::string::npos;
      EXPECT_FALSE(e.fails()) << model << " LoRA on " << device << " in " << dtype << ": " << e.name << " rel_err "
                              << e.rel_error << " > bound " << e.bound;
    }
    EXPECT_EQ(adapters, adapter_grads(model)) << model;
    EXPECT_EQ(r.finish(), 0) << model << " LoRA on " << device << " in " << dtype;
  }
}

}  // namespace

TEST(LoraGolden, MatchesPeftFloat64ReferenceInFp32Cpu) {
  expect_lora_parity({"llama-tiny", "qwen2-tiny", "gpt2-tiny", "unet-sd-tiny", "unet-sdxl-tiny"}, "cpu", "fp32");
}

TEST(LoraGoldenGpu, MatchesPeftFloat64ReferenceInBf16) {
  ZP_SKIP_WITHOUT_GPU();
  expect_lora_parity({"llama-tiny", "qwen2-tiny", "gpt2-tiny"}, "cuda", "bf16");
}

// The UNets' in bf16 (diffusers + PEFT's dumps). On an H100, 2026-11-25, SD passed and SDXL missed its
// bound on one of 178 tensors (an attn1.to_out.0 lora_A gradient, 4.6e-2 against 3.7e-2): the same
// bf16 UNet gap as UNetParityGpu.SdAndSdxlBf16's, open in issue 15.
TEST(LoraGoldenGpu, UNetsMatchDiffusersPeftFloat64ReferenceInBf16) {
  ZP_SKIP_WITHOUT_GPU();
  expect_lora_parity({"unet-sd-tiny", "unet-sdxl-tiny"}, "cuda", "bf16");
}

namespace {

// The CUDA-vs-CPU adapter tests: f32 on the CPU, bf16 on the GPU, both drawing the same dropout masks.
struct CpuAndGpu {
  nn::Ctx cpu, gpu;
  CpuAndGpu() {
    cpu.dropout = gpu.dropout = {77, 5};
    gpu.dev = Device::cuda(0);
    gpu.dt = DType::BF16;
  }
  // n normal values rounded to bf16: as the CPU's f32 tensor and the GPU's bf16 one.
  static std::pair<Tensor, Tensor> rounded(int64_t n, uint64_t seed) {
    const std::vector<float> v = round_to(randn(size_t(n), seed), DType::BF16);
    return {upload(v, DType::F32, Device::cpu()), upload(v, DType::BF16)};
  }
};

}  // namespace

TEST(LoraLinearGpu, Bf16AdaptersAndDropoutFollowTheCpu) {
  ZP_SKIP_WITHOUT_GPU();
  // The same packed Linear in f32 on the CPU and bf16 on the GPU (values rounded to bf16 first).
  const int64_t N = 256, in = 64, R = 8;
  auto make = [&](Device dev, DType dt, nn::ParamBlock& base, nn::ParamBlock& ad) {
    nn::Parameter* w = base.add("w.weight", {96, in}, true);
    base.freeze();
    base.allocate(dev, dt);
    nn::Parameter* a1 = ad.add("q.lora_A.weight", {R, in}, true);
    nn::Parameter* a2 = ad.add("v.lora_A.weight", {R, in}, true, true);
    nn::Parameter* b1 = ad.add("q.lora_B.weight", {32, R}, true);
    nn::Parameter* b2 = ad.add("v.lora_B.weight", {32, R}, true);
    ad.allocate(dev, dt);
    uint64_t seed = 1;
    for (nn::Parameter* p : {w, a1, a2, b1, b2})
      p->value.copy_from(upload(round_to(randn(size_t(p->numel()), seed++, 0.2f), DType::BF16), dt, dev));
    nn::Linear l(w, nullptr);
    l.set_adapters({{a1, b1, 0}, {a2, b2, 64}}, 2.f, 0.25f);
    return l;
  };
  nn::ParamBlock cb("b"), ca("a"), gb("b"), ga("a");
  nn::Linear cpu = make(Device::cpu(), DType::F32, cb, ca), gpu = make(Device::cuda(0), DType::BF16, gb, ga);
  const CpuAndGpu at;
  const nn::Ctx &cc = at.cpu, &gc = at.gpu;
  const auto [xc, xg] = CpuAndGpu::rounded(N * in, 3);
  const auto [gvc, gvg] = CpuAndGpu::rounded(N * 96, 4);
  Tensor yc = Tensor::zeros({N, 96}, DType::F32, Device::cpu()), yg = Tensor::zeros({N, 96}, DType::BF16, Device::cuda(0));
  cpu.forward(cc, yc.data(), xc.data(), N);
  gpu.forward(gc, yg.data(), xg.data(), N);
  EXPECT_LE(rel_error(download(yg), download(yc)), tolerance(DType::BF16));
  Tensor dc = Tensor::zeros({N, in}, DType::F32, Device::cpu()), dg = Tensor::zeros({N, in}, DType::BF16, Device::cuda(0));
  cpu.backward(cc, dc.data(), gvc.data(), xc.data(), N);
  gpu.backward(gc, dg.data(), gvg.data(), xg.data(), N);
  EXPECT_LE(rel_error(download(dg), download(dc)), tolerance(DType::BF16));
  EXPECT_LE(rel_error(download(ga.grads()), download(ca.grads())), tolerance(DType::BF16));

  // The masks themselves: the same elements dropped on both sides.
  Tensor ones_c = upload(std::vector<float>(size_t(N * in), 1.f), DType::F32, Device::cpu());
  Tensor ones_g = upload(std::vector<float>(size_t(N * in), 1.f), DType::BF16);
  kernels::cpu::dropout_apply(nullptr, DType::F32, ones_c.data(), 0, ones_c.data(), 0, N, in, 9, 42, 0.5f, false);
  kernels::cuda::dropout_apply(nullptr, DType::BF16, ones_g.data(), 0, ones_g.data(), 0, N, in, 9, 42, 0.5f, false);
  EXPECT_EQ(download(ones_g), download(ones_c));
}

TEST(LoraConv2dGpu, Bf16AdaptersAndDropoutFollowTheCpu) {
  ZP_SKIP_WITHOUT_GPU();
  // The same frozen conv with an adapter in f32 on the CPU and bf16 on the GPU (values rounded to bf16
  // first): 3x3 with padding, strided, and 1x1.
  for (auto [k, stride, pad] : {std::tuple<int64_t, int64_t, int64_t>{3, 1, 1}, {3, 2, 1}, {1, 1, 0}}) {
    const int64_t N = 2, Cin = 32, Cout = 48, R = 8, H = 16, W = 12;
    auto make = [&](Device dev, DType dt, nn::ParamBlock& base, nn::ParamBlock& ad) {
      nn::Parameter* w = base.add("c.weight", {Cout, Cin, k, k}, true);
      nn::Parameter* bias = base.add("c.bias", {Cout}, false);
      base.freeze();
      base.allocate(dev, dt);
      nn::Parameter* a = ad.add("c.lora_A.weight", {R, Cin, k, k}, true);
      nn::Parameter* b = ad.add("c.lora_B.weight", {Cout, R, 1, 1}, true);
      ad.allocate(dev, dt);
      uint64_t seed = 1;
      for (nn::Parameter* p : {w, bias, a, b})
        p->value.copy_from(upload(round_to(randn(size_t(p->numel()), seed++, 0.2f), DType::BF16), dt, dev));
      nn::Conv2d conv(w, bias, stride, pad);
      conv.set_adapter(a, b, 2.f, 0.25f);
      return conv;
    };
    nn::ParamBlock cb("b"), ca("a"), gb("b"), ga("a");
    nn::Conv2d cpu = make(Device::cpu(), DType::F32, cb, ca), gpu = make(Device::cuda(0), DType::BF16, gb, ga);
    const CpuAndGpu at;
    const nn::Ctx &cc = at.cpu, &gc = at.gpu;
    const kernels::Conv2dShape s = cpu.shape(N, H, W);
    const auto [xc, xg] = CpuAndGpu::rounded(s.x_numel(), 3);
    const auto [gvc, gvg] = CpuAndGpu::rounded(s.y_numel(), 4);
    Tensor yc = Tensor::zeros({s.y_numel()}, DType::F32, Device::cpu()), yg = Tensor::zeros({s.y_numel()}, DType::BF16, Device::cuda(0));
    cpu.forward(cc, yc.data(), xc.data(), N, H, W);
    gpu.forward(gc, yg.data(), xg.data(), N, H, W);
    const std::string what = std::to_string(k) + "x" + std::to_string(k) + " stride " + std::to_string(stride);
    EXPECT_LE(rel_error(download(yg), download(yc)), tolerance(DType::BF16)) << what;
    Tensor dc = Tensor::zeros({s.x_numel()}, DType::F32, Device::cpu()), dg = Tensor::zeros({s.x_numel()}, DType::BF16, Device::cuda(0));
    for (nn::ParamBlock* blk : {&cb, &ca, &gb, &ga}) blk->zero_grad();
    cpu.backward(cc, dc.data(), gvc.data(), xc.data(), N, H, W);
    gpu.backward(gc, dg.data(), gvg.data(), xg.data(), N, H, W);
    EXPECT_LE(rel_error(download(dg), download(dc)), tolerance(DType::BF16)) << what << ": dx";
    EXPECT_LE(rel_error(download(ga.grads()), download(ca.grads())), tolerance(DType::BF16)) << what << ": dA, dB";
    EXPECT_EQ(download(gb.grads()), std::vector<float>(size_t(gb.grads().numel()), 0.f)) << what << ": frozen base";
  }
}

}  // namespace zp::test
