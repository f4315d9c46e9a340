#pragma once
// The training step on the Hopper kernels (plan: hopper/step_plan.hpp): cross-entropy's row LSEs
// and gradients in 3 products instead of the 4 of a forward and the fused backward. Per chunk of
// rows, in order:
//   1. tlse_hop_lse_forward sweeps the chunk against every column, gives the row LSE states and
//      keeps the exponentials (exp(x - s) by row in the input type: bf16 with s the row's target
//      logit where the row's logits lie within 64 above it, else a max per row and part of a
//      tile; fp16 with s a multiple of ln 2 per row and part, tlse_hopper.h);
//   2. exponentials_to_gradient_kernel merges each row's states into its LSE. Without a softcap,
//      G = scale * dL/dx is diag(c) E' with E' the exponentials but for the target's entry: the
//      kernel writes that entry, c, and the chunk's rows times c (A'), and touches the other
//      exponentials only in a row with a part under its own max (bf16), or rescales every part
//      by a power of two (fp16). With a softcap it turns the exponentials into G in place;
//   3. dA_chunk = G B = diag(c) (E' B) (tlse_hop_product, c its row scale): complete, written to
//      the chunk's gradient rows;
//   4. dB (+)= G^T A_chunk = E'^T A': written, or summed over the chunks in an fp32 accumulator.
// Under a budget that holds no chunk, the same kernels keep the exponentials of a part of the
// columns in the caller's dB, and past it in the workspace, instead (run_kept_columns). Fixed
// order, fixed-order sums, no atomics: bitwise reproducible. No gradient filtering (every entry of
// G is computed anyway) and the columns in their stored order.
// fp16, as in the fused backward (hopper/backward.hpp): entries like p / N fall below its range,
// so G, or A' where G = diag(c) E', is stored times one power of two for the chunk (half of
// row_scale_for of the rows' term bounds, from their LSEs: row_bound_kernel, step_factor_kernel),
// and the products that read it multiply their output by the inverse, exactly. E' itself needs
// none: the kernel puts it at most 2^15 with its fp32 row factor c.
#if defined(TLSE_HAVE_HOPPER)
#include <tlse/backends/cuda/hopper/backward.hpp>
#include <tlse/backends/cuda/hopper/step_plan.hpp>
#include <tlse/impl/step_request.hpp>

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

