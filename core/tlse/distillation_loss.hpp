#pragma once
/// \file distillation_loss.hpp
/// Fused linear distillation: the divergence (forward KL, reverse KL or generalized JSD) between
/// a teacher's softmax(Ht Wt^T / T) and a student's softmax(Hs Ws^T / T) over the same vocabulary,
/// optionally mixed with the student's hard-label cross-entropy, without either N x V logit
/// matrix: the forward keeps O(N) statistics per row, the backward recomputes the tiles.
#include <tlse/distillation_options.hpp>
#include <tlse/impl/distillation_call.hpp>
#include <tlse/impl/lse_forward.hpp>

#include <algorithm>

namespace tlse {

/// Workspace bytes distillation_loss, distillation_loss_backward and
/// distillation_loss_with_gradients need (the largest of the three).
/// \param exec execution space instance the calls will run on (the size depends on its concurrency)
/// \param Hs (N x D_s) student hidden states (only the extents are read)
/// \param Ws (V x D_s) student classifier (only the extents are read)
/// \param Ht (N x D_t) teacher hidden states (only the extents are read)
/// \param Wt (V x D_t) teacher classifier (only the extents are read)
/// \param opts the options the calls will get
/// \return bytes for DistillationOptions::workspace: O(N + V) on the generic kernels; on the GPU's
///         tile-pair kernels (bf16 on Hopper) also their panels of both heads' logits, at most
///         opts.memory_budget.
template <class Exec, class HsV, class WsV, class HtV, class WtV>
std::size_t distillation_loss_workspace_bytes(const Exec& exec, const HsV& Hs, const WsV& Ws, const HtV& Ht,
                                              const WtV& Wt, const DistillationOptions& opts = {}) {
  using T = impl::scalar_of<HsV>;
  using Acc = accumulator_t<T>;
  (void)Wt;
  const impl::index_t N = Hs.extent(0), V = Ws.extent(0);
  const std::size_t pairs = impl::distillation_pair_scratch_bytes<T>(exec, Hs, Ws, Ht, opts);
  impl::WorkspaceCarver forward, backward, step;
  impl::DistillationForwardArrays<Acc>::carve(forward, exec, N, V, pairs);
  impl::DistillationBackwardArrays<Acc>::carve(backward, N, pairs);
  impl::DistillationStepArrays<Acc>::carve(step, exec, N, V, pairs);
  return std::max({forward.bytes(), backward.bytes(), step.bytes()});
}

/// Whether distillation_loss_with_gradients runs the training step fused for these shapes and
/// options: one sweep of the vocabulary for the forward and one for the backward, the second
/// reading the teacher's logits the first kept (for at least one panel of the vocabulary) rather
/// than recomputing them. It fuses with a Hopper GPU, bf16, depths that are multiples of 8, the
/// forward or reverse KL (not the JSD), and an opts.memory_budget that holds the working panels
/// and a panel of kept logits, in the workspace or (with opts.accumulate off, for a call given
/// dWs) in dWs's storage; never on the host. It lets a caller decide beforehand whether computing
/// the gradients with the loss pays. The call itself may still run the two calls for reasons only
/// its data shows (every row ignored, operands not 16-byte aligned).
/// \param exec execution space instance the call will run on
/// \param Hs, Ws, Ht, Wt the call's operands (only the extents are read)
/// \param opts the options the call will get (divergence, beta, memory_budget and accumulate matter)
/// \param want_teacher_gradients whether the call will be given dHt (its accumulator takes space)
/// \return true when the step runs fused
template <class Exec, class HsV, class WsV, class HtV, class WtV>
bool distillation_step_fuses(const Exec& exec, const HsV& Hs, const WsV& Ws, const HtV& Ht, const WtV& Wt,
                             const DistillationOptions& opts, bool want_teacher_gradients) {
  using T = impl::scalar_of<HsV>;
  using Acc = accumulator_t<T>;
  if (impl::DivergenceModel<Acc>::make(opts.divergence, opts.beta).divergence == Divergence::jsd ||
      !impl::specializations_enabled())
    return false;
  impl::DistillationStepShape shape;
  shape.rows = impl::index_t(Hs.extent(0));
  shape.cols = impl::index_t(Ws.extent(0));
  shape.depth_s = impl::index_t(Hs.extent(1));
  shape.depth_t = impl::index_t(Ht.extent(1));
  shape.memory_budget = opts.memory_budget;
  shape.dHt = want_teacher_gradients;
  shape.dWs_storage = !opts.accumulate;
  (void)Wt;
  return impl::DistillationSpecialization<Exec>::template step_kept_columns<T>(exec, shape) > 0;
}

namespace impl {

/// dHs, dWs, dHt and dWt: matrices of the input scalar type.
template <class Exec, class T, class DHsV, class DWsV, class DHtV, class DWtV>
constexpr void static_check_distillation_gradients() {
  static_check_view<Exec, DHsV, 2>();
  static_check_view<Exec, DWsV, 2>();
  static_check_view<Exec, DHtV, 2>();
  static_check_view<Exec, DWtV, 2>();
  static_assert(
      std::is_same<typename DHsV::value_type, T>::value && std::is_same<typename DWsV::value_type, T>::value &&
          std::is_same<typename DHtV::value_type, T>::value && std::is_same<typename DWtV::value_type, T>::value,
      "tlse: the distillation's dHs, dWs, dHt and dWt are non-const views of the input scalar type");
}

/// The cross-entropy's logits: the student's at T = 1.
template <class T, class Acc>
TileProblem<T, Acc> cross_entropy_logits(const PairProblem<T, Acc>& pp) {
  TileProblem<T, Acc> ce = pp.student;
  ce.logit.scale = Acc(1);
  return ce;
}

/// The forward's statistics (by row id, into stats) the way the backend takes them: in one
/// sweep, or the LSE sweeps then the divergence's sums.
template <class Call, class Arrays, class Pair, class Acc = typename Call::Acc>
void distillation_statistics_of(const Call& call, const Arrays& a, const Pair& pp, Acc* stats) {
  const auto& exec = call.exec;
  const auto& opts = call.o;
  const bool with_ce = opts.alpha > 0;
  if (distillation_statistics(exec, pp, stats, with_ce, opts.temperature != 1.0, a.pair_scratch, a.pair_scratch_bytes))
    return;
  const index_t active_count = call.active_count;
  const auto grid = ForwardGrid::plan(exec, active_count, call.V);
  const auto store = [&](const Acc* value, int field) {
    store_row_stat(exec, a.active, active_count, value, field, stats);
  };
  lse_forward(exec, pp.student, grid, a.partials, a.lse, (Acc*)nullptr, (Acc*)nullptr);
  store(a.lse, stat_lse_s);
  if (with_ce) {
    if (opts.temperature != 1.0)
      lse_forward(exec, cross_entropy_logits(pp), grid, a.partials, a.lse, (Acc*)nullptr, (Acc*)nullptr);
    store(a.lse, stat_lse_ce);
  }
  lse_forward(exec, pp.teacher, grid, a.partials, a.lse, (Acc*)nullptr, (Acc*)nullptr);
  store(a.lse, stat_lse_t);
  distillation_terms(exec, pp, grid, a.partials, a.term_s, a.term_t, a.pair_scratch, a.pair_scratch_bytes);
  store(a.term_s, stat_term_s);
  store(a.term_t, stat_term_t);
}

/// The loss from the forward's statistics: the cross-entropy's target logits where alpha > 0,
/// each row's loss, the reduction.
template <class Call, class Arrays, class Pair, class LossV>
void distillation_losses(const Call& call, const Arrays& a, const Pair& pp, const LossV& loss) {
  using Acc = typename Call::Acc;
  const auto& exec = call.exec;
  if (call.o.alpha > 0) {
    const int* active = a.active;
    const int* row_target = a.row_target;
    pair_logits(
        exec, cross_entropy_logits(pp), call.active_count, KOKKOS_LAMBDA(index_t k) { return index_t(active[k]); },
        KOKKOS_LAMBDA(index_t k) { return index_t(row_target[active[k]]); }, a.target_logit);
  }
  call.row_losses(a.active, pp.stats, a.target_logit, a.row_loss);
  write_row_losses(exec, call.o.reduction == Reduction::none, (const Acc*)a.row_loss, call.N, loss.data(), a.total);
}

}  // namespace impl

/// Forward. Per scored row i, with z_s = Hs_i Ws^T / T and z_t = Ht_i Wt^T / T over the V
/// classes, p_s = softmax(z_s) and p_t = softmax(z_t), the row's loss is
/// alpha * CE_i + (1 - alpha) * div_i: div_i the divergence of opts.divergence (Divergence), CE_i
/// the student's hard-label cross-entropy on its unscaled logits Hs_i Ws^T against targets(i +
/// shift). Rows whose target is ignore_index, and the last `shift` rows, are not scored (loss 0).
/// No T^2 factor (see DistillationOptions::temperature). Extra memory: O(N) in row_stats and
/// the workspace (distillation_loss_workspace_bytes: O(N + V), and on the GPU's tile-pair kernels
/// panels of both heads' logits within opts.memory_budget), no N x V buffer.
/// \param exec execution space instance; kernels are enqueued on it
/// \param Hs (N x D_s) row-major view of T (float, double, tlse::bfloat16, tlse::float16)
/// \param Ws (V x D_s) row-major view of T
/// \param Ht (N x D_t) row-major view of T (D_t may differ from D_s)
/// \param Wt (V x D_t) row-major view of T
/// \param targets (N) integer view (int32 or int64), each in [0, V) or opts.ignore_index; or empty:
///        every row scored (then opts.alpha must be 0)
/// \param loss output view of accumulator_t<T>: (N) with Reduction::none, (1) otherwise
/// \param row_stats (N x distillation_row_stats) row-major output view of accumulator_t<T>: what
///        the backward needs (opaque; 0 for rows not scored)
/// \param opts see DistillationOptions
/// \throws std::invalid_argument naming the call, the argument and the values on a wrong shape
///         (vocabulary sizes or row counts that differ, depths that do not match), layout,
///         target, option (beta or alpha outside [0, 1], temperature <= 0 or not finite, shift
///         < 0, alpha > 0 without targets) or workspace size (and on NaN/Inf with
///         NonFinite::detect), before any output is written.
template <class Exec, class HsV, class WsV, class HtV, class WtV, class TargetV, class LossV, class StatsV>
void distillation_loss(const Exec& exec, const HsV& Hs, const WsV& Ws, const HtV& Ht, const WtV& Wt,
                       const TargetV& targets, const LossV& loss, const StatsV& row_stats,
                       const DistillationOptions& opts = {}) {
  const impl::ArgumentChecker check("tlse::distillation_loss");
  auto call = impl::distillation_call(exec, check, Hs, Ws, Ht, Wt, targets, opts);
  using T = typename decltype(call)::T;
  using Acc = typename decltype(call)::Acc;
  impl::static_check_acc_vector<Exec, T, LossV>();
  impl::static_check_row_stats<Exec, T, StatsV>();
  static_assert(!std::is_const<typename StatsV::value_type>::value, "tlse::distillation_loss: row_stats is an output");
  call.validate();
  call.check_loss_shape("loss", loss);
  call.check_row_stats(row_stats);
  const impl::index_t N = call.N, V = call.V;
  Kokkos::Profiling::pushRegion("tlse::distillation_loss");
  using Arrays = impl::DistillationForwardArrays<Acc>;
  const std::size_t pairs = impl::distillation_pair_scratch_bytes<T>(exec, Hs, Ws, Ht, opts);
  impl::with_workspace(
      check.function(), exec, opts.workspace,
      [&](impl::WorkspaceCarver& c) { return Arrays::carve(c, exec, N, V, pairs); },
      [&](const Arrays& a) {
        call.prepare_rows(a.row_target, a.active, a.position);
        impl::fill(exec, row_stats.data(), N * distillation_row_stats, Acc(0));
        const auto pp = call.problem(a.active, a.position, row_stats.data());
        impl::distillation_statistics_of(call, a, pp, row_stats.data());
        impl::distillation_losses(call, a, pp, loss);
      });
  Kokkos::Profiling::popRegion();
}

/// Backward. Takes the forward's inputs, its row_stats and dloss (shaped like the forward's loss)
/// and writes the gradients dHs (N x D_s), dWs (V x D_s), dHt (N x D_t) and dWt (V x D_t); any of
/// them may be an empty view (not computed: the teacher is frozen when dHt and dWt are empty).
/// Rows that are not scored get zero gradient. No atomics: bitwise reproducible. Extra memory:
/// the workspace (as the forward's; the GPU's tile-pair kernels also sum dHs, and dHt where
/// wanted, in fp32 there) or, on the generic kernels, O(N) workspace plus Kokkos team scratch
/// (32 x (D_s + D_t) accumulators per running team).
/// \param exec execution space instance
/// \param Hs, Ws, Ht, Wt, targets the forward's inputs
/// \param row_stats (N x distillation_row_stats) the forward's row_stats output
/// \param dloss gradient with respect to the loss, shaped like the forward's loss
/// \param dHs (N x D_s) output view of T, or empty
/// \param dWs (V x D_s) output view of T, or empty
/// \param dHt (N x D_t) output view of T, or empty
/// \param dWt (V x D_t) output view of T, or empty
/// \param opts the forward's options; `accumulate` adds into the gradients
/// \throws std::invalid_argument as distillation_loss, and on a wrong shape of row_stats, dloss
///         or a gradient, before any output is written.
template <class Exec, class HsV, class WsV, class HtV, class WtV, class TargetV, class StatsV, class DLossV, class DHsV,
          class DWsV, class DHtV, class DWtV>
void distillation_loss_backward(const Exec& exec, const HsV& Hs, const WsV& Ws, const HtV& Ht, const WtV& Wt,
                                const TargetV& targets, const StatsV& row_stats, const DLossV& dloss, const DHsV& dHs,
                                const DWsV& dWs, const DHtV& dHt, const DWtV& dWt,
                                const DistillationOptions& opts = {}) {
  const impl::ArgumentChecker check("tlse::distillation_loss_backward");
  auto call = impl::distillation_call(exec, check, Hs, Ws, Ht, Wt, targets, opts);
  using T = typename decltype(call)::T;
  using Acc = typename decltype(call)::Acc;
  impl::static_check_row_stats<Exec, T, StatsV>();
  impl::static_check_acc_vector<Exec, T, DLossV>();
  impl::static_check_distillation_gradients<Exec, T, DHsV, DWsV, DHtV, DWtV>();
  call.validate();
  call.check_row_stats(row_stats);
  const auto wanted = call.check_gradients(dloss, dHs, dWs, dHt, dWt);
  const impl::index_t N = call.N;
  Kokkos::Profiling::pushRegion("tlse::distillation_loss_backward");
  using Arrays = impl::DistillationBackwardArrays<Acc>;
  const std::size_t pairs = impl::distillation_pair_scratch_bytes<T>(exec, Hs, Ws, Ht, opts);
  impl::with_workspace(
      check.function(), exec, opts.workspace, [&](impl::WorkspaceCarver& c) { return Arrays::carve(c, N, pairs); },
      [&](const Arrays& a) {
        call.prepare_rows(a.row_target, a.active, a.position);
        call.gradient_coefficients(a.active, dloss, a.div, a.ce);
        if (wanted.dHs) call.zero_unscored_rows(a.position, dHs);
        if (wanted.dHt) call.zero_unscored_rows(a.position, dHt);
        const auto pp = call.problem(a.active, a.position, row_stats.data());
        impl::DistillationGradientTerms<Acc> g{a.div, opts.alpha > 0 ? a.ce : nullptr, a.row_target};
        impl::distillation_backward(exec, pp, g, wanted.dHs ? dHs.data() : nullptr, wanted.dWs ? dWs.data() : nullptr,
                                    wanted.dHt ? dHt.data() : nullptr, wanted.dWt ? dWt.data() : nullptr,
                                    opts.accumulate, a.pair_scratch, a.pair_scratch_bytes);
      });
  Kokkos::Profiling::popRegion();
}

/// Loss and gradients in one call: a training step. The same results as distillation_loss
/// followed by distillation_loss_backward with `dloss` (bitwise where it runs those two; up to
/// rounding on the Hopper path, whose panels may be narrower than the two calls'), and the same
/// checks; one call lets a backend share work between the two halves. On Hopper GPUs (bf16, the forward or the
/// reverse KL; distillation_step_fuses) the forward's sweep of the vocabulary keeps the teacher's
/// logits of its first panels, within opts.memory_budget and (with opts.accumulate off) in dWs's
/// storage before dWs is written, and the backward's sweep reads them instead of recomputing
/// them (docs/api.md, Memory). Otherwise the two calls run.
/// \param exec execution space instance
/// \param Hs, Ws, Ht, Wt, targets as for distillation_loss
/// \param dloss gradient with respect to the loss, shaped like the loss (1 for the mean loss of a
///        training step)
/// \param loss output view of accumulator_t<T>: (N) with Reduction::none, (1) otherwise
/// \param dHs, dWs, dHt, dWt output views of T as for distillation_loss_backward, each may be
///        empty (not computed)
/// \param opts see DistillationOptions; `accumulate` adds into the gradients; a lent workspace
///        holds distillation_loss_workspace_bytes(exec, Hs, Ws, Ht, Wt, opts)
/// \throws std::invalid_argument as distillation_loss and distillation_loss_backward, before any
///         output is written.
template <class Exec, class HsV, class WsV, class HtV, class WtV, class TargetV, class DLossV, class LossV, class DHsV,
          class DWsV, class DHtV, class DWtV>
void distillation_loss_with_gradients(const Exec& exec, const HsV& Hs, const WsV& Ws, const HtV& Ht, const WtV& Wt,
                                      const TargetV& targets, const DLossV& dloss, const LossV& loss, const DHsV& dHs,
                                      const DWsV& dWs, const DHtV& dHt, const DWtV& dWt,
                                      const DistillationOptions& opts = {}) {
  const impl::ArgumentChecker check("tlse::distillation_loss_with_gradients");
  auto call = impl::distillation_call(exec, check, Hs, Ws, Ht, Wt, targets, opts);
  using T = typename decltype(call)::T;
  using Acc = typename decltype(call)::Acc;
  using Mem = typename HsV::memory_space;
  impl::static_check_acc_vector<Exec, T, LossV>();
  impl::static_check_acc_vector<Exec, T, DLossV>();
  impl::static_check_distillation_gradients<Exec, T, DHsV, DWsV, DHtV, DWtV>();
  call.validate();
  call.check_loss_shape("loss", loss);
  const auto wanted = call.check_gradients(dloss, dHs, dWs, dHt, dWt);
  const impl::index_t N = call.N, V = call.V;
  // The two calls below check a lent workspace each, and the forward writes the loss before the
  // backward checks: the workspace is checked against both (and the step) here.
  check.lent_workspace(opts.workspace, "distillation_loss_workspace_bytes",
                       [&] { return distillation_loss_workspace_bytes(exec, Hs, Ws, Ht, Wt, opts); });
  const std::size_t pairs = impl::distillation_pair_scratch_bytes<T>(exec, Hs, Ws, Ht, opts);
  bool done = false;
  if (pairs > 0 && call.active_count > 0 &&
      impl::DivergenceModel<Acc>::make(opts.divergence, opts.beta).divergence != Divergence::jsd) {
    Kokkos::Profiling::pushRegion("tlse::distillation_loss_with_gradients");
    using Arrays = impl::DistillationStepArrays<Acc>;
    impl::with_workspace(
        check.function(), exec, opts.workspace,
        [&](impl::WorkspaceCarver& c) { return Arrays::carve(c, exec, N, V, pairs); },
        [&](const Arrays& s) {
          const auto& a = s.forward;
          call.prepare_rows(a.row_target, a.active, a.position);
          impl::fill(exec, s.stats, N * distillation_row_stats, Acc(0));
          const auto pp = call.problem(a.active, a.position, s.stats);
          call.gradient_coefficients(a.active, dloss, s.div, s.ce);
          if (wanted.dHs) call.zero_unscored_rows(a.position, dHs);
          if (wanted.dHt) call.zero_unscored_rows(a.position, dHt);
          const impl::PairStatisticsRequest<T, Acc> forward{
              pp, s.stats, opts.alpha > 0, opts.temperature != 1.0, a.pair_scratch, a.pair_scratch_bytes};
          const impl::DistillationGradientTerms<Acc> g{s.div, opts.alpha > 0 ? s.ce : nullptr, a.row_target};
          const impl::PairBackwardRequest<T, Acc, T> backward{{pp, g},
                                                              wanted.dHs ? dHs.data() : nullptr,
                                                              wanted.dWs ? dWs.data() : nullptr,
                                                              wanted.dHt ? dHt.data() : nullptr,
                                                              wanted.dWt ? dWt.data() : nullptr,
                                                              opts.accumulate,
                                                              a.pair_scratch,
                                                              a.pair_scratch_bytes};
          done = impl::distillation_step(exec, forward, backward);
          if (done) impl::distillation_losses(call, a, pp, loss);
        });
    Kokkos::Profiling::popRegion();
  }
  if (done) return;
  // The two calls; their checks pass (the same as above). The forward's statistics live here.
  Kokkos::View<Acc**, Kokkos::LayoutRight, Mem> row_stats(
      Kokkos::view_alloc(Kokkos::WithoutInitializing, "tlse::distillation_loss_with_gradients::row_stats"), N,
      distillation_row_stats);
  distillation_loss(exec, Hs, Ws, Ht, Wt, targets, loss, row_stats, opts);
  distillation_loss_backward(exec, Hs, Ws, Ht, Wt, targets, row_stats, dloss, dHs, dWs, dHt, dWt, opts);
}

}  // namespace tlse
