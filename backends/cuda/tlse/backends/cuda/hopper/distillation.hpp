#pragma once
// The distillation's tile pairs (distillation_tiles.hpp) on the Hopper kernels, for bf16. The
// vocabulary goes in panels of P columns (a multiple of 256, as many as the call's scratch holds
// beside the gradient accumulators), each in order:
//   1. tlse_hop_product writes both heads' dot products of every stored row with the panel's
//      classes, in fp32: Zs = Hs Ws_panel^T and Zt = Ht Wt_panel^T (8 P bytes a row);
//   2. a block per row works along its entries: the forward of the KLs folds them into the row's
//      running LSE states of both heads (and the cross-entropy's), the tracked one also summing
//      its weights times the log-ratio (forward KL: sum_j e^(b_j - m_t) (b_j - a_j) with b the
//      teacher's and a the student's logits), so that one sweep gives the LSEs and
//      KL = sum / S_t - lse_t + lse_s; the JSD's forward, whose terms need both LSEs first, adds
//      its terms (the DivergenceModel) after the LSE sweeps, from the saved LSEs; the backward
//      turns each pair into dL/dx of both heads (PairGradient), rounded to bf16 and stored in
//      place, G's row over the first half of Z's row;
//   3. the backward's products: dWs_panel = Gs^T Hs (complete, rounded to bf16 once) and
//      acc_s += Gs Ws_panel (fp32, every row x D_s); the teacher's likewise where wanted. Then
//      dHs = acc_s (+ dHs with accumulate).
// The training step (DistillationHopper::step) runs the forward's sweep and then the backward's,
// the first writing the teacher's dot products of its first panels where they stay until the
// second reads them (DistillationPanels::for_step): the teacher's product of those columns runs
// once, not twice.
// The logits are the tensor cores' fp32 sums of bf16 products (the generic tiles sum in another
// order) and G is rounded to bf16 before its products, as the cross-entropy's backward rounds
// its G. Fixed order throughout (panels in turn, the blocks' sums a fixed tree): bitwise
// reproducible. Rows without a position (ignored tokens) are swept with the rest and skipped.
// The request types come from distillation_tiles.hpp, which includes this header through the
// backend registry, so that everything here is a template of them.
#if defined(TLSE_HAVE_HOPPER)
#include <tlse_hopper.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <tlse/backends/cuda/grid_stride.hpp>
#include <tlse/backends/cuda/hopper/backward.hpp>
#include <tlse/backends/cuda/hopper/forward.hpp>
#include <tlse/distillation_options.hpp>
#include <tlse/impl/backend_dispatch.hpp>
#include <tlse/impl/workspace_carver.hpp>
#include <type_traits>
#include <utility>

namespace tlse::impl::cuda {

/// The panels a scratch holds: P columns of both heads' fp32 dot products for every stored row,
/// beside the fp32 row-gradient accumulators of the heads whose dH is wanted; in a training step
/// also the teacher's dot products of its first panels, kept from the forward's sweep for the
/// backward's: the first `in_gradient` in dWs's storage (16-bit elements, the caller's, which the
/// backward writes only after reading them: panel k at P D_s + k stride elements, stride = P
/// max(2 rows, D_s), past dWs's rows of panels 0..k), the next `in_scratch` in the scratch. Where
/// one is in the scratch the step may take its place as the teacher's working panel
/// (`zt_in_kept`): the forward sweeps the panels it does not keep before the kept ones, which
/// fill it last, and the backward sweeps them after the kept ones, which free it first.
struct DistillationPanels {
  static constexpr index_t STEP = 256;  // the Hopper tiles' width
  /// The step's panel widths, from which it takes the one keeping the most columns: narrower
  /// panels keep more of them, but below the minimum (or a quarter of a smaller vocabulary) the dW
  /// products of a panel (panel x D outputs over every row) leave most of their last wave of
  /// tiles idle.
  static constexpr index_t STEP_PANEL_MIN = 6144, STEP_PANEL_MAX = 8192;
  index_t panel = 0;  // P; 0: the scratch holds no panel
  index_t rows = 0, acc_s = 0, acc_t = 0;
  index_t depth_s = 0, in_gradient = 0, in_scratch = 0;  // the step's kept panels
  bool zt_in_kept = false;

