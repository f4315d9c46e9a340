#pragma once
// CUDA specialization of one backward pass (the gradient of the owned side) for bf16/fp16
// inputs and float in TF32 on tensor cores, and for exact float with FfmaProduct (mma/ffma_product.hpp:
// the same plan and kernels, FFMA products). The generic pass keeps a TM x depth accumulator per
// team, which does not fit on chip at depth 4096; here the pass runs over chunks of owned rows,
// each in two kernels:
//   1. the tile sweep (mma/nt_sweep.hpp) recomputes the logits of the chunk against the whole other
//      side and its epilogue turns them into G = scale * dL/dx, stored as T in a chunk buffer
//      (rows x other, bounded by chunk_budget_bytes), plus per-row partial sums for dscale/dbias;
//      With gradient filtering (CCE), a tile whose softmax entries are all below filter_eps and
//      that holds no target is not stored and is marked skipped in a per-tile mask;
//   2. grad_product_kernel multiplies G by the other side's rows (K = the other side, so each
//      output tile accumulates its whole sum in registers) and writes the gradient rows once,
//      directly or, when a chunk has too few output tiles to fill the GPU, through a fixed-order
//      split over K.
// fp16 cannot hold G as it is: entries like p / N fall below its 2^-24 floor. Each owned row of
// G is stored times a power of two that puts the row's bound (row_scale_for) at 2^14, and the
// product divides it out exactly; bf16 (float's exponent range) and float store G unscaled.
// A whole float backward wanting both gradients (LseBackwardMma::run_fused) runs one pass owning
// the rows in three products instead of two passes' four: the sweep also stores the chunk's G
// transposed, and a third kernel adds dB += G^T A_chunk (grad_product_kernel again, K the chunk's
// rows) into the columns' gradient, chunk after chunk. Float only: the sum over the chunks lies
// in the gradient itself, exact for float and too coarse for 16-bit outputs, and fp16's per-row
// scale of G would fall inside that product's K.
// No atomics: results are bitwise reproducible. Everything lives in the caller's workspace.
#include <tlse/backends/cuda/grid_stride.hpp>
#include <tlse/backends/cuda/mma/backward_plan.hpp>
#include <tlse/backends/cuda/mma/nt_sweep.hpp>
#include <tlse/impl/workspace_carver.hpp>

#include <type_traits>

