#pragma once
// CUDA specialization of the forward LSE for bf16/fp16 inputs (and float in TF32; exact float
// with FfmaProduct, mma/ffma_product.hpp): the tile sweep (mma/nt_sweep.hpp) with an epilogue that folds
// each finished tile into per-row online LSE states and, on request, into per-column states and
// column logit sums, so the contrastive loss gets its row and column LSE (and cross-entropy its
// vocabulary order) from one pass over the tiles. Launched natively on exec.cuda_stream() because
// it needs 108 KiB of shared memory (Kokkos 3.4 caps team scratch at 40 KiB).
//
// Layout of the work, as the generic forward (lse_forward.hpp): block (x, y) takes row tiles
// [x r, x r + r) and the column tiles of split y. Its row states stay in registers for one row
// tile; its column states live in the column partials of slot x, which only this block touches
// (read-modify-write once per tile, 1 KiB against a 128 x 128 x depth product). No atomics:
// results are bitwise reproducible.
#include <tlse/backends/cuda/launch_shape.hpp>
#include <tlse/backends/cuda/mma/nt_sweep.hpp>

namespace tlse::impl::cuda {

/// What a forward block needs; one __grid_constant__ kernel parameter, so that the epilogue can
/// refer to it without the copy to local memory that taking a parameter's address costs.
template <class T>
struct ForwardParams {
  Side<T> A, B;  // rows, columns
  index_t depth;
  LogitModel<T, float> logit;
  bool plain_logits;  // logit.plain(B): full tiles take x = scale * dot alone
  int row_tiles_per_block, col_tiles_per_split;
  float *row_max, *row_sum;  // [gridDim.y][A.count]
  float *col_max, *col_sum;  // [gridDim.x][B.count], or nullptr: no column LSE
  float* col_logit_sum;      // [gridDim.x][B.count], or nullptr
  float* row_best;           // [gridDim.y][A.count]: the argmax kernel's largest logit of each row
  int* row_best_col;         // and its column id (the lowest of equal ones; INT32_MAX: none)
};

/// Online (max, sum) per row over the block's column tiles, merged over the 4 column warps
/// through shared memory in a fixed order; with Columns, per column over the tile's rows, merged
/// over the 2 row warps and into the block's column slot in a fixed order. (A template flag, not
/// a run-time branch: the column code costs registers the row-only kernel should not pay.)
template <class T, bool Columns, bool ArgMax = false>
struct LseEpilogue {
  const ForwardParams<T>& p;
  index_t row0;
  bool first_row_tile;  // the block's first row tile writes its column slots instead of merging
  float (*red_max)[BM];
  float (*red_sum)[BM];
  int (*red_col)[BM];  // ArgMax: the column of each warp's largest logit of a row
  float run_max = -infinity<float>(), run_sum = 0;
  float run_best = -infinity<float>();  // ArgMax: the row's largest logit (threads tid < BM)
  int run_best_col = INT32_MAX;

  /// acc: dot products -> logits, -inf past the edges. A full tile under a plain logit model
  /// takes x = scale * dot alone: the per-entry model's ids, mask tests and branches were most of
  /// the epilogue's instructions (docs/notes/2026-12-07-float32-split.md).
  __device__ __forceinline__ void to_logits(TileAccumulator& acc, index_t col_base, const WarpPosition& w) const {
    if (p.plain_logits && full_tile(row0, p.A.count, col_base, p.B.count)) {
#pragma unroll
      for (int mt = 0; mt < 4; ++mt)
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[mt][nt][e] = p.logit.scale * acc[mt][nt][e];
      return;
    }
#pragma unroll
    for (int mt = 0; mt < 4; ++mt)
    #pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r_local = w.row(mt, h);
        const bool r_ok = row0 + r_local < p.A.count;
        const index_t aid = r_ok ? p.A.id(row0 + r_local) : 0;
      #pragma unroll
        for (int nt = 0; nt < 4; ++nt)
        #pragma unroll
          for (int j = 0; j < 2; ++j) {
            const index_t b = col_base + w.col(nt, j);
            float& x = acc[mt][nt][2 * h + j];
            x = r_ok && b < p.B.count ? p.logit(x, aid, p.B.id(b)) : -infinity<float>();
          }
      }
  }