  struct Buffers {
    float *zs, *zt, *acc_s, *acc_t;
    float* kept;              // in_scratch panels of rows x P (the first also zt where zt_in_kept)
    std::uint16_t* gradient;  // dWs's storage, where in_gradient > 0
  };

  /// The widest panel within `bytes` for `rows` rows (no wider than the vocabulary, rounded up
  /// to STEP), with acc_s and acc_t floats of accumulators.
  static DistillationPanels within(std::size_t bytes, index_t rows, index_t cols, index_t acc_s, index_t acc_t) {
    DistillationPanels p;
    p.rows = rows, p.acc_s = acc_s, p.acc_t = acc_t;
    // Each array may start up to an alignment past the last one's end, the base as much.
    const std::size_t fixed = 8 * WorkspaceCarver::alignment + sizeof(float) * std::size_t(acc_s + acc_t);
    if (rows <= 0 || bytes <= fixed) return p;
    const index_t fit = index_t((bytes - fixed) / (2 * sizeof(float) * std::size_t(rows))) / STEP * STEP;
    p.panel = std::min(fit, (cols + STEP - 1) / STEP * STEP);
    return p;
  }

  /// A training step's panels within `bytes`: of the widths `within` allows (its widest, and
  /// STEP_PANEL_MIN, or a quarter of the vocabulary where less, to STEP_PANEL_MAX), the one whose
  /// kept panels cover the most columns (the wider on a tie); dWs's storage (depth_s columns)
  /// holds some where `gradient_storage`.
  static DistillationPanels for_step(std::size_t bytes, index_t rows, index_t cols, index_t depth_s, index_t acc_s,
                                     index_t acc_t, bool gradient_storage) {
    DistillationPanels best = within(bytes, rows, cols, acc_s, acc_t);
    if (best.panel == 0) return best;
    const index_t widest = best.panel;
    const auto keeping = [&](index_t width, bool zt_in_kept) {
      DistillationPanels p = best;
      p.panel = width, p.depth_s = depth_s, p.in_gradient = p.in_scratch = 0, p.zt_in_kept = zt_in_kept;
      const index_t count = (cols + width - 1) / width;
      if (gradient_storage && width < cols)
        p.in_gradient = std::min(count, (cols - width) * depth_s / (width * std::max(2 * rows, depth_s)));
      const std::size_t one = sizeof(float) * std::size_t(rows) * std::size_t(width);
      const std::size_t used = p.bytes() + WorkspaceCarver::alignment;
      p.in_scratch = used < bytes ? std::min(count - p.in_gradient, index_t((bytes - used) / one)) : 0;
      if (zt_in_kept && p.in_scratch == 0) p.in_gradient = 0;  // no such layout: keeps nothing
      return p;
    };
    best = keeping(widest, false);
    const index_t narrowest = std::min(STEP_PANEL_MIN, std::max(STEP, (cols / 4 + STEP - 1) / STEP * STEP));
    for (index_t width = narrowest; width <= std::min(STEP_PANEL_MAX, widest); width += STEP)
      for (bool zt_in_kept : {false, true}) {
        const DistillationPanels p = keeping(width, zt_in_kept);
        if (p.kept_columns(cols) >= best.kept_columns(cols) && p.kept_columns(cols) > 0) best = p;
      }
    return best;
  }

  index_t kept_panels() const { return in_gradient + in_scratch; }
  index_t kept_columns(index_t cols) const { return std::min(cols, kept_panels() * panel); }
  /// Where kept panel k lies (nullptr: panel k is not kept).
  float* kept_panel(const Buffers& b, index_t k) const {
    if (k < in_gradient)
      return reinterpret_cast<float*>(b.gradient + panel * depth_s + k * panel * std::max(2 * rows, depth_s));
    if (k < kept_panels()) return b.kept + (k - in_gradient) * rows * panel;
    return nullptr;
  }

