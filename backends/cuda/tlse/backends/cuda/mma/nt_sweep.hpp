#pragma once
// The tensor-core tile sweep shared by the forward and the backward: a block takes 128 rows of
// side A and sweeps a range of 128-column tiles of side B, computing each 128 x 128 tile of
// dot products A_a . B_b on tensor cores (mma.sync m16n8k16, fp32 accumulation) from operands
// staged in shared memory by a 3-stage cp.async pipeline (128 x 128 x 64) that runs on across
// column tiles. What happens to a finished tile is the epilogue's business: the forward folds it
// into online LSE states, the backward turns it into dL/dx. The tile never leaves the SM. How a
// stage's operands are multiplied is the Product's: tensor cores here (TensorCoreProduct, exact
// float32 as 3xTF32 among them), FFMA in mma/ffma_product.hpp, all into the same accumulator
// layout.
#include <tlse/backends/cuda/mma/primitives.hpp>
#include <tlse/backends/cuda/mma/tile_shape.hpp>

namespace tlse::impl::cuda {

/// Accumulator layout of a warp (8 warps as 2 x 4, each a 64 x 32 sub-tile of 4 x 4 mma tiles):
/// acc[mt][nt][2 h + j] holds row  wm * 64 + mt * 16 + lane / 4 + 8 h  and
/// column  wn * 32 + nt * 8 + (lane % 4) * 2 + j  of the block's tile.
using TileAccumulator = float[4][4][4];

struct WarpPosition {
  int tid, lane, wm, wn;
  __device__ WarpPosition()
      : tid(threadIdx.x), lane(threadIdx.x & 31), wm((threadIdx.x >> 5) >> 2), wn((threadIdx.x >> 5) & 3) {}
  __device__ int row(int mt, int h) const { return wm * 64 + mt * 16 + (lane >> 2) + 8 * h; }
  __device__ int col(int nt, int j) const { return wn * 32 + nt * 8 + (lane & 3) * 2 + j; }
};

/// Whether the block's tile of rows [row0, row0 + BM) and columns [col_base, col_base + BN) lies
/// inside the rows before a_end and the columns before b_count: no entry needs an edge test.
__device__ __forceinline__ bool full_tile(index_t row0, index_t a_end, index_t col_base, index_t b_count) {
  return row0 + BM <= a_end && col_base + BN <= b_count;
}

/// Zeroes a warp's accumulator (before a tile, and after the epilogue has consumed it).
__device__ __forceinline__ void clear(TileAccumulator& acc) {
#pragma unroll
  for (int mt = 0; mt < 4; ++mt)
  #pragma unroll
    for (int nt = 0; nt < 4; ++nt)
    #pragma unroll
      for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0;
}

/// The warp's 4 A fragments (rows wm * 64 + 16 mt) at depth kk of a stage whose A rows are
/// LDS halves apart: the layout of both the sweep and the gradient product.
__device__ __forceinline__ void load_a_fragments(unsigned (&a)[4][4], const std::uint16_t* sa, const WarpPosition& w,
                                                 int kk) {
#pragma unroll
  for (int mt = 0; mt < 4; ++mt)
    ldmatrix_x4(a[mt], smem_address(sa + (w.wm * 64 + mt * 16 + (w.lane & 15)) * LDS + kk + (w.lane >> 4) * 8));
}

/// acc += a b over the warp's 4 x 4 mma tiles, one mma.sync per 16 x 8 block: 16-bit inputs,
/// and float inputs that allow TF32 (rounded to it first).
template <class T>
struct OneMmaPerBlock {
  static bool applies(const TileProblem<T, float>& prob) { return sizeof(T) == 2 || prob.tf32; }
  static __device__ __forceinline__ void multiply(TileAccumulator& acc, unsigned (&a)[4][4], unsigned (&b)[4][2]) {
    MmaOp<T>::prepare(&a[0][0], 16);
    MmaOp<T>::prepare(&b[0][0], 8);
#pragma unroll
    for (int mt = 0; mt < 4; ++mt)
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) MmaOp<T>::run(acc[mt][nt], a[mt], b[nt]);
  }
};

