#pragma once
// CUDA specialization of the forward row LSE for bf16 and fp16 inputs: logit tiles on tensor
// cores (mma.sync m16n8k16, fp32 accumulation), operands staged in shared memory by a 3-stage
// cp.async pipeline (128 x 128 x 64 tiles) that runs on across column tiles, and the online LSE merged in the epilogue
// without the tile ever leaving the SM. Launched natively on exec.cuda_stream() because it
// needs 108 KiB of shared memory (Kokkos 3.4 caps team scratch at 40 KiB).
#include <tlse/impl/tile_problem.hpp>

#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace tlse::impl::cuda {

constexpr int BM = 128, BN = 128, BK = 64, STAGES = 3, THREADS = 256;
constexpr int LDS = BK + 8;  // shared row stride in halves: 144 bytes keeps ldmatrix conflict-free
constexpr int CHUNKS = BM * BK / 8 / THREADS;  // 16-byte copies per thread per operand and stage
constexpr int SMEM_BYTES = STAGES * (BM + BN) * LDS * 2;

template <class T>
struct MmaOp;
template <>
struct MmaOp<bfloat16> {
  static __device__ __forceinline__ void run(float* d, const unsigned* a, const unsigned* b) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
};
template <>
struct MmaOp<float16> {
  static __device__ __forceinline__ void run(float* d, const unsigned* a, const unsigned* b) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
};

