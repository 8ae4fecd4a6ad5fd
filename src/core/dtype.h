// Element types and the host-side 16-bit float types.
//
// bf16 and f16 are stored as raw uint16 so that host code (and the CPU-only build) needs no CUDA
// headers; their layout matches __nv_bfloat16 / __half, so CUDA code reinterpret_casts the pointers.
// Conversions to 16 bits round to nearest even, as the hardware does.
#pragma once
#include <cstdint>
#include <cstring>
#include <string_view>

namespace zp {

enum class DType : uint8_t { F32, BF16, F16, I32, I64, U8, F64 };

constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: case DType::I32: return 4;
    case DType::BF16: case DType::F16: return 2;
    case DType::I64: case DType::F64: return 8;
    case DType::U8: return 1;
  }
  return 0;
}

constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "f32";
    case DType::BF16: return "bf16";
    case DType::F16: return "f16";
    case DType::I32: return "i32";
    case DType::I64: return "i64";
    case DType::U8: return "u8";
    case DType::F64: return "f64";
  }
  return "?";
}

constexpr bool dtype_is_float(DType t) {
  return t == DType::F32 || t == DType::BF16 || t == DType::F16 || t == DType::F64;
}

inline uint32_t float_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline float bits_float(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

struct bf16 {
  uint16_t bits = 0;
  bf16() = default;
  bf16(float f) {  // NOLINT(google-explicit-constructor): behaves like a float type
    uint32_t u = float_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) { bits = uint16_t((u >> 16) | 0x40); return; }  // quiet NaN
    u += 0x7fffu + ((u >> 16) & 1u);
    bits = uint16_t(u >> 16);
  }
  bf16(double d) : bf16(float(d)) {}
  operator float() const { return bits_float(uint32_t(bits) << 16); }
  static bf16 from_bits(uint16_t b) { bf16 r; r.bits = b; return r; }
};

struct f16 {
  uint16_t bits = 0;
  f16() = default;
  f16(float f) {  // NOLINT(google-explicit-constructor)
    uint32_t u = float_bits(f);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t a = u & 0x7fffffffu;
    if (a >= 0x7f800000u) { bits = uint16_t(sign | 0x7c00u | (a > 0x7f800000u ? 0x200u : 0u)); return; }
    if (a >= 0x477ff000u) { bits = uint16_t(sign | 0x7c00u); return; }  // rounds to inf
    if (a < 0x38800000u) {  // subnormal or zero in f16
      float af = bits_float(a) + 0.5f;  // align the mantissa so the FPU rounds for us
      bits = uint16_t(sign | (float_bits(af) - 0x3f000000u));
      return;
    }
    uint32_t mant_odd = (a >> 13) & 1u;
    a += 0xc8000fffu + mant_odd;  // rebias exponent (-112 << 23) and round to nearest even
    bits = uint16_t(sign | (a >> 13));
  }
  f16(double d) : f16(float(d)) {}
  operator float() const {
    uint32_t sign = uint32_t(bits & 0x8000u) << 16;
    uint32_t exp = (bits >> 10) & 0x1fu, mant = bits & 0x3ffu;
    if (exp == 0) {
      float v = float(mant) * (1.0f / 16777216.0f);  // 2^-24
      return sign ? -v : v;
    }
    if (exp == 31) return bits_float(sign | 0x7f800000u | (mant << 13));
    return bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
  }
  static f16 from_bits(uint16_t b) { f16 r; r.bits = b; return r; }
};

template <class T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::F32; }
template <> constexpr DType dtype_of<double>() { return DType::F64; }
template <> constexpr DType dtype_of<bf16>() { return DType::BF16; }
template <> constexpr DType dtype_of<f16>() { return DType::F16; }
template <> constexpr DType dtype_of<int32_t>() { return DType::I32; }
template <> constexpr DType dtype_of<int64_t>() { return DType::I64; }
template <> constexpr DType dtype_of<uint8_t>() { return DType::U8; }

}  // namespace zp