/// Exact float on TF32 tensor cores, the 3xTF32 scheme of CUTLASS's big + small GEMMs: each operand
/// x = big + small, a b = a_small b_big + a_big b_small + a_big b_big with the small terms first,
/// dropping a_small b_small: products within a few units of float's rounding, whose sum over the
/// depth errs more, at three tensor-core products each (docs/notes/2026-12-06-float32.md measures
/// the error against float64).
///
/// The split is Veltkamp's, in float arithmetic: t = (2^13 + 1) x, big = t - (t - x) keeps 11
/// significant bits (TF32's, so the tensor cores take it whole) and small = x - big is exact, of
/// at most 12 bits, of which the tensor cores read the top 11: |x - big - small_read| <= 2^-22 |x|
/// (2^-23 at worst over every significand, checked exhaustively in float arithmetic). Float
/// multiplies and adds, because the kernels are bound by instruction issue on the integer
/// pipe: the integer form of the same rounding (and ptxas's emulated cvt.rna.tf32, more so) kept
/// that pipe busier than the tensor cores (docs/notes/2026-12-07-float32-split.md and
/// 2026-12-07-float32-fused.md). The _rn intrinsics keep the compiler from fusing t - x into an
/// FMA, which would break the split.
///
/// An operand that does not split keeps small = 0 and enters the cross terms as 0, so that its
/// product is big times big alone, as in float (a cross term small * inf would be NaN wherever the
/// other operand's small part is 0: a -inf mask times an exact 1): infinities and NaN, and finite
/// values of magnitude at or above 2^114 (where (2^13 + 1) x would overflow), which enter as
/// they are (the tensor cores read their TF32 part).
struct SplitTf32 {
  template <class T>
  static bool applies(const TileProblem<T, float>& prob) {
    return sizeof(T) == 4 && !prob.tf32;
  }
  static constexpr float SPLITTER = 8193.f;        // 2^13 + 1: big keeps 24 - 13 significant bits
  static constexpr float SPLITS_BELOW = 0x1p114f;  // SPLITTER * x stays finite below it

  /// x (bits, in place) split into big and small; cross is big as the cross terms take it.
  static __device__ __forceinline__ void split(unsigned& x, unsigned& small, unsigned& cross) {
    const float v = __uint_as_float(x);
    const float t = __fmul_rn(SPLITTER, v);
    const float big = __fsub_rn(t, __fsub_rn(t, v));
    const bool splits = fabsf(v) < SPLITS_BELOW;
    small = splits ? __float_as_uint(__fsub_rn(v, big)) : 0u;
    cross = splits ? __float_as_uint(big) : 0u;
    x = splits ? __float_as_uint(big) : x;
  }
  template <int N>
  static __device__ __forceinline__ void split(unsigned (&x)[N], unsigned (&small)[N], unsigned (&cross)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) split(x[i], small[i], cross[i]);
  }
  /// B's parts once per step, A's per row block: a row block's parts live only while its 12
  /// products issue, which keeps the warp's registers under the two-blocks-per-SM bound.
  static __device__ __forceinline__ void multiply(TileAccumulator& acc, unsigned (&a)[4][4], unsigned (&b)[4][2]) {
    unsigned b_small[4][2], b_cross[4][2];
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) split(b[nt], b_small[nt], b_cross[nt]);
#pragma unroll
    for (int mt = 0; mt < 4; ++mt) {
      unsigned a_small[4], a_cross[4];
      split(a[mt], a_small, a_cross);
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        MmaOp<float>::run(acc[mt][nt], a_small, b_cross[nt]);
        MmaOp<float>::run(acc[mt][nt], a_cross, b_small[nt]);
        MmaOp<float>::run(acc[mt][nt], a[mt], b[nt]);
      }
    }
  }
};

/// The products of one pipeline stage on tensor cores (mma.sync, fp32 accumulation), the warp
/// tile multiplied by Multiply: OneMmaPerBlock (16-bit inputs, float in TF32) or SplitTf32
/// (exact float).
template <class T, class Multiply = OneMmaPerBlock<T>>
struct TensorCoreProduct {
  static bool applies(const TileProblem<T, float>& prob) { return Multiply::applies(prob); }

  /// acc += A B^T over the stage: A rows [m][k] and B rows [n][k], LDS halves apart (the sweep).
  static __device__ __forceinline__ void stage_nt(TileAccumulator& acc, const std::uint16_t* sa,
                                                  const std::uint16_t* sb, const WarpPosition& w) {
  #pragma unroll
    for (int kk = 0; kk < BK; kk += 16) {
      unsigned a[4][4], b[4][2];
      load_a_fragments(a, sa, w, kk);
    #pragma unroll
      for (int p = 0; p < 2; ++p) {
        unsigned r[4];
        ldmatrix_x4(r, smem_address(sb + (w.wn * 32 + p * 16 + (w.lane & 7) + (w.lane >> 4) * 8) * LDS + kk +
                                    ((w.lane >> 3) & 1) * 8));
        b[2 * p][0] = r[0], b[2 * p][1] = r[1], b[2 * p + 1][0] = r[2], b[2 * p + 1][1] = r[3];
      }
      Multiply::multiply(acc, a, b);
    }
  }

