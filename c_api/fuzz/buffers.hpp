#pragma once
// Memory the fuzzer lends to a call of the C API. Each array sits between guard bytes that
// AddressSanitizer sees as poisoned (any read or write of them is a report) and that are compared
// after the call (a write shows even without ASan); its bytes can be saved before the call to
// check afterwards that the call left them alone.
#include <sanitizer/asan_interface.h>  // ASAN_(UN)POISON_MEMORY_REGION: no-ops without ASan

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace fuzz {

/// Element types of the C API's arrays: the four dtypes, int64 targets, int32 vocab_order, and
/// the bytes of a workspace.
enum class Kind { f32, f64, bf16, f16, i64, i32, u8 };

inline std::size_t size_of(Kind k) {
  switch (k) {
    case Kind::f64:
    case Kind::i64:
      return 8;
    case Kind::f32:
    case Kind::i32:
      return 4;
    case Kind::u8:
      return 1;
    default:
      return 2;
  }
}

/// The largest finite value of a floating-point kind.
inline double max_finite(Kind k) {
  return k == Kind::f64    ? 1.7976931348623157e308
         : k == Kind::f16  ? 65504.0
         : k == Kind::bf16 ? 3.3895313892515355e38
                           : 3.4028234663852886e38;
}

/// bfloat16 and IEEE half from and to float, rounding to nearest even (as the library's types).
inline std::uint16_t bf16_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  if (std::isnan(f)) return 0x7fc0;
  return std::uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
inline float bf16_value(std::uint16_t h) {
  const std::uint32_t u = std::uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline std::uint16_t f16_bits(float f) {
  const std::uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  const float a = std::fabs(f);
  if (std::isnan(f)) return 0x7e00;
  if (a >= 65520.0f) return sign | 0x7c00;                                     // rounds to infinity
  if (a < 0x1p-14f) return sign | std::uint16_t(std::nearbyint(a * 0x1p24f));  // subnormal (or 0)
  int e;
  const float m = std::frexp(a, &e);                                       // a = m 2^e, m in [0.5, 1)
  std::uint32_t mant = std::uint32_t(std::nearbyint((m * 2 - 1) * 1024));  // 10 bits, may round to 1024
  std::uint32_t exp = std::uint32_t(e - 1 + 15);
  if (mant == 1024) mant = 0, ++exp;
  return std::uint16_t(sign | (exp >= 31 ? 0x7c00 : (exp << 10) | mant));
}
inline float f16_value(std::uint16_t h) {
  const float sign = h & 0x8000 ? -1.0f : 1.0f;
  const int exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  if (exp == 0) return sign * std::ldexp(float(mant), -24);
  if (exp == 31) return mant ? NAN : sign * INFINITY;
  return sign * std::ldexp(float(1024 + mant), exp - 25);
}

/// `count` elements of `kind` between two poisoned guards of `guard` bytes. `misaligned` shifts
/// the array one byte off its type's alignment.
class Buffer {
 public:
  static constexpr std::size_t guard = 64;
  Buffer(Kind kind, std::size_t count, bool misaligned = false)
      : kind_(kind), count_(count), bytes_(count * size_of(kind)), offset_(guard + (misaligned ? 1 : 0)) {
    total_ = offset_ + bytes_ + guard;
    base_ = static_cast<unsigned char*>(std::aligned_alloc(64, (total_ + 63) / 64 * 64));
    std::memset(base_, pattern, total_);
    ASAN_POISON_MEMORY_REGION(base_, offset_);
    ASAN_POISON_MEMORY_REGION(base_ + offset_ + bytes_, total_ - offset_ - bytes_);
  }
  ~Buffer() {
    ASAN_UNPOISON_MEMORY_REGION(base_, total_);
    std::free(base_);
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const { return base_ + offset_; }
  std::size_t count() const { return count_; }
  std::size_t bytes() const { return bytes_; }
  Kind kind() const { return kind_; }

  double get(std::size_t i) const {
    const unsigned char* p = base_ + offset_ + i * size_of(kind_);
    switch (kind_) {
      case Kind::f32:
        return load<float>(p);
      case Kind::f64:
        return load<double>(p);
      case Kind::bf16:
        return bf16_value(load<std::uint16_t>(p));
      case Kind::f16:
        return f16_value(load<std::uint16_t>(p));
      case Kind::i64:
        return double(load<std::int64_t>(p));
      case Kind::i32:
        return double(load<std::int32_t>(p));
      case Kind::u8:
        return double(*p);
    }
    return 0;
  }
  std::int64_t get_int(std::size_t i) const {
    const unsigned char* p = base_ + offset_ + i * size_of(kind_);
    return kind_ == Kind::i64 ? load<std::int64_t>(p) : load<std::int32_t>(p);
  }
  /// Stores `v` rounded to the element type.
  void set(std::size_t i, double v) {
    unsigned char* p = base_ + offset_ + i * size_of(kind_);
    switch (kind_) {
      case Kind::f32:
        return store(p, float(v));
      case Kind::f64:
        return store(p, v);
      case Kind::bf16:
        return store(p, bf16_bits(float(v)));
      case Kind::f16:
        return store(p, f16_bits(float(v)));
      case Kind::i64:
        return store(p, std::int64_t(v));
      case Kind::i32:
        return store(p, std::int32_t(v));
      case Kind::u8:
        return store(p, static_cast<unsigned char>(v));
    }
  }
  void set_int(std::size_t i, std::int64_t v) {
    unsigned char* p = base_ + offset_ + i * size_of(kind_);
    if (kind_ == Kind::i64) return store(p, v);
    store(p, std::int32_t(v));
  }

  /// Saves the array's bytes; changed() compares with them.
  void save() { saved_.assign(base_ + offset_, base_ + offset_ + bytes_); }
  bool changed() const { return bytes_ > 0 && std::memcmp(saved_.data(), base_ + offset_, bytes_) != 0; }
  /// Whether both guards still hold the fill pattern (read through the poison).
  bool guards_intact() const {
    ASAN_UNPOISON_MEMORY_REGION(base_, total_);
    bool ok = true;
    for (std::size_t i = 0; i < offset_; ++i) ok &= base_[i] == pattern;
    for (std::size_t i = offset_ + bytes_; i < total_; ++i) ok &= base_[i] == pattern;
    ASAN_POISON_MEMORY_REGION(base_, offset_);
    ASAN_POISON_MEMORY_REGION(base_ + offset_ + bytes_, total_ - offset_ - bytes_);
    return ok;
  }

 private:
  static constexpr unsigned char pattern = 0xa5;
  template <class U>
  static U load(const unsigned char* p) {
    U v;
    std::memcpy(&v, p, sizeof(U));
    return v;
  }
  template <class U>
  static void store(unsigned char* p, U v) {
    std::memcpy(p, &v, sizeof(U));
  }

  Kind kind_;
  std::size_t count_, bytes_, offset_, total_;
  unsigned char* base_;
  std::vector<unsigned char> saved_;
};

}  // namespace fuzz
