#pragma once
// The unit the O(rows + cols) row kernels read their rows in where a row's start and depth
// allow it: 16 bytes of T, one vector load on a GPU (pair_logits, label_smoothing.hpp's sums).
#include <cstdint>

namespace tlse::impl {

/// 16 bytes of T (one vector load on a GPU).
template <class T>
struct alignas(16) SixteenBytes {
  static constexpr int COUNT = int(16 / sizeof(T));
  T v[COUNT];

  /// Whether rows of `depth` values each, from `rows` on, can be read 16 bytes at a time: the
  /// depth a multiple of COUNT and the first row 16-byte aligned.
  static bool fits(const T* rows, std::int64_t depth) {
    return depth % COUNT == 0 && reinterpret_cast<std::uintptr_t>(rows) % 16 == 0;
  }
};

}  // namespace tlse::impl