  /// acc += A B over the stage: A rows [m][k] as above, B k-major [k][n], rows LDSB elements
  /// apart (the gradient product); read with ldmatrix.trans (16-bit inputs) or with 32-bit shared
  /// loads (TF32: ldmatrix.trans would split the floats).
  static __device__ __forceinline__ void stage_nn(TileAccumulator& acc, const std::uint16_t* sa,
                                                  const std::uint16_t* sb, const WarpPosition& w) {
  #pragma unroll
    for (int kk = 0; kk < BK; kk += 16) {
      unsigned a[4][4], b[4][2];
      load_a_fragments(a, sa, w, kk);
      if constexpr (sizeof(T) == 2) {
      #pragma unroll
        for (int p = 0; p < 2; ++p) {
          unsigned r[4];
          ldmatrix_x4_trans(r, smem_address(sb + (kk + ((w.lane >> 3) & 1) * 8 + (w.lane & 7)) * LDSB + w.wn * 32 +
                                            p * 16 + (w.lane >> 4) * 8));
          b[2 * p][0] = r[0], b[2 * p][1] = r[1], b[2 * p + 1][0] = r[2], b[2 * p + 1][1] = r[3];
        }
      } else {  // TF32 m16n8k8: b0 = X[k = lane % 4][n = lane / 4], b1 = the same at k + 4
        const unsigned* sbw = reinterpret_cast<const unsigned*>(sb);
        const int k = kk / 2 + (w.lane & 3), n = w.wn * 32 + (w.lane >> 2);
      #pragma unroll
        for (int nt = 0; nt < 4; ++nt)
          b[nt][0] = sbw[k * LDSB + n + nt * 8], b[nt][1] = sbw[(k + 4) * LDSB + n + nt * 8];
      }
      Multiply::multiply(acc, a, b);
    }
  }
};

/// Exact float products on tensor cores (SplitTf32).
using Tf32x3Product = TensorCoreProduct<float, SplitTf32>;

/// Sweeps column tiles [ct_begin, ct_end) of B against rows [row0, row0 + BM) of A (positions
/// at or past a_end read as zero). Calls epi.column_tile(acc, ct) after each column tile, with
/// every thread of the block, then clears the accumulator. Needs SWEEP_SMEM_BYTES of dynamic
/// shared memory at `smem`; depth a multiple of 8 and 16-byte aligned rows.
template <class T, class Epilogue, class Product = TensorCoreProduct<T>>
__device__ __forceinline__ void nt_sweep(const Side<T> A, const Side<T> B, index_t K, index_t row0, index_t a_end,
                                         int ct_begin, int ct_end, std::uint16_t* smem, Epilogue& epi) {
  const WarpPosition w;
  const index_t nb = B.count;
  constexpr int BKT = depth_per_stage<T>;
  const int KT = int((K + BKT - 1) / BKT);
  const int iters = ct_end > ct_begin ? (ct_end - ct_begin) * KT : 0;

  // Each thread copies CHUNKS 16-byte chunks of A and of B per stage: chunk c = tid + 256 i,
  // row c / (BK / 8), depth offset (c % (BK / 8)) * 8. A's rows are fixed for the whole block.
  const T* a_row[CHUNKS];
  bool a_ok[CHUNKS];
#pragma unroll
  for (int i = 0; i < CHUNKS; ++i) {
    const int r = (w.tid + i * THREADS) / (BK / 8);
    a_ok[i] = row0 + r < a_end;
    a_row[i] = A.data + (a_ok[i] ? A.id(row0 + r) : 0) * K;
  }
  auto load = [&](int it, int stage) {
    const int ct = ct_begin + it / KT;
    const index_t k0 = index_t(it % KT) * BKT;
    std::uint16_t* sa = smem + stage * (BM + BN) * LDS;
    std::uint16_t* sb = sa + BM * LDS;
  #pragma unroll
    for (int i = 0; i < CHUNKS; ++i) {
      const int c = w.tid + i * THREADS, r = c / (BK / 8), kh = (c % (BK / 8)) * 8;
      const int kc = (c % (BK / 8)) * per_16_bytes<T>;
      const bool k_ok = k0 + kc < K;  // depth is a multiple of per_16_bytes: no chunk straddles the end
      cp_async16(smem_address(sa + r * LDS + kh), a_ok[i] && k_ok ? a_row[i] + k0 + kc : A.data,
                 a_ok[i] && k_ok ? 16 : 0);
      const index_t b = index_t(ct) * BN + r;
      const bool b_ok = b < nb && k_ok;
      cp_async16(smem_address(sb + r * LDS + kh), b_ok ? B.data + B.id(b) * K + k0 + kc : B.data, b_ok ? 16 : 0);
    }
  };

  TileAccumulator acc;
  clear(acc);

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
    Product::stage_nt(acc, sa, sa + BM * LDS, w);
    if (it % KT != KT - 1) continue;
    epi.column_tile(acc, ct_begin + it / KT);
    clear(acc);
  }
  cp_async_wait<0>();
}

/// Whether the sweep with `Product` takes a problem: the product takes its precision; rows of a
/// whole number of 16-byte chunks, 16-byte aligned (cp.async copies 16 bytes); both sides non-empty.
template <class T, class Product = TensorCoreProduct<T>>
bool sweep_applies(const TileProblem<T, float>& prob) {
  const auto aligned = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; };
  return Product::applies(prob) && prob.depth > 0 && prob.depth % per_16_bytes<T> == 0 && aligned(prob.rows.data) &&
         aligned(prob.cols.data) && prob.rows.count > 0 && prob.cols.count > 0;
}

/// Sums per-row values over the 4 column warps in a fixed order: each warp's quad leader puts
/// its row value in red[wn][row]; after the barrier thread `tid < BM` owns row tid.
__device__ __forceinline__ float column_warp_sum(const float (*red)[BM], int row) {
  return ((red[0][row] + red[1][row]) + red[2][row]) + red[3][row];
}

}  // namespace tlse::impl::cuda
