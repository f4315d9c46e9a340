#pragma once
// The unit the O(rows + cols) row kernels read their rows in where a row's start and depth
// allow it: 16 bytes of T, one vector load on a GPU (pair_logits, label_smoothing.hpp's sums).

namespace tlse::impl {

/// 16 bytes of T (one vector load on a GPU).
template <class T>
struct alignas(16) SixteenBytes {
  static constexpr int COUNT = int(16 / sizeof(T));
  T v[COUNT];
};

}  // namespace tlse::impl
