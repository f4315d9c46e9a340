#pragma once
// The training step on the Hopper kernels (plan: hopper/step_plan.hpp): cross-entropy's row LSEs
// and gradients in 3 products instead of the 4 of a forward and the fused backward. Per chunk of
// rows, in order:
//   1. tlse_hop_lse_forward sweeps the chunk against every column, gives the row LSE states and
//      keeps the exponentials (exp(x - s) by row in the input type: bf16 with s the row's target
//      logit where the row's logits lie within 64 above it, else a max per row and part of a
//      tile; fp16 with s a multiple of ln 2 per row and part, tlse_hopper.h);
//   2. exponentials_to_gradient_kernel merges each row's states into its LSE. Without a softcap,
//      G = scale * dL/dx is diag(c) E' with E' the exponentials but for the target's entry: the
//      kernel writes that entry, c, and the chunk's rows times c (A'), and touches the other
//      exponentials only in a row with a part under its own max (bf16), or rescales every part
//      by a power of two (fp16). With a softcap it turns the exponentials into G in place;
//   3. dA_chunk = G B = diag(c) (E' B) (tlse_hop_product, c its row scale): complete, written to
//      the chunk's gradient rows;
//   4. dB (+)= G^T A_chunk = E'^T A': written, or summed over the chunks in an fp32 accumulator.
// Under a budget that holds no chunk, or only several chunks whose accumulator costs more than
// recomputing a part of the columns (kept_columns_first), the same kernels keep the exponentials
// of a part of the columns in the caller's dB, and past it in the workspace, instead
// (run_kept_columns). Fixed order, fixed-order sums, no atomics: bitwise reproducible. No
// gradient filtering (every entry of G is computed anyway) and the columns in their stored order.
// fp16, as in the fused backward (hopper/backward.hpp): entries like p / N fall below its range,
// so G, or A' where G = diag(c) E', is stored times one power of two for the chunk (half of
// row_scale_for of the rows' term bounds, from their LSEs: row_bound_kernel, step_factor_kernel),
// and the products that read it multiply their output by the inverse, exactly. E' itself needs
// none: the kernel puts it at most 2^15 with its fp32 row factor c.
// The row kernels (step 2, fp16's factor, the target logits by row): hopper/step_kernels.hpp.
#if defined(TLSE_HAVE_HOPPER)
#include <tlse/backends/cuda/hopper/backward.hpp>
#include <tlse/backends/cuda/hopper/step_kernels.hpp>
#include <tlse/backends/cuda/hopper/step_plan.hpp>
#include <tlse/impl/step_request.hpp>

namespace tlse::impl::cuda {

struct LseStepHopper {
  /// Whether the step takes inputs of type T: bf16 or fp16.
  template <class T>
  static constexpr bool takes = std::is_same<T, bfloat16>::value || std::is_same<T, float16>::value;
  /// Whether G (and A') are stored times a factor: fp16, as in the fused backward.
  template <class T>
  static constexpr bool scaled = LseBackwardHopper::scaled<T>;

  /// The workspace of the step for a shape, 0 when the step does not take it (takes<T>; depth a
  /// multiple of 8): chunks of rows (StepPlan) or, for a call that does not add into its
  /// gradients, the kept columns (KeptColumnsPlan), as kept_columns_first chooses.
  template <class T>
  static std::size_t scratch_bytes(int device, const BackwardShape& s) {
    if (!takes<T> || s.depth % 8 != 0) return 0;
    const int sms = multiprocessors(device);
    const StepPlan chunks = StepPlan::make(s.rows, s.cols, s.depth, s.memory_budget, sms);
    if (chunks.fits && chunks.chunks() == 1) return chunks.bytes;
    const KeptColumnsPlan kept =
        s.accumulate ? KeptColumnsPlan{} : KeptColumnsPlan::make(s.rows, s.cols, s.depth, s.memory_budget, sms);
    if (kept_columns_first(chunks, kept)) return kept.bytes;
    return chunks.fits ? chunks.bytes : 0;
  }

