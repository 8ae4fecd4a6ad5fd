// Plain attention, one (batch, query head, query) at a time, in double: scores, mask, softmax,
// weighted sum. The backward recomputes the probabilities itself instead of trusting `out` and `lse`.
// Segments (packed sequences) only add to the mask: a key of another segment gets probability 0.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/attention.h"

namespace zp::kernels::cpu {
namespace {

struct Layout {
  int64_t B, Tq, Tk, Hq, Hkv, D, qs, ks, vs, os;
  const int32_t* segments;  // [B, T] or nullptr
  int64_t group() const { return Hq / Hkv; }
  int64_t q(int64_t b, int64_t i, int64_t h) const { return (b * Tq + i) * qs + h * D; }
  int64_t k(int64_t b, int64_t j, int64_t h) const { return (b * Tk + j) * ks + h * D; }
  int64_t v(int64_t b, int64_t j, int64_t h) const { return (b * Tk + j) * vs + h * D; }
  int64_t o(int64_t b, int64_t i, int64_t h) const { return (b * Tq + i) * os + h * D; }
  // Keys 0..visible-1 pass the causal rule for query i.
  int64_t visible(int64_t i, bool causal) const {
    return causal ? std::clamp<int64_t>(i + (Tk - Tq) + 1, 0, Tk) : Tk;
  }
  // Key j (that passes the causal rule) is in query i's segment.
  bool same_segment(int64_t b, int64_t i, int64_t j) const {
    return !segments || segments[b * Tq + i] == segments[b * Tq + j];
  }
};

Layout make_layout(int64_t B, int64_t Tq, int64_t Tk, int64_t Hq, int64_t Hkv, int64_t D, int64_t qs,
                   int64_t ks, int64_t vs, int64_t os, const int32_t* segments) {
  ZP_CHECK(B >= 0 && Tq >= 0 && Tk >= 0 && Hq > 0 && Hkv > 0 && D > 0);
  ZP_CHECK(Hq % Hkv == 0, "Hq ", Hq, " is not a multiple of Hkv ", Hkv);
  ZP_CHECK(!segments || Tq == Tk, "attention segments need Tq == Tk, got Tq ", Tq, " Tk ", Tk);
  Layout L{B, Tq, Tk, Hq, Hkv, D, qs ? qs : Hq * D, ks ? ks : Hkv * D, vs ? vs : Hkv * D, os ? os : Hq * D,
           segments};
  ZP_CHECK(L.qs >= Hq * D && L.os >= Hq * D && L.ks >= Hkv * D && L.vs >= Hkv * D, "row stride too small");
  return L;
}

// p[j] = softmax_j(scale * q.k_j) over the visible keys j < n_vis (0 for keys of another segment);
// returns the logsumexp (-inf if none visible).
template <class T>
double probabilities(const Layout& L, const T* q, const T* k, int64_t b, int64_t h, int64_t i, int64_t n_vis,
                     double scale, std::vector<double>& p) {
  int64_t hk = h / L.group();
  const T* qi = q + L.q(b, i, h);
  double mx = -INFINITY;
  for (int64_t j = 0; j < n_vis; ++j) {
    if (!L.same_segment(b, i, j)) {
      p[size_t(j)] = -INFINITY;
      continue;
    }
    const T* kj = k + L.k(b, j, hk);
    double dot = 0;
    for (int64_t d = 0; d < L.D; ++d) dot += double(qi[d]) * double(kj[d]);
    p[size_t(j)] = scale * dot;
    mx = std::max(mx, p[size_t(j)]);
  }
  if (mx == -INFINITY) {  // nothing visible
    std::fill(p.begin(), p.begin() + n_vis, 0.0);
    return -INFINITY;
  }
  double sum = 0;
  for (int64_t j = 0; j < n_vis; ++j) sum += p[size_t(j)] = std::exp(p[size_t(j)] - mx);
  for (int64_t j = 0; j < n_vis; ++j) p[size_t(j)] /= sum;
  return mx + std::log(sum);
}

}  // namespace

void attention_forward(StreamHandle, DType dt, void* out, float* lse, const void* q, const void* k, const void* v,
                       int64_t B, int64_t Tq, int64_t Tk, int64_t Hq, int64_t Hkv, int64_t D, int64_t q_stride,
                       int64_t k_stride, int64_t v_stride, int64_t o_stride, float scale, bool causal,
                       const int32_t* segments) {
  Layout L = make_layout(B, Tq, Tk, Hq, Hkv, D, q_stride, k_stride, v_stride, o_stride, segments);
  ZP_DISPATCH_FLOAT(dt, T, [&] {
    auto* pq = static_cast<const T*>(q);
    auto* pk = static_cast<const T*>(k);
    auto* pv = static_cast<const T*>(v);
    auto* po = static_cast<T*>(out);
    std::vector<double> p(static_cast<size_t>(Tk)), acc(static_cast<size_t>(D));
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < Hq; ++h)
        for (int64_t i = 0; i < Tq; ++i) {
          int64_t n_vis = L.visible(i, causal);
          double l = probabilities(L, pq, pk, b, h, i, n_vis, scale, p);
          std::fill(acc.begin(), acc.end(), 0.0);
          for (int64_t j = 0; j < n_vis; ++j) {
            const T* vj = pv + L.v(b, j, h / L.group());
            for (int64_t d = 0; d < D; ++d) acc[size_t(d)] += p[size_t(j)] * double(vj[d]);
          }
          for (int64_t d = 0; d < D; ++d) po[L.o(b, i, h) + d] = T(acc[size_t(d)]);
          lse[(b * Hq + h) * Tq + i] = float(l);
        }
  });
}

