#pragma once
// The elementwise kernels beside the tensor-core ones (gathers, sums over splits, conversions):
// the host sizes their grid with grid_for, which caps the blocks, and each thread walks its items
// by the grid's stride with for_each_index, so that one launch covers any count (a grid of one
// thread per item would stop at 65535 x 256 = 16.7M items under the cap).
#include <tlse/impl/tile_problem.hpp>

#include <cuda_runtime.h>

#include <algorithm>

namespace tlse::impl::cuda {

/// Blocks of `threads` threads for `work` items: one item per thread, at least 1 block and at
/// most 65535 (enough to fill any GPU many times over; for_each_index takes the items past them).
inline unsigned grid_for(index_t work, int threads = 256) {
  return unsigned(std::max<index_t>(1, std::min<index_t>((work + threads - 1) / threads, 65535)));
}

/// Calls f(i) for each of this thread's items among [0, n): its index in the grid, then every
/// gridDim.x * blockDim.x past it.
template <class F>
__device__ inline void for_each_index(index_t n, F&& f) {
  const index_t stride = index_t(gridDim.x) * blockDim.x;
  for (index_t i = index_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) f(i);
}

}  // namespace tlse::impl::cuda
