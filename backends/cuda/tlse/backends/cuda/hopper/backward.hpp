#pragma once
// The backward on the Hopper kernels (plan: hopper/backward_plan.hpp). Per panel of columns, in
// order:
//   1. tlse_hop_gradient recomputes the panel's tiles (every row) into G = scale * dL/dx (in T),
//      the per-tile filtering mask, the row sums of dL/dz * dot (dscale) and the column sums of
//      dL/dz (dbias);
//   2. dB_panel = G^T A (tlse_hop_product, G read transposed): complete, written to the
//      gradient rows of the panel's columns (through the column index), or added into the dA
//      accumulator for the self-similarity form, whose columns are its rows;
//   3. acc += G B_panel (fp32, rows x depth).
// Then dA = acc (+ dA with accumulate). Under a budget without room for the accumulator, step 3
// gives way to a pass of its own (plan.two_passes()), run first: per panel of rows,
// tlse_hop_gradient recomputes the panel's rows against every column into G and dA_panel = G B
// is complete (the self-similarity form's step 2 then adds onto it in T). The steps run in
// a fixed order with fixed-order sums: bitwise reproducible. Filtered tiles are neither stored
// nor multiplied. Columns visited through an index (the vocabulary order) are gathered per panel,
// since TMA reads contiguous rows; the rows' targets move to the gathered panel's positions where
// nothing else in a tile reads a column's id (only_targets_read_column_ids).
// Float in TF32 runs the same steps on K-major operands (wgmma reads TF32 only so): the gradient
// kernel writes G^T for dB = G^T A, which reads A^T (transposed once per call), and dA's products
// read the columns transposed (per panel, or every column once for the two passes' row pass). The
// transposes round to TF32, as G is rounded when stored.
// Under a plan with K blocks (plan.row_blocks(), col_blocks()) each panel sweeps its rows (the row
// panels their columns) a block at a time, and dB_panel (dA_panel) is summed over the blocks in
// order in fp32 before it is rounded to T once; TF32 transposes each block's operand as it goes.
// fp16 cannot hold G as it is (entries like p / N fall below its 2^-24 floor): G is stored times
// one power of two for the whole call that puts the largest |G| any entry can take at most at
// 2^14 (mma/backward.hpp's row_scale_for, from both sides' term bounds), and every product
// multiplies its output by the inverse, exactly. One factor rather than one a row (as the
// mma.sync passes take): G serves both products, and dB = G^T A sums over G's rows. An entry
// loses at most 2^-38 of that bound to fp16's range (docs/design.md: what that costs a sum).
#if defined(TLSE_HAVE_HOPPER)
#include <tlse/backends/cuda/grid_stride.hpp>
#include <tlse/backends/cuda/hopper/backward_plan.hpp>
#include <tlse/backends/cuda/hopper/forward.hpp>
#include <tlse/backends/cuda/mma/backward.hpp>
#include <tlse/backends/cuda/mma/primitives.hpp>
#include <tlse/impl/backward_request.hpp>