  Buffers carve(WorkspaceCarver& c) const {
    Buffers b;
    b.zs = c.take<float>(rows * panel);
    b.zt = c.take<float>(zt_in_kept ? 0 : rows * panel);
    b.acc_s = c.take<float>(acc_s);
    b.acc_t = c.take<float>(acc_t);
    b.kept = c.take<float>(in_scratch * rows * panel);
    if (zt_in_kept) b.zt = b.kept;
    b.gradient = nullptr;
    return b;
  }
  std::size_t bytes() const {
    WorkspaceCarver c;
    carve(c);
    return c.bytes();
  }
};

/// Thread 0's sum of every thread's v (blocks of a multiple of 32 threads, at most 1024), in a
/// fixed order: the warps' shuffle trees, then the warps in turn.
__device__ inline float block_sum(float v, float* warp_sums) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = v;
  __syncthreads();
  float s = 0.f;
  if (threadIdx.x == 0)
    for (unsigned w = 0; w < blockDim.x / 32; ++w) s += warp_sums[w];
  __syncthreads();
  return s;
}

/// A running LSE state (max m, sum s of e^(x - m)) with a tracked sum a of e^(x - m) y, merged
/// and rescaled alike; an entry of weight 0 adds 0 to a whatever y (0 log 0 = 0).
struct TrackedLse {
  float m, s, a;  // no initializers: a __shared__ array holds them

  __device__ static TrackedLse none() { return TrackedLse{-INFINITY, 0.f, 0.f}; }

  __device__ void add(float x, float y) {
    if (x == -INFINITY) return;
    if (x > m) {
      const float r = expf(m - x);
      s = s * r + 1.f, a = (r == 0.f ? 0.f : a * r) + y, m = x;
    } else {
      const float p = expf(x - m);
      s += p;
      a += p == 0.f ? 0.f : p * y;
    }
  }
  __device__ void merge(const TrackedLse& o) {
    if (o.m == -INFINITY) return;
    if (m == -INFINITY) {
      *this = o;
      return;
    }
    const float top = fmaxf(m, o.m), r = expf(m - top), ro = expf(o.m - top);
    s = s * r + o.s * ro;
    a = (r == 0.f ? 0.f : a * r) + (ro == 0.f ? 0.f : o.a * ro);
    m = top;
  }
  __device__ float lse() const { return m == -INFINITY ? m : m + logf(s); }
  /// Thread 0's merge of every thread's state (as block_sum: the warps' trees, then the warps).
  __device__ TrackedLse block_merge(TrackedLse* warp_states) const {
    TrackedLse v = *this;
    for (int o = 16; o > 0; o >>= 1) {
      TrackedLse other;
      other.m = __shfl_xor_sync(0xffffffffu, v.m, o);
      other.s = __shfl_xor_sync(0xffffffffu, v.s, o);
      other.a = __shfl_xor_sync(0xffffffffu, v.a, o);
      v.merge(other);
    }
    if (threadIdx.x % 32 == 0) warp_states[threadIdx.x / 32] = v;
    __syncthreads();
    TrackedLse all = none();
    if (threadIdx.x == 0)
      for (unsigned w = 0; w < blockDim.x / 32; ++w) all.merge(warp_states[w]);
    __syncthreads();
    return all;
  }
};

/// The running states of a row in the forward's one sweep (TrackedLse): the student's, the
/// teacher's, the cross-entropy's (scale 1).
struct PairRowStates {
  TrackedLse s, t, ce;
};

/// Calls f(j, zs[j], zt[j]) for this thread's entries j < width of a row (zs and zt 16-byte
/// aligned): four neighbours at a time through float4 loads (four times the bytes in flight of
/// one float each: the sweeps are bound by the loads), then the tail.
template <class F>
__device__ inline void for_row_entries(const float* zs, const float* zt, index_t width, F&& f) {
  const index_t quads = width / 4;
  const auto* s4 = reinterpret_cast<const float4*>(zs);
  const auto* t4 = reinterpret_cast<const float4*>(zt);
  for (index_t q = threadIdx.x; q < quads; q += blockDim.x) {
    const float4 a = s4[q], b = t4[q];
    f(4 * q, a.x, b.x), f(4 * q + 1, a.y, b.y), f(4 * q + 2, a.z, b.z), f(4 * q + 3, a.w, b.w);
  }
  for (index_t j = 4 * quads + threadIdx.x; j < width; j += blockDim.x) f(j, zs[j], zt[j]);
}

/// Whether stored row r is scored: every row, or the rows with a position.
template <class Side>
__device__ inline bool scored_row(const Side& rows, index_t r) {
  return rows.index == nullptr || rows.position[r] >= 0;
}