namespace tlse::impl::cuda {

// The product's B tile is k-major, LDSB elements per row (mma/nt_sweep.hpp): 272 bytes for 16-bit
// inputs, conflict-free ldmatrix.trans.
constexpr int PRODUCT_SMEM_BYTES = STAGES * (BM * LDS + BK * LDSB) * 2;
static_assert(PRODUCT_SMEM_BYTES <= SWEEP_SMEM_BYTES + 1024, "both kernels fit two blocks per SM");

/// One position's softmax terms (SoftmaxTerms at an id): its share of dL/dx is g exp(x - lse),
/// minus w where the other position is its target. Same arithmetic as BackwardTiles::dlogit,
/// with the loads taken out of the per-element loop.
struct TermsAt {
  float lse = 0, g = 0, w = 0;
  int target = -1;
  /// A bound of |share| (p <= 1) for this position.
  __device__ __forceinline__ float bound() const { return fabsf(g) + fabsf(w); }
  __device__ __forceinline__ void load(const SoftmaxTerms<float>& t, index_t id) {
    if (!t.active()) return;
    lse = t.lse[id], g = t.g[id];
    if (t.target) target = t.target[id], w = t.w[id];
  }
  /// Sets `significant` where the entry survives gradient filtering (see BackwardTiles::dlogit).
  __device__ __forceinline__ float share(float x, index_t other_id, float filter_eps, bool& significant) const {
    const float p = expf(x - lse);
    significant |= !(p < filter_eps);
    if (target != other_id) return g * p;
    significant = true;
    return g * p - w;
  }
};

/// The power of two that scales a row of G whose entries are at most `bound` in magnitude to at
/// most 2^14 (headroom under fp16's 65504 for a recomputed p slightly above 1); 1 for a zero or
/// non-finite bound. Exponents are clamped so that the scale and its inverse stay normal floats.
__device__ __forceinline__ float row_scale_for(float bound) {
  if (!(bound > 0.f) || !(bound < INFINITY)) return 1.f;
  int e;
  frexpf(bound, &e);  // bound < 2^e
  const int k = 14 - e;
  return ldexpf(1.f, k < -100 ? -100 : k > 100 ? 100 : k);
}

/// The max of every thread's m over a block of whole warps (at most 1024 threads), in thread 0
/// (the others get their warp's). Every thread of the block calls it.
__device__ inline float block_max(float m) {
  __shared__ float red[32];
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = m;
  __syncthreads();
  if (threadIdx.x == 0)
    for (int i = 1; i < int(blockDim.x >> 5); ++i) m = fmaxf(m, red[i]);
  return m;
}

/// max over the other side's positions of TermsAt::bound(), into *out (one block).
template <class T>
__global__ void terms_bound_kernel(SoftmaxTerms<float> terms, Side<T> side, float* out) {
  float m = 0;
  if (terms.active())
    for (index_t x = threadIdx.x; x < side.count; x += blockDim.x) {
      TermsAt t;
      t.load(terms, side.id(x));
      m = fmaxf(m, t.bound());
    }
  m = block_max(m);
  if (threadIdx.x == 0) *out = m;
}

/// What a gradient-sweep block needs, as one __grid_constant__ parameter (see ForwardParams).
template <class T, class F>
struct GradientParams {
  F f;           // the pass (a BackwardTiles<T, float>): logit model, softmax terms, outputs
  Side<T> A, B;  // owned side, other side
  index_t a_begin = 0, a_end = 0, ldp = 0;
  int col_tiles_per_split = 1;
  T* G = nullptr;   // chunk buffer, or nullptr when no gradient rows are wanted
  T* Gt = nullptr;  // the fused backward's G^T: [other][ldt], or nullptr
  index_t ldt = 0;
  unsigned char* tile_mask = nullptr;  // [chunk row tile][column tile]: 0 where filtered; nullptr: no filtering
  int mask_ld = 0;
  float* row_scale = nullptr;          // [chunk]: scale of each stored row of G (fp16); nullptr: unscaled
  const float* other_bound = nullptr;  // max TermsAt::bound() of the other side (fp16 only)
  float* part = nullptr;      // row sums (dscale: dL/dz * dot, or dbias: dL/dz), or nullptr when neither is wanted
  bool sum_products = false;  // part sums dL/dz * dot (dscale) rather than dL/dz (dbias)
  bool plain_logits = false;  // f.prob.logit.plain(f.prob.cols): full tiles take x = scale * dot alone
};

/// Epilogue of the gradient sweep: G into the chunk buffer and the wanted row sum into the
/// block's running total. The other side's terms for the tile's 128 columns are staged in
/// shared memory once per tile, the owned side's are loaded once per row.
template <class T, class F>
struct GradientEpilogue {
  const GradientParams<T, F>& p;
  index_t row0;
  float (*red)[BM];
  TermsAt* other;  // [BN]
  float run = 0;