void attention_backward(StreamHandle, DType dt, void* dq, void* dk, void* dv, const void* dout, const void* q,
                        const void* k, const void* v, const void* out, const float* lse, int64_t B, int64_t Tq,
                        int64_t Tk, int64_t Hq, int64_t Hkv, int64_t D, int64_t q_stride, int64_t k_stride,
                        int64_t v_stride, int64_t o_stride, float scale, bool causal, const int32_t* segments) {
  Layout L = make_layout(B, Tq, Tk, Hq, Hkv, D, q_stride, k_stride, v_stride, o_stride, segments);
  ZP_DISPATCH_FLOAT(dt, T, [&] {
    auto* pq = static_cast<const T*>(q);
    auto* pk = static_cast<const T*>(k);
    auto* pv = static_cast<const T*>(v);
    auto* pdo = static_cast<const T*>(dout);
    // Gradients accumulate in double, per batch, then are written with the q/k/v strides.
    std::vector<double> gq(size_t(Tq * Hq * D)), gk(size_t(Tk * Hkv * D)), gv(size_t(Tk * Hkv * D));
    std::vector<double> p(static_cast<size_t>(Tk)), dp(static_cast<size_t>(Tk));
    for (int64_t b = 0; b < B; ++b) {
      std::fill(gq.begin(), gq.end(), 0.0);
      std::fill(gk.begin(), gk.end(), 0.0);
      std::fill(gv.begin(), gv.end(), 0.0);
      for (int64_t h = 0; h < Hq; ++h) {
        int64_t hk = h / L.group();
        for (int64_t i = 0; i < Tq; ++i) {
          int64_t n_vis = L.visible(i, causal);
          probabilities(L, pq, pk, b, h, i, n_vis, scale, p);
          const T* qi = pq + L.q(b, i, h);
          const T* doi = pdo + L.o(b, i, h);
          double delta = 0;  // sum_j p_j dp_j: the softmax backward's row dot product
          for (int64_t j = 0; j < n_vis; ++j) {
            const T* vj = pv + L.v(b, j, hk);
            double dot = 0;
            for (int64_t d = 0; d < D; ++d) dot += double(doi[d]) * double(vj[d]);
            dp[size_t(j)] = dot;
            delta += p[size_t(j)] * dot;
          }
          for (int64_t j = 0; j < n_vis; ++j) {
            double ds = p[size_t(j)] * (dp[size_t(j)] - delta) * double(scale);
            const T* kj = pk + L.k(b, j, hk);
            for (int64_t d = 0; d < D; ++d) {
              gq[size_t((i * Hq + h) * D + d)] += ds * double(kj[d]);
              gk[size_t((j * Hkv + hk) * D + d)] += ds * double(qi[d]);
              gv[size_t((j * Hkv + hk) * D + d)] += p[size_t(j)] * double(doi[d]);
            }
          }
        }
      }
      for (int64_t i = 0; i < Tq; ++i)
        for (int64_t h = 0; h < Hq; ++h)
          for (int64_t d = 0; d < D; ++d)
            static_cast<T*>(dq)[L.q(b, i, h) + d] = T(gq[size_t((i * Hq + h) * D + d)]);
      for (int64_t j = 0; j < Tk; ++j)
        for (int64_t h = 0; h < Hkv; ++h)
          for (int64_t d = 0; d < D; ++d) {
            static_cast<T*>(dk)[L.k(b, j, h) + d] = T(gk[size_t((j * Hkv + h) * D + d)]);
            static_cast<T*>(dv)[L.v(b, j, h) + d] = T(gv[size_t((j * Hkv + h) * D + d)]);
          }
    }
  });
}

}  // namespace zp::kernels::cpu
