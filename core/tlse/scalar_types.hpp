#pragma once
/// \file scalar_types.hpp
/// Storage-only 16-bit floating-point types. Kokkos 3.4 has no bfloat16 and its half_t is
/// backend-specific, so TiledLSE carries two tiny portable types: they only convert to and
/// from float (round to nearest even), and every kernel accumulates in float.
#include <Kokkos_Core.hpp>

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace tlse {

namespace impl {
KOKKOS_INLINE_FUNCTION std::uint32_t float_bits(float f) {
  std::uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}
KOKKOS_INLINE_FUNCTION float bits_float(std::uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}
}  // namespace impl

/// bfloat16 storage: the upper half of an IEEE float32.
struct bfloat16 {
  /// the stored bit pattern (sign, 8 exponent bits, 7 mantissa bits)
  std::uint16_t bits = 0;
  /// +0
  bfloat16() = default;
  /// Rounds f to the nearest bfloat16 (ties to even); NaN stays a quiet NaN.
  KOKKOS_INLINE_FUNCTION explicit bfloat16(float f) {
    const std::uint32_t u = impl::float_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) {  // NaN: keep it quiet, never round to Inf
      bits = static_cast<std::uint16_t>((u >> 16) | 0x40u);
    } else {
      const std::uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
      bits = static_cast<std::uint16_t>((u + rounding) >> 16);
    }
  }
  /// The exact float value.
  KOKKOS_INLINE_FUNCTION explicit operator float() const {
    return impl::bits_float(static_cast<std::uint32_t>(bits) << 16);
  }
};

/// IEEE binary16 storage (fp16).
struct float16 {
  /// the stored bit pattern (sign, 5 exponent bits, 10 mantissa bits)
  std::uint16_t bits = 0;
  /// +0
  float16() = default;
  /// Rounds f to the nearest binary16 (ties to even; >= 65520 becomes Inf, subnormals kept).
  KOKKOS_INLINE_FUNCTION explicit float16(float f) {
    const std::uint32_t u = impl::float_bits(f);
    const std::uint32_t sign = (u >> 16) & 0x8000u;
    const std::uint32_t abs = u & 0x7fffffffu;
    std::uint32_t h;
    if (abs > 0x7f800000u) {
      h = 0x7e00u;  // NaN
    } else if (abs >= 0x477ff000u) {
      h = 0x7c00u;  // rounds to Inf (>= 65520)
    } else if (abs >= 0x38800000u) {  // normal half
      const std::uint32_t rounded = abs + 0xfffu + ((abs >> 13) & 1u);
      h = (rounded - 0x38000000u) >> 13;
    } else {  // subnormal half or zero: scale by 2^24 via an exact float add trick
      const float magic = impl::bits_float(0x3f000000u);  // 0.5 = 2^-1; half ulp of subnormals is 2^-25
      const float shifted = impl::bits_float(abs) + magic;
      h = impl::float_bits(shifted) - impl::float_bits(magic);
    }
    bits = static_cast<std::uint16_t>(sign | h);
  }
  /// The exact float value.
  KOKKOS_INLINE_FUNCTION explicit operator float() const {
    const std::uint32_t sign = (static_cast<std::uint32_t>(bits) & 0x8000u) << 16;
    const std::uint32_t exp = (bits >> 10) & 0x1fu;
    const std::uint32_t man = bits & 0x3ffu;
    if (exp == 0x1fu) return impl::bits_float(sign | 0x7f800000u | (man << 13));
    if (exp == 0) {  // zero or subnormal: man * 2^-24
      const float v = static_cast<float>(man) * impl::bits_float(0x33800000u);
      return impl::bits_float(sign | impl::float_bits(v));
    }
    return impl::bits_float(sign | ((exp + 112u) << 23) | (man << 13));
  }
};

/// The type every kernel accumulates in: double for double inputs, float otherwise.
template <class T>
using accumulator_t = std::conditional_t<std::is_same<T, double>::value, double, float>;

/// True for the input types TiledLSE accepts: float, double, bfloat16, float16.
template <class T>
struct is_supported_scalar
    : std::integral_constant<bool, std::is_same<T, float>::value || std::is_same<T, double>::value ||
                                       std::is_same<T, bfloat16>::value || std::is_same<T, float16>::value> {};

/// Machine epsilon of the storage type (used for per-dtype defaults such as filter_eps).
template <class T>
constexpr double storage_epsilon() {
  return std::is_same<T, double>::value ? 0x1p-52
         : std::is_same<T, float>::value ? 0x1p-23
         : std::is_same<T, bfloat16>::value ? 0x1p-7
                                            : 0x1p-10;
}

/// Short name of the storage type: "f64", "f32", "bf16" or "f16" (messages, benchmark names).
template <class T>
constexpr const char* scalar_name() {
  return std::is_same<T, double>::value ? "f64"
         : std::is_same<T, float>::value ? "f32"
         : std::is_same<T, bfloat16>::value ? "bf16"
                                            : "f16";
}

namespace impl {
/// Converts any supported storage type to the accumulator type and back.
template <class Acc, class T>
KOKKOS_INLINE_FUNCTION Acc to_acc(const T& v) {
  return static_cast<Acc>(static_cast<float>(v));
}
template <class Acc>
KOKKOS_INLINE_FUNCTION Acc to_acc(const double& v) {
  return static_cast<Acc>(v);
}
template <class T, class Acc>
KOKKOS_INLINE_FUNCTION T from_acc(Acc v) {
  return T(static_cast<float>(v));
}
template <>
KOKKOS_INLINE_FUNCTION double from_acc<double, double>(double v) {
  return v;
}
template <>
KOKKOS_INLINE_FUNCTION float from_acc<float, float>(float v) {
  return v;
}
}  // namespace impl
}  // namespace tlse