/// Forward: term_s[r], term_t[r] (+)= the divergence's sums over the panel's columns [first,
/// first + width) of each scored stored row r, from its dot products (zs, zt: ld apart).
template <class Problem>
__global__ void pair_terms_kernel(Problem pp, const float* zs, const float* zt, index_t ld, index_t rows, index_t first,
                                  index_t width, float* term_s, float* term_t, bool add) {
  __shared__ float warp_sums[32];
  for (index_t r = blockIdx.x; r < rows; r += gridDim.x) {
    if (!scored_row(pp.student.rows, r)) continue;
    float ts = 0.f, tt = 0.f;
    for_row_entries(zs + r * ld, zt + r * ld, width, [&](index_t j, float dot_s, float dot_t) {
      float ls, lt;
      pp.log_probs(dot_s, dot_t, r, first + j, ls, lt);
      pp.model.add_terms(ls, lt, ts, tt);
    });
    ts = block_sum(ts, warp_sums);
    tt = block_sum(tt, warp_sums);
    if (threadIdx.x == 0) {
      term_s[r] = add ? term_s[r] + ts : ts;
      term_t[r] = add ? term_t[r] + tt : tt;
    }
  }
}

/// The KLs' forward in one sweep: folds the panel's columns [first, first + width) into each
/// scored stored row's running states (states[r], written by the sweep's first panel) and, after
/// its last, stores the row's statistics (Request::store). forward: the teacher's state tracks
/// b - a (the forward KL), else the student's tracks a - b (the reverse KL).
template <class Request>
__global__ void pair_statistics_kernel(Request req, const float* zs, const float* zt, index_t ld, index_t rows,
                                       index_t first, index_t width, PairRowStates* states, bool forward,
                                       bool first_panel, bool last_panel) {
  __shared__ TrackedLse warp_states[32];
  const float scale_s = req.pp.student.logit.scale, scale_t = req.pp.teacher.logit.scale;
  for (index_t r = blockIdx.x; r < rows; r += gridDim.x) {
    if (!scored_row(req.pp.student.rows, r)) continue;
    PairRowStates mine{TrackedLse::none(), TrackedLse::none(), TrackedLse::none()};
    for_row_entries(zs + r * ld, zt + r * ld, width, [&](index_t, float dot_s, float dot_t) {
      const float a = scale_s * dot_s, b = scale_t * dot_t;
      mine.s.add(a, forward ? 0.f : a - b);
      mine.t.add(b, forward ? b - a : 0.f);
      if (req.ce_own) mine.ce.add(dot_s, 0.f);
    });
    PairRowStates row{TrackedLse::none(), TrackedLse::none(), TrackedLse::none()};
    row.s = mine.s.block_merge(warp_states);
    row.t = mine.t.block_merge(warp_states);
    if (req.ce_own) row.ce = mine.ce.block_merge(warp_states);
    if (threadIdx.x != 0) continue;
    if (!first_panel) {
      PairRowStates before = states[r];
      before.s.merge(row.s), before.t.merge(row.t), before.ce.merge(row.ce);
      row = before;
    }
    if (!last_panel) {
      states[r] = row;
      continue;
    }
    const float lse_s = row.s.lse(), lse_t = row.t.lse();
    const float lse_ce = !req.ce_lse ? 0.f : req.ce_own ? row.ce.lse() : lse_s;
    if (forward)
      Request::store(req.stats, r, lse_s, lse_t, lse_ce, 0.f, row.t.a / row.t.s - lse_t + lse_s);
    else
      Request::store(req.stats, r, lse_s, lse_t, lse_ce, row.s.a / row.s.s - lse_s + lse_t, 0.f);
  }
}

/// Four values of T at out[j], j a multiple of 4 (8-byte aligned): one 8-byte store.
template <class T>
__device__ inline void store_four(T* out, index_t j, const float (&v)[4]) {
  static_assert(sizeof(T) == 2, "four 16-bit values to a store");
  T t[4] = {from_acc<T>(v[0]), from_acc<T>(v[1]), from_acc<T>(v[2]), from_acc<T>(v[3])};
  uint2 packed;
  memcpy(&packed, t, sizeof(packed));
  *reinterpret_cast<uint2*>(out + j) = packed;
}

