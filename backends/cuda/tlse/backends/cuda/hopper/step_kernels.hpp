#pragma once
// The kernels of the training step on the Hopper kernels, which hopper/step.hpp launches around
// the products, one block (or warp) per row of a chunk: the row's LSE from the forward's partial
// states (merged_row_state), fp16's bound of each row's terms and the chunk's power of two for G
// and A' (row_bound_kernel, step_factor_kernel), the kept exponentials turned into E' and the
// scaled rows A', or into G in place under a softcap (exponentials_to_gradient_kernel, with
// KeptLayout saying where the forward kept them), and a gather of the target logits by row
// (by_position_kernel).
#if defined(TLSE_HAVE_HOPPER)
#include <tlse_hopper.h>

#include <tlse/backends/cuda/grid_stride.hpp>
#include <tlse/backends/cuda/hopper/backward_plan.hpp>
#include <tlse/backends/cuda/mma/backward.hpp>
#include <tlse/impl/step_request.hpp>
#include <type_traits>

namespace tlse::impl::cuda {

/// exp(x - l) of a kept exponential e = exp(x - s) (bf16, up to e^SPAN): from x = s + log(e), not
/// as e * exp(s - l), whose second factor underflows float (s - l < -103) while e^SPAN would have
/// lifted the product back into range (a part under the row's shift, in a row whose LSE lies far
/// above it: seen as dC errors up to 23x the bound on tiny classes, logits of std 30). 0 where e
/// = 0 (s = -inf among them; no NaN from l = -inf). Where s - l >= -80, e * exp(s - l) is as good.
__device__ inline float probability(float e, float s, float l) { return e == 0.f ? 0.f : expf(s + logf(e) - l); }

/// log2 e as the Hopper forward takes it (logit_model.cuh): fp16's kept exponentials are
/// 2^(x LOG2E_F - k), and the step forms its exponents with the same constant.
constexpr float LOG2E_F = 1.4426950408889634f;

/// Row p's LSE state from the forward's `splits` partial states (max[k][p], sum[k][p]), merged
/// by one warp in a fixed tree (a split per lane, then the lanes): every lane holds the same.
__device__ inline LseState<float> merged_row_state(const float* max, const float* sum, int splits, index_t chunk_rows,
                                                   index_t p) {
  LseState<float> s;
  for (int k = int(threadIdx.x & 31); k < splits; k += 32) s.merge(max[k * chunk_rows + p], sum[k * chunk_rows + p]);
  for (int lanes = 16; lanes > 0; lanes >>= 1)
    s.merge(__shfl_xor_sync(0xffffffffu, s.max, lanes), __shfl_xor_sync(0xffffffffu, s.sum, lanes));
  return s;
}

/// The rows of a chunk as the forward left them: row p of the chunk (p < count) is scored row
/// first + p, whose id is id_of[first + p] (or first + p without id_of), and its LSE state is
/// spread over the forward's `splits` column splits (max[k][p], sum[k][p]).
struct ChunkRows {
  const float* max = nullptr;
  const float* sum = nullptr;
  int splits = 0;
  index_t count = 0;
  index_t first = 0;
  const int* id_of = nullptr;

