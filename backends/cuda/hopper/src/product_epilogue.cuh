#pragma once
// Epilogue of the backward's products: the tile of out = A x B goes to an fp32 accumulator
// (+= across column panels), to the gradient rows in the input type (through an index, += with
// accumulate), or, when K is split, to that split's fp32 partial for split_reduce_kernel. The K
// steps of G tiles that gradient filtering removed are skipped (keep), in the mainloop's producer
// and consumers alike. A row scale multiplies each row of the tile first (the training step's
// dA = diag(c) E B, E its kept exponentials), and an output factor every row (fp16: undoes G's
// g_factor).
#include "kernel.cuh"
#include "logit_model.cuh"
#include "staged_store.cuh"

namespace tlse::hopper {

template <class T>
struct ProductParams {
  int64_t M, N;
  const uint8_t* mask;
  int64_t mask_ld;
  bool mask_of_a_transposed;
  const float* row_scale;   // by row of A x B, or nullptr
  const float* out_factor;  // one factor for every row, or nullptr
  int k_step;              // elements of K per mainloop step
  float* out_f32;
  T* out;
  const int32_t* out_index;
  int64_t ldo;
  bool accumulate;
  float* partials;      // [k split][M][N], or nullptr when K is not split
  CUtensorMap out_map;  // ProductStore::Staged: out (M x N, ldo); StagedPartials: the partials' layers
};

/// The output row that product row m goes to (through the row index of an output in the input type).
template <class T>
__device__ __forceinline__ int64_t output_row(const ProductParams<T>& p, int64_t m) {
  return p.out_f32 || !p.out_index ? m : int64_t(p.out_index[m]);
}

/// The pair at columns n, n + 1 (n even) of output row `row` as it stands, in fp32.
template <class T>
__device__ __forceinline__ float2 read_pair(const ProductParams<T>& p, int64_t row, int64_t n) {
  if (p.out_f32) return *reinterpret_cast<const float2*>(p.out_f32 + row * p.ldo + n);
  const cutlass::Array<T, 2> old = *reinterpret_cast<const cutlass::Array<T, 2>*>(p.out + row * p.ldo + n);
  return make_float2(float(old[0]), float(old[1]));
}

/// Stores v0, v1 at columns n, n + 1 of output row `row`, in the output's type.
template <class T>
__device__ __forceinline__ void store_pair(const ProductParams<T>& p, int64_t row, int64_t n, float v0, float v1) {
  if (p.out_f32) {
    *reinterpret_cast<float2*>(p.out_f32 + row * p.ldo + n) = make_float2(v0, v1);
    return;
  }
  cutlass::Array<T, 2> pair;
  pair[0] = T(v0), pair[1] = T(v1);
  *reinterpret_cast<cutlass::Array<T, 2>*>(p.out + row * p.ldo + n) = pair;
}

/// How a product's tile leaves the registers. A compile-time choice: the reduction path in the same
/// kernel as the others made ptxas spill 184 bytes of the accumulators in every product, which
/// slowed the training step's products (which never take it; docs/notes/2026-11-24.md, "A
/// regression found and fixed").
enum class ProductStore {
  Registers,       // any output, pair by pair from the registers (read-add-store with accumulate)
  InPlaceF32,      // out_f32, accumulated, K not split: the tile is added by reductions
  Staged,          // out in the input type, complete (no accumulate, index or split): through StagedStore
  StagedPartials,  // K split: the split's fp32 partial through StagedStore
};

template <class T, ProductStore Store>
struct ProductEpilogue {
  using Params = ProductParams<T>;
  static constexpr bool STAGED = Store == ProductStore::Staged || Store == ProductStore::StagedPartials;
  struct NoStaging {};
  struct SharedStorage {
    std::conditional_t<STAGED, StagedStore::Storage, NoStaging> staged;  // the tile's boxes on their way out
  };
  const Params& p;
  SharedStorage& s;