/// Backward: each stored row's dL/dx of both heads over the panel's columns [first, first +
/// width), from its dot products (zs, zt: ld floats apart, 16-byte aligned rows), stored in T in
/// place (row r's G at the start of its Z row, 2 ld values apart); 0 in the rows not scored. A
/// block walks its row in steps of four entries a thread (float4 loads), reading a step before
/// writing it: the step's values in T cover Z values the block has read.
template <class T, class Gradient>
__global__ void pair_gradient_kernel(Gradient grad, float* zs, float* zt, index_t ld, index_t rows, index_t first,
                                     index_t width, bool want_s, bool want_t) {
  const index_t step = 4 * index_t(blockDim.x);
  for (index_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const bool scored = scored_row(grad.pp.student.rows, r);
    float* zs_row = zs + r * ld;
    float* zt_row = zt + r * ld;
    for (index_t j0 = 0; j0 < width; j0 += step) {
      const index_t j = j0 + 4 * index_t(threadIdx.x);
      const bool whole = j + 4 <= width;
      float ds[4] = {0.f, 0.f, 0.f, 0.f}, dt[4] = {0.f, 0.f, 0.f, 0.f}, dot_s[4], dot_t[4];
      if (whole) {
        const float4 a = *reinterpret_cast<const float4*>(zs_row + j), b = *reinterpret_cast<const float4*>(zt_row + j);
        dot_s[0] = a.x, dot_s[1] = a.y, dot_s[2] = a.z, dot_s[3] = a.w;
        dot_t[0] = b.x, dot_t[1] = b.y, dot_t[2] = b.z, dot_t[3] = b.w;
      } else {
        for (int k = 0; k < 4; ++k)
          dot_s[k] = j + k < width ? zs_row[j + k] : 0.f, dot_t[k] = j + k < width ? zt_row[j + k] : 0.f;
      }
      if (scored)
        for (int k = 0; k < 4; ++k)
          if (j + k < width) grad(dot_s[k], dot_t[k], r, first + j + k, ds[k], dt[k]);
      __syncthreads();
      auto* gs_row = reinterpret_cast<T*>(zs_row);
      auto* gt_row = reinterpret_cast<T*>(zt_row);
      if (whole) {
        if (want_s) store_four(gs_row, j, ds);
        if (want_t) store_four(gt_row, j, dt);
      } else {
        for (int k = 0; k < 4 && j + k < width; ++k) {
          if (want_s) gs_row[j + k] = from_acc<T>(ds[k]);
          if (want_t) gt_row[j + k] = from_acc<T>(dt[k]);
        }
      }
    }
  }
}

struct DistillationHopper {
  template <class T>
  static constexpr bool takes = std::is_same<T, bfloat16>::value;

  /// The scratch a call with this shape carves: its budget, or less where every column fits.
  template <class T>
  static std::size_t scratch_bytes(const DistillationShape& s) {
    if constexpr (!takes<T>) {
      (void)s;
      return 0;
    } else {
      if (s.rows <= 0 || s.cols <= 0 || s.depth_s % 8 != 0 || s.depth_t % 8 != 0) return 0;
      const index_t accs = s.rows * (s.depth_s + s.depth_t);
      DistillationPanels all = DistillationPanels::within(SIZE_MAX / 2, s.rows, s.cols, accs, 0);
      const std::size_t bytes = std::min(s.memory_budget, all.bytes());
      // The student's accumulator and one panel at least (else the generic kernels).
      return DistillationPanels::within(bytes, s.rows, s.cols, s.rows * s.depth_s, 0).panel > 0 ? bytes : 0;
    }
  }

  /// The columns a training step of this shape keeps the teacher's dot products of (0: none, or
  /// the step does not run here).
  template <class T>
  static index_t step_kept_columns(const DistillationStepShape& s) {
    const std::size_t bytes = scratch_bytes<T>(s);
    if (bytes == 0) return 0;
    return step_panels(bytes, s.rows, s.cols, s.depth_s, s.depth_t, s.dHs, s.dHt, s.dWs_storage).kept_columns(s.cols);
  }