namespace tlse::impl::cuda {

/// dst[p] = src row index[p] for p < count, `depth` elements of T each (16-byte copies).
template <class T>
__global__ void gather_rows_kernel(const T* src, const int* index, index_t count, index_t depth, T* dst) {
  const index_t chunks = depth * index_t(sizeof(T)) / 16;
  for_each_index(count * chunks, [&](index_t i) {
    const index_t p = i / chunks, c = i % chunks;
    reinterpret_cast<uint4*>(dst + p * depth)[c] = reinterpret_cast<const uint4*>(src + index_t(index[p]) * depth)[c];
  });
}

/// local[id] = the column that row id's target (a column id, or anything out of [0, cols) for
/// none) takes in the panel of the order's positions [first, first + width), or -1 outside it.
__global__ void panel_targets_kernel(const int* target, const int* position, index_t ids, index_t cols, index_t first,
                                     index_t width, int* local) {
  for_each_index(ids, [&](index_t id) {
    const int t = target[id];
    const index_t p = t >= 0 && t < cols ? index_t(position[t]) - first : -1;
    local[id] = p >= 0 && p < width ? int(p) : -1;
  });
}

/// out[i] (+)= the sum over `splits` of part[s * n + i], in order (the first panel writes).
__global__ void add_row_sums_kernel(const float* part, int splits, index_t n, float* out, bool add) {
  for_each_index(n, [&](index_t i) {
    float v = 0.f;
    for (int s = 0; s < splits; ++s) v += part[s * n + i];
    out[i] = add ? out[i] + v : v;
  });
}

/// dbias[id of column col_begin + j] (+)= the sum over the row tiles of col_sums[t][j], in order.
template <class T>
__global__ void column_sums_kernel(const float* col_sums, index_t row_tiles, index_t width, const int* index,
                                   index_t col_begin, T* dbias, bool accumulate) {
  for_each_index(width, [&](index_t j) {
    float v = 0.f;
    for (index_t t = 0; t < row_tiles; ++t) v += col_sums[t * width + j];
    T& out = dbias[index ? index_t(index[col_begin + j]) : col_begin + j];
    out = from_acc<T>(accumulate ? to_acc<float>(out) + v : v);
  });
}

/// dst[k * ldd + p] = src[p * ld + k] rounded to TF32, for p < count and k < depth: the K-major
/// copy TF32's products read. 32 x 32 tiles through shared memory, so that reads and writes both
/// go along rows; blocks of 32 x 8 threads.
__global__ void transpose_tf32_kernel(const float* src, index_t ld, index_t count, index_t depth, float* dst,
                                      index_t ldd) {
  __shared__ float tile[32][33];
  const index_t p0 = index_t(blockIdx.x) * 32, k0 = index_t(blockIdx.y) * 32;
  for (int i = threadIdx.y; i < 32; i += 8) {
    const index_t p = p0 + i, k = k0 + threadIdx.x;
    if (p < count && k < depth) tile[i][threadIdx.x] = round_to_tf32(src[p * ld + k]);
  }
  __syncthreads();
  for (int i = threadIdx.y; i < 32; i += 8) {
    const index_t k = k0 + i, p = p0 + threadIdx.x;
    if (p < count && k < depth) dst[k * ldd + p] = tile[threadIdx.x][i];
  }
}

inline void transpose_tf32(cudaStream_t stream, const float* src, index_t ld, index_t count, index_t depth,
                           float* dst, index_t ldd) {
  const dim3 grid(unsigned((count + 31) / 32), unsigned((depth + 31) / 32)), block(32, 8);
  transpose_tf32_kernel<<<grid, block, 0, stream>>>(src, ld, count, depth, dst, ldd);
  check_launch("transpose_tf32_kernel");
}

/// ids[i] = i: the rows' ids for a row panel's gradient sweep, whose rows start past row 0.
__global__ void iota_kernel(int* ids, index_t n) {
  for_each_index(n, [&](index_t i) { ids[i] = int(i); });
}

/// Row i / depth of acc into grad's row index[i / depth] (or i / depth): acc (+ grad with
/// accumulate), rounded to T once.
template <class T>
__global__ void finish_rows_kernel(const float* acc, index_t n, index_t depth, const int* index, T* grad,
                                   bool accumulate) {
  for_each_index(n, [&](index_t i) {
    T& out = index ? grad[index_t(index[i / depth]) * depth + i % depth] : grad[i];
    out = from_acc<T>(accumulate ? to_acc<float>(out) + acc[i] : acc[i]);
  });
}

template <class T>
void finish_rows(cudaStream_t stream, const float* acc, index_t rows, index_t depth, const int* index, T* grad,
                 bool accumulate) {
  finish_rows_kernel<T><<<grid_for(rows * depth), 256, 0, stream>>>(acc, rows * depth, depth, index, grad, accumulate);
  check_launch("finish_rows_kernel");
}

/// factor[0] = fp16's power of two for G, factor[1] its inverse, from the sides' term bounds in
/// factor[2] and factor[3] (terms_bound_kernel) and the logit scale (|dx/dz| <= 1 under a softcap).
__global__ void gradient_factor_kernel(float logit_scale, float* factor) {
  const float f = row_scale_for(fabsf(logit_scale) * (factor[2] + factor[3]));
  factor[0] = f, factor[1] = 1.f / f;  // powers of two: exact
}

struct LseBackwardHopper {
  /// Whether the kernels take inputs of type T: bf16, fp16, or float in TF32.
  template <class T>
  static bool takes(bool tf32) {
    return std::is_same<T, bfloat16>::value || std::is_same<T, float16>::value ||
           (std::is_same<T, float>::value && tf32);
  }
  /// Whether G is stored times a factor (see the top).
  template <class T>
  static constexpr bool scaled = std::is_same<T, float16>::value;