  __device__ __forceinline__ void column_tile(TileAccumulator& acc, int ct) {
    const WarpPosition w;
    const index_t col_base = index_t(ct) * BN;
    to_logits(acc, col_base, w);
#pragma unroll
    for (int mt = 0; mt < 4; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r_local = w.row(mt, h);
        float m = -infinity<float>();
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
          for (int j = 0; j < 2; ++j) m = nan_max(m, acc[mt][nt][2 * h + j]);
        m = quad_max(m);
        if constexpr (ArgMax) {  // the quad's lowest column holding m
          int col = INT32_MAX;
        #pragma unroll
          for (int nt = 3; nt >= 0; --nt)
          #pragma unroll
            for (int j = 1; j >= 0; --j)
              if (acc[mt][nt][2 * h + j] == m && m != -infinity<float>()) col = int(p.B.id(col_base + w.col(nt, j)));
          for (int o = 1; o < 4; o <<= 1) col = min(col, __shfl_xor_sync(0xffffffffu, col, o));
          if ((w.lane & 3) == 0) red_col[w.wn][r_local] = col;
        }
        float s = 0;
        if (m != -infinity<float>())
        #pragma unroll
          for (int nt = 0; nt < 4; ++nt)
          #pragma unroll
            for (int j = 0; j < 2; ++j) s += expf(acc[mt][nt][2 * h + j] - m);
        s = quad_sum(s);
        if ((w.lane & 3) == 0) red_max[w.wn][r_local] = m, red_sum[w.wn][r_local] = s;
      }
    __syncthreads();
    if (w.tid < BM) {
      LseState<float> st{run_max, run_sum};
    #pragma unroll
      for (int q = 0; q < 4; ++q) st.merge(red_max[q][w.tid], red_sum[q][w.tid]);
      run_max = st.max, run_sum = st.sum;
      if constexpr (ArgMax)
      #pragma unroll
        for (int q = 0; q < 4; ++q) {
          const float v = red_max[q][w.tid];
          const int col = red_col[q][w.tid];
          if (col != INT32_MAX && (v > run_best || (v == run_best && col < run_best_col)))
            run_best = v, run_best_col = col;
        }
    }
    if constexpr (Columns) columns(acc, col_base);
  }

  /// The tile's column states (acc holds logits now). red_max[wm] / red_sum[wm] take row warp
  /// wm's column max and sum, red_max[2 + wm] its column logit sum.
  __device__ __forceinline__ void columns(const TileAccumulator& acc, index_t col_base) {
    const WarpPosition w;
    __syncthreads();  // the row merge above has read red_max / red_sum
  #pragma unroll
    for (int nt = 0; nt < 4; ++nt)
    #pragma unroll
      for (int j = 0; j < 2; ++j) {
        float m = -infinity<float>(), total = 0;
      #pragma unroll
        for (int mt = 0; mt < 4; ++mt)
        #pragma unroll
          for (int h = 0; h < 2; ++h) {
            const float x = acc[mt][nt][2 * h + j];
            m = nan_max(m, x);
            if (x != -infinity<float>()) total += x;
          }
        m = column_lanes_max(m);
        float s = 0;
        if (m != -infinity<float>())
        #pragma unroll
          for (int mt = 0; mt < 4; ++mt)
          #pragma unroll
            for (int h = 0; h < 2; ++h) s += expf(acc[mt][nt][2 * h + j] - m);
        s = column_lanes_sum(s);
        total = column_lanes_sum(total);
        if (w.lane < 4) {
          const int c = w.col(nt, j);
          red_max[w.wm][c] = m, red_sum[w.wm][c] = s, red_max[2 + w.wm][c] = total;
        }
      }
    __syncthreads();
    const index_t col = col_base + w.tid;
    if (w.tid >= BN || col >= p.B.count) return;
    const index_t slot = index_t(blockIdx.x) * p.B.count + col;
    if (p.col_max) {
      LseState<float> st;
      if (!first_row_tile) st = LseState<float>{p.col_max[slot], p.col_sum[slot]};
      st.merge(red_max[0][w.tid], red_sum[0][w.tid]);
      st.merge(red_max[1][w.tid], red_sum[1][w.tid]);
      p.col_max[slot] = st.max, p.col_sum[slot] = st.sum;
    }
    if (p.col_logit_sum)
      p.col_logit_sum[slot] = (first_row_tile ? 0.f : p.col_logit_sum[slot]) + red_max[2][w.tid] + red_max[3][w.tid];
  }
};