  __device__ __forceinline__ void column_tile(TileAccumulator& acc, int ct) {
    const WarpPosition w;
    const index_t col_base = index_t(ct) * BN;
    const bool sums = p.part != nullptr;
    const SoftmaxTerms<float>& other_terms = p.f.owner_is_row ? p.f.col_terms : p.f.row_terms;
    const bool other_on = other_terms.active();
    if (other_on) {  // the previous tile's readers are past a main-loop barrier
      if (w.tid < BN) {
        TermsAt t;
        if (col_base + w.tid < p.B.count) t.load(other_terms, p.B.id(col_base + w.tid));
        other[w.tid] = t;
      }
      __syncthreads();
    }
    bool significant = false;
    // dL/dz * scale replaces each dot product in acc; stored once the tile's fate is known.
    if (p.plain_logits && full_tile(row0, p.a_end, col_base, p.B.count))
      shares<true>(acc, ct, significant);
    else
      shares<false>(acc, ct, significant);
    // One barrier: it publishes the row sums and, when filtering, decides the tile's fate.
    bool keep = true;
    if (p.tile_mask)
      keep = __syncthreads_or(significant) != 0;
    else if (sums)
      __syncthreads();
    if (p.tile_mask && w.tid == 0) p.tile_mask[((row0 - p.a_begin) / BM) * p.mask_ld + ct] = keep;
    if (p.G && keep)
#pragma unroll
      for (int mt = 0; mt < 4; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const index_t o = row0 + w.row(mt, h);
#pragma unroll
          for (int nt = 0; nt < 4; ++nt) {
            const index_t x0 = col_base + w.col(nt, 0);
            if (o < p.a_end && x0 < p.ldp)
              store_pair(p.G, (o - p.a_begin) * p.ldp + x0, acc[mt][nt][2 * h], acc[mt][nt][2 * h + 1]);
          }
        }
    if (p.Gt && keep)  // rows of the tile past a_end hold zeros, which the product reads
#pragma unroll
      for (int mt = 0; mt < 4; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const index_t o = row0 + w.row(mt, h) - p.a_begin;
#pragma unroll
          for (int nt = 0; nt < 4; ++nt)
#pragma unroll
            for (int j = 0; j < 2; ++j) {
              const index_t x = col_base + w.col(nt, j);
              if (x < p.B.count) p.Gt[x * p.ldt + o] = from_acc<T>(acc[mt][nt][2 * h + j]);
            }
        }
    if (sums && w.tid < BM) run += column_warp_sum(red, w.tid);
  }

  /// acc: dot products -> dL/dz * scale (times the row's scale for fp16), the row sums into red.
  /// Plain: a full tile under a plain logit model, whose logit is scale * dot with no edge, mask,
  /// bias or softcap to test per entry (the per-entry model's branches dominated the epilogue).
  template <bool Plain>
  __device__ __forceinline__ void shares(TileAccumulator& acc, int ct, bool& significant) {
    const WarpPosition w;
    const index_t col_base = index_t(ct) * BN;
    const float scale = p.f.prob.logit.scale;
    const bool sums = p.part != nullptr, by_row = p.f.owner_is_row;
    const SoftmaxTerms<float>& own_terms = by_row ? p.f.row_terms : p.f.col_terms;
    const bool own_on = own_terms.active(), other_on = (by_row ? p.f.col_terms : p.f.row_terms).active();
    const float eps = p.tile_mask ? p.f.filter_eps : 0.f;
#pragma unroll
    for (int mt = 0; mt < 4; ++mt)
    #pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r_local = w.row(mt, h);
        const index_t o = row0 + r_local;
        const bool o_ok = o < p.a_end;
        const index_t oid = o_ok ? p.A.id(o) : 0;
        TermsAt own;
        if (o_ok) own.load(own_terms, oid);
        float g_scale = scale;
        if (p.row_scale) {
          const float rs = row_scale_for(fabsf(scale) * (own.bound() + *p.other_bound));
          g_scale *= rs;
          if (o_ok && ct == 0 && w.wn == 0 && (w.lane & 3) == 0) p.row_scale[o - p.a_begin] = rs;
        }
        float sum = 0;
      #pragma unroll
        for (int nt = 0; nt < 4; ++nt)
        #pragma unroll
          for (int j = 0; j < 2; ++j) {
            const index_t x = col_base + w.col(nt, j);
            float& v = acc[mt][nt][2 * h + j];
            const float dot = v;
            float dz = 0;
            if (Plain || (o_ok && x < p.B.count)) {
              const index_t xid = p.B.id(x);
              const float lx = Plain ? scale * dot : p.f.prob.logit(dot, by_row ? oid : xid, by_row ? xid : oid);
              if (lx != -infinity<float>()) {
                float share = own_on ? own.share(lx, xid, eps, significant) : 0.f;
                if (other_on) share += other[w.col(nt, j)].share(lx, oid, eps, significant);
                dz = Plain ? share : share * p.f.prob.logit.dx_dz(lx);
              }
              sum += p.sum_products ? dz * dot : dz;
            }
            v = dz * g_scale;
          }
        if (sums) {
          sum = quad_sum(sum);
          if ((w.lane & 3) == 0) red[w.wn][r_local] = sum;
        }
      }
  }
};

