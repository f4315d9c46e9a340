#pragma once
// The training step on the Hopper kernels (plan: hopper_step_plan.hpp): cross-entropy's row LSEs
// and gradients in 3 products instead of the 4 of a forward and the fused backward. Per chunk of
// rows, in order:
//   1. tlse_hop_lse_forward sweeps the chunk against every column, gives the row LSE states and
//      keeps the exponentials (fp16 2^15 exp(x - m) by row, m a max per row and part of a tile);
//   2. exponentials_to_gradient_kernel merges each row's states into its LSE and turns the row's
//      exponentials into G = scale * dL/dx (bf16) in place;
//   3. dA_chunk = G B (tlse_hop_product): complete, written to the chunk's gradient rows;
//   4. dB (+)= G^T A_chunk: written, or summed over the chunks in an fp32 accumulator.
// Fixed order, fixed-order sums, no atomics: bitwise reproducible. No gradient filtering (every
// entry of G is computed anyway) and the columns in their stored order.
#if defined(TLSE_HAVE_HOPPER)
#include <cuda_fp16.h>

#include <tlse/backends/cuda/hopper_backward.hpp>
#include <tlse/backends/cuda/hopper_step_plan.hpp>
#include <tlse/impl/step_request.hpp>

namespace tlse::impl::cuda {

/// A block per row p of the chunk (row id `id[first + p]`, or first + p): its LSE l from the
/// forward's `splits` states (max[s][p], sum[s][p]) to lse[id], then its exponentials e = 2^15
/// exp(x - m) (fp16; m = tile_max[p][4 tile + (j mod 8) / 2], tlse_hopper.h) in place into
/// G = scale * (g e 2^-15 exp(m - l) - [j == target] w) * dx/dz, g = coef (1 + 2 z lse), w = coef,
/// in T (scale and dx/dz from the logit model the forward used). The target's own term takes its
/// logit from target_logit[first + p] (the loss's, by position): e does not tell a masked target
/// (no term) from one far below the tile's max, nor give dx/dz where e underflows. Other entries
/// take dx/dz at m + log(e 2^-15) under a softcap (e = 0: no term); without one it is 1.
template <class T>
__global__ void exponentials_to_gradient_kernel(void* exps, index_t ld, const float* tile_max, index_t ld_tile_max,
                                                const float* max, const float* sum, int splits, index_t chunk_rows,
                                                index_t first, const int* id_of, index_t cols, const int* target,
                                                const float* target_logit, const float* coef, float z_loss,
                                                const LogitModel<T, float> model, float* lse) {
  static_assert(sizeof(T) == 2, "G is stored in a 16-bit type");
  const index_t p = blockIdx.x;
  const index_t id = id_of ? index_t(id_of[first + p]) : first + p;
  const index_t t = index_t(target[id]);
  __shared__ float row_lse;
  if (threadIdx.x == 0) {
    LseState<float> s;
    for (int k = 0; k < splits; ++k) s.merge(max[k * chunk_rows + p], sum[k * chunk_rows + p]);
    row_lse = s.value();
    lse[id] = row_lse;
  }
  __syncthreads();
  const float x_t = t >= 0 && t < cols ? target_logit[first + p] : -infinity<float>();
  const float l = row_lse, w = coef[id], g = w * (1.f + 2.f * z_loss * l);
  const bool softcap = model.softcap > 0.f;
  const float target_dx_dz = model.dx_dz(x_t);
  struct alignas(16) Eight {
    unsigned short v[8];
  };
  const float* row_max = tile_max + p * ld_tile_max;
  Eight* row = reinterpret_cast<Eight*>(static_cast<unsigned short*>(exps) + p * ld);  // ld is a multiple of 8
  // G of the eight columns from j: its maxima m4, a pair each (a tile's columns hold whole eights),
  // per pair f = g 2^-15 exp(m - l), 0 where m = -inf (e = 0 there; no NaN from l = -inf).
  const auto gradient = [&](const Eight& in, const float4& m4, index_t j) {
    const float ms[4] = {m4.x, m4.y, m4.z, m4.w};
    float fs[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) fs[q] = ms[q] == -infinity<float>() ? 0.f : g * 0x1p-15f * expf(ms[q] - l);
    Eight out;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const float m = ms[k / 2], f = fs[k / 2];
      const float e = __half2float(__ushort_as_half(in.v[k]));
      float dz;
      if (j + k == t)
        dz = x_t == -infinity<float>() ? 0.f : (e * f - w) * target_dx_dz;
      else if (j + k >= cols || e == 0.f)
        dz = 0.f;
      else
        dz = e * f * (softcap ? model.dx_dz(m + logf(e * 0x1p-15f)) : 1.f);
      const T gv = from_acc<T>(dz * model.scale);
      out.v[k] = reinterpret_cast<const unsigned short&>(gv);
    }
    return out;
  };
  // IN_FLIGHT eights per thread are loaded before any is written back: the stores go to the same
  // row, so the compiler kept one load in flight otherwise (ncu, N=8192, two H100s of 2026-11-26:
  // 2.22 ms before, 2.13 after, for its 4.2 GB; a shorter way for the eights of rows without
  // softcap did not change it: the pass is bound by the memory's mix of reads and writes).
  constexpr int IN_FLIGHT = 4;
  const index_t eights = (cols + 7) / 8, stride = index_t(blockDim.x);
  for (index_t first_eight = threadIdx.x; first_eight < eights; first_eight += IN_FLIGHT * stride) {
    Eight in[IN_FLIGHT];
    float4 m4[IN_FLIGHT];
#pragma unroll
    for (int u = 0; u < IN_FLIGHT; ++u) {
      const index_t eight = first_eight + u * stride;
      if (eight < eights) {
        in[u] = row[eight];
        m4[u] = *reinterpret_cast<const float4*>(row_max + 4 * (8 * eight / FusedBackwardPlan::TILE_N));
      }
    }
#pragma unroll
    for (int u = 0; u < IN_FLIGHT; ++u) {
      const index_t eight = first_eight + u * stride;
      if (eight < eights) row[eight] = gradient(in[u], m4[u], 8 * eight);
    }
  }
}

