#pragma once
// The implicit matrix x_rc = logit(A_r . B_c) as the tile kernels see it: two sides (rows of
// A and rows of B, each optionally visited through an index list), the elementwise logit model
// (scale, column bias, softcap, masks) and, for the backward, the softmax terms of each side.
#include <tlse/impl/kokkos_compat.hpp>
#include <tlse/scalar_types.hpp>

#include <cstdint>

namespace tlse::impl {

using index_t = std::int64_t;

/// Tile shape of the generic kernels: TM rows x TN columns, depth consumed TK at a time.
/// 32 x 32 x 32 keeps a double-precision team's scratch under Kokkos 3.4's 40 KiB CUDA cap.
struct GenericTile {
  static constexpr int TM = 32, TN = 32, TK = 32;
};

/// The rows of one operand. Logical position `p` reads row `id(p)` of `data`; an index list
/// lets the kernels skip rows (ignored tokens) or visit them in another order (sorted vocabulary)
/// without copying.
template <class T>
struct Side {
  const T* data = nullptr;
  const int* index = nullptr;  // logical position -> row of data; nullptr means identity
  index_t count = 0;           // number of logical positions
  index_t stored = 0;          // rows of data (count without an index)
  /// With an index, where the caller has it: its inverse, row of data -> logical position or -1
  /// for a row no position visits (backends that sweep the stored rows use it).
  const int* position = nullptr;
  KOKKOS_INLINE_FUNCTION index_t id(index_t p) const { return index ? index_t(index[p]) : p; }
};

/// x = softcap(scale * dot + bias_c), or -inf where masked (excluded diagonal, c >= valid_cols,
/// a -inf bias).
template <class T, class Acc>
struct LogitModel {
  Acc scale = 1;
  const T* col_bias = nullptr;
  Acc softcap = 0;  // 0: no softcap
  bool exclude_diagonal = false;
  index_t diagonal_offset = 0;  // the diagonal is row_id + diagonal_offset == col_id
  index_t valid_cols = INT64_MAX;

  /// Whether every column of `cols` takes x = scale * dot: no mask, bias or softcap reaches it,
  /// so that a tile kernel may skip the per-entry model on its full tiles.
  template <class Cols>
  bool plain(const Cols& cols) const {
    return col_bias == nullptr && !(softcap > Acc(0)) && !exclude_diagonal &&
           valid_cols >= (cols.index ? cols.stored : cols.count);
  }
  KOKKOS_INLINE_FUNCTION bool masked(index_t row_id, index_t col_id) const {
    return col_id >= valid_cols || (exclude_diagonal && row_id + diagonal_offset == col_id);
  }
  KOKKOS_INLINE_FUNCTION Acc operator()(Acc dot, index_t row_id, index_t col_id) const {
    if (masked(row_id, col_id)) return -infinity<Acc>();
    Acc z = scale * dot;
    if (col_bias) z += to_acc<Acc>(col_bias[col_id]);
    // A -inf logit stays masked under the softcap (softcap * tanh(-inf) would be -softcap: a
    // class masked by a -inf bias would get probability again).
    return softcap > Acc(0) && z != -infinity<Acc>() ? softcap * impl::tanh(z / softcap) : z;
  }
  /// dx/dz for the softcap, written in terms of x itself (1 - tanh^2).
  KOKKOS_INLINE_FUNCTION Acc dx_dz(Acc x) const {
    if (!(softcap > Acc(0))) return Acc(1);
    const Acc t = x / softcap;
    return Acc(1) - t * t;
  }
};

/// One side's share of dL/dx_rc: g[i] * exp(x - lse[i]) - (other == target[i] ? w[i] : 0)
/// - spread[i] * u[other], indexed by that side's id (u = spread_weight by the other side's id,
/// nullptr: 1; the last term is label smoothing's, on every unmasked entry). All pointers null:
/// the side contributes nothing.
template <class Acc>
struct SoftmaxTerms {
  const Acc* lse = nullptr;
  const Acc* g = nullptr;
  const int* target = nullptr;  // id on the other side, or anything out of range for none
  const Acc* w = nullptr;
  const Acc* spread = nullptr;         // nullptr: no spread term
  const Acc* spread_weight = nullptr;  // by the other side's id; nullptr: 1
  KOKKOS_INLINE_FUNCTION bool active() const { return g != nullptr; }
};

template <class T, class Acc>
struct TileProblem {
  Side<T> rows, cols;
  index_t depth = 0;
  LogitModel<T, Acc> logit;
  bool tf32 = false;  // float products may run in TF32 (Precision::tf32)
};

/// Online log-sum-exp state (running max and sum of exp(x - max)), Inf-CL eq. 4-5.
template <class Acc>
struct LseState {
  Acc max = -infinity<Acc>();
  Acc sum = 0;
  KOKKOS_INLINE_FUNCTION void merge(Acc other_max, Acc other_sum) {
    if (other_max == -infinity<Acc>()) return;
    if (max == -infinity<Acc>()) {
      max = other_max;
      sum = other_sum;
    } else if (other_max > max) {
      sum = sum * impl::exp(max - other_max) + other_sum;
      max = other_max;
    } else {
      sum += other_sum * impl::exp(other_max - max);
    }
  }
  KOKKOS_INLINE_FUNCTION Acc value() const {
    return sum == Acc(0) ? -infinity<Acc>() : max + impl::log(sum);  // NaN sums propagate
  }
};

/// max that lets a NaN win, so that NaN inputs propagate to the LSE instead of vanishing.
template <class Acc>
KOKKOS_INLINE_FUNCTION Acc nan_max(Acc a, Acc b) {
  return (b > a || b != b) ? b : a;
}

}  // namespace tlse::impl