/// Block (x, y): owned rows [a_begin + 128 x, + 128) against the other side's column tiles of
/// split y. Row sums go to part[y * chunk + row - a_begin].
template <class T, class F, class Product>
__global__ void __launch_bounds__(THREADS, 2) gradient_sweep_kernel(const __grid_constant__ GradientParams<T, F> p) {
  extern __shared__ uint4 smem_raw[];
  __shared__ float red[4][BM];
  __shared__ TermsAt other[BN];  // red and other: 4 KiB, so that two blocks still fit an SM
  const index_t row0 = p.a_begin + index_t(blockIdx.x) * BM, chunk = p.a_end - p.a_begin;
  const int total_ct = int((p.B.count + BN - 1) / BN);
  const int ct_begin = blockIdx.y * p.col_tiles_per_split;
  const int ct_end = ct_begin + p.col_tiles_per_split < total_ct ? ct_begin + p.col_tiles_per_split : total_ct;
  GradientEpilogue<T, F> epi{p, row0, red, other};
  nt_sweep<T, GradientEpilogue<T, F>, Product>(p.A, p.B, p.f.prob.depth, row0, p.a_end, ct_begin, ct_end,
                                               reinterpret_cast<std::uint16_t*>(smem_raw), epi);
  const int tid = threadIdx.x;
  if (p.part && tid < BM && row0 + tid < p.a_end)
    p.part[index_t(blockIdx.y) * chunk + row0 + tid - p.a_begin] = epi.run;
}

/// What a gradient-product block needs (grad_product_kernel), as one __grid_constant__ parameter.
template <class T>
struct ProductParams {
  const T* G = nullptr;  // rows x K, row-major with stride ldg, zero from K up to ldg
  index_t ldg = 0, rows = 0;
  Side<T> X;  // K = X.count rows of depth D, row k at X.id(k)
  index_t D = 0;
  int k_tiles_per_split = 1;
  // Kept K steps: tile_mask[m tile * mask_m + k tile * mask_k] (128 x 128 tiles of G) is 0 where
  // the sweep filtered the tile out; nullptr: every step.
  const unsigned char* tile_mask = nullptr;
  index_t mask_m = 0, mask_k = 0;
  const float* row_scale = nullptr;  // [rows]: the scale of each stored row of G (fp16), or nullptr
  Side<T> own;                       // output row m is the gradient row own.id(a_begin + m)
  index_t a_begin = 0;
  T* grad = nullptr;
  bool accumulate = false;  // grad += result
  float* part = nullptr;    // [K split][rows][D], with gridDim.z > 1
};