  __device__ index_t id(index_t p) const { return id_of ? index_t(id_of[first + p]) : first + p; }
  /// Row p's state, merged by one warp (merged_row_state).
  __device__ LseState<float> state(index_t p) const { return merged_row_state(max, sum, splits, count, p); }
};

/// fp16's step: a warp per row p of the chunk (as exponentials_to_gradient_kernel numbers them),
/// bound[p] = |g| + |w|, the bound of the row's |dL/dz| (TermsAt::bound), from its LSE. A row
/// without a target weighs nothing (the kept columns' sweep of every stored row: its
/// coefficients are not set).
__global__ void row_bound_kernel(const ChunkRows chunk, const int* target, const StepCoefficients<float> coef,
                                 float* bound) {
  const index_t p = blockIdx.x;
  const index_t id = chunk.id(p);
  const float l = chunk.state(p).value();
  const float w = coef.w(target, id), g = coef.g(target, id, l);
  if (threadIdx.x == 0) bound[p] = fabsf(g) + fabsf(w);
}

/// fp16's step: factor[0] = the power of two that G, and A' = diag(c) A, are stored times, half
/// of row_scale_for(|scale| max bound) (G at most 2^13; c f at most 1, exponentials_to_gradient_kernel,
/// so that A' stays within A's range), and factor[1] its inverse for the products. One block.
__global__ void step_factor_kernel(const float* bound, index_t rows, float logit_scale, float* factor) {
  float m = 0.f;
  for (index_t p = threadIdx.x; p < rows; p += blockDim.x) m = fmaxf(m, bound[p]);
  m = block_max(m);
  if (threadIdx.x == 0) {
    const float f = 0.5f * row_scale_for(fabsf(logit_scale) * m);
    factor[0] = f, factor[1] = 1.f / f;  // powers of two: exact
  }
}

/// Where the forward kept the exponentials of a chunk's rows (bf16 or fp16): row p's of column j at
/// p * ld + j, or in panels of `panel` columns (a multiple of 8), panel k = j / panel at
/// panel_data(k) + p * ld + j - k * panel: data + k * panel_stride, or from panel tail_panel on
/// (where tail is set) tail + (k - tail_panel) * tail_stride (tlse_hop_kept_exponentials::tail).
struct KeptLayout {
  void* data = nullptr;
  index_t ld = 0, panel = 0, panel_stride = 0;
  void* tail = nullptr;
  index_t tail_panel = 0, tail_stride = 0;
  template <class T>
  __host__ __device__ T* panel_data(index_t k) const {
    return tail && k >= tail_panel ? static_cast<T*>(tail) + (k - tail_panel) * tail_stride
                                   : static_cast<T*>(data) + k * panel_stride;
  }
  template <class T>
  __device__ T* at(index_t p, index_t j) const {
    const index_t k = panel > 0 ? j / panel : 0;
    return panel_data<T>(k) + p * ld + (j - k * panel);
  }
};

/// What exponentials_to_gradient_kernel reads and writes for the rows of one chunk.
template <class T>
struct ToGradientParams {
  ChunkRows chunk;                      ///< the chunk's rows and the forward's partial states of them
  KeptLayout kept;                      ///< where the forward kept their exponentials
  const float* shift = nullptr;         ///< by row: the shifts of its parts, 4 per tile (tlse_hopper.h)
  index_t ld_shift = 0;                 ///< floats from a row of `shift` to the next
  index_t cols = 0;                     ///< the kept columns (class ids below it)
  const int* target = nullptr;          ///< by row id: the target class (out of [0, cols): no target term)
  const float* target_logit = nullptr;  ///< by scored row (first + p): the target's logit x_t; bf16: the row's shift r
  StepCoefficients<float> coef;
  LogitModel<T, float> model;
  const float* factor = nullptr;  ///< fp16: factor[0], what G and A' are stored times (step_factor_kernel)
  float* lse = nullptr;           ///< out, by row id: the row's LSE
  float* row_g = nullptr;         ///< out, by row id: g, the weight of its softmax; or NULL
  float* row_scale = nullptr;     ///< out, by chunk row: c (Factored)
  const T* rows = nullptr;        ///< the chunk's input rows, `depth` elements each
  T* scaled_rows = nullptr;       ///< out (Factored): the input rows times c (fp16: times factor[0] too); or NULL
  index_t depth = 0;
};

/// fp16's factor for a row's kept exponentials (Factored): E' = e times one factor per part, so
/// that E' times a is the row's softmax.
struct Fp16RowFactor {
  float a = 0.f;              ///< exp(r - l), r the shift E' is under; 0: the row keeps its exponentials as they are
  bool exact_target = false;  ///< the target's entry is exact_entry = +-2^m
  float exact_entry = 0.f;
  float k_r = 0.f;  ///< without exact_target, E' = 2^(x log2 e - k_r)

