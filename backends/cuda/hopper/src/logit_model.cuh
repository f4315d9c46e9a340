#pragma once
// The elementwise model of the implicit matrix, as the epilogues see it: a side's positions and
// ids, x = softcap(scale * dot + bias) with its masks, the online LSE merge, and one position's
// softmax terms. The same arithmetic as core/tlse/impl/tile_problem.hpp (LogitModel, LseState)
// and the mma.sync backward (TermsAt), so every path computes the same function.
#include <cuda_runtime.h>

#include <cstdint>

#include "../tlse_hopper.h"

namespace tlse::hopper {

constexpr float NEG_INF = -__builtin_huge_valf();

struct DeviceSide {
  int64_t count = 0;
  const int32_t* index = nullptr;
  const int32_t* position = nullptr;
  int64_t positions = 0;  // entries per split of the outputs by position
  __device__ __forceinline__ int64_t id(int64_t p) const { return index ? int64_t(index[p]) : p; }
  /// The output position of row p, or -1 when it takes no part (past the end, or ignored).
  __device__ __forceinline__ int64_t output(int64_t p) const {
    return p >= count ? -1 : position ? int64_t(position[p]) : p;
  }
};

inline DeviceSide device_side(const tlse_hop_side& s) {
  return DeviceSide{s.count, s.index, s.position, s.positions > 0 ? s.positions : s.count};
}

constexpr float LOG2E = 1.4426950408889634f;
constexpr float LN2 = 0.6931471805599453f;

/// 2^x on the special function unit (relative error about 2^-22; subnormal results flush to 0,
/// which no sum of exponentials here notices).
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

/// exp(scale * dot - shift) as one fma and ex2, from scale2 = scale log2 e and shift2 = shift
/// log2 e (the caller forms them once per tile or row). Rounding the exponent's terms in log2 units
/// adds about |scale * dot| 2^-23 to it, less than the dot product's own fp32 accumulation error
/// (depth 2^-24 sum |a b|, which the tests' tolerances count); forming x - shift first, then
/// scaling it, took two more instructions per entry.
__device__ __forceinline__ float exp_of_dot(float dot, float scale2, float shift2) {
  return ex2(fmaf(dot, scale2, -shift2));
}

/// exp(x - shift) for a logit x: exp_of_dot with scale 1 (shift2 is loop-invariant where shift is).
__device__ __forceinline__ float exp_shifted(float x, float shift) { return exp_of_dot(x, LOG2E, shift * LOG2E); }

/// max that lets a NaN win (NaN inputs propagate to the LSE instead of vanishing): one instruction.
__device__ __forceinline__ float nan_max(float a, float b) {
  float m;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(m) : "f"(a), "f"(b));
  return m;
}

/// What the general logit model takes of one column: its id, -1 where the column is masked (past
/// the side's end, or at or past valid_cols), and its bias (0 without one). The epilogues' general
/// loops read a tile's from shared memory, where each consumer thread puts the column it loaded
/// before the tile's products: read from global memory entry by entry, the ids and biases of a
/// thread's 64 columns were hoisted into registers that ptxas spilled (720-760 bytes per thread, in
/// the code every tile of the kernel runs).
struct ModelColumn {
  int32_t id;
  float bias;
};

template <class T>
struct DeviceLogitModel {
  float scale = 1;
  const T* col_bias = nullptr;
  float softcap = 0;
  bool exclude_diagonal = false;
  int64_t diagonal_offset = 0;
  int64_t valid_cols = INT64_MAX;
  /// Columns [0, simple_cols) of a side without index need nothing but the scale: no bias, no
  /// softcap, no column past valid_cols, and (with rows without index too) no diagonal but in the
  /// tiles that meet it (0 when the model is not that simple).
  int64_t simple_cols = 0;
  /// Columns [0, capped_cols) need the scale and a softcap only: x = capped(scale * dot) (0
  /// when the model has no softcap, or needs more than these two).
  int64_t capped_cols = 0;

  /// Whether every entry of the tile at (row0, col0) needs only x = scale * dot: its columns lie
  /// below simple_cols, and no entry of it is on the excluded diagonal, which meets a few tiles
  /// only (ids are positions where simple_cols > 0). Rows are checked one by one: a row that
  /// takes no part is skipped whole.
  __device__ __forceinline__ bool simple_tile(int64_t row0, int tile_m, int64_t col0, int tile_n) const {
    return col0 + tile_n <= simple_cols && !meets_diagonal(row0, tile_m, col0, tile_n);
  }
  /// Whether the excluded diagonal crosses the tile at (row0, col0) (ids are positions there).
  __device__ __forceinline__ bool meets_diagonal(int64_t row0, int tile_m, int64_t col0, int tile_n) const {
    const int64_t first = row0 + diagonal_offset;  // the column that the tile's first row excludes
    return exclude_diagonal && first + tile_m > col0 && first < col0 + tile_n;
  }
  /// Whether every tile of columns [0, end) is simple_tile: the kernels without the general model serve.
  bool all_simple(int64_t end) const { return simple_cols >= end && !exclude_diagonal; }
  /// Whether every tile of columns [0, end) is simple_tile but for the diagonal: a kernel without
  /// the general model serves if it zeroes the diagonal's entries itself.
  bool simple_but_diagonal(int64_t end) const { return simple_cols >= end && exclude_diagonal; }