/// out = G X: 128 x 128 output tiles over depth D, K consumed 128 bytes at a time through the
/// same 3-stage cp.async pipeline as the sweep; X's tile is stored k-major (Product::stage_nn
/// reads it). gridDim.z == 1: writes the gradient rows (+= with accumulate); otherwise split z of
/// K writes its fp32 partial to part[z][m][n] for gradient_reduce_kernel. K steps whose G tile
/// the sweep filtered out are skipped: they hold no stored values.
template <class T, class Product>
__global__ void __launch_bounds__(THREADS, 2) grad_product_kernel(const __grid_constant__ ProductParams<T> p) {
  extern __shared__ uint4 smem_raw[];
  auto* smem = reinterpret_cast<std::uint16_t*>(smem_raw);
  const WarpPosition w;
  const index_t m0 = index_t(blockIdx.x) * BM, n0 = index_t(blockIdx.y) * BN, nx = p.X.count, D = p.D;
  constexpr int BKT = depth_per_stage<T>, EPC = per_16_bytes<T>, HALVES = int(sizeof(T)) / 2;
  constexpr int B_CHUNKS_PER_ROW = BN / EPC;
  const int total_kt = int((nx + BKT - 1) / BKT);
  const int kt_begin = blockIdx.z * p.k_tiles_per_split;
  const int kt_end = kt_begin + p.k_tiles_per_split < total_kt ? kt_begin + p.k_tiles_per_split : total_kt;
  const unsigned char* kept = p.tile_mask ? p.tile_mask + blockIdx.x * p.mask_m : nullptr;
  const auto next_kept = [&](int kt) {  // the first K step at or after kt that the sweep kept
    while (kt < kt_end && kept && !kept[(kt * BKT / BN) * p.mask_k]) ++kt;
    return kt;
  };
  constexpr int STAGE = BM * LDS + BK * LDSB;  // the same in halves for either element size
  constexpr int LDSB_T = LDSB * HALVES;        // B row stride in halves: BKT rows of BN + 8 elements

  auto load = [&](int kt, int stage) {
    const index_t k0 = index_t(kt) * BKT;
    std::uint16_t* sa = smem + stage * STAGE;
    std::uint16_t* sb = sa + BM * LDS;
  #pragma unroll
    for (int i = 0; i < CHUNKS; ++i) {
      const int c = w.tid + i * THREADS;
      const int ar = c / (BK / 8), ah = (c % (BK / 8)) * 8, ak = (c % (BK / 8)) * EPC;  // G: 128 rows x BKT k
      // A chunk that starts before K ends reads G's zeros past it (ldg >= K rounded up to 8).
      const bool a_ok = m0 + ar < p.rows && k0 + ak < nx;
      cp_async16(smem_address(sa + ar * LDS + ah), a_ok ? p.G + (m0 + ar) * p.ldg + k0 + ak : p.G, a_ok ? 16 : 0);
      const int bk = c / B_CHUNKS_PER_ROW, bn = (c % B_CHUNKS_PER_ROW) * EPC;  // X: BKT k x 128 n
      const bool b_ok = k0 + bk < nx && n0 + bn < D;
      cp_async16(smem_address(sb + bk * LDSB_T + bn * HALVES),
                 b_ok ? p.X.data + p.X.id(k0 + bk) * D + n0 + bn : p.X.data, b_ok ? 16 : 0);
    }
  };

  TileAccumulator acc;
  clear(acc);
  // Loads are issued in K order, one per commit group, `issued` so far; step `it` computes the
  // it-th kept K step, which the wait below guarantees has landed (as in nt_sweep).
  int next = next_kept(kt_begin), issued = 0;
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (next < kt_end) load(next, s), next = next_kept(next + 1), ++issued;
    cp_async_commit();
  }
  for (int it = 0; it < issued; ++it) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();
    if (next < kt_end) load(next, issued % STAGES), next = next_kept(next + 1), ++issued;
    cp_async_commit();
    const std::uint16_t* sa = smem + (it % STAGES) * STAGE;
    Product::stage_nn(acc, sa, sa + BM * LDS, w);
  }
  cp_async_wait<0>();