  /// Runs the step on `stream`; false when it does not qualify (the forward and backward then run).
  template <class T>
  static bool run(cudaStream_t stream, int device, const StepRequest<T, float>& r) {
    static_assert(takes<T>, "the step takes bf16 or fp16");
    const TileProblem<T, float>& prob = r.prob;
    const index_t R = prob.rows.count, V = prob.cols.count, D = prob.depth;
    if (r.scratch == nullptr || r.target_logit == nullptr || R <= 0 || prob.cols.index != nullptr || D % 8 != 0 ||
        reinterpret_cast<std::uintptr_t>(prob.rows.data) % 16 != 0 ||
        reinterpret_cast<std::uintptr_t>(prob.cols.data) % 16 != 0)
      return false;
    const StepPlan chunks = StepPlan::make(R, V, D, r.scratch_bytes, multiprocessors(device));
    if (chunks.fits && chunks.chunks() == 1) return run_chunks(stream, chunks, r);
    if (run_kept_columns(stream, device, r, chunks)) return true;
    return chunks.fits && run_chunks(stream, chunks, r);
  }

 private:
  /// Per chunk of rows: the steps at the top of this file.
  template <class T>
  static bool run_chunks(cudaStream_t stream, const StepPlan& plan, const StepRequest<T, float>& r) {
    const TileProblem<T, float>& prob = r.prob;
    const index_t R = prob.rows.count, V = prob.cols.count, D = prob.depth;
    WorkspaceCarver carver(aligned_base(r.scratch));
    const StepPlan::Buffers buf = plan.carve(carver);
    const KeptLayout kept{buf.exponentials, plan.ld_exponentials};  // every chunk's, in turn
    const bool several = plan.chunks() > 1;
    // Without a softcap dL/dz is the exponential's multiple: G = diag(c) E' (the kernel's comment).
    const bool factored = !(prob.logit.softcap > 0.f);
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
      // The row shift: a logit of the row, at most its LSE.
      const tlse_hop_forward_args f =
          forward_keeping(stream, prob, chunk, rows, kept, 0, buf.shifts, r.target_logit + first, buf.partials);
      if constexpr (scaled<T>) step_factor(stream, f, rows, first, row_index, r, buf.row_scale, buf.factor);

      const auto to_gradient =
          factored ? &exponentials_to_gradient_kernel<T, true> : &exponentials_to_gradient_kernel<T, false>;
      T* scaled_rows = factored && r.grad_cols ? reinterpret_cast<T*>(buf.chunk_rows) : nullptr;
      ToGradientParams<T> params;
      params.chunk = chunk_rows(f, rows, first, row_index);
      params.kept = kept, params.shift = buf.shifts, params.ld_shift = plan.ld_shifts(), params.cols = V;
      params.target = r.target, params.target_logit = r.target_logit, params.coef = r.coef;
      params.model = prob.logit, params.factor = buf.factor;
      params.lse = r.lse, params.row_scale = buf.row_scale;
      params.rows = chunk, params.scaled_rows = scaled_rows, params.depth = D;
      to_gradient<<<unsigned(rows), 256, 0, stream>>>(params);
      check_launch("exponentials_to_gradient_kernel");

      if (r.grad_rows) {  // dA_chunk = G B: diag(c) (E' B) exactly, or G B with G stored times the factor
        tlse_hop_product_args p =
            exponentials_product<T>(buf.exponentials, plan.ldg(), D, buf.k_partials, plan.k_partial_floats(),
                                    plan.k_splits_rows, factored ? nullptr : buf.factor);
        p.row_scale = factored ? buf.row_scale : nullptr;
        p.b = prob.cols.data, p.ldb = D, p.b_transposed = 1;
        p.M = rows, p.N = D, p.K = V;
        p.out = row_index ? static_cast<void*>(r.grad_rows) : static_cast<void*>(r.grad_rows + first * D);
        p.out_index = row_index ? row_index + first : nullptr;
        p.accumulate = r.accumulate;
        check_hopper(tlse_hop_product(&p, stream), "tlse_hop_product (rows)");
      }
      if (r.grad_cols) {  // dB (+)= G^T A_chunk = E'^T A': G or A' times the factor
        tlse_hop_product_args p = exponentials_product<T>(buf.exponentials, plan.ldg(), D, buf.k_partials,
                                                          plan.k_partial_floats(), plan.k_splits_cols, buf.factor);
        p.a_transposed = 1;
        p.b = scaled_rows ? scaled_rows : chunk, p.ldb = D, p.b_transposed = 1;
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
    if (r.grad_cols && several) finish_rows(stream, buf.acc, V, D, nullptr, r.grad_cols, r.accumulate);
    return true;
  }

  /// Under a budget that holds no chunk of rows, or several that cost more (kept_columns_first;
  /// it declines otherwise, and where its plan does not fit), the kept columns (KeptColumnsPlan):
  /// dA and dB wanted and written, not added into, since their storage holds A' and the kept
  /// exponentials until their values go there. Every stored row is swept (the exponentials' rows
  /// are A's, as dA's storage holds them); where some are not scored (a row index) those have no
  /// target and weigh nothing (g = c = 0: their rows of G, A' and dA are 0), and the target
  /// logits go by row:
  ///   1. the forward over every column, keeping the exponentials of the first `kept` columns in
  ///      panels in dB's storage, each past dB's rows of the panels up to its own, and those past
  ///      what dB's storage holds in the workspace's tail;
  ///   2. exponentials_to_gradient_kernel over those columns (the row LSEs, g, c, and A' in dA's
  ///      storage);
  ///   3. acc = the sum over the kept panels k of diag(c) E_k' B_k (or G_k B_k), in one product
  ///      over the panels in dB's storage and one over the tail's; then per kept panel, in order,
  ///      dB_k = E_k'^T A' (or G_k^T A under a softcap) into dB's rows of the panel;
  ///   4. the fused backward's column panels from `kept` on (the recomputed G overwrites nothing
  ///      of the exponentials', dB's rows past `kept` do, no longer read), adding into acc; then
  ///      dA = acc.
  template <class T>
  static bool run_kept_columns(cudaStream_t stream, int device, const StepRequest<T, float>& r,
                               const StepPlan& chunks) {
    const TileProblem<T, float>& prob = r.prob;
    const index_t V = prob.cols.count, D = prob.depth;
    tlse_hop_side row_side{};  // every stored row; outputs by position
    if (r.grad_rows == nullptr || r.grad_cols == nullptr || r.accumulate ||
        !hopper_side(prob.rows, D, true, row_side) || reinterpret_cast<std::uintptr_t>(r.grad_rows) % 16 != 0 ||
        reinterpret_cast<std::uintptr_t>(r.grad_cols) % 16 != 0)
      return false;
    const index_t R = row_side.count;
    const KeptColumnsPlan plan = KeptColumnsPlan::make(R, V, D, r.scratch_bytes, multiprocessors(device));
    if (!kept_columns_first(chunks, plan)) return false;
    WorkspaceCarver carver(aligned_base(r.scratch));
    const KeptColumnsPlan::Buffers buf = plan.carve(carver);
    void* const tail = plan.tail_panels() > 0 ? buf.tail : nullptr;  // the panels past dB's storage
    const KeptLayout kept{r.grad_cols + plan.exponentials_offset(),
                          plan.ld_exponentials(),
                          plan.panel,
                          plan.panel_stride(),
                          tail,
                          plan.panels_in_gradient,
                          plan.tail_stride()};
    const bool factored = !(prob.logit.softcap > 0.f);
    const T* rows = prob.rows.data;
    const float* target_logit = r.target_logit;  // by row
    if (row_side.position) {
      by_position_kernel<<<grid_for(R), 256, 0, stream>>>(r.target_logit, row_side.position, R, -infinity<float>(),
                                                          buf.row_target_logit);
      check_launch("by_position_kernel");
      target_logit = buf.row_target_logit;
    }

    const tlse_hop_forward_args f =
        forward_keeping(stream, prob, rows, R, kept, plan.kept, buf.shifts, target_logit, buf.partials);
    // fp16: one factor serves the kept panels and the fused backward's (its G at most 2^13).
    float* const factor = buf.panels.factor;
    if constexpr (scaled<T>) step_factor(stream, f, R, 0, nullptr, r, buf.row_scale, factor);

    const auto to_gradient =
        factored ? &exponentials_to_gradient_kernel<T, true> : &exponentials_to_gradient_kernel<T, false>;
    T* scaled_rows = factored ? r.grad_rows : nullptr;
    ToGradientParams<T> params;
    params.chunk = chunk_rows(f, R, 0, nullptr);
    params.kept = kept, params.shift = buf.shifts, params.ld_shift = plan.ld_shifts(), params.cols = plan.kept;
    params.target = r.target, params.target_logit = target_logit, params.coef = r.coef;
    params.model = prob.logit, params.factor = factor;
    params.lse = r.lse, params.row_g = buf.g, params.row_scale = buf.row_scale;
    params.rows = rows, params.scaled_rows = scaled_rows, params.depth = D;
    to_gradient<<<unsigned(R), 256, 0, stream>>>(params);
    check_launch("exponentials_to_gradient_kernel");

    // acc (+)= the sum over the panels of G_k B_k: one product over the panels in dB's storage and
    // one over those in the tail, K running through the panels (tlse_hop_product_args::a_panel),
    // before any dB_k overwrites a panel. One product per panel, each adding into acc (read and
    // written once a panel), left the step at N=8192 in 1.5 GiB (15 panels) behind one chunk of
    // every row, though its kernels alone took less: under the power cap the accumulator's traffic
    // costs energy (docs/notes/2026-11-29.md, "The kept panels' accumulator in one product").
    const auto rows_product = [&](index_t first_panel, index_t panels, index_t panel_stride) {
      if (panels == 0) return;
      tlse_hop_product_args p =
          exponentials_product<T>(kept.panel_data<T>(first_panel), kept.ld, D, buf.k_partials, plan.k_partial_floats(),
                                  plan.k_splits_rows, factored ? nullptr : factor);
      p.a_panel = plan.panel, p.a_panel_stride = panel_stride;
      p.row_scale = factored ? buf.row_scale : nullptr;
      p.b = prob.cols.data + first_panel * plan.panel * D, p.ldb = D, p.b_transposed = 1;
      p.M = R, p.N = D, p.K = panels * plan.panel;
      p.out_f32 = buf.panels.acc;
      p.accumulate = first_panel > 0;
      check_hopper(tlse_hop_product(&p, stream), "tlse_hop_product (rows, the kept panels)");
    };
    rows_product(0, plan.panels_in_gradient, plan.panel_stride());
    rows_product(plan.panels_in_gradient, plan.tail_panels(), plan.tail_stride());
    for (index_t k = 0; k < plan.kept_panels(); ++k) {
      tlse_hop_product_args p = exponentials_product<T>(kept.panel_data<T>(k), kept.ld, D, buf.k_partials,
                                                        plan.k_partial_floats(), plan.k_splits_cols, factor);
      p.a_transposed = 1;  // dB_k = G_k^T A
      p.b = scaled_rows ? scaled_rows : rows, p.ldb = D, p.b_transposed = 1;
      p.M = plan.panel, p.N = D, p.K = R;
      p.out = r.grad_cols + k * plan.panel * D;
      check_hopper(tlse_hop_product(&p, stream), "tlse_hop_product (a kept panel)");
    }

    BackwardRequest<T, float> b;
    b.prob = prob;
    b.row_terms = {r.lse, buf.g, r.target, r.coef.target};
    b.grad_rows = r.grad_rows;
    b.grad_cols = r.grad_cols;
    LseBackwardHopper::column_panels<T>(stream, b, row_side, plan.panels, buf.panels, plan.kept);
    finish_rows(stream, buf.panels.acc, R, D, nullptr, r.grad_rows, false);
    return true;
  }

  /// The forward sweep of `count` rows (from `rows`) against every column of prob, keeping the
  /// exponentials of the columns below kept_cols (0: all) where `kept` says, under the rows'
  /// shifts row_shift (the shifts per part to `shifts`), the row LSE states to `partials`
  /// (MAX_SWEEP_SPLITS x 2 x count); returns its arguments (row_partials, col_splits).
  template <class T>
  static tlse_hop_forward_args forward_keeping(cudaStream_t stream, const TileProblem<T, float>& prob, const T* rows,
                                               index_t count, const KeptLayout& kept, index_t kept_cols, float* shifts,
                                               const float* row_shift, float* partials) {
    static_assert(StepPlan::MAX_SWEEP_SPLITS == KeptColumnsPlan::MAX_SWEEP_SPLITS, "one size of partials");
    const index_t D = prob.depth;
    tlse_hop_forward_args f{};
    f.dtype = hopper_dtype<T>(false);
    f.rows = tlse_hop_side{rows, D, count, nullptr, nullptr, 0};
    f.cols = tlse_hop_side{prob.cols.data, D, prob.cols.count, nullptr, nullptr, 0};
    f.depth = D;
    f.logit = hopper_logit(prob.logit);
    f.row_partials.max = f.row_partials.sum = partials;
    f.kept.data = kept.data, f.kept.ld = kept.ld, f.kept.shift = shifts;
    f.kept.row_shift = scaled<T> ? nullptr : row_shift;  // fp16: every part under its own (tlse_hopper.h)
    f.kept.cols = kept_cols;
    f.kept.panel = kept.panel, f.kept.panel_stride = kept.panel_stride;
    f.kept.tail = kept.tail, f.kept.tail_panel = kept.tail_panel;
    f.max_col_splits = StepPlan::MAX_SWEEP_SPLITS, f.max_row_groups = 1;
    check_hopper(tlse_hop_lse_forward_plan(&f), "tlse_hop_lse_forward_plan");
    f.row_partials.sum = partials + f.col_splits * count;
    check_hopper(tlse_hop_lse_forward(&f, stream), "tlse_hop_lse_forward (exponentials kept)");
    return f;
  }

  /// The `rows` rows from scored row `first` on (ids through row_index, or none) with the
  /// partial states forward `f` left of them.
  static ChunkRows chunk_rows(const tlse_hop_forward_args& f, index_t rows, index_t first, const int* row_index) {
    return ChunkRows{f.row_partials.max, f.row_partials.sum, int(f.col_splits), rows, first, row_index};
  }

  /// fp16: the chunk's (or every row's) factor for G and A' (step_factor_kernel), from the row
  /// bounds (in `bound`, which exponentials_to_gradient_kernel overwrites with c).
  template <class T>
  static void step_factor(cudaStream_t stream, const tlse_hop_forward_args& f, index_t rows, index_t first,
                          const int* row_index, const StepRequest<T, float>& r, float* bound, float* factor) {
    row_bound_kernel<<<unsigned(rows), 32, 0, stream>>>(chunk_rows(f, rows, first, row_index), r.target, r.coef, bound);
    check_launch("row_bound_kernel");
    step_factor_kernel<<<1, 1024, 0, stream>>>(bound, rows, r.prob.logit.scale, factor);
    check_launch("step_factor_kernel");
  }

  /// The arguments a product of kept exponentials (or G) as operand A shares: a with its leading
  /// dimension, the output's, the K splits and their partials, and fp16's out_factor (the
  /// inverse of what G or A' is stored times; NULL where the product takes neither).
  template <class T>
  static tlse_hop_product_args exponentials_product(const void* a, index_t lda, index_t depth, float* partials,
                                                    std::int64_t partial_floats, int k_splits, const float* factor) {
    tlse_hop_product_args p{};
    p.dtype = hopper_dtype<T>(false);
    p.out_factor = scaled<T> && factor ? factor + 1 : nullptr;
    p.a = a, p.lda = lda;
    p.ldo = depth;
    p.workspace = partials;
    p.workspace_bytes = std::size_t(partial_floats) * sizeof(float);
    p.max_k_splits = k_splits;
    return p;
  }
};

}  // namespace tlse::impl::cuda
#endif