__device__ __forceinline__ unsigned smem_address(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
/// 16-byte asynchronous copy; src_bytes = 0 zero-fills (edges of the matrix).
__device__ __forceinline__ void cp_async16(unsigned dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}
__device__ __forceinline__ void ldmatrix_x4(unsigned* r, unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ float quad_max(float v) {
  for (int o = 1; o < 4; o <<= 1) v = nan_max(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float quad_sum(float v) {
  for (int o = 1; o < 4; o <<= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

/// Block (blockIdx.x, blockIdx.y): rows [128 x, 128 x + 128) against the column tiles of split y.
/// 8 warps as 2 x 4, each a 64 x 32 sub-tile of 4 x 4 mma tiles. Writes one partial LSE state
/// per row: part_max/part_sum[y * rows + row].
template <class T>
__global__ void __launch_bounds__(THREADS, 2)
    lse_forward_mma_kernel(TileProblem<T, float> prob, int col_tiles_per_split, float* part_max, float* part_sum) {
  extern __shared__ uint4 smem_raw[];
  auto* smem = reinterpret_cast<std::uint16_t*>(smem_raw);
  __shared__ float red_max[4][BM], red_sum[4][BM];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wm = warp >> 2, wn = warp & 3;
  const index_t nr = prob.rows.count, nc = prob.cols.count, K = prob.depth;
  const index_t row0 = index_t(blockIdx.x) * BM;
  const int total_ct = int((nc + BN - 1) / BN);
  const int ct_begin = blockIdx.y * col_tiles_per_split;
  const int ct_end = ct_begin + col_tiles_per_split < total_ct ? ct_begin + col_tiles_per_split : total_ct;
  const int KT = int((K + BK - 1) / BK);
  const int iters = ct_end > ct_begin ? (ct_end - ct_begin) * KT : 0;

  // Each thread copies CHUNKS 16-byte chunks of A and of B per stage: chunk c = tid + 256 i,
  // row c / (BK / 8), depth offset (c % (BK / 8)) * 8. A's rows are fixed for the whole block.
  const T* a_row[CHUNKS];
  bool a_ok[CHUNKS];
#pragma unroll
  for (int i = 0; i < CHUNKS; ++i) {
    const int r = (tid + i * THREADS) / (BK / 8);
    a_ok[i] = row0 + r < nr;
    a_row[i] = prob.rows.data + (a_ok[i] ? prob.rows.id(row0 + r) : 0) * K;
  }
  auto load = [&](int it, int stage) {
    const int ct = ct_begin + it / KT;
    const index_t k0 = index_t(it % KT) * BK;
    std::uint16_t* sa = smem + stage * (BM + BN) * LDS;
    std::uint16_t* sb = sa + BM * LDS;
  #pragma unroll
    for (int i = 0; i < CHUNKS; ++i) {
      const int c = tid + i * THREADS, r = c / (BK / 8), kc = (c % (BK / 8)) * 8;
      const bool k_ok = k0 + kc < K;  // depth % 8 == 0: a chunk never straddles the end
      cp_async16(smem_address(sa + r * LDS + kc), a_ok[i] && k_ok ? a_row[i] + k0 + kc : prob.rows.data,
                 a_ok[i] && k_ok ? 16 : 0);
      const index_t col = index_t(ct) * BN + r;
      const bool b_ok = col < nc && k_ok;
      cp_async16(smem_address(sb + r * LDS + kc), b_ok ? prob.cols.data + prob.cols.id(col) * K + k0 + kc : prob.cols.data,
                 b_ok ? 16 : 0);
    }
  };

  float run_max = -infinity<float>(), run_sum = 0;
  float acc[4][4][4];
#pragma unroll
  for (int mt = 0; mt < 4; ++mt)
  #pragma unroll
    for (int nt = 0; nt < 4; ++nt)
    #pragma unroll
      for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0;

#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < iters) load(s, s);
    cp_async_commit();
  }
  for (int it = 0; it < iters; ++it) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();
    if (it + STAGES - 1 < iters) load(it + STAGES - 1, (it + STAGES - 1) % STAGES);
    cp_async_commit();
    const std::uint16_t* sa = smem + (it % STAGES) * (BM + BN) * LDS;
    const std::uint16_t* sb = sa + BM * LDS;
  #pragma unroll
    for (int kk = 0; kk < BK; kk += 16) {
      unsigned a[4][4], b[4][2];
    #pragma unroll
      for (int mt = 0; mt < 4; ++mt)
        ldmatrix_x4(a[mt], smem_address(sa + (wm * 64 + mt * 16 + (lane & 15)) * LDS + kk + (lane >> 4) * 8));
    #pragma unroll
      for (int p = 0; p < 2; ++p) {
        unsigned r[4];
        ldmatrix_x4(r, smem_address(sb + (wn * 32 + p * 16 + (lane & 7) + (lane >> 4) * 8) * LDS + kk +
                                    ((lane >> 3) & 1) * 8));
        b[2 * p][0] = r[0], b[2 * p][1] = r[1], b[2 * p + 1][0] = r[2], b[2 * p + 1][1] = r[3];
      }
    #pragma unroll
      for (int mt = 0; mt < 4; ++mt)
      #pragma unroll
        for (int nt = 0; nt < 4; ++nt) MmaOp<T>::run(acc[mt][nt], a[mt], b[nt]);
    }
    if (it % KT != KT - 1) continue;

    // Epilogue of a column tile: logits, per-row (max, sum) over the warp's 32 columns, then
    // over the 4 column warps through shared memory, merged into the running state.
    const index_t col_base = index_t(ct_begin + it / KT) * BN + wn * 32;
  #pragma unroll
    for (int mt = 0; mt < 4; ++mt)
    #pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r_local = wm * 64 + mt * 16 + (lane >> 2) + 8 * h;
        const bool r_ok = row0 + r_local < nr;
        const index_t rid = r_ok ? prob.rows.id(row0 + r_local) : 0;
        float m = -infinity<float>();
      #pragma unroll
        for (int nt = 0; nt < 4; ++nt)
        #pragma unroll
          for (int j = 0; j < 2; ++j) {
            const index_t col = col_base + nt * 8 + (lane & 3) * 2 + j;
            float& x = acc[mt][nt][2 * h + j];
            x = r_ok && col < nc ? prob.logit(x, rid, prob.cols.id(col)) : -infinity<float>();
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
        if ((lane & 3) == 0) red_max[wn][r_local] = m, red_sum[wn][r_local] = s;
      #pragma unroll
        for (int nt = 0; nt < 4; ++nt)
        #pragma unroll
          for (int e = 2 * h; e < 2 * h + 2; ++e) acc[mt][nt][e] = 0;
      }
    __syncthreads();
    if (tid < BM) {
      LseState<float> st{run_max, run_sum};
    #pragma unroll
      for (int w = 0; w < 4; ++w) st.merge(red_max[w][tid], red_sum[w][tid]);
      run_max = st.max, run_sum = st.sum;
    }
  }
  cp_async_wait<0>();
  if (tid < BM && row0 + tid < nr) {
    part_max[index_t(blockIdx.y) * nr + row0 + tid] = run_max;
    part_sum[index_t(blockIdx.y) * nr + row0 + tid] = run_sum;
  }
}

/// The forward row LSE on tensor cores for bf16/fp16 inputs, when the problem allows it: depth a
/// multiple of 8 and 16-byte aligned rows (cp.async copies 16 bytes).
struct LseForwardMma {
  template <class T>
  static bool applies(const TileProblem<T, float>& prob) {
    const auto aligned = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; };
    return prob.depth > 0 && prob.depth % 8 == 0 && aligned(prob.rows.data) && aligned(prob.cols.data) &&
           prob.rows.count > 0 && prob.cols.count > 0;
  }

  /// Column splits for about four resident blocks per SM, at most `max_splits`.
  static int splits(index_t rows, index_t cols, int sms, index_t max_splits) {
    const index_t row_tiles = (rows + BM - 1) / BM, col_tiles = (cols + BN - 1) / BN;
    index_t s = (4 * index_t(sms) + row_tiles - 1) / row_tiles;
    s = s < col_tiles ? s : col_tiles;
    s = s < max_splits ? s : max_splits;
    return int(s < 1 ? 1 : s);
  }

  template <class T>
  static void run(cudaStream_t stream, int device, const TileProblem<T, float>& prob, index_t max_splits,
                  float* part_max_sum, int& splits_used) {
    static const bool configured = [] {
      return cudaFuncSetAttribute(lse_forward_mma_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  SMEM_BYTES) == cudaSuccess;
    }();
    if (!configured) throw std::runtime_error("tlse: cannot raise the shared-memory limit of lse_forward_mma_kernel");
    int sms = 0;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    const index_t nr = prob.rows.count, nc = prob.cols.count;
    splits_used = splits(nr, nc, sms, max_splits);
    const int col_tiles = int((nc + BN - 1) / BN);
    const int per_split = (col_tiles + splits_used - 1) / splits_used;
    const dim3 grid(unsigned((nr + BM - 1) / BM), unsigned(splits_used));
    lse_forward_mma_kernel<T><<<grid, THREADS, SMEM_BYTES, stream>>>(prob, per_split, part_max_sum,
                                                                     part_max_sum + index_t(splits_used) * nr);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) throw std::runtime_error(std::string("tlse: lse_forward_mma_kernel: ") + cudaGetErrorString(err));
  }
};

}  // namespace tlse::impl::cuda