  int ct;
  float row_factor[Fragment::ROWS];  // with a row scale or factor: the factors of the thread's rows of the tile

  __device__ ProductEpilogue(const Params& params, SharedStorage& storage, int consumer_thread)
      : p(params), s(storage), ct(consumer_thread) {}

  /// Whether the K step k of output row tile m reads a G tile the gradient panel kept.
  __device__ static bool keep(const Params& p, int m, int k) {
    if (!p.mask) return true;
    const int64_t m0 = int64_t(m) * TILE_M, k0 = int64_t(k) * p.k_step;
    return p.mask_of_a_transposed ? p.mask[(k0 / TILE_M) * p.mask_ld + m0 / TILE_N] != 0
                                  : p.mask[(m0 / TILE_M) * p.mask_ld + k0 / TILE_N] != 0;
  }

  __device__ bool scaled() const { return p.row_scale || p.out_factor; }

  /// The factors of the thread's rows of row tile m (row scale times output factor), loaded
  /// before its products.
  __device__ void begin_row(const Fragment& c, const WorkUnit&, int m) {
    if (!scaled()) return;
    const float all = p.out_factor ? *p.out_factor : 1.f;
#pragma unroll
    for (int r = 0; r < Fragment::ROWS; ++r) {
      const int64_t row = int64_t(m) * TILE_M + c.row(r);
      row_factor[r] = row >= p.M ? 0.f : p.row_scale ? p.row_scale[row] * all : all;
    }
  }
  /// Before tile (m, n)'s products: the output tile an accumulating epilogue will read is
  /// brought into L2 (two consumer threads per row, 128-byte lines), so that its reads after the
  /// products wait on L2 rather than on HBM, where every CTA's epilogue lands at once.
  __device__ void prefetch(const WorkUnit&, int m, int n) {
    if (Store != ProductStore::Registers || !p.accumulate || p.partials) return;
    const int64_t row = int64_t(m) * TILE_M + ct / 2;
    const int64_t n0 = int64_t(n) * TILE_N + (ct % 2) * (TILE_N / 2);
    if (row >= p.M || n0 >= p.N) return;
    const int64_t dest = output_row(p, row);
    const char* begin = p.out_f32 ? reinterpret_cast<const char*>(p.out_f32 + dest * p.ldo + n0)
                                  : reinterpret_cast<const char*>(p.out + dest * p.ldo + n0);
    const int bytes = int((p.N - n0 < TILE_N / 2 ? p.N - n0 : TILE_N / 2) * (p.out_f32 ? sizeof(float) : sizeof(T)));
    for (int b = 0; b < bytes; b += 128) asm volatile("prefetch.global.L2 [%0];" ::"l"(begin + b));
  }
  __device__ void end_row(const Fragment&, const WorkUnit&, int) {}

  /// Columns of a row whose old values are loaded together before any of them is stored: a store
  /// may alias a later load as far as the compiler knows, so pair by pair every load would wait a
  /// full memory latency (64 round trips per tile and thread, all with the tensor cores idle).
  static constexpr int BATCH = 32;