  /// The plan for a shape, when the Hopper backward takes it (the rows side is not split).
  template <class T>
  static bool plan(int device, const BackwardShape& s, FusedBackwardPlan& out) {
    if (!takes<T>(s.precision == Precision::tf32) || s.rows <= 0 || s.cols <= 0 || s.depth <= 0 || s.depth % 8 != 0)
      return false;
    out = FusedBackwardPlan::make(s.rows, s.cols, s.depth, s.memory_budget, multiprocessors(device), sizeof(T));
    return out.fits;
  }

  /// Runs the request on `stream`; false when it does not qualify (the passes then run).
  template <class T>
  static bool run(cudaStream_t stream, int device, const BackwardRequest<T, float>& r) {
    const TileProblem<T, float>& prob = r.prob;
    tlse_hop_side rows{};
    if (!takes<T>(prob.tf32) || r.scratch == nullptr || !hopper_side(prob.rows, prob.depth, true, rows) ||
        reinterpret_cast<std::uintptr_t>(prob.cols.data) % 16 != 0)
      return false;
    // The plan the scratch holds: the one scratch_bytes sized for the call's budget.
    const FusedBackwardPlan plan = FusedBackwardPlan::make(rows.count, prob.cols.count, prob.depth, r.scratch_bytes,
                                                           multiprocessors(device), sizeof(T));
    // A block's row sums of dL/dz * dot lie by position: rows with positions (an index) would need
    // them for every position (no caller asks dscale of those).
    if (!plan.fits || (plan.row_blocks() && rows.position && r.dscale_part)) return false;
    char* base = aligned_base(r.scratch);
    WorkspaceCarver carver(base);
    const FusedBackwardPlan::Buffers buf = plan.carve(carver);
    const index_t R = rows.count, D = prob.depth;
    const bool want_rows = r.grad_rows != nullptr;
    const bool rows_in_acc = want_rows && !plan.two_passes();
    if (rows_in_acc) cudaMemsetAsync(buf.acc, 0, size_t(R * D) * sizeof(float), stream);
    if constexpr (scaled<T>) {
      terms_bound_kernel<T><<<1, 1024, 0, stream>>>(r.row_terms, prob.rows, buf.factor + 2);
      check_launch("terms_bound_kernel");
      terms_bound_kernel<T><<<1, 1024, 0, stream>>>(r.col_terms, prob.cols, buf.factor + 3);
      check_launch("terms_bound_kernel");
      gradient_factor_kernel<<<1, 1, 0, stream>>>(prob.logit.scale, buf.factor);
      check_launch("gradient_factor_kernel");
    }
    // Two passes: the row panels first, so that the self-similarity form's column products can
    // add into the rows' gradient they leave (the workspace serves one pass, then the other).
    if (want_rows && plan.two_passes()) row_panels<T>(stream, r, rows, plan, base);
    column_panels<T>(stream, r, rows, plan, buf, 0);
    if (rows_in_acc) finish_rows(stream, buf.acc, R, D, nullptr, r.grad_rows, r.accumulate);
    return true;
  }