  /// The KLs' forward in one sweep (a PairStatisticsRequest); false for the JSD or when the
  /// problem does not qualify.
  template <class Request>
  static bool statistics(cudaStream_t stream, const Request& r) {
    const auto& pp = r.pp;
    using T = std::remove_const_t<std::remove_pointer_t<decltype(pp.student.rows.data)>>;
    using Acc = std::remove_pointer_t<decltype(r.stats)>;
    if constexpr (!takes<T> || !std::is_same<Acc, float>::value) {
      return false;
    } else {
      if (pp.model.divergence == Divergence::jsd || !qualifies(pp)) return false;
      const index_t rows = pp.student.rows.stored, cols = pp.student.cols.count;
      const DistillationPanels panels = DistillationPanels::within(r.scratch_bytes, rows, cols, state_floats(rows), 0);
      if (panels.panel == 0) return false;
      WorkspaceCarver carver(aligned_base(r.scratch));
      forward_sweep(stream, r, panels, panels.carve(carver));
      return true;
    }
  }

  /// The forward's divergence sums (a PairTermsRequest); false when the problem does not qualify.
  template <class Request>
  static bool terms(cudaStream_t stream, const Request& r) {
    const auto& pp = r.pp;
    using T = std::remove_const_t<std::remove_pointer_t<decltype(pp.student.rows.data)>>;
    using Acc = std::remove_pointer_t<decltype(r.term_s)>;
    if constexpr (!takes<T> || !std::is_same<Acc, float>::value) {
      return false;
    } else {
      if (!qualifies(pp)) return false;
      const index_t rows = pp.student.rows.stored;
      const DistillationPanels panels = DistillationPanels::within(r.scratch_bytes, rows, pp.student.cols.count, 0, 0);
      if (panels.panel == 0) return false;
      WorkspaceCarver carver(aligned_base(r.scratch));
      const index_t P = panels.panel;
      sweep(stream, pp, panels, panels.carve(carver), false, false,
            [&](index_t first, index_t width, float* zs, float* zt, bool opens, bool) {
              pair_terms_kernel<<<row_blocks(rows), 256, 0, stream>>>(pp, zs, zt, P, rows, first, width, r.term_s,
                                                                      r.term_t, !opens);
              check_launch("pair_terms_kernel");
            });
      return true;
    }
  }

  /// The backward (a PairBackwardRequest); false when the problem does not qualify.
  template <class Request>
  static bool backward(cudaStream_t stream, const Request& r) {
    if constexpr (!backward_takes<Request>()) {
      return false;
    } else {
      const auto& pp = r.grad.pp;
      if (!qualifies(pp)) return false;
      const index_t rows = pp.student.rows.stored, cols = pp.student.cols.count;
      const index_t ds = pp.student.depth, dt = pp.teacher.depth;
      const DistillationPanels panels =
          DistillationPanels::within(r.scratch_bytes, rows, cols, r.dHs ? rows * ds : 0, r.dHt ? rows * dt : 0);
      if (panels.panel == 0) return false;
      WorkspaceCarver carver(aligned_base(r.scratch));
      backward_sweep(stream, r, panels, panels.carve(carver));
      return true;
    }
  }

  /// The training step (a PairStepRequest): the forward's one sweep, which writes the teacher's
  /// dot products of the first panels where they are kept (DistillationPanels::for_step), then
  /// the backward's, which reads those instead of recomputing them. The products and row kernels
  /// are the two calls', over panels that may be narrower (for more kept columns): the same
  /// results up to rounding, and bitwise reproducible. false for the JSD or when the problem
  /// does not qualify (nothing run).
  template <class Request>
  static bool step(cudaStream_t stream, const Request& r) {
    if constexpr (!backward_takes<std::remove_reference_t<decltype(r.backward)>>()) {
      return false;
    } else {
      const auto& b = r.backward;
      const auto& pp = b.grad.pp;
      if (pp.model.divergence == Divergence::jsd || !qualifies(pp)) return false;
      const index_t rows = pp.student.rows.stored, cols = pp.student.cols.count;
      const bool in_dws = b.dWs && !b.accumulate && reinterpret_cast<std::uintptr_t>(b.dWs) % 16 == 0;
      const DistillationPanels panels = step_panels(r.forward.scratch_bytes, rows, cols, pp.student.depth,
                                                    pp.teacher.depth, b.dHs != nullptr, b.dHt != nullptr, in_dws);
      if (panels.panel == 0) return false;
      WorkspaceCarver carver(aligned_base(r.forward.scratch));
      DistillationPanels::Buffers buf = panels.carve(carver);
      buf.gradient = reinterpret_cast<std::uint16_t*>(b.dWs);
      forward_sweep(stream, r.forward, panels, buf);
      backward_sweep(stream, b, panels, buf);
      return true;
    }
  }

