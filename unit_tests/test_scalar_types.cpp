// The 16-bit storage types: conversions against the compiler's _Float16 and exact rounding.
#include <tlse/scalar_types.hpp>

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

namespace {

float next_float(float f, int steps) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  u += steps;
  std::memcpy(&f, &u, 4);
  return f;
}

TEST(ScalarTypes, Float16MatchesCompilerConversionEverywhere) {
  // Every half value converts to float exactly, and back to itself.
  for (std::uint32_t bits = 0; bits < 0x10000; ++bits) {
    tlse::float16 h;
    h.bits = std::uint16_t(bits);
    _Float16 ref;
    std::memcpy(&ref, &h.bits, 2);
    const float f = float(h);
    if (std::isnan(float(ref))) {
      EXPECT_TRUE(std::isnan(f));
      continue;
    }
    ASSERT_EQ(f, float(ref)) << std::hex << bits;
    ASSERT_EQ(tlse::float16(f).bits, h.bits) << std::hex << bits;
  }
  // Random floats (normal, subnormal-half range, overflow, ties) round as the compiler does.
  std::mt19937 rng(12345);
  for (int i = 0; i < 2000000; ++i) {
    std::uint32_t u = rng();
    float f;
    std::memcpy(&f, &u, 4);
    if (std::isnan(f)) continue;
    if (i % 2) f = std::ldexp(float(int(u % 4096) - 2048), int(u % 50) - 40);  // near-representable values
    const _Float16 ref = _Float16(f);
    std::uint16_t want;
    std::memcpy(&want, &ref, 2);
    ASSERT_EQ(tlse::float16(f).bits, want) << f;
  }
}

TEST(ScalarTypes, BFloat16RoundsToNearestEven) {
  std::mt19937 rng(777);
  for (int i = 0; i < 1000000; ++i) {
    std::uint32_t u = rng();
    float f;
    std::memcpy(&f, &u, 4);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(float(tlse::bfloat16(f))));
      continue;
    }
    const float lo = [&] { std::uint32_t t = u & 0xffff0000u; float r; std::memcpy(&r, &t, 4); return r; }();
    const float hi = next_float(lo, 0x10000);
    const float got = float(tlse::bfloat16(f));
    // Past the largest bf16, the upper neighbour is 2^128, which rounds to Inf.
    const double hi_value = std::isinf(hi) ? std::copysign(std::ldexp(1.0, 128), double(f)) : double(hi);
    const double dlo = std::fabs(double(f) - lo), dhi = std::fabs(hi_value - f);
    if (dlo < dhi) EXPECT_EQ(got, lo) << f;
    else if (dhi < dlo) EXPECT_EQ(got, hi) << f;
    else EXPECT_EQ(tlse::bfloat16(got).bits & 1u, 0u) << "tie must go to even: " << f;
  }
  EXPECT_TRUE(std::isinf(float(tlse::bfloat16(INFINITY))));
  EXPECT_TRUE(std::isnan(float(tlse::bfloat16(NAN))));
}

}  // namespace
