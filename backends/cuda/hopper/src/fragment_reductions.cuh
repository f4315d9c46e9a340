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

__device__ __forceinline__ float column_lanes_sum(float v) {
#pragma unroll
  for (int o = 4; o <= 16; o <<= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float column_lanes_max(float v) {
#pragma unroll
  for (int o = 4; o <= 16; o <<= 1) v = nan_max(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

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
