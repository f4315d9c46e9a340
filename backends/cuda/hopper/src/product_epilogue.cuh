#pragma once
// Epilogue of the backward's products: the tile of out = A x B goes to an fp32 accumulator
// (+= across column panels), to the gradient rows in the input type (through an index, += with
// accumulate), or, when K is split, to that split's fp32 partial for split_reduce_kernel. The K
// steps of G tiles that gradient filtering removed are skipped (keep), in the mainloop's producer
// and consumers alike.
#include "kernel.cuh"
#include "logit_model.cuh"

namespace tlse::hopper {

template <class T>
struct ProductParams {
  int64_t M, N;
  const uint8_t* mask;
  int64_t mask_ld;
  bool mask_of_a_transposed;
  int k_step;  // elements of K per mainloop step
  float* out_f32;
  T* out;
  const int32_t* out_index;
  int64_t ldo;
  bool accumulate;
  float* partials;  // [k split][M][N], or nullptr when K is not split
};

/// Writes v0, v1 at columns n, n + 1 of output row m (n even, N even), per the product's output mode.
template <class T>
__device__ __forceinline__ void write_pair(const ProductParams<T>& p, int64_t m, int64_t n, float v0, float v1) {
  if (p.out_f32) {
    float2* o = reinterpret_cast<float2*>(p.out_f32 + m * p.ldo + n);
    if (p.accumulate) {
      const float2 old = *o;
      v0 += old.x, v1 += old.y;
    }
    *o = make_float2(v0, v1);
    return;
  }
  const int64_t row = p.out_index ? int64_t(p.out_index[m]) : m;
  cutlass::Array<T, 2>* o = reinterpret_cast<cutlass::Array<T, 2>*>(p.out + row * p.ldo + n);
  if (p.accumulate) {
    const cutlass::Array<T, 2> old = *o;
    v0 += float(old[0]), v1 += float(old[1]);
  }
  cutlass::Array<T, 2> pair;
  pair[0] = T(v0), pair[1] = T(v1);
  *o = pair;
}

template <class T>
struct ProductEpilogue {
  using Params = ProductParams<T>;
  struct SharedStorage {};
  const Params& p;

  __device__ ProductEpilogue(const Params& params, SharedStorage&, int) : p(params) {}

  /// Whether the K step k of output row tile m reads a G tile the gradient panel kept.
  __device__ static bool keep(const Params& p, int m, int k) {
    if (!p.mask) return true;
    const int64_t m0 = int64_t(m) * TILE_M, k0 = int64_t(k) * p.k_step;
    return p.mask_of_a_transposed ? p.mask[(k0 / TILE_M) * p.mask_ld + m0 / TILE_N] != 0
                                  : p.mask[(m0 / TILE_M) * p.mask_ld + k0 / TILE_N] != 0;
  }

  __device__ void begin_row(const Fragment&, const WorkUnit&, int) {}
  __device__ void end_row(const Fragment&, const WorkUnit&, int) {}

  template <class Acc>
  __device__ void tile(Acc& acc, const Fragment& c, const WorkUnit& w, int m, int n) {
    const int64_t m0 = int64_t(m) * TILE_M, n0 = int64_t(n) * TILE_N;
#pragma unroll
    for (int r = 0; r < Fragment::ROWS; ++r) {
      const int64_t row = m0 + c.row(r);
      if (row >= p.M) continue;
#pragma unroll
      for (int j = 0; j < Fragment::COLS; j += 2) {
        const int64_t col = n0 + c.col(j);
        if (col >= p.N) continue;
        if (p.partials) {
          *reinterpret_cast<float2*>(p.partials + (int64_t(w.k_unit) * p.M + row) * p.N + col) =
              make_float2(Fragment::at(acc, r, j), Fragment::at(acc, r, j + 1));
        } else {
          write_pair(p, row, col, Fragment::at(acc, r, j), Fragment::at(acc, r, j + 1));
        }
      }
    }
  }
};

/// Sums the K splits' partials in order and writes each output pair (one thread per pair).
template <class T>
__global__ void split_reduce_kernel(const __grid_constant__ ProductParams<T> p, int splits) {
  const int64_t pairs = p.M * p.N / 2;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < pairs; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t m = 2 * i / p.N, n = 2 * i % p.N;
    float v0 = 0.f, v1 = 0.f;
    for (int z = 0; z < splits; ++z) {
      const float2 v = *reinterpret_cast<const float2*>(p.partials + (int64_t(z) * p.M + m) * p.N + n);
      v0 += v.x, v1 += v.y;
    }
    write_pair(p, m, n, v0, v1);
  }
}

}  // namespace tlse::hopper