/// Block (x, y): row tiles [x r, x r + r) (r = row_tiles_per_block) against the column tiles of
/// split y. Writes one partial state per row, row_max/row_sum[y * A.count + row], and merges the
/// column states into slot x.
template <class T, bool Columns, class Product, bool ArgMax = false>
__global__ void __launch_bounds__(THREADS, 2) lse_forward_mma_kernel(const __grid_constant__ ForwardParams<T> p) {
  extern __shared__ uint4 smem_raw[];
  __shared__ float red_max[4][BM], red_sum[4][BM];
  __shared__ int red_col[ArgMax ? 4 : 1][BM];
  const index_t na = p.A.count;
  const int total_ct = int((p.B.count + BN - 1) / BN);
  const int ct_begin = blockIdx.y * p.col_tiles_per_split;
  const int ct_end = ct_begin + p.col_tiles_per_split < total_ct ? ct_begin + p.col_tiles_per_split : total_ct;
  for (int rt = 0; rt < p.row_tiles_per_block; ++rt) {
    const index_t row0 = (index_t(blockIdx.x) * p.row_tiles_per_block + rt) * BM;
    if (row0 >= na) break;
    LseEpilogue<T, Columns, ArgMax> epi{p, row0, rt == 0, red_max, red_sum, red_col};
    nt_sweep<T, LseEpilogue<T, Columns, ArgMax>, Product>(p.A, p.B, p.depth, row0, na, ct_begin, ct_end,
                                                          reinterpret_cast<std::uint16_t*>(smem_raw), epi);
    const int tid = threadIdx.x;
    if (tid < BM && row0 + tid < na) {
      const index_t slot = index_t(blockIdx.y) * na + row0 + tid;
      p.row_max[slot] = epi.run_max;
      p.row_sum[slot] = epi.run_sum;
      if constexpr (ArgMax) p.row_best[slot] = epi.run_best, p.row_best_col[slot] = epi.run_best_col;
    }
  }
}

/// The forward LSE on tensor cores (or with FfmaProduct, in exact float), when sweep_applies.
struct LseForwardMma {
  template <class T, class Product = TensorCoreProduct<T>>
  static bool applies(const TileProblem<T, float>& prob) {
    return sweep_applies<T, Product>(prob);
  }

  /// Fills `parts` (see ForwardPartials; the argmax with the rows alone). Without column outputs
  /// every block takes one row tile and only the column splits are chosen; with them the row
  /// tiles are grouped into at most max_row_splits blocks, each owning a column slot.
  template <class T, class Product = TensorCoreProduct<T>>
  static void run(cudaStream_t stream, int device, const TileProblem<T, float>& prob, ForwardPartials<float>& parts) {
    static const bool configured =
        (raise_smem_limit(lse_forward_mma_kernel<T, false, Product>, SWEEP_SMEM_BYTES, "lse_forward_mma_kernel"),
         raise_smem_limit(lse_forward_mma_kernel<T, true, Product>, SWEEP_SMEM_BYTES, "lse_forward_mma_kernel"),
         raise_smem_limit(lse_forward_mma_kernel<T, false, Product, true>, SWEEP_SMEM_BYTES, "lse_forward_mma_kernel"),
         true);
    (void)configured;
    const index_t na = prob.rows.count, nb = prob.cols.count;
    const index_t row_tiles = (na + BM - 1) / BM, col_tiles = (nb + BN - 1) / BN;
    const bool columns = parts.cols || parts.col_sums;
    index_t row_blocks = columns ? std::min(row_tiles, parts.max_row_splits) : row_tiles;
    const index_t per_block = (row_tiles + row_blocks - 1) / row_blocks;
    row_blocks = (row_tiles + per_block - 1) / per_block;  // every block has a first row tile
    const int splits = balanced_splits(row_blocks, col_tiles, parts.max_col_splits, multiprocessors(device));
    const int per_split = int((col_tiles + splits - 1) / splits);
    parts.col_splits = (col_tiles + per_split - 1) / per_split;  // no empty split
    parts.row_splits = row_blocks;
    ForwardParams<T> params{prob.rows,
                            prob.cols,
                            prob.depth,
                            prob.logit,
                            prob.logit.plain(prob.cols),
                            int(per_block),
                            per_split,
                            parts.rows,
                            parts.rows + parts.col_splits * na,
                            parts.cols,
                            nullptr,
                            parts.col_sums,
                            parts.row_best,
                            parts.row_best_id};
    if (parts.cols) params.col_sum = parts.cols + row_blocks * nb;
    const dim3 grid(unsigned(row_blocks), unsigned(parts.col_splits));
    if (columns)
      lse_forward_mma_kernel<T, true, Product><<<grid, THREADS, SWEEP_SMEM_BYTES, stream>>>(params);
    else if (parts.row_best)
      lse_forward_mma_kernel<T, false, Product, true><<<grid, THREADS, SWEEP_SMEM_BYTES, stream>>>(params);
    else
      lse_forward_mma_kernel<T, false, Product><<<grid, THREADS, SWEEP_SMEM_BYTES, stream>>>(params);
    check_launch("lse_forward_mma_kernel");
  }
};

}  // namespace tlse::impl::cuda