 private:
  static unsigned row_blocks(index_t rows) { return unsigned(std::min<index_t>(rows, 65535)); }

  static index_t state_floats(index_t rows) { return rows * index_t(sizeof(PairRowStates) / sizeof(float)); }

  /// Whether a backward request's types are this path's (bf16 in, bf16 gradients, fp32 sums).
  template <class Request>
  static constexpr bool backward_takes() {
    using T = std::remove_const_t<std::remove_pointer_t<decltype(std::declval<Request&>().grad.pp.student.rows.data)>>;
    using G = std::remove_pointer_t<decltype(std::declval<Request&>().dHs)>;
    using Acc = std::remove_const_t<std::remove_pointer_t<decltype(std::declval<Request&>().grad.pp.stats)>>;
    return takes<T> && std::is_same<G, T>::value && std::is_same<Acc, float>::value;
  }

  /// A step's panels: the forward's row states and the backward's accumulators share a space.
  static DistillationPanels step_panels(std::size_t bytes, index_t rows, index_t cols, index_t ds, index_t dt, bool dHs,
                                        bool dHt, bool dws_storage) {
    return DistillationPanels::for_step(bytes, rows, cols, ds, std::max(dHs ? rows * ds : 0, state_floats(rows)),
                                        dHt ? rows * dt : 0, dws_storage);
  }

  /// For each panel of the vocabulary: both heads' dot products into buf.zs and buf.zt, the
  /// teacher's of a kept panel into where it is kept instead (or, with `reuse`, not computed:
  /// read from there), then pass(first, width, zs, zt, opens, closes) (the sweep's first and last
  /// panel). In order, or with `kept_last` the panels not kept first.
  template <class Pair, class Pass>
  static void sweep(cudaStream_t stream, const Pair& pp, const DistillationPanels& panels,
                    const DistillationPanels::Buffers& buf, bool reuse, bool kept_last, Pass&& pass) {
    const index_t cols = pp.student.cols.count, P = panels.panel;
    const index_t count = (cols + P - 1) / P, kept = kept_last ? std::min(count, panels.kept_panels()) : 0;
    for (index_t i = 0; i < count; ++i) {
      const index_t k = i < count - kept ? kept + i : i - (count - kept);
      const index_t first = k * P, width = std::min(P, cols - first);
      float* kept_here = panels.kept_panel(buf, k);
      float* zt = kept_here ? kept_here : buf.zt;
      logit_panel(stream, pp.student, first, width, buf.zs, P);
      if (!(reuse && kept_here)) logit_panel(stream, pp.teacher, first, width, zt, P);
      pass(first, width, buf.zs, zt, i == 0, i == count - 1);
    }
  }

  /// The KLs' forward sweep (PairStatisticsRequest), the row states in buf.acc_s.
  template <class Request>
  static void forward_sweep(cudaStream_t stream, const Request& r, const DistillationPanels& panels,
                            const DistillationPanels::Buffers& buf) {
    const index_t rows = r.pp.student.rows.stored, P = panels.panel;
    auto* states = reinterpret_cast<PairRowStates*>(buf.acc_s);
    const bool forward = r.pp.model.divergence == Divergence::forward_kl;
    sweep(stream, r.pp, panels, buf, false, panels.zt_in_kept,
          [&](index_t first, index_t width, float* zs, float* zt, bool opens, bool closes) {
            pair_statistics_kernel<<<row_blocks(rows), 256, 0, stream>>>(r, zs, zt, P, rows, first, width, states,
                                                                         forward, opens, closes);
            check_launch("pair_statistics_kernel");
          });
  }