struct LseStepHopper {
  /// The plan for a shape, when the step takes it (bf16; depth a multiple of 8).
  template <class T>
  static bool plan(int device, const BackwardShape& s, StepPlan& out) {
    if (!std::is_same<T, bfloat16>::value || s.depth % 8 != 0) return false;
    out = StepPlan::make(s.rows, s.cols, s.depth, s.memory_budget, multiprocessors(device));
    return out.fits;
  }

  /// Runs the step on `stream`; false when it does not qualify (the forward and backward then run).
  static bool run(cudaStream_t stream, int device, const StepRequest<bfloat16, float>& r) {
    using T = bfloat16;
    const TileProblem<T, float>& prob = r.prob;
    const index_t R = prob.rows.count, V = prob.cols.count, D = prob.depth;
    if (r.scratch == nullptr || r.target_logit == nullptr || R <= 0 || prob.cols.index != nullptr || D % 8 != 0 ||
        reinterpret_cast<std::uintptr_t>(prob.rows.data) % 16 != 0 ||
        reinterpret_cast<std::uintptr_t>(prob.cols.data) % 16 != 0)
      return false;
    const StepPlan plan = StepPlan::make(R, V, D, r.scratch_bytes, multiprocessors(device));
    if (!plan.fits) return false;
    WorkspaceCarver carver(r.scratch + (64 - reinterpret_cast<std::uintptr_t>(r.scratch) % 64) % 64);
    const StepPlan::Buffers buf = plan.carve(carver);
    const bool several = plan.chunks() > 1;
    const int* row_index = prob.rows.index;

    for (index_t first = 0; first < R; first += plan.chunk) {
      const index_t rows = std::min(plan.chunk, R - first);
      // The chunk's rows, contiguous: in place, or gathered through the index of scored rows.
      const T* chunk = prob.rows.data + first * D;
      if (row_index) {
        gather_rows_kernel<T><<<grid_for(rows * D / 8), 256, 0, stream>>>(prob.rows.data, row_index + first, rows, D,
                                                                          reinterpret_cast<T*>(buf.chunk_rows));
        check_launch("gather_rows_kernel");
        chunk = reinterpret_cast<const T*>(buf.chunk_rows);
      }
      tlse_hop_forward_args f{};
      f.dtype = TLSE_HOP_BF16;
      f.rows = tlse_hop_side{chunk, D, rows, nullptr, nullptr, 0};
      f.cols = tlse_hop_side{prob.cols.data, D, V, nullptr, nullptr, 0};
      f.depth = D;
      f.logit = hopper_logit(prob.logit);
      f.row_max = f.row_sum = buf.partials;
      f.exponentials = buf.exponentials, f.ld_exponentials = plan.ld_exponentials, f.exponentials_max = buf.tile_max;
      f.max_col_splits = StepPlan::MAX_SWEEP_SPLITS, f.max_row_groups = 1;
      check_hopper(tlse_hop_lse_forward_plan(&f), "tlse_hop_lse_forward_plan");
      f.row_sum = buf.partials + f.col_splits * rows;
      check_hopper(tlse_hop_lse_forward(&f, stream), "tlse_hop_lse_forward (exponentials kept)");

      exponentials_to_gradient_kernel<T><<<unsigned(rows), 256, 0, stream>>>(
          buf.exponentials, plan.ld_exponentials, buf.tile_max, plan.ld_tile_max(), f.row_max, f.row_sum,
          int(f.col_splits), rows, first, row_index, V, r.target, r.target_logit, r.coef, r.z_loss, prob.logit, r.lse);
      check_launch("exponentials_to_gradient_kernel");

      if (r.grad_rows) {  // dA_chunk = G B
        tlse_hop_product_args p = product(plan, buf, plan.k_splits_rows);
        p.b = prob.cols.data, p.ldb = D, p.b_transposed = 1;
        p.M = rows, p.N = D, p.K = V;
        p.out = row_index ? static_cast<void*>(r.grad_rows) : static_cast<void*>(r.grad_rows + first * D);
        p.out_index = row_index ? row_index + first : nullptr;
        p.accumulate = r.accumulate;
        check_hopper(tlse_hop_product(&p, stream), "tlse_hop_product (rows)");
      }
      if (r.grad_cols) {  // dB (+)= G^T A_chunk
        tlse_hop_product_args p = product(plan, buf, plan.k_splits_cols);
        p.a_transposed = 1;
        p.b = chunk, p.ldb = D, p.b_transposed = 1;
        p.M = V, p.N = D, p.K = rows;
        if (several) {
          p.out_f32 = buf.acc;
          p.accumulate = first > 0;
        } else {
          p.out = r.grad_cols;
          p.accumulate = r.accumulate;
        }
        check_hopper(tlse_hop_product(&p, stream), "tlse_hop_product (columns)");
      }
    }
    if (r.grad_cols && several) {
      finish_rows_kernel<T><<<grid_for(V * D), 256, 0, stream>>>(buf.acc, V * D, r.grad_cols, r.accumulate);
      check_launch("finish_rows_kernel");
    }
    return true;
  }

 private:
  /// The arguments both products share: G (bf16 over the chunk's exponentials) as operand A, the
  /// split partials.
  static tlse_hop_product_args product(const StepPlan& plan, const StepPlan::Buffers& buf, int k_splits) {
    tlse_hop_product_args p{};
    p.dtype = TLSE_HOP_BF16;
    p.a = buf.exponentials, p.lda = plan.ldg();
    p.ldo = plan.depth;
    p.workspace = buf.k_partials;
    p.workspace_bytes = std::size_t(plan.k_partial_floats()) * sizeof(float);
    p.max_k_splits = k_splits;
    return p;
  }
};

}  // namespace tlse::impl::cuda
#endif