  /// The column panels (steps 1-3 above) from column first_col on, into buf.acc as it stands
  /// (dA's sum over the panels before first_col, or zeros) when dA is summed there.
  template <class T>
  static void column_panels(cudaStream_t stream, const BackwardRequest<T, float>& r, const tlse_hop_side& rows,
                            const FusedBackwardPlan& plan, const FusedBackwardPlan::Buffers& buf, index_t first_col) {
    const TileProblem<T, float>& prob = r.prob;
    const index_t R = rows.count, D = prob.depth;
    const bool self = r.cols_into_rows;
    T* grad_rows = r.grad_rows;
    T* grad_cols = self ? nullptr : r.grad_cols;
    const bool want_rows = grad_rows != nullptr, want_cols = grad_cols != nullptr || (self && want_rows);
    const bool rows_in_acc = want_rows && !plan.two_passes();
    const bool tf32 = plan.tf32();
    tlse_hop_gradient_args g = gradient_args<T>(r, rows, buf.factor);
    // 16-bit: G serves both products. TF32: G for dA, G^T for dB.
    g.G = rows_in_acc || (!tf32 && want_cols) ? buf.G : nullptr;
    g.ldg = plan.ldg;
    g.GT = tf32 && want_cols ? buf.GT : nullptr;
    g.ldgt = plan.ldgt();
    g.tile_mask = buf.mask;
    g.max_col_splits = FusedBackwardPlan::MAX_SWEEP_SPLITS;
    const bool filtered = g.filter_eps > 0.f && (g.G != nullptr || g.GT != nullptr);
    const T* B = prob.cols.data;
    const auto* A = static_cast<const T*>(rows.data);
    const bool blocks = plan.row_blocks();
    const bool targets_by_panel = prob.cols.index && prob.cols.position && only_targets_read_column_ids(r);
    if (targets_by_panel) g.row_terms.target = buf.panel_targets;  // filled per panel, before its sweeps
    const RowParts parts = RowParts::of(stream, g, blocks ? buf.ids : nullptr, R);
    if (tf32 && want_cols && !blocks)  // after the row panels, whose workspace this shares
      transpose_tf32(stream, reinterpret_cast<const float*>(A), rows.ld, R, D, buf.At, plan.ldgt());
    for (index_t first = first_col; first < prob.cols.count; first += plan.panel) {
      const index_t width = std::min(plan.panel, prob.cols.count - first);
      // The panel's columns: in place, or gathered through the index (the panel is then the
      // whole gathered side, and the index gives the ids; or, with targets_by_panel, its columns
      // are their positions in the panel and the targets are moved there).
      const T* panel = B + first * D;
      if (prob.cols.index) {
        gather_rows_kernel<T><<<grid_for(width * D / 8), 256, 0, stream>>>(B, prob.cols.index + first, width, D,
                                                                           reinterpret_cast<T*>(buf.panel_rows));
        check_launch("gather_rows_kernel");
        panel = reinterpret_cast<const T*>(buf.panel_rows);
        g.cols = tlse_hop_side{panel, D, width, targets_by_panel ? nullptr : prob.cols.index + first, nullptr, 0};
        g.col_begin = 0, g.col_end = width;
        if (targets_by_panel) {
          panel_targets_kernel<<<grid_for(R), 256, 0, stream>>>(r.row_terms.target, prob.cols.position, R,
                                                                prob.cols.count, first, width, buf.panel_targets);
          check_launch("panel_targets_kernel");
        }
      } else {
        g.cols = tlse_hop_side{B, D, prob.cols.count, nullptr, nullptr, 0};
        g.col_begin = first, g.col_end = first + width;
      }
      if (tf32 && rows_in_acc)
        transpose_tf32(stream, reinterpret_cast<const float*>(panel), D, width, D, buf.Bt, plan.ldg);
      const index_t mask_ld = (width + FusedBackwardPlan::TILE_N - 1) /
                              FusedBackwardPlan::TILE_N;  // the mask row, as tlse_hop_gradient lays it
      // Where dB_panel goes: the self-similarity form's fp32 accumulator, or in T onto the row
      // panels' dA (its columns are its rows; rounded to T a second time), or the columns'
      // gradient (through the vocabulary order). Under K blocks it is first summed over them in
      // buf.panel_acc, but for the accumulator.
      T* out = !want_cols        ? nullptr
               : self            ? grad_rows + first * D
               : prob.cols.index ? grad_cols
                                 : grad_cols + first * D;
      const int* out_index = self ? nullptr : prob.cols.index ? prob.cols.index + first : nullptr;
      const bool out_accumulate = self || r.accumulate;
      const bool panel_in_acc = want_cols && blocks && !(self && rows_in_acc);
      for (index_t top = 0; top < R; top += plan.row_block) {
        const index_t height = std::min(plan.row_block, R - top);
        if (blocks) parts.select<T>(g, top, height);
        const index_t top_tile = top / FusedBackwardPlan::TILE_M;
        g.tile_mask = buf.mask + top_tile * mask_ld;
        g.row_dot_sums = r.dscale_part ? buf.row_dot : nullptr;
        g.col_sums = r.dbias ? buf.col_sums + top_tile * width : nullptr;
        check_hopper(tlse_hop_gradient(&g, stream), "tlse_hop_gradient");
        if (r.dscale_part) {
          const index_t n = blocks ? height : prob.rows.count;  // by position
          add_row_sums_kernel<<<grid_for(n), 256, 0, stream>>>(buf.row_dot, int(g.col_splits), n, r.dscale_part + top,
                                                               first > 0);
          check_launch("add_row_sums_kernel");
        }
        const unsigned char* mask = filtered ? g.tile_mask : nullptr;
        if (want_cols) {  // dB_panel (+)= G^T A
          tlse_hop_product_args p = product<T>(plan, buf.G, plan.ldg, mask, mask_ld, buf.partials,
                                               plan.partial_floats(), plan.k_splits_cols, buf.factor);
          p.mask_of_a_transposed = 1;
          if (tf32) {
            if (blocks)
              transpose_tf32(stream, reinterpret_cast<const float*>(A + top * rows.ld), rows.ld, height, D, buf.At,
                             plan.ldgt());
            p.a = buf.GT, p.lda = plan.ldgt(), p.b = buf.At, p.ldb = plan.ldgt();
          } else {
            p.a_transposed = 1, p.b = A + top * rows.ld, p.ldb = D;
          }
          p.M = width, p.N = D, p.K = height;
          if (self && rows_in_acc) {
            p.out_f32 = buf.acc + first * D;
            p.accumulate = 1;
          } else if (panel_in_acc) {
            p.out_f32 = buf.panel_acc;
            p.accumulate = top > 0;
          } else {
            p.out = out, p.out_index = out_index, p.accumulate = out_accumulate;
          }
          check_hopper(tlse_hop_product(&p, stream), "tlse_hop_product (columns)");
        }
        if (rows_in_acc) {  // acc += G B_panel
          tlse_hop_product_args p = product<T>(plan, buf.G, plan.ldg, mask, mask_ld, buf.partials,
                                               plan.partial_floats(), plan.k_splits_rows, buf.factor);
          if (tf32)
            p.b = buf.Bt, p.ldb = plan.ldg;
          else
            p.b = panel, p.ldb = D;
          p.M = height, p.N = D, p.K = width;
          p.out_f32 = buf.acc + top * D;
          p.accumulate = 1;
          check_hopper(tlse_hop_product(&p, stream), "tlse_hop_product (rows)");
        }
      }
      if (panel_in_acc) finish_rows(stream, buf.panel_acc, width, D, out_index, out, out_accumulate);
      if (r.dbias) {
        column_sums_kernel<T><<<grid_for(width), 256, 0, stream>>>(buf.col_sums, plan.row_tiles(), width,
                                                                   prob.cols.index, first, r.dbias, r.accumulate);
        check_launch("column_sums_kernel");
      }
    }
  }