#pragma unroll
  for (int mt = 0; mt < 4; ++mt)
  #pragma unroll
    for (int h = 0; h < 2; ++h) {
      const index_t m = m0 + w.row(mt, h);
      if (m >= p.rows) continue;
      const float unscale = p.row_scale ? 1.f / p.row_scale[m] : 1.f;  // a power of two: exact
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        const index_t n = n0 + w.col(nt, 0);  // even, and D % 8 == 0: n + 1 < D too
        if (n >= D) continue;
        float v0 = acc[mt][nt][2 * h] * unscale, v1 = acc[mt][nt][2 * h + 1] * unscale;
        if (gridDim.z > 1) {
          *reinterpret_cast<float2*>(p.part + (index_t(blockIdx.z) * p.rows + m) * D + n) = make_float2(v0, v1);
          continue;
        }
        T* out = p.grad + p.own.id(p.a_begin + m) * D + n;
        if (p.accumulate) v0 += to_acc<float>(out[0]), v1 += to_acc<float>(out[1]);
        out[0] = from_acc<T>(v0), out[1] = from_acc<T>(v1);
      }
    }
}

/// Sums the K splits of grad_product_kernel in order and writes the gradient rows.
template <class T>
__global__ void gradient_reduce_kernel(const float* part, int splits, index_t chunk, index_t D, Side<T> own,
                                       index_t a_begin, T* grad, bool accumulate) {
  for_each_index(chunk * D, [&](index_t i) {
    float v = 0;
    for (int z = 0; z < splits; ++z) v += part[z * chunk * D + i];
    T& out = grad[own.id(a_begin + i / D) * D + i % D];
    out = from_acc<T>(accumulate ? v + to_acc<float>(out) : v);
  });
}

/// Sums the sweep splits' row sums in order into dscale_part[a_begin + m] (by position) or
/// dbias[own.id(a_begin + m)] (by id, += with accumulate), whichever is not null.
template <class T>
__global__ void row_sums_reduce_kernel(const float* part, int splits, index_t chunk, Side<T> own, index_t a_begin,
                                       float* dscale_part, T* dbias, bool accumulate) {
  for_each_index(chunk, [&](index_t m) {
    float sum = 0;
    for (int y = 0; y < splits; ++y) sum += part[y * chunk + m];
    if (dscale_part) dscale_part[a_begin + m] = sum;
    if (dbias) {
      T& out = dbias[own.id(a_begin + m)];
      out = from_acc<T>(accumulate ? sum + to_acc<float>(out) : sum);
    }
  });
}

/// The rows [first, first + n) of a side, as a side of their own.
template <class T>
Side<T> side_part(const Side<T>& s, index_t first, index_t n, index_t depth) {
  Side<T> part;
  part.data = s.index ? s.data : s.data + first * depth;
  part.index = s.index ? s.index + first : nullptr;
  part.count = n;
  part.stored = s.index ? s.stored : n;
  return part;
}

struct LseBackwardMma {
  template <class T, class Product = TensorCoreProduct<T>>
  static bool applies(const TileProblem<T, float>& prob) {
    return sweep_applies<T, Product>(prob);
  }

  /// Scratch one pass needs (owned x other rows, depth, T of elem_bytes).
  static std::size_t scratch_bytes(int device, index_t owned, index_t other, index_t depth, index_t elem_bytes) {
    if (owned == 0 || other == 0 || depth == 0) return 0;
    return BackwardPlan::make(owned, other, depth, multiprocessors(device), elem_bytes).bytes(depth);
  }

  /// Scratch of the fused backward (run_fused) for float inputs of the shape within its budget;
  /// 0 where not even one row tile fits.
  static std::size_t fused_scratch_bytes(int device, index_t rows, index_t cols, index_t depth, std::size_t budget) {
    if (rows <= 0 || cols <= 0 || depth <= 0) return 0;
    const BackwardPlan plan = BackwardPlan::fused(rows, cols, depth, multiprocessors(device), sizeof(float), budget);
    return plan.chunk > 0 ? plan.bytes(depth) : 0;
  }

