#pragma once
// Reductions over a wgmma accumulator tile. A row of the tile lives in the 4 lanes of a quad
// (lane / 4 fixed), a column in the 8 lanes with the same lane % 4 of each of the 8 consumer
// warps (16 rows each). Shuffle trees run in a fixed order, so every result is reproducible.
#include "kernel.cuh"
#include "logit_model.cuh"

namespace tlse::hopper {

__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

/// Merges the online LSE states of a quad.
__device__ __forceinline__ void quad_lse_merge(float& max, float& sum) {
#pragma unroll
  for (int o = 1; o <= 2; o <<= 1) {
    const float m = __shfl_xor_sync(0xffffffffu, max, o), s = __shfl_xor_sync(0xffffffffu, sum, o);
    lse_merge(max, sum, m, s);
  }
}

/// Column reductions over a warp's 16 rows, 8 columns per lane at the end. value(j) gives the
/// thread's value of fragment column j (its 2 rows combined); op reduces the 8 lanes that hold the
/// same columns (lane % 4 fixed) in three shuffle steps, each sending half of what is left to the
/// partner lane and keeping the other half (a reduce-scatter: 56 shuffles instead of the 192 of a
/// tree per column). out[k] is the result for fragment column scatter_first_column(lane) + k.
template <class Value, class Op>
__device__ __forceinline__ void column_lanes_scatter(Value&& value, Op&& op, int lane, float (&out)[8]) {
  float v[32];
  const bool up4 = lane & 4, up8 = lane & 8, up16 = lane & 16;
#pragma unroll
  for (int k = 0; k < 32; ++k) {
    const float a = value(k), b = value(k + 32);
    v[k] = op(up4 ? b : a, __shfl_xor_sync(0xffffffffu, up4 ? a : b, 4));
  }
#pragma unroll
  for (int k = 0; k < 16; ++k)
    v[k] = op(up8 ? v[k + 16] : v[k], __shfl_xor_sync(0xffffffffu, up8 ? v[k] : v[k + 16], 8));
#pragma unroll
  for (int k = 0; k < 8; ++k)
    out[k] = op(up16 ? v[k + 8] : v[k], __shfl_xor_sync(0xffffffffu, up16 ? v[k] : v[k + 8], 16));
}

/// The first of the 8 fragment columns whose results column_lanes_scatter leaves in `lane`.
__device__ __forceinline__ int scatter_first_column(int lane) {
  return 32 * ((lane >> 2) & 1) + 16 * ((lane >> 3) & 1) + 8 * ((lane >> 4) & 1);
}

__device__ __forceinline__ float add(float a, float b) { return a + b; }

/// 1 when any consumer thread passes true (one flag word per warp in `flags`, which must not be
/// reused before the next consumer_sync).
__device__ __forceinline__ bool consumers_any(bool pred, int* flags, int consumer_thread) {
  const unsigned any = __any_sync(0xffffffffu, pred);
  if ((consumer_thread & 31) == 0) flags[consumer_thread >> 5] = int(any);
  consumer_sync();
  int all = 0;
#pragma unroll
  for (int w = 0; w < CONSUMER_THREADS / 32; ++w) all |= flags[w];
  return all != 0;
}

}  // namespace tlse::hopper