 private:
  static tlse_hop_terms hopper_terms(const SoftmaxTerms<float>& t) { return tlse_hop_terms{t.lse, t.g, t.target, t.w}; }

  /// The gradient kernel's arguments for the request; factor: the plan's (see the top).
  template <class T>
  static tlse_hop_gradient_args gradient_args(const BackwardRequest<T, float>& r, const tlse_hop_side& rows,
                                              const float* factor) {
    tlse_hop_gradient_args g{};
    g.dtype = hopper_dtype<T>(r.prob.tf32);
    g.g_factor = scaled<T> ? factor : nullptr;
    g.rows = rows;
    g.depth = r.prob.depth;
    g.logit = hopper_logit(r.prob.logit);
    g.row_terms = hopper_terms(r.row_terms);
    g.col_terms = hopper_terms(r.col_terms);
    g.filter_eps = float(r.filter_eps);
    return g;
  }

  /// Whether a tile reads no column's id but to match the rows' targets: no column terms, bias,
  /// spread, diagonal or mask past valid_cols. Then columns visited through an index (the
  /// vocabulary order) whose inverse the caller gives (cols.position) can be swept as positions
  /// of the gathered panel, the targets moved there (panel_targets_kernel), and the gradient
  /// kernel keeps its simple logit model: through the index every tile took the general one
  /// (docs/notes/2026-12-07-filtering.md).
  template <class T>
  static bool only_targets_read_column_ids(const BackwardRequest<T, float>& r) {
    const LogitModel<T, float>& m = r.prob.logit;
    return !r.col_terms.active() && r.row_terms.spread == nullptr && m.col_bias == nullptr && !m.exclude_diagonal &&
           m.valid_cols >= r.prob.cols.count;
  }