  template <class Acc>
  __device__ void tile(Acc& acc, const Fragment& c, const WorkUnit& w, int m, int n) {
    const int64_t m0 = int64_t(m) * TILE_M, n0 = int64_t(n) * TILE_N;
    if (scaled())
#pragma unroll
      for (int r = 0; r < Fragment::ROWS; ++r)
#pragma unroll
        for (int j = 0; j < Fragment::COLS; ++j) {
          float& v = Fragment::at(acc, r, j);
          v = row_factor[r] == 0.f ? 0.f : v * row_factor[r];  // 0, not 0 x an infinite sum
        }
    if constexpr (STAGED) {
      // Each warp stages its 16 rows in shared memory and one lane stores them with TMA, which
      // clips what lies past the output (a split's partial: layer k_unit of the map). From the
      // registers, each pair's 64-bit address and bounds test made the epilogue a large share of
      // the warps' time in the training step's dC = G^T E (64 K steps per tile), with the tensor
      // cores idle meanwhile (docs/notes/2026-11-26.md, "Where the time goes, by warp-state samples").
      constexpr bool partial = Store == ProductStore::StagedPartials;
      StagedStore::put_rows<std::conditional_t<partial, float, T>, partial>(
          s.staged, ct >> 5, ct & 31, p.out_map, m, n, c, [&](int r, int j) { return Fragment::at(acc, r, j); },
          w.k_unit);
    } else if constexpr (Store == ProductStore::InPlaceF32) {
      // out_f32 += acc as red.global.add: the L2 adds, the consumers go straight back to the
      // tensor cores instead of waiting for the old values (every CTA's epilogue lands on memory
      // at once, and a read there idled the tensor cores for as long as 36 K steps per tile).
      // Deterministic: each element takes exactly one addition per launch (K splits write
      // partials instead), and old + acc is the same fp32 sum as the read-add-store it replaces.
#pragma unroll
      for (int r = 0; r < Fragment::ROWS; ++r) {
        const int64_t row = m0 + c.row(r);
        if (row >= p.M) continue;
        float* out_row = p.out_f32 + row * p.ldo;
#pragma unroll
        for (int j = 0; j < Fragment::COLS; j += 2) {
          const int64_t col = n0 + c.col(j);
          if (col >= p.N) continue;
          asm volatile("red.global.add.v2.f32 [%0], {%1, %2};" ::"l"(out_row + col), "f"(Fragment::at(acc, r, j)),
                       "f"(Fragment::at(acc, r, j + 1))
                       : "memory");
        }
      }
    } else {
#pragma unroll
      for (int r = 0; r < Fragment::ROWS; ++r) {
        const int64_t row = m0 + c.row(r);
        if (row >= p.M) continue;
        const int64_t dest = output_row(p, row);
        const bool add = p.accumulate && !p.partials;
#pragma unroll
        for (int j0 = 0; j0 < Fragment::COLS; j0 += BATCH) {
          float2 old[BATCH / 2];
#pragma unroll
          for (int b = 0; b < BATCH / 2; ++b) {
            const int64_t col = n0 + c.col(j0 + 2 * b);
            if (add && col < p.N) old[b] = read_pair(p, dest, col);
          }
#pragma unroll
          for (int b = 0; b < BATCH / 2; ++b) {
            const int j = j0 + 2 * b;
            const int64_t col = n0 + c.col(j);
            if (col >= p.N) continue;
            float v0 = Fragment::at(acc, r, j), v1 = Fragment::at(acc, r, j + 1);
            if (add) v0 += old[b].x, v1 += old[b].y;
            if (p.partials)
              *reinterpret_cast<float2*>(p.partials + (int64_t(w.k_unit) * p.M + row) * p.N + col) =
                  make_float2(v0, v1);
            else
              store_pair(p, dest, col, v0, v1);
          }
        }
      }
    }
  }
};

/// Sums the K splits' partials in order and writes each output pair (one thread per pair).
/// Launched as a dependent launch after its product.
template <class T>
__global__ void split_reduce_kernel(const __grid_constant__ ProductParams<T> p, int splits) {
  wait_for_previous_grid();
  allow_next_grid();
  const int64_t pairs = p.M * p.N / 2;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < pairs; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t m = 2 * i / p.N, n = 2 * i % p.N;
    const int64_t dest = output_row(p, m);
    const float2 old = p.accumulate ? read_pair(p, dest, n) : make_float2(0.f, 0.f);
    float v0 = 0.f, v1 = 0.f;
    for (int z = 0; z < splits; ++z) {
      const float2 v = *reinterpret_cast<const float2*>(p.partials + (int64_t(z) * p.M + m) * p.N + n);
      v0 += v.x, v1 += v.y;
    }
    store_pair(p, dest, n, v0 + old.x, v1 + old.y);
  }
}

}  // namespace tlse::hopper