/// fp16's step: a warp per row p of the chunk (as exponentials_to_gradient_kernel numbers them),
/// bound[p] = |g| + |w|, the bound of the row's |dL/dz| (TermsAt::bound), from its LSE. A row
/// without a target weighs nothing (the kept columns' sweep of every stored row: its
/// coefficients are not set).
__global__ void row_bound_kernel(const float* max, const float* sum, int splits, index_t chunk_rows, index_t first,
                                 const int* id_of, const int* target, const StepCoefficients<float> coef,
                                 float* bound) {
  const index_t p = blockIdx.x;
  const index_t id = id_of ? index_t(id_of[first + p]) : first + p;
  const float l = merged_row_state(max, sum, splits, chunk_rows, p).value();
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
/// (where tail is set) tail + (k - tail_panel) * tail_stride (tlse_hop_forward_args'
/// exponentials_tail).
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

/// A block per row p of the chunk (row id `id[first + p]`, or first + p), after the forward kept
/// its exponentials e = exp(x - s) of the columns below `cols` (in T, where `kept` says; s =
/// shift[p][4 tile + (j mod 8) / 2], tlse_hopper.h), bf16 under the row's shift r =
/// target_logit[first + p] where it could, fp16 under k ln 2 per part.
/// Merges the forward's `splits` states (max[k][p], sum[k][p]) into the row's LSE l (lse[id]),
/// then, with g and w from `coef` (StepCoefficients; g to row_g[id], unless NULL), and dL/dz = g exp(x - l)
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
__global__ void exponentials_to_gradient_kernel(const KeptLayout kept, const float* shift, index_t ld_shift,
                                                const float* max, const float* sum, int splits, index_t chunk_rows,
                                                index_t first, const int* id_of, index_t cols, const int* target,
                                                const float* target_logit, const StepCoefficients<float> coef,
                                                const LogitModel<T, float> model, const float* factor, float* lse,
                                                float* row_g, float* row_scale, const T* rows, T* scaled_rows,
                                                index_t depth) {
  static_assert(std::is_same<T, bfloat16>::value || std::is_same<T, float16>::value,
                "the step keeps its exponentials and G in bf16 or fp16");
  constexpr bool fp16 = std::is_same<T, float16>::value;
  const index_t p = blockIdx.x;
  const index_t id = id_of ? index_t(id_of[first + p]) : first + p;
  const index_t t = index_t(target[id]);
  __shared__ float row_lse, row_max;
  if (threadIdx.x < 32) {
    const LseState<float> s = merged_row_state(max, sum, splits, chunk_rows, p);
    if (threadIdx.x == 0) {
      row_lse = s.value(), row_max = s.max;
      lse[id] = row_lse;
    }
  }
  __syncthreads();
  const float x_t = t >= 0 && t < cols ? target_logit[first + p] : -infinity<float>();
  const float l = row_lse, w = coef.w(target, id), g = coef.g(target, id, l);
  if (row_g && threadIdx.x == 0) row_g[id] = g;
  // fp16: what G (or A' = diag(c) A) is stored times, for its range (step_factor_kernel).
  const float stored_times = fp16 ? factor[0] : 1.f;
  struct alignas(16) Eight {
    T v[8];
  };
  const float* row_shift = shift + p * ld_shift;
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
    bool exact_target = false;  // fp16: the target's entry is exact_entry = +-2^m (below)
    float exact_entry = 0.f;
    if constexpr (fp16) {
      a = 0.f;  // a row of weight 0 (c = 0) keeps its exponentials as they are
      if (g != 0.f && l != -infinity<float>()) {
        // Every part was kept under its own 2^k (keep_row), so each is rescaled by one factor.
        // Where the row's target is among the columns, a = |T| 2^-m with T = p_t - w / g, so that
        // the target's entry T / a = +-2^m is exact: the term that dominates most rows of dA
        // loses nothing to fp16, as in G = scale (g p_t - w) of the fused backward (where w is a
        // power of two and p_t negligible), while each other entry is rounded a second time
        // (e's in the forward, then p / a). m puts |E'| at most 2^15 (p <= 1 over a >= 2^-15).
        // Elsewhere (no target entry, or T too small for fp16's normal range) on the grid of the
        // forward's shifts: E' = 2^(x log2 e - k_r) exactly, with k_r putting E' at most
        // 2^(15 - h) and a written target's entry T / a within 2^15 (2^h >= 1 + |w / g|).
        // The exponents are formed as fma(-l, log2 e, k), with the forward's log2 e and one
        // rounding, since l log2 e alone carries float's error of l (1e-3 at l = 1e4).
        const float term = x_t != -infinity<float>() ? (g * expm1f(x_t - l) + (g - w)) / g : 0.f;  // T
        int e = 0;
        if (term != 0.f) frexpf(fabsf(term), &e);  // |T| in [2^(e-1), 2^e)
        const int m = e + 14 < 15 ? e + 14 : 15;
        exact_target = term != 0.f && m >= -14;
        float k_r = 0.f;
        if (exact_target) {
          a = ldexpf(fabsf(term), -m);
          exact_entry = copysignf(ldexpf(1.f, m), term);
        } else {
          int h = 0;
          frexpf(1.f + fabsf(w / g), &h);
          k_r = ceilf(l * LOG2E_F) - float(TLSE_HOP_FP16_HEADROOM - h);
          a = exp2f(fmaf(-l, LOG2E_F, k_r));
        }
        // Each part's e to E', one factor per part: 2^(k_part - k_r) on the grid (exact), else p / (e a).
        const auto by = [&](float shift) {
          const float k_part = rintf(shift * LOG2E_F);  // an integer (keep_row)
          return shift == -infinity<float>() ? 0.f
                 : exact_target              ? exp2f(fmaf(-l, LOG2E_F, k_part)) / a
                                             : ldexpf(1.f, int(k_part - k_r));
        };
        each_eight(
            [&](float4 s) {
              return float4{by(s.x), by(s.y), by(s.z), by(s.w)};
            },
            [&](const Eight& in, const float(&factors)[4], index_t) {
              Eight out;
#pragma unroll
              for (int k = 0; k < 8; ++k) out.v[k] = from_acc<T>(to_acc<float>(in.v[k]) * factors[k / 2]);
              return out;
            });
      }
    } else {
      // The shift every part of the row is under, as the forward chose it (begin_row, keep_row).
      const float r0 = target_logit[first + p] < infinity<float>() ? target_logit[first + p] : -infinity<float>();
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
      row_scale[p] = c;
      if (c != 0.f && x_t != -infinity<float>())
        *kept.at<T>(p, t) = from_acc<T>(exact_target ? exact_entry : (g * expm1f(x_t - l) + (g - w)) / (g * a));
    }
    if (scaled_rows) {  // 16 bytes at a time (depth is a multiple of 8, the rows 16-byte aligned)
      const Eight* in = reinterpret_cast<const Eight*>(rows + p * depth);
      Eight* out = reinterpret_cast<Eight*>(scaled_rows + p * depth);
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

struct LseStepHopper {
  /// Whether the step takes inputs of type T: bf16 or fp16.
  template <class T>
  static constexpr bool takes = std::is_same<T, bfloat16>::value || std::is_same<T, float16>::value;
  /// Whether G (and A') are stored times a factor: fp16, as in the fused backward.
  template <class T>
  static constexpr bool scaled = LseBackwardHopper::scaled<T>;

  /// The workspace of the step for a shape, 0 when the step does not take it (takes<T>; depth a
  /// multiple of 8): chunks of rows (StepPlan) when the budget holds one, else, for a call that
  /// does not add into its gradients, the kept columns (KeptColumnsPlan).
  template <class T>
  static std::size_t scratch_bytes(int device, const BackwardShape& s) {
    if (!takes<T> || s.depth % 8 != 0) return 0;
    const int sms = multiprocessors(device);
    const StepPlan chunks = StepPlan::make(s.rows, s.cols, s.depth, s.memory_budget, sms);
    if (chunks.fits) return chunks.bytes;
    if (s.accumulate) return 0;
    const KeptColumnsPlan kept = KeptColumnsPlan::make(s.rows, s.cols, s.depth, s.memory_budget, sms);
    return kept.fits ? kept.bytes : 0;
  }

  /// Runs the step on `stream`; false when it does not qualify (the forward and backward then run).
  template <class T>
  static bool run(cudaStream_t stream, int device, const StepRequest<T, float>& r) {
    static_assert(takes<T>, "the step takes bf16 or fp16");
    const TileProblem<T, float>& prob = r.prob;
    const index_t R = prob.rows.count, V = prob.cols.count, D = prob.depth;
    if (r.scratch == nullptr || r.target_logit == nullptr || R <= 0 || prob.cols.index != nullptr || D % 8 != 0 ||
        reinterpret_cast<std::uintptr_t>(prob.rows.data) % 16 != 0 ||
        reinterpret_cast<std::uintptr_t>(prob.cols.data) % 16 != 0)
      return false;
    const StepPlan plan = StepPlan::make(R, V, D, r.scratch_bytes, multiprocessors(device));
    if (plan.fits) return run_chunks(stream, plan, r);
    return run_kept_columns(stream, device, r);
  }

 private:
  /// Per chunk of rows: the steps at the top of this file.
  template <class T>
  static bool run_chunks(cudaStream_t stream, const StepPlan& plan, const StepRequest<T, float>& r) {
    const TileProblem<T, float>& prob = r.prob;
    const index_t R = prob.rows.count, V = prob.cols.count, D = prob.depth;
    WorkspaceCarver carver(aligned_base(r.scratch));
    const StepPlan::Buffers buf = plan.carve(carver);
    const KeptLayout kept{buf.exponentials, plan.ld_exponentials};  // every chunk's, in turn
    const bool several = plan.chunks() > 1;
    // Without a softcap dL/dz is the exponential's multiple: G = diag(c) E' (the kernel's comment).
    const bool factored = !(prob.logit.softcap > 0.f);
    const int* row_index = prob.rows.index;

    for (index_t first = 0; first < R; first += plan.chunk) {
      const index_t rows = std::min(plan.chunk, R - first);
      // The chunk's rows, contiguous: in place, or gathered through the index of scored rows.
      const T* chunk = prob.rows.data + first * D;
      if (row_index) {
        gather_rows_kernel<T><<<grid_for(rows * D / 8), 256, 0, stream>>>(prob.rows.data, row_index + first, rows, D,
                                                                          reinterpret_cast<T*>(buf.chunk_rows));
        check_launch("gather_rows_kernel");
        chunk = reinterpret_cast<const T*>(buf.chunk_rows);
      }
      // The row shift: a logit of the row, at most its LSE.
      const tlse_hop_forward_args f =
          forward_keeping(stream, prob, chunk, rows, kept, 0, buf.shifts, r.target_logit + first, buf.partials);
      if constexpr (scaled<T>) step_factor(stream, f, rows, first, row_index, r, buf.row_scale, buf.factor);

      const auto to_gradient =
          factored ? &exponentials_to_gradient_kernel<T, true> : &exponentials_to_gradient_kernel<T, false>;
      T* scaled_rows = factored && r.grad_cols ? reinterpret_cast<T*>(buf.chunk_rows) : nullptr;
      to_gradient<<<unsigned(rows), 256, 0, stream>>>(kept, buf.shifts, plan.ld_shifts(), f.row_max, f.row_sum,
                                                      int(f.col_splits), rows, first, row_index, V, r.target,
                                                      r.target_logit, r.coef, prob.logit, buf.factor, r.lse,
                                                      nullptr, buf.row_scale, chunk, scaled_rows, D);
      check_launch("exponentials_to_gradient_kernel");

      if (r.grad_rows) {  // dA_chunk = G B: diag(c) (E' B) exactly, or G B with G stored times the factor
        tlse_hop_product_args p =
            exponentials_product<T>(buf.exponentials, plan.ldg(), D, buf.k_partials, plan.k_partial_floats(),
                                    plan.k_splits_rows, factored ? nullptr : buf.factor);
        p.row_scale = factored ? buf.row_scale : nullptr;
        p.b = prob.cols.data, p.ldb = D, p.b_transposed = 1;
        p.M = rows, p.N = D, p.K = V;
        p.out = row_index ? static_cast<void*>(r.grad_rows) : static_cast<void*>(r.grad_rows + first * D);
        p.out_index = row_index ? row_index + first : nullptr;
        p.accumulate = r.accumulate;
        check_hopper(tlse_hop_product(&p, stream), "tlse_hop_product (rows)");
      }
      if (r.grad_cols) {  // dB (+)= G^T A_chunk = E'^T A': G or A' times the factor
        tlse_hop_product_args p = exponentials_product<T>(buf.exponentials, plan.ldg(), D, buf.k_partials,
                                                          plan.k_partial_floats(), plan.k_splits_cols, buf.factor);
        p.a_transposed = 1;
        p.b = scaled_rows ? scaled_rows : chunk, p.ldb = D, p.b_transposed = 1;
        p.M = V, p.N = D, p.K = rows;
        if (several) {
          p.out_f32 = buf.acc;
          p.accumulate = first > 0;
        } else {
          p.out = r.grad_cols;
          p.accumulate = r.accumulate;
        }
        check_hopper(tlse_hop_product(&p, stream), "tlse_hop_product (columns)");
      }
    }
    if (r.grad_cols && several) finish_rows(stream, buf.acc, V, D, nullptr, r.grad_cols, r.accumulate);
    return true;
  }

  /// Under a budget that holds no chunk of rows (KeptColumnsPlan): dA and dB wanted and written,
  /// not added into, since their storage holds A' and the kept exponentials until their values go
  /// there. Every stored row is swept (the exponentials' rows are A's, as dA's storage holds
  /// them); where some are not scored (a row index) those have no target and weigh nothing (g = c
  /// = 0: their rows of G, A' and dA are 0), and the target logits go by row:
  ///   1. the forward over every column, keeping the exponentials of the first `kept` columns in
  ///      panels in dB's storage, each past dB's rows of the panels up to its own, and those past
  ///      what dB's storage holds in the workspace's tail;
  ///   2. exponentials_to_gradient_kernel over those columns (the row LSEs, g, c, and A' in dA's
  ///      storage);
  ///   3. acc = the sum over the kept panels k of diag(c) E_k' B_k (or G_k B_k), in one product
  ///      over the panels in dB's storage and one over the tail's; then per kept panel, in order,
  ///      dB_k = E_k'^T A' (or G_k^T A under a softcap) into dB's rows of the panel;
  ///   4. the fused backward's column panels from `kept` on (the recomputed G overwrites nothing
  ///      of the exponentials', dB's rows past `kept` do, no longer read), adding into acc; then
  ///      dA = acc.
  template <class T>
  static bool run_kept_columns(cudaStream_t stream, int device, const StepRequest<T, float>& r) {
    const TileProblem<T, float>& prob = r.prob;
    const index_t V = prob.cols.count, D = prob.depth;
    tlse_hop_side row_side{};  // every stored row; outputs by position
    if (r.grad_rows == nullptr || r.grad_cols == nullptr || r.accumulate ||
        !hopper_side(prob.rows, D, true, row_side) || reinterpret_cast<std::uintptr_t>(r.grad_rows) % 16 != 0 ||
        reinterpret_cast<std::uintptr_t>(r.grad_cols) % 16 != 0)
      return false;
    const index_t R = row_side.count;
    const KeptColumnsPlan plan = KeptColumnsPlan::make(R, V, D, r.scratch_bytes, multiprocessors(device));
    if (!plan.fits) return false;
    WorkspaceCarver carver(aligned_base(r.scratch));
    const KeptColumnsPlan::Buffers buf = plan.carve(carver);
    void* const tail = plan.tail_panels() > 0 ? buf.tail : nullptr;  // the panels past dB's storage
    const KeptLayout kept{r.grad_cols + plan.exponentials_offset(),
                          plan.ld_exponentials(),
                          plan.panel,
                          plan.panel_stride(),
                          tail,
                          plan.panels_in_gradient,
                          plan.tail_stride()};
    const bool factored = !(prob.logit.softcap > 0.f);
    const T* rows = prob.rows.data;
    const float* target_logit = r.target_logit;  // by row
    if (row_side.position) {
      by_position_kernel<<<grid_for(R), 256, 0, stream>>>(r.target_logit, row_side.position, R, -infinity<float>(),
                                                          buf.row_target_logit);
      check_launch("by_position_kernel");
      target_logit = buf.row_target_logit;
    }

    const tlse_hop_forward_args f =
        forward_keeping(stream, prob, rows, R, kept, plan.kept, buf.shifts, target_logit, buf.partials);
    // fp16: one factor serves the kept panels and the fused backward's (its G at most 2^13).
    float* const factor = buf.panels.factor;
    if constexpr (scaled<T>) step_factor(stream, f, R, 0, nullptr, r, buf.row_scale, factor);

    const auto to_gradient =
        factored ? &exponentials_to_gradient_kernel<T, true> : &exponentials_to_gradient_kernel<T, false>;
    T* scaled_rows = factored ? r.grad_rows : nullptr;
    to_gradient<<<unsigned(R), 256, 0, stream>>>(
        kept, buf.shifts, plan.ld_shifts(), f.row_max, f.row_sum, int(f.col_splits), R, 0, nullptr, plan.kept, r.target,
        target_logit, r.coef, prob.logit, factor, r.lse, buf.g, buf.row_scale, rows, scaled_rows, D);
    check_launch("exponentials_to_gradient_kernel");

    // acc (+)= the sum over the panels of G_k B_k: one product over the panels in dB's storage and
    // one over those in the tail, K running through the panels (tlse_hop_product_args::a_panel),
    // before any dB_k overwrites a panel. One product per panel, each adding into acc (read and
    // written once a panel), left the step at N=8192 in 1.5 GiB (15 panels) behind one chunk of
    // every row, though its kernels alone took less: under the power cap the accumulator's traffic
    // costs energy (docs/notes/2026-11-29.md, "The kept panels' accumulator in one product").
    const auto rows_product = [&](index_t first_panel, index_t panels, index_t panel_stride) {
      if (panels == 0) return;
      tlse_hop_product_args p =
          exponentials_product<T>(kept.panel_data<T>(first_panel), kept.ld, D, buf.k_partials, plan.k_partial_floats(),
                                  plan.k_splits_rows, factored ? nullptr : factor);
      p.a_panel = plan.panel, p.a_panel_stride = panel_stride;
      p.row_scale = factored ? buf.row_scale : nullptr;
      p.b = prob.cols.data + first_panel * plan.panel * D, p.ldb = D, p.b_transposed = 1;
      p.M = R, p.N = D, p.K = panels * plan.panel;
      p.out_f32 = buf.panels.acc;
      p.accumulate = first_panel > 0;
      check_hopper(tlse_hop_product(&p, stream), "tlse_hop_product (rows, the kept panels)");
    };
    rows_product(0, plan.panels_in_gradient, plan.panel_stride());
    rows_product(plan.panels_in_gradient, plan.tail_panels(), plan.tail_stride());
    for (index_t k = 0; k < plan.kept_panels(); ++k) {
      tlse_hop_product_args p = exponentials_product<T>(kept.panel_data<T>(k), kept.ld, D, buf.k_partials,
                                                        plan.k_partial_floats(), plan.k_splits_cols, factor);
      p.a_transposed = 1;  // dB_k = G_k^T A
      p.b = scaled_rows ? scaled_rows : rows, p.ldb = D, p.b_transposed = 1;
      p.M = plan.panel, p.N = D, p.K = R;
      p.out = r.grad_cols + k * plan.panel * D;
      check_hopper(tlse_hop_product(&p, stream), "tlse_hop_product (a kept panel)");
    }

    BackwardRequest<T, float> b;
    b.prob = prob;
    b.row_terms = {r.lse, buf.g, r.target, r.coef.target};
    b.grad_rows = r.grad_rows;
    b.grad_cols = r.grad_cols;
    LseBackwardHopper::column_panels<T>(stream, b, row_side, plan.panels, buf.panels, plan.kept);
    finish_rows(stream, buf.panels.acc, R, D, nullptr, r.grad_rows, false);
    return true;
  }

  /// The forward sweep of `count` rows (from `rows`) against every column of prob, keeping the
  /// exponentials of the columns below kept_cols (0: all) where `kept` says, under the rows'
  /// shifts row_shift (the shifts per part to `shifts`), the row LSE states to `partials`
  /// (MAX_SWEEP_SPLITS x 2 x count); returns its arguments (row_max, row_sum, col_splits).
  template <class T>
  static tlse_hop_forward_args forward_keeping(cudaStream_t stream, const TileProblem<T, float>& prob, const T* rows,
                                               index_t count, const KeptLayout& kept, index_t kept_cols, float* shifts,
                                               const float* row_shift, float* partials) {
    static_assert(StepPlan::MAX_SWEEP_SPLITS == KeptColumnsPlan::MAX_SWEEP_SPLITS, "one size of partials");
    const index_t D = prob.depth;
    tlse_hop_forward_args f{};
    f.dtype = hopper_dtype<T>(false);
    f.rows = tlse_hop_side{rows, D, count, nullptr, nullptr, 0};
    f.cols = tlse_hop_side{prob.cols.data, D, prob.cols.count, nullptr, nullptr, 0};
    f.depth = D;
    f.logit = hopper_logit(prob.logit);
    f.row_max = f.row_sum = partials;
    f.exponentials = kept.data, f.ld_exponentials = kept.ld, f.exponentials_shift = shifts;
    f.exponentials_row_shift = scaled<T> ? nullptr : row_shift;  // fp16: every part under its own (tlse_hopper.h)
    f.exponentials_cols = kept_cols;
    f.exponentials_panel = kept.panel, f.exponentials_panel_stride = kept.panel_stride;
    f.exponentials_tail = kept.tail, f.exponentials_tail_panel = kept.tail_panel;
    f.max_col_splits = StepPlan::MAX_SWEEP_SPLITS, f.max_row_groups = 1;
    check_hopper(tlse_hop_lse_forward_plan(&f), "tlse_hop_lse_forward_plan");
    f.row_sum = partials + f.col_splits * count;
    check_hopper(tlse_hop_lse_forward(&f, stream), "tlse_hop_lse_forward (exponentials kept)");
    return f;
  }

  /// fp16: the chunk's (or every row's) factor for G and A' (step_factor_kernel), from the row
  /// bounds (in `bound`, which exponentials_to_gradient_kernel overwrites with c).
  template <class T>
  static void step_factor(cudaStream_t stream, const tlse_hop_forward_args& f, index_t rows, index_t first,
                          const int* row_index, const StepRequest<T, float>& r, float* bound, float* factor) {
    row_bound_kernel<<<unsigned(rows), 32, 0, stream>>>(f.row_max, f.row_sum, int(f.col_splits), rows, first, row_index,
                                                        r.target, r.coef, bound);
    check_launch("row_bound_kernel");
    step_factor_kernel<<<1, 1024, 0, stream>>>(bound, rows, r.prob.logit.scale, factor);
    check_launch("step_factor_kernel");
  }

  /// The arguments a product of kept exponentials (or G) as operand A shares: a with its leading
  /// dimension, the output's, the K splits and their partials, and fp16's out_factor (the
  /// inverse of what G or A' is stored times; NULL where the product takes neither).
  template <class T>
  static tlse_hop_product_args exponentials_product(const void* a, index_t lda, index_t depth, float* partials,
                                                    std::int64_t partial_floats, int k_splits, const float* factor) {
    tlse_hop_product_args p{};
    p.dtype = hopper_dtype<T>(false);
    p.out_factor = scaled<T> && factor ? factor + 1 : nullptr;
    p.a = a, p.lda = lda;
    p.ldo = depth;
    p.workspace = partials;
    p.workspace_bytes = std::size_t(partial_floats) * sizeof(float);
    p.max_k_splits = k_splits;
    return p;
  }
};

}  // namespace tlse::impl::cuda
#endif
