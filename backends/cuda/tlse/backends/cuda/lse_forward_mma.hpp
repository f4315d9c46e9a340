#pragma once
// CUDA specialization of the forward LSE for bf16 and fp16 inputs: the tensor-core sweep
// (nt_sweep.hpp) with an epilogue that folds each finished tile into per-row online LSE states.
// `transposed` sweeps the matrix the other way round (A = the column side), which is how the
// column LSE of the contrastive loss is computed: the dot product is symmetric, so it is the
// same kernel with the logit model told that A holds columns. Launched natively on
// exec.cuda_stream() because it needs 108 KiB of shared memory (Kokkos 3.4 caps team scratch
// at 40 KiB).
#include <tlse/backends/cuda/nt_sweep.hpp>

namespace tlse::impl::cuda {

/// What a forward block needs; one __grid_constant__ kernel parameter, so that the epilogue can
/// refer to it without the copy to local memory that taking a parameter's address costs.
template <class T>
struct ForwardParams {
  Side<T> A, B;  // A = the rows whose LSE is computed (prob.cols when transposed)
  index_t depth;
  LogitModel<T, float> logit;
  bool transposed;
  int col_tiles_per_split;
  float *part_max, *part_sum;
};

/// Online (max, sum) per A row over the block's column tiles; merged over the 4 column warps
/// through shared memory in a fixed order, so results are reproducible.
template <class T>
struct LseEpilogue {
  const ForwardParams<T>& p;
  index_t row0;
  float (*red_max)[BM];
  float (*red_sum)[BM];
  float run_max = -infinity<float>(), run_sum = 0;

  __device__ __forceinline__ void column_tile(TileAccumulator& acc, int ct) {
    const WarpPosition w;
    const index_t col_base = index_t(ct) * BN;
  #pragma unroll
    for (int mt = 0; mt < 4; ++mt)
    #pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r_local = w.row(mt, h);
        const bool r_ok = row0 + r_local < p.A.count;
        const index_t aid = r_ok ? p.A.id(row0 + r_local) : 0;
        float m = -infinity<float>();
      #pragma unroll
        for (int nt = 0; nt < 4; ++nt)
        #pragma unroll
          for (int j = 0; j < 2; ++j) {
            const index_t b = col_base + w.col(nt, j);
            float& x = acc[mt][nt][2 * h + j];
            if (r_ok && b < p.B.count) {
              const index_t bid = p.B.id(b);
              x = p.logit(x, p.transposed ? bid : aid, p.transposed ? aid : bid);
            } else {
              x = -infinity<float>();
            }
            m = nan_max(m, x);
          }
        m = quad_max(m);
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
    }
  }
};

/// Block (blockIdx.x, blockIdx.y): A rows [128 x, 128 x + 128) against the column tiles of split
/// y. Writes one partial LSE state per A row: part_max/part_sum[y * A.count + row].
template <class T>
__global__ void __launch_bounds__(THREADS, 2) lse_forward_mma_kernel(const __grid_constant__ ForwardParams<T> p) {
  extern __shared__ uint4 smem_raw[];
  __shared__ float red_max[4][BM], red_sum[4][BM];
  const index_t na = p.A.count, row0 = index_t(blockIdx.x) * BM;
  const int total_ct = int((p.B.count + BN - 1) / BN);
  const int ct_begin = blockIdx.y * p.col_tiles_per_split;
  const int ct_end = ct_begin + p.col_tiles_per_split < total_ct ? ct_begin + p.col_tiles_per_split : total_ct;
  LseEpilogue<T> epi{p, row0, red_max, red_sum};
  nt_sweep(p.A, p.B, p.depth, row0, na, ct_begin, ct_end, reinterpret_cast<std::uint16_t*>(smem_raw), epi);
  const int tid = threadIdx.x;
  if (tid < BM && row0 + tid < na) {
    p.part_max[index_t(blockIdx.y) * na + row0 + tid] = epi.run_max;
    p.part_sum[index_t(blockIdx.y) * na + row0 + tid] = epi.run_sum;
  }
}

/// The forward LSE on tensor cores for bf16/fp16 inputs, when sweep_applies.
struct LseForwardMma {
  template <class T>
  static bool applies(const TileProblem<T, float>& prob) {
    return sweep_applies(prob);
  }

  /// Column splits for about four resident blocks per SM, at most `max_splits`.
  static int splits(index_t rows, index_t cols, int sms, index_t max_splits) {
    const index_t row_tiles = (rows + BM - 1) / BM, col_tiles = (cols + BN - 1) / BN;
    index_t s = (4 * index_t(sms) + row_tiles - 1) / row_tiles;
    s = s < col_tiles ? s : col_tiles;
    s = s < max_splits ? s : max_splits;
    return int(s < 1 ? 1 : s);
  }

  /// Writes `splits` partial states per A row (max, then sum, each splits x A.count) to
  /// part_max_sum and returns `splits`. A = prob.rows, or prob.cols when `transposed`.
  template <class T>
  static int run(cudaStream_t stream, int device, const TileProblem<T, float>& prob, bool transposed,
                 index_t max_splits, float* part_max_sum) {
    static const bool configured = (raise_smem_limit(lse_forward_mma_kernel<T>, SWEEP_SMEM_BYTES,
                                                     "lse_forward_mma_kernel"),
                                    true);
    (void)configured;
    const Side<T>& A = transposed ? prob.cols : prob.rows;
    const Side<T>& B = transposed ? prob.rows : prob.cols;
    const index_t na = A.count;
    const int used = splits(na, B.count, multiprocessors(device), max_splits);
    const int col_tiles = int((B.count + BN - 1) / BN);
    const int per_split = (col_tiles + used - 1) / used;
    const dim3 grid(unsigned((na + BM - 1) / BM), unsigned(used));
    const ForwardParams<T> params{A,         B,        prob.depth,  prob.logit,
                                  transposed, per_split, part_max_sum, part_max_sum + index_t(used) * na};
    lse_forward_mma_kernel<T><<<grid, THREADS, SWEEP_SMEM_BYTES, stream>>>(params);
    check_launch("lse_forward_mma_kernel");
    return used;
  }
};

}  // namespace tlse::impl::cuda