  /// The backward's sweep (PairBackwardRequest): G of both heads in place, their products, dH.
  template <class Request>
  static void backward_sweep(cudaStream_t stream, const Request& r, const DistillationPanels& panels,
                             const DistillationPanels::Buffers& buf) {
    const auto& pp = r.grad.pp;
    using T = std::remove_const_t<std::remove_pointer_t<decltype(pp.student.rows.data)>>;
    const index_t rows = pp.student.rows.stored, P = panels.panel;
    const bool want_s = r.dHs || r.dWs, want_t = r.dHt || r.dWt;
    sweep(stream, pp, panels, buf, true, false, [&](index_t first, index_t width, float* zs, float* zt, bool, bool) {
      pair_gradient_kernel<T>
          <<<row_blocks(rows), 256, 0, stream>>>(r.grad, zs, zt, P, rows, first, width, want_s, want_t);
      check_launch("pair_gradient_kernel");
      if (want_s)
        gradient_products(stream, pp.student, zs, P, first, width, r.dWs, r.dHs ? buf.acc_s : nullptr, r.accumulate);
      if (want_t)
        gradient_products(stream, pp.teacher, zt, P, first, width, r.dWt, r.dHt ? buf.acc_t : nullptr, r.accumulate);
    });
    if (r.dHs) finish_rows(stream, buf.acc_s, rows, pp.student.depth, nullptr, r.dHs, r.accumulate);
    if (r.dHt) finish_rows(stream, buf.acc_t, rows, pp.teacher.depth, nullptr, r.dHt, r.accumulate);
  }

  /// Both heads read in place with TMA under the plain logit model (the distillation's: a scale).
  template <class Pair>
  static bool qualifies(const Pair& pp) {
    for (const auto* p : {&pp.student, &pp.teacher}) {
      const auto& m = p->logit;
      if (p->rows.index != nullptr && p->rows.position == nullptr) return false;
      if (p->cols.index != nullptr || p->cols.count != pp.student.cols.count || p->depth <= 0 || p->depth % 8 != 0)
        return false;
      if (reinterpret_cast<std::uintptr_t>(p->rows.data) % 16 != 0 ||
          reinterpret_cast<std::uintptr_t>(p->cols.data) % 16 != 0)
        return false;
      if (m.col_bias != nullptr || m.softcap != 0 || m.exclude_diagonal || m.valid_cols < p->cols.count) return false;
    }
    return pp.student.rows.stored == pp.teacher.rows.stored;
  }

  /// z[row * ld + j] = the dot product of stored row `row` with column first + j, j < width.
  template <class Problem>
  static void logit_panel(cudaStream_t stream, const Problem& p, index_t first, index_t width, float* z, index_t ld) {
    tlse_hop_product_args a{};
    a.dtype = TLSE_HOP_BF16;
    a.a = p.rows.data, a.lda = p.depth;
    a.b = p.cols.data + first * p.depth, a.ldb = p.depth;  // K-major: the classes' rows
    a.M = p.rows.stored, a.N = width, a.K = p.depth;
    a.out_f32 = z, a.ldo = ld;
    a.max_k_splits = 1;
    check_hopper(tlse_hop_product(&a, stream), "tlse_hop_product (distillation logits)");
  }

  /// A head's products of its panel's G (in T, 2 ld apart): dW_panel = G^T H, written (added with
  /// accumulate) where wanted, and acc (+)= G W_panel where acc is given.
  template <class Problem, class T>
  static void gradient_products(cudaStream_t stream, const Problem& p, const float* z, index_t ld, index_t first,
                                index_t width, T* dW, float* acc, bool accumulate) {
    const index_t depth = p.depth;
    tlse_hop_product_args a{};
    a.dtype = TLSE_HOP_BF16;
    a.a = z, a.lda = 2 * ld;
    a.b_transposed = 1, a.ldb = depth;
    a.N = depth, a.ldo = depth;
    a.max_k_splits = 1;
    if (dW) {
      tlse_hop_product_args w = a;
      w.a_transposed = 1;
      w.b = p.rows.data;
      w.M = width, w.K = p.rows.stored;
      w.out = dW + first * depth, w.accumulate = accumulate;
      check_hopper(tlse_hop_product(&w, stream), "tlse_hop_product (distillation dW)");
    }
    if (acc) {
      tlse_hop_product_args h = a;
      h.b = p.cols.data + first * depth;
      h.M = p.rows.stored, h.K = width;
      h.out_f32 = acc, h.accumulate = first > 0;
      check_hopper(tlse_hop_product(&h, stream), "tlse_hop_product (distillation dH)");
    }
  }
};

}  // namespace tlse::impl::cuda
#endif