  /// Runs the pass described by f (a BackwardTiles<T, float>) on `stream` with Product's
  /// arithmetic; false when the problem does not qualify or the scratch is too small (the caller
  /// then runs the generic pass).
  template <class T, class Product = TensorCoreProduct<T>, class F>
  static bool run(cudaStream_t stream, int device, const F& f, char* scratch, std::size_t scratch_bytes) {
    // One row sum per pass at most (dscale for the contrastive row pass, dbias for the
    // cross-entropy column pass); a pass wanting both is left to the generic kernel.
    if (!applies<T, Product>(f.prob) || (f.dscale_part && f.dbias)) return false;
    const Side<T>& own = f.owner_is_row ? f.prob.rows : f.prob.cols;
    const Side<T>& other = f.owner_is_row ? f.prob.cols : f.prob.rows;
    const index_t D = f.prob.depth;
    const BackwardPlan plan = BackwardPlan::make(own.count, other.count, D, multiprocessors(device), sizeof(T));
    if (scratch == nullptr || scratch_bytes < plan.bytes(D)) return false;
    run_chunks<T, Product>(stream, plan, f, aligned_base(scratch), OtherGradient<T>{});
    return true;
  }

  /// Runs a whole backward of float inputs that wants both gradients (and maybe dscale) as one
  /// pass owning the rows, whose sweep also feeds dB = G^T A (the top of this file), with the plan
  /// the scratch holds: the one fused_scratch_bytes sized for the call's budget. f is the row pass
  /// (a BackwardTiles<float, float> with grad set, no dbias), grad_cols the columns' gradient (by
  /// id, added into with f.accumulate). False where the problem does not qualify or not even one
  /// row tile fits the scratch; the passes then run.
  template <class Product, class F>
  static bool run_fused(cudaStream_t stream, int device, const F& f, float* grad_cols) {
    if (!applies<float, Product>(f.prob) || !f.owner_is_row || f.grad == nullptr || grad_cols == nullptr ||
        f.dbias != nullptr || f.scratch == nullptr)
      return false;
    const index_t D = f.prob.depth;
    const BackwardPlan plan = BackwardPlan::fused(f.prob.rows.count, f.prob.cols.count, D, multiprocessors(device),
                                                  sizeof(float), f.scratch_bytes);
    if (plan.chunk == 0) return false;
    run_chunks<float, Product>(stream, plan, f, aligned_base(f.scratch), OtherGradient<float>{grad_cols, f.accumulate});
    return true;
  }

 private:
  /// The other side's gradient, when the fused backward adds it chunk after chunk (grad != nullptr).
  template <class T>
  struct OtherGradient {
    T* grad = nullptr;
    bool accumulate = false;  // the first chunk adds too
  };