  /// The factor of a part kept under `shift` (an integer times ln 2, keep_row): 2^(k_part - k_r)
  /// on the grid (exact), else p / (e a).
  __device__ float of_part(float shift, float l) const {
    const float k_part = rintf(shift * LOG2E_F);
    return shift == -infinity<float>() ? 0.f
           : exact_target              ? exp2f(fmaf(-l, LOG2E_F, k_part)) / a
                                       : ldexpf(1.f, int(k_part - k_r));
  }
};

/// The factor of a row with weights g, w, LSE l and target logit x_t (-inf: none among the
/// columns). Every part was kept under its own 2^k (keep_row), so each is rescaled by one factor.
/// Where the row's target is among the columns, a = |T| 2^-m with T = p_t - w / g, so that the
/// target's entry T / a = +-2^m is exact: the term that dominates most rows of dA loses nothing
/// to fp16, as in G = scale (g p_t - w) of the fused backward (where w is a power of two and p_t
/// negligible), while each other entry is rounded a second time (e's in the forward, then p / a).
/// m puts |E'| at most 2^15 (p <= 1 over a >= 2^-15). Elsewhere (no target entry, or T too small
/// for fp16's normal range) on the grid of the forward's shifts: E' = 2^(x log2 e - k_r) exactly,
/// with k_r putting E' at most 2^(15 - h) and a written target's entry T / a within 2^15 (2^h >=
/// 1 + |w / g|). The exponents are formed as fma(-l, log2 e, k), with the forward's log2 e and
/// one rounding, since l log2 e alone carries float's error of l (1e-3 at l = 1e4).
__device__ inline Fp16RowFactor fp16_row_factor(float g, float w, float l, float x_t) {
  Fp16RowFactor f;
  if (g == 0.f || l == -infinity<float>()) return f;                                         // weight 0 (c = 0)
  const float term = x_t != -infinity<float>() ? (g * expm1f(x_t - l) + (g - w)) / g : 0.f;  // T
  int e = 0;
  if (term != 0.f) frexpf(fabsf(term), &e);  // |T| in [2^(e-1), 2^e)
  const int m = e + 14 < 15 ? e + 14 : 15;
  f.exact_target = term != 0.f && m >= -14;
  if (f.exact_target) {
    f.a = ldexpf(fabsf(term), -m);
    f.exact_entry = copysignf(ldexpf(1.f, m), term);
  } else {
    int h = 0;
    frexpf(1.f + fabsf(w / g), &h);
    f.k_r = ceilf(l * LOG2E_F) - float(TLSE_HOP_FP16_HEADROOM - h);
    f.a = exp2f(fmaf(-l, LOG2E_F, f.k_r));
  }
  return f;
}

/// A block per row p of the chunk, after the forward kept its exponentials e = exp(x - s) of the
/// columns below `cols` (in T, where `kept` says; s = shift[p][4 tile + (j mod 8) / 2],
/// tlse_hopper.h), bf16 under the row's shift r = target_logit[first + p] where it could, fp16
/// under k ln 2 per part (ToGradientParams names the arguments).
/// Merges the forward's states into the row's LSE l (lse[id]), then, with g and w from `coef` (StepCoefficients; g to
/// row_g[id], unless NULL), and dL/dz = g exp(x - l)
/// - [j == t] w (the target's term only for a target among the kept columns):
///   - Factored (no softcap, dx/dz = 1): G = diag(c) E', so that the products need no pass over
///     the exponentials: c = scale g exp(r - l) goes to row_scale[p], the target's entry becomes
///     e'_t = (g p_t - w) / (g exp(r - l)), and the row's input row times c (fp16: times
///     factor[0] too) to scaled_rows[p] (dB = G^T A = E'^T (diag(c) A)). bf16: a row with a part
///     under its own max (its largest logit more than the span above r: a loss above ~64 nats, or
///     a masked target) is first rescaled to r = l in place, the cost of the pass for that row
///     alone. fp16: every row of nonzero weight is rescaled, one factor per part (below);
///   - otherwise (a softcap): G = scale dL/dz dx/dz in place (fp16: times factor[0]), dx/dz at
///     s + log(e).
/// The target's term takes its logit from target_logit (the loss's): e does not tell a masked
/// target (no term) from one far below the row's shift, nor give dx/dz where e underflows.
template <class T, bool Factored>
__global__ void exponentials_to_gradient_kernel(const __grid_constant__ ToGradientParams<T> params) {
  static_assert(std::is_same<T, bfloat16>::value || std::is_same<T, float16>::value,
                "the step keeps its exponentials and G in bf16 or fp16");
  constexpr bool fp16 = std::is_same<T, float16>::value;
  const KeptLayout& kept = params.kept;
  const LogitModel<T, float>& model = params.model;
  const index_t cols = params.cols;
  const index_t p = blockIdx.x;
  const index_t id = params.chunk.id(p);
  const index_t t = index_t(params.target[id]);
  const float* const target_logit = params.target_logit + params.chunk.first + p;  // this row's
  __shared__ float row_lse, row_max;
  if (threadIdx.x < 32) {
    const LseState<float> s = params.chunk.state(p);
    if (threadIdx.x == 0) {
      row_lse = s.value(), row_max = s.max;
      params.lse[id] = row_lse;
    }
  }
  __syncthreads();
  const float x_t = t >= 0 && t < cols ? *target_logit : -infinity<float>();
  const float l = row_lse, w = params.coef.w(params.target, id), g = params.coef.g(params.target, id, l);
  if (params.row_g && threadIdx.x == 0) params.row_g[id] = g;
  // fp16: what G (or A' = diag(c) A) is stored times, for its range (step_factor_kernel).
  const float stored_times = fp16 ? params.factor[0] : 1.f;
  struct alignas(16) Eight {
    T v[8];
  };
  const float* row_shift = params.shift + p * params.ld_shift;
  // Each eight of the row in place through f(its values, four values of its tile, its first
  // column): the tile's shifts, one per pair of the eight (tlse_hopper.h), or what `per_tile`
  // makes of them. The row goes in windows of at most WINDOW_TILES tiles, none across panels:
  // the window's four values per tile in shared memory first, made once per tile instead of
  // once per eight, and the eights addressed from the panel's start instead of through
  // KeptLayout::at's division per eight (docs/notes/2026-11-29.md, "Where fp16's extra time goes,
  // and the rescaling pass in windows").
  // IN_FLIGHT eights per thread are loaded before any is written back, since the stores go to
  // the same row and the compiler kept one load in flight otherwise (docs/notes/2026-11-26.md,
  // "The step on H100s, its clocks and kernels"). 8 instead of 4, so that a panel of 1056 eights
  // takes one round instead of two, made fp16's step at N=8192 in 256 MiB no faster
  // (docs/notes/2026-11-29.md, "The pass as one loop over windows, and the softcap's baseline").
  constexpr index_t TILE = FusedBackwardPlan::TILE_N, WINDOW_TILES = 256;
  constexpr int IN_FLIGHT = 4;
  __shared__ float4 window[WINDOW_TILES];
  const auto each_eight = [&](auto&& per_tile, auto&& f) {
    const index_t segment = kept.panel > 0 ? kept.panel : cols;  // columns at one pointer: a panel, or the row
    // A window ends at its panel's end or after WINDOW_TILES tiles: begin stays a multiple of
    // TILE, as a panel's width is one.
    for (index_t begin = 0, end; begin < cols; begin = end) {
      const index_t next_panel = begin - begin % segment + segment, panel_end = next_panel < cols ? next_panel : cols;
      end = begin + WINDOW_TILES * TILE < panel_end ? begin + WINDOW_TILES * TILE : panel_end;
      __syncthreads();  // the previous window's values are read
      for (index_t i = threadIdx.x; i < (end - begin + TILE - 1) / TILE; i += blockDim.x)
        window[i] = per_tile(*reinterpret_cast<const float4*>(row_shift + 4 * (begin / TILE + i)));
      __syncthreads();
      // ld, panel and panel_stride are multiples of 8: the eights are 16-byte aligned.
      Eight* const eights_at = reinterpret_cast<Eight*>(kept.at<T>(p, begin));
      const index_t eights = (end - begin + 7) / 8, stride = index_t(blockDim.x);
      for (index_t first_eight = threadIdx.x; first_eight < eights; first_eight += IN_FLIGHT * stride) {
        Eight in[IN_FLIGHT];
#pragma unroll
        for (int u = 0; u < IN_FLIGHT; ++u)
          if (first_eight + u * stride < eights) in[u] = eights_at[first_eight + u * stride];
#pragma unroll
        for (int u = 0; u < IN_FLIGHT; ++u) {
          const index_t eight = first_eight + u * stride;
          if (eight >= eights) continue;
          const float4 v = window[8 * eight / TILE];
          const float values[4] = {v.x, v.y, v.z, v.w};
          eights_at[eight] = f(in[u], values, begin + 8 * eight);
        }
      }
    }
  };
  const auto shifts_as_they_are = [](float4 s) { return s; };
  if constexpr (Factored) {
    float a;                    // exp(r - l), r the shift E' is under: E' times a is the row's softmax
    bool exact_target = false;  // fp16: the target's entry is exact_entry = +-2^m (fp16_row_factor)
    float exact_entry = 0.f;
    if constexpr (fp16) {
      const Fp16RowFactor f = fp16_row_factor(g, w, l, x_t);
      a = f.a, exact_target = f.exact_target, exact_entry = f.exact_entry;
      if (g != 0.f && l != -infinity<float>())
        each_eight(
            [&](float4 s) {
              return float4{f.of_part(s.x, l), f.of_part(s.y, l), f.of_part(s.z, l), f.of_part(s.w, l)};
            },
            [&](const Eight& in, const float(&factors)[4], index_t) {
              Eight out;
#pragma unroll
              for (int k = 0; k < 8; ++k) out.v[k] = from_acc<T>(to_acc<float>(in.v[k]) * factors[k / 2]);
              return out;
            });
    } else {
      // The shift every part of the row is under, as the forward chose it (begin_row, keep_row).
      const float r0 = *target_logit < infinity<float>() ? *target_logit : -infinity<float>();
      // (A row of weight 0 needs no rescaling: c = 0 takes it out of both products.)
      const bool own_max = g != 0.f && row_max > r0 + float(TLSE_HOP_ROW_SHIFT_SPAN);
      const float r = own_max ? l : r0;
      if (own_max)
        each_eight(shifts_as_they_are, [&](const Eight& in, const float(&shifts)[4], index_t) {
          Eight out;
#pragma unroll
          for (int k = 0; k < 8; ++k) out.v[k] = from_acc<T>(probability(to_acc<float>(in.v[k]), shifts[k / 2], l));
          return out;
        });
      a = l == -infinity<float>() ? 0.f : expf(r - l);  // the row's exponentials to probabilities
    }
    const float c = g == 0.f || a == 0.f ? 0.f : model.scale * g * a;
    __syncthreads();  // the rescaled row is in place before the target's entry is
    if (threadIdx.x == 0) {
      params.row_scale[p] = c;
      if (c != 0.f && x_t != -infinity<float>())
        *kept.at<T>(p, t) = from_acc<T>(exact_target ? exact_entry : (g * expm1f(x_t - l) + (g - w)) / (g * a));
    }
    if (params.scaled_rows) {  // 16 bytes at a time (depth is a multiple of 8, the rows 16-byte aligned)
      const index_t depth = params.depth;
      const Eight* in = reinterpret_cast<const Eight*>(params.rows + p * depth);
      Eight* out = reinterpret_cast<Eight*>(params.scaled_rows + p * depth);
      const float cf = c * stored_times;
      for (index_t k = threadIdx.x; k < depth / 8; k += blockDim.x) {
        const Eight v = in[k];
        Eight scaled;
#pragma unroll
        for (int i = 0; i < 8; ++i) scaled.v[i] = from_acc<T>(cf * to_acc<float>(v.v[i]));
        out[k] = scaled;
      }
    }
  } else {
    const float target_dx_dz = model.dx_dz(x_t);
    const bool softcap = model.softcap > 0.f;
    each_eight(shifts_as_they_are, [&](const Eight& in, const float(&shifts)[4], index_t j) {
      // exp(s - l) once per pair where it cannot underflow (then e exp(s - l) is exact to float's
      // rounding); else -1: probability() per entry (an exponential more per entry made the
      // step at N=8192 with a softcap slower: docs/notes/2026-11-27.md, "The softcap's per-row
      // pass: one exponential per pair").
      float to_p[4];
#pragma unroll
      for (int q = 0; q < 4; ++q) to_p[q] = shifts[q] - l >= -80.f ? expf(shifts[q] - l) : -1.f;
      Eight out;
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const float e = to_acc<float>(in.v[k]), s = shifts[k / 2], f = to_p[k / 2];
        const float p = f >= 0.f ? e * f : probability(e, s, l);
        float dz;
        if (j + k == t)
          dz = x_t == -infinity<float>() ? 0.f : (g * p - w) * target_dx_dz;
        else if (j + k >= cols || e == 0.f)
          dz = 0.f;
        else
          dz = g * p * (softcap ? model.dx_dz(s + logf(e)) : 1.f);
        out.v[k] = from_acc<T>(dz * model.scale * stored_times);
      }
      return out;
    });
  }
}

/// out[row] = in[position[row]], or `none` for a row without a position (not scored).
__global__ void by_position_kernel(const float* in, const int* position, index_t rows, float none, float* out) {
  for_each_index(rows, [&](index_t row) { out[row] = position[row] >= 0 ? in[position[row]] : none; });
}

}  // namespace tlse::impl::cuda
#endif
