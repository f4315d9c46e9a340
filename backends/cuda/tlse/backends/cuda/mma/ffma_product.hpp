#pragma once
// The FFMA products of the tile kernels for exact float32 (Precision::exact on float inputs under
// TLSE_CUDA_EXACT_F32=ffma; 3xTF32, mma/nt_sweep.hpp, is the default): the same 128 x 128 tiles,
// shared-memory stages and cp.async pipeline as the tensor-core kernels (mma/nt_sweep.hpp,
// mma/backward.hpp), multiplied with FFMA instead of mma.sync. Each thread
// computes the 8 x 8 block of the tile that the mma.sync accumulator layout gives it
// (TileAccumulator, WarpPosition: rows wm 64 + 16 mt + lane / 4 + 8 h, columns
// wn 32 + 8 nt + 2 (lane % 4) + j), so the epilogues (LseEpilogue, GradientEpilogue) and the
// backward's plan, chunks and K splits serve it unchanged: only the stage's inner loop differs.
//
// A stage holds 32 floats of depth per row. Per pair of depth steps a thread reads its 8 rows
// of A and its 8 columns of B as float2 (16 shared loads, conflict-free: the row stride of 36
// floats puts the 8 rows a warp reads at once on distinct banks) and issues 128 FFMA, summing
// each dot product in depth order. No TF32, no reordering: float products, float sums, as the
// generic kernels compute them.
#include <tlse/backends/cuda/mma/nt_sweep.hpp>

#include <type_traits>

namespace tlse::impl::cuda {

struct FfmaProduct {
  static constexpr int LDF = LDS / 2;   // row stride of the [m][k] and [n][k] stages, in floats
  static constexpr int DEPTH = BK / 2;  // floats of depth per stage

  template <class T>
  static bool applies(const TileProblem<T, float>& prob) {
    return std::is_same<T, float>::value && !prob.tf32;
  }

  /// The thread's 8 rows of A at depth k, k + 1: x[mt][h] holds row wm 64 + 16 mt + lane / 4 + 8 h.
  static __device__ __forceinline__ void load_rows(float2 (&x)[4][2], const float* a, int k) {
  #pragma unroll
    for (int mt = 0; mt < 4; ++mt)
    #pragma unroll
      for (int h = 0; h < 2; ++h) x[mt][h] = *reinterpret_cast<const float2*>(a + (mt * 16 + 8 * h) * LDF + k);
  }

  /// acc[.][.][2 h + j] += x[mt][h] * y[nt][j] at depth k (`.x`) then k + 1 (`.y`).
  static __device__ __forceinline__ void multiply(TileAccumulator& acc, const float2 (&x)[4][2],
                                                  const float2 (&y)[4][2]) {
  #pragma unroll
    for (int mt = 0; mt < 4; ++mt)
    #pragma unroll
      for (int h = 0; h < 2; ++h)
      #pragma unroll
        for (int nt = 0; nt < 4; ++nt)
        #pragma unroll
          for (int j = 0; j < 2; ++j) {
            float& c = acc[mt][nt][2 * h + j];
            c = fmaf(x[mt][h].x, y[nt][j].x, c);
            c = fmaf(x[mt][h].y, y[nt][j].y, c);
          }
  }

  /// acc += A B^T over the stage: A rows [m][k] and B rows [n][k], LDF floats apart (the sweep).
  /// Not unrolled: the sweep kernels also hold their epilogue's and pipeline's state, and unrolled
  /// steps let the compiler hoist loads until it spills (ptxas, sm_90, 128 registers: the forward
  /// kept a 96-byte stack unrolled, 24 bytes - as the tensor-core forward - not; the loop costs a
  /// few integer instructions per 128 FFMA).
  static __device__ __forceinline__ void stage_nt(TileAccumulator& acc, const std::uint16_t* sa,
                                                  const std::uint16_t* sb, const WarpPosition& w) {
    const float* a = reinterpret_cast<const float*>(sa) + (w.wm * 64 + (w.lane >> 2)) * LDF;
    const float* b = reinterpret_cast<const float*>(sb) + (w.wn * 32 + (w.lane & 3) * 2) * LDF;
  #pragma unroll 1
    for (int k = 0; k < DEPTH; k += 2) {
      float2 x[4][2], y[4][2];
      load_rows(x, a, k);
    #pragma unroll
      for (int nt = 0; nt < 4; ++nt)
      #pragma unroll
        for (int j = 0; j < 2; ++j) y[nt][j] = *reinterpret_cast<const float2*>(b + (nt * 8 + j) * LDF + k);
      multiply(acc, x, y);
    }
  }

  /// acc += A B over the stage: A rows [m][k] as above, B k-major [k][n], rows LDSB floats apart
  /// (the gradient product). Not unrolled either: unrolled, it spills nothing but takes 79% FFMA
  /// instead of 85% (shuffled loads) and four times the code, which every binary carries.
  static __device__ __forceinline__ void stage_nn(TileAccumulator& acc, const std::uint16_t* sa,
                                                  const std::uint16_t* sb, const WarpPosition& w) {
    const float* a = reinterpret_cast<const float*>(sa) + (w.wm * 64 + (w.lane >> 2)) * LDF;
    const float* b = reinterpret_cast<const float*>(sb) + w.wn * 32 + (w.lane & 3) * 2;
  #pragma unroll 1
    for (int k = 0; k < DEPTH; k += 2) {
      float2 x[4][2], y[4][2];
      load_rows(x, a, k);
    #pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        // Columns n, n + 1 of rows k and k + 1, regrouped as (column, depth pair) for multiply.
        const float2 at_k = *reinterpret_cast<const float2*>(b + k * LDSB + nt * 8);
        const float2 at_k1 = *reinterpret_cast<const float2*>(b + (k + 1) * LDSB + nt * 8);
        y[nt][0] = make_float2(at_k.x, at_k1.x), y[nt][1] = make_float2(at_k.y, at_k1.y);
      }
      multiply(acc, x, y);
    }
  }
};

}  // namespace tlse::impl::cuda