  /// Position col of the column side, of which [0, end) take part, as the general model sees it.
  __device__ __forceinline__ ModelColumn column(const DeviceSide& cols, int64_t col, int64_t end) const {
    const int64_t id = col < end ? cols.id(col) : valid_cols;
    if (id >= valid_cols) return {-1, 0.f};
    return {int32_t(id), col_bias ? float(col_bias[id]) : 0.f};  // ids and counts < 2^31
  }
  /// The column id that the diagonal mask takes out of the row with id row_id; -2 (no column's)
  /// where there is none.
  __device__ __forceinline__ int32_t excluded_id(int64_t row_id) const {
    if (!exclude_diagonal) return -2;
    const int64_t id = row_id + diagonal_offset;
    return id >= 0 && id < valid_cols && id <= INT32_MAX ? int32_t(id) : -2;
  }
  /// The logit of a dot product in column col of a row whose diagonal takes out column id
  /// `excluded` (excluded_id).
  __device__ __forceinline__ float at(float dot, ModelColumn col, int32_t excluded) const {
    if (col.id < 0 || col.id == excluded) return NEG_INF;
    const float z = scale * dot + col.bias;
    return softcap > 0.f ? capped(z) : z;
  }
  /// softcap tanh(z / softcap) (softcap > 0), as LogitModel computes it (tile_problem.hpp); a -inf
  /// logit stays masked.
  __device__ __forceinline__ float capped(float z) const { return z != NEG_INF ? softcap * tanhf(z / softcap) : z; }
  /// dx/dz of the softcap in terms of x itself (1 - tanh^2).
  __device__ __forceinline__ float dx_dz(float x) const {
    if (!(softcap > 0.f)) return 1.f;
    const float t = x / softcap;
    return 1.f - t * t;
  }
};

/// A self-similarity (NT-Xent) matrix excludes its diagonal: its other tiles keep the simple model
/// (with every tile on the general one, the form's forward took about twice the paired form's time:
/// docs/notes/2026-11-28.md, "The self-similarity form (NT-Xent) off the general logit model").
template <class T>
DeviceLogitModel<T> device_logit_model(const tlse_hop_logit_model& m, const tlse_hop_side& rows,
                                       const tlse_hop_side& cols) {
  DeviceLogitModel<T> d;
  d.scale = m.scale;
  d.col_bias = static_cast<const T*>(m.col_bias);
  d.softcap = m.softcap;
  d.exclude_diagonal = m.exclude_diagonal != 0;
  d.diagonal_offset = m.diagonal_offset;
  d.valid_cols = m.valid_cols;
  const bool scaled = !m.col_bias && !cols.index;  // but for the softcap and the diagonal
  const int64_t valid = cols.count < m.valid_cols ? cols.count : m.valid_cols;
  d.simple_cols = scaled && !(m.softcap > 0.f) && (!m.exclude_diagonal || !rows.index) ? valid : 0;
  d.capped_cols = scaled && m.softcap > 0.f && !m.exclude_diagonal ? valid : 0;
  return d;
}

/// Online LSE state merge (max, sum of exp(x - max)), as LseState::merge.
__device__ __forceinline__ void lse_merge(float& max, float& sum, float other_max, float other_sum) {
  if (other_max == NEG_INF) return;
  if (max == NEG_INF) {
    max = other_max;
    sum = other_sum;
  } else if (other_max > max) {
    sum = sum * expf(max - other_max) + other_sum;
    max = other_max;
  } else {
    sum += other_sum * expf(other_max - max);
  }
}

struct DeviceTerms {
  const float* lse = nullptr;
  const float* g = nullptr;
  const int32_t* target = nullptr;
  const float* w = nullptr;
  __device__ __forceinline__ bool active() const { return g != nullptr; }
};

inline DeviceTerms device_terms(const tlse_hop_terms& t) { return DeviceTerms{t.lse, t.g, t.target, t.w}; }

/// One position's softmax terms: its share of dL/dx is g exp(x - lse), minus w where the other
/// position is its target (see BackwardTiles::dlogit). Ids fit 32 bits (counts < 2^31).
struct TermsAt {
  float lse2 = 0, g = 0, w = 0;  // lse2: the position's LSE in log2 units (lse log2 e)
  int32_t target = -1;
  __device__ __forceinline__ void load(const DeviceTerms& t, int64_t id) {
    if (!t.active()) return;
    lse2 = t.lse[id] * LOG2E, g = t.g[id];
    if (t.target) target = t.target[id], w = t.w[id];
  }
  /// The softmax entry exp(x - lse) of x = scale * dot (scale2 = scale log2 e; exp_of_dot).
  __device__ __forceinline__ float softmax(float dot, float scale2) const { return exp_of_dot(dot, scale2, lse2); }
  /// The share of softmax entry p when the caller knows whether the other position is the target.
  __device__ __forceinline__ float term(float p, bool is_target) const { return is_target ? g * p - w : g * p; }
  /// The share of logit x; sets `significant` where the entry survives gradient filtering.
  __device__ __forceinline__ float share(float x, int32_t other_id, float filter_eps, bool& significant) const {
    const float p = softmax(x, LOG2E);
    const bool is_target = target == other_id;
    significant |= is_target || !(p < filter_eps);
    return term(p, is_target);
  }
};

}  // namespace tlse::hopper