  /// A sweep over a part of the rows (a row panel, a K block) keeps their ids, so that the
  /// softmax terms, targets and masks read as in the sweep of every row. Without the columns'
  /// terms (whose targets are row ids) only the rows' own terms and the diagonal mask read them:
  /// the part then passes as a side of its own, its terms from its first row on and the diagonal
  /// moved as far, so that the tiles the diagonal does not meet keep the simple logit model
  /// (through an index of ids every tile of the self-similarity form took the general one, much
  /// slower: docs/notes/2026-11-28.md, "The self-similarity form (NT-Xent) off the general logit
  /// model"). Else the ids come through an index, 0, 1, ... written once.
  struct RowParts {
    tlse_hop_side rows;
    tlse_hop_terms terms;
    std::int64_t diagonal = 0;
    const int* ids = nullptr;  // null: the parts are sides of their own

    /// The parts of g's rows; `ids` (rows of them) receives the index where one is needed and
    /// the caller gives one (a caller that sweeps every row at once gives none).
    static RowParts of(cudaStream_t stream, const tlse_hop_gradient_args& g, int* ids, index_t rows) {
      RowParts p;
      p.rows = g.rows, p.terms = g.row_terms, p.diagonal = g.logit.diagonal_offset;
      if (ids && g.col_terms.g != nullptr) {
        iota_kernel<<<grid_for(rows), 256, 0, stream>>>(ids, rows);
        check_launch("iota_kernel");
        p.ids = ids;
      }
      return p;
    }
    /// Points g's sweep at rows [first, first + count).
    template <class T>
    void select(tlse_hop_gradient_args& g, index_t first, index_t count) const {
      g.rows.data = static_cast<const T*>(rows.data) + first * rows.ld;
      g.rows.count = count;
      if (ids) {
        g.rows.index = ids + first;
      } else {
        g.rows.index = nullptr;
        g.row_terms = shifted(terms, first);
        g.logit.diagonal_offset = diagonal + first;
      }
      g.rows.position = rows.position ? rows.position + first : nullptr;
    }
  };