  template <class T, class Product, class F>
  static void run_chunks(cudaStream_t stream, const BackwardPlan& plan, const F& f, char* base,
                         const OtherGradient<T>& other_grad) {
    static const bool configured =
        (raise_smem_limit(gradient_sweep_kernel<T, F, Product>, SWEEP_SMEM_BYTES, "gradient_sweep_kernel"),
         raise_smem_limit(grad_product_kernel<T, Product>, PRODUCT_SMEM_BYTES, "grad_product_kernel"), true);
    (void)configured;
    const Side<T>& own = f.owner_is_row ? f.prob.rows : f.prob.cols;
    const Side<T>& other = f.owner_is_row ? f.prob.cols : f.prob.rows;
    const index_t D = f.prob.depth;
    WorkspaceCarver carver(base);
    const BackwardPlan::Buffers buf = plan.carve(carver, D);
    const bool sums = f.dscale_part != nullptr || f.dbias != nullptr;
    const bool filter = f.grad != nullptr && f.filter_eps > 0;
    const bool scaled = std::is_same<T, float16>::value;
    if (scaled) {
      terms_bound_kernel<T><<<1, 1024, 0, stream>>>(f.owner_is_row ? f.col_terms : f.row_terms, other, buf.other_bound);
      check_launch("terms_bound_kernel");
    }
    for (index_t a_begin = 0; a_begin < own.count; a_begin += plan.chunk) {
      const index_t a_end = std::min(own.count, a_begin + plan.chunk), chunk = a_end - a_begin;
      const index_t row_tiles = (chunk + BM - 1) / BM;
      GradientParams<T, F> params{f, own, other};
      params.a_begin = a_begin, params.a_end = a_end, params.ldp = plan.ldp;
      params.col_tiles_per_split = plan.col_tiles_per_split;
      params.G = f.grad ? reinterpret_cast<T*>(buf.G) : nullptr;
      params.Gt = other_grad.grad ? reinterpret_cast<T*>(buf.Gt) : nullptr;
      params.ldt = plan.ldt;
      params.tile_mask = filter ? buf.tile_mask : nullptr;
      params.mask_ld = int(plan.col_tiles);
      params.row_scale = scaled ? buf.row_scale : nullptr;
      params.other_bound = buf.other_bound;
      params.part = sums ? buf.row_sums : nullptr;
      params.sum_products = f.dscale_part != nullptr;
      params.plain_logits = f.prob.logit.plain(f.prob.cols);
      gradient_sweep_kernel<T, F, Product>
          <<<dim3(unsigned(row_tiles), unsigned(plan.sweep_splits)), THREADS, SWEEP_SMEM_BYTES, stream>>>(params);
      check_launch("gradient_sweep_kernel");
      if (sums) {
        row_sums_reduce_kernel<T><<<grid_for(chunk), 256, 0, stream>>>(buf.row_sums, plan.sweep_splits, chunk, own,
                                                                       a_begin, f.dscale_part, f.dbias, f.accumulate);
        check_launch("row_sums_reduce_kernel");
      }
      if (!f.grad) continue;
      ProductParams<T> own_product;  // dA_chunk = G B
      own_product.G = reinterpret_cast<const T*>(buf.G), own_product.ldg = plan.ldp, own_product.rows = chunk;
      own_product.X = other, own_product.D = D, own_product.k_tiles_per_split = plan.k_tiles_per_split;
      own_product.tile_mask = params.tile_mask, own_product.mask_m = plan.col_tiles, own_product.mask_k = 1;
      own_product.row_scale = params.row_scale;
      own_product.own = own, own_product.a_begin = a_begin;
      own_product.grad = f.grad, own_product.accumulate = f.accumulate, own_product.part = buf.part;
      const dim3 grid(unsigned(row_tiles), unsigned((D + BN - 1) / BN), unsigned(plan.k_splits));
      grad_product_kernel<T, Product><<<grid, THREADS, PRODUCT_SMEM_BYTES, stream>>>(own_product);
      check_launch("grad_product_kernel");
      if (plan.k_splits > 1) {
        gradient_reduce_kernel<T><<<grid_for(chunk * D), 256, 0, stream>>>(buf.part, plan.k_splits, chunk, D, own,
                                                                           a_begin, f.grad, f.accumulate);
        check_launch("gradient_reduce_kernel");
      }
      if (!other_grad.grad) continue;
      ProductParams<T> other_product;  // dB (+)= G^T A_chunk, one K split: the other side has the tiles
      other_product.G = reinterpret_cast<const T*>(buf.Gt), other_product.ldg = plan.ldt;
      other_product.rows = other.count;
      other_product.X = side_part(own, a_begin, chunk, D), other_product.D = D;
      other_product.k_tiles_per_split = int((chunk + depth_per_stage<T> - 1) / depth_per_stage<T>);
      other_product.tile_mask = params.tile_mask, other_product.mask_m = 1, other_product.mask_k = plan.col_tiles;
      other_product.own = other, other_product.a_begin = 0;
      other_product.grad = other_grad.grad, other_product.accumulate = other_grad.accumulate || a_begin > 0;
      const dim3 other_grid(unsigned(plan.col_tiles), unsigned((D + BN - 1) / BN), 1);
      grad_product_kernel<T, Product><<<other_grid, THREADS, PRODUCT_SMEM_BYTES, stream>>>(other_product);
      check_launch("grad_product_kernel");
    }
  }
};

}  // namespace tlse::impl::cuda