  /// The row side of the two passes: per panel of rows, G = the panel's rows against every
  /// column (in blocks of plan.col_block), then the panel's dA = G B, complete (summed over the
  /// blocks in fp32 first). The columns are read in place, in id order even where the call gives
  /// a vocabulary order (which only groups the columns the filter skips): dA is the same sum in
  /// another fixed order. Its workspace reuses the column panels'.
  template <class T>
  static void row_panels(cudaStream_t stream, const BackwardRequest<T, float>& r, const tlse_hop_side& rows,
                         const FusedBackwardPlan& plan, char* base) {
    WorkspaceCarver carver(base);
    const FusedBackwardPlan::RowPanelBuffers buf = plan.carve_row_panels(carver);
    const index_t R = rows.count, C = r.prob.cols.count, D = r.prob.depth;
    tlse_hop_gradient_args g = gradient_args<T>(r, rows, buf.factor);
    const RowParts parts = RowParts::of(stream, g, buf.ids, R);
    const auto* B = static_cast<const T*>(r.prob.cols.data);
    g.cols = tlse_hop_side{B, D, C, nullptr, nullptr, 0};
    g.G = buf.G, g.ldg = plan.ldg_rows;
    g.tile_mask = buf.mask;
    const bool filtered = g.filter_eps > 0.f, blocks = plan.col_blocks();
    if (plan.tf32() && !blocks)
      transpose_tf32(stream, reinterpret_cast<const float*>(B), D, C, D, buf.Bt, plan.ldg_rows);
    for (index_t first = 0; first < R; first += plan.row_panel) {
      const index_t height = std::min(plan.row_panel, R - first);
      parts.select<T>(g, first, height);
      for (index_t left = 0; left < C; left += plan.col_block) {
        const index_t width = std::min(plan.col_block, C - left);
        g.col_begin = left, g.col_end = left + width;
        g.max_col_splits = width;  // few row tiles: the columns are split to fill the device
        check_hopper(tlse_hop_gradient(&g, stream), "tlse_hop_gradient (row panel)");
        tlse_hop_product_args p =
            product<T>(plan, buf.G, plan.ldg_rows, filtered ? buf.mask : nullptr,
                       (width + FusedBackwardPlan::TILE_N - 1) / FusedBackwardPlan::TILE_N, buf.partials,
                       plan.row_panel_partial_floats(), plan.k_splits_row_panel, buf.factor);
        if (plan.tf32()) {
          if (blocks)
            transpose_tf32(stream, reinterpret_cast<const float*>(B + left * D), D, width, D, buf.Bt, plan.ldg_rows);
          p.b = buf.Bt, p.ldb = plan.ldg_rows;
        } else {
          p.b = B + left * D, p.ldb = D;
        }
        p.M = height, p.N = D, p.K = width;
        if (blocks) {
          p.out_f32 = buf.rows_acc;
          p.accumulate = left > 0;
        } else {
          p.out = r.grad_rows + first * D;
          p.accumulate = r.accumulate;
        }
        check_hopper(tlse_hop_product(&p, stream), "tlse_hop_product (row panel)");
      }
      if (blocks) finish_rows(stream, buf.rows_acc, height, D, nullptr, r.grad_rows + first * D, r.accumulate);
    }
  }

  /// Terms read by id, for ids from `first` on.
  static tlse_hop_terms shifted(const tlse_hop_terms& t, index_t first) {
    const auto from = [first](auto* p) { return p ? p + first : p; };
    return tlse_hop_terms{from(t.lse), from(t.g), from(t.target), from(t.w)};
  }

  /// The arguments the products share: G as operand A, its tile mask (mask_ld tiles a row; NULL:
  /// no filtering), the split partials (partial_floats of them), the plan's factor (fp16: the
  /// outputs are multiplied by its inverse).
  template <class T>
  static tlse_hop_product_args product(const FusedBackwardPlan& plan, const char* G, index_t ldg,
                                       const unsigned char* mask, index_t mask_ld, float* partials,
                                       std::int64_t partial_floats, int k_splits, const float* factor) {
    tlse_hop_product_args p{};
    p.dtype = hopper_dtype<T>(plan.tf32());
    p.out_factor = scaled<T> ? factor + 1 : nullptr;
    p.a = G, p.lda = ldg;
    p.b_transposed = plan.tf32() ? 0 : 1;  // TF32: the caller passes the K-major copy
    p.mask = mask;
    p.mask_ld = mask ? mask_ld : 0;
    p.ldo = plan.depth;
    p.workspace = partials;
    p.workspace_bytes = size_t(partial_floats) * sizeof(float);
    p.max_k_splits = k_splits;
    return p;
  }
};

}  // namespace tlse::impl::cuda
#endif
