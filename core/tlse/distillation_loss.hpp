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

/// Workspace bytes distillation_loss and distillation_loss_backward need (the larger of the two).
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
  impl::WorkspaceCarver forward, backward;
  impl::DistillationForwardArrays<Acc>::carve(forward, exec, N, V, pairs);
  impl::DistillationBackwardArrays<Acc>::carve(backward, N, pairs);
  return std::max(forward.bytes(), backward.bytes());
}

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
        const impl::index_t active_count = call.active_count;
        call.prepare_rows(a.row_target, a.active, a.position);
        Acc* stats = row_stats.data();
        impl::fill(exec, stats, N * distillation_row_stats, Acc(0));
        const auto pp = call.problem(a.active, a.position, stats);
        const bool with_ce = opts.alpha > 0;
        // The cross-entropy's logits are the student's at T = 1.
        auto ce = pp.student;
        ce.logit.scale = Acc(1);
        if (!impl::distillation_statistics(exec, pp, stats, with_ce, opts.temperature != 1.0, a.pair_scratch,
                                           a.pair_scratch_bytes)) {
          const auto grid = impl::ForwardGrid::plan(exec, active_count, V);
          const auto store = [&](const Acc* value, int field) {
            impl::store_row_stat(exec, a.active, active_count, value, field, stats);
          };
          impl::lse_forward(exec, pp.student, grid, a.partials, a.lse, (Acc*)nullptr, (Acc*)nullptr);
          store(a.lse, impl::stat_lse_s);
          if (with_ce) {
            if (opts.temperature != 1.0)
              impl::lse_forward(exec, ce, grid, a.partials, a.lse, (Acc*)nullptr, (Acc*)nullptr);
            store(a.lse, impl::stat_lse_ce);
          }
          impl::lse_forward(exec, pp.teacher, grid, a.partials, a.lse, (Acc*)nullptr, (Acc*)nullptr);
          store(a.lse, impl::stat_lse_t);
          impl::distillation_terms(exec, pp, grid, a.partials, a.term_s, a.term_t, a.pair_scratch,
                                   a.pair_scratch_bytes);
          store(a.term_s, impl::stat_term_s);
          store(a.term_t, impl::stat_term_t);
        }
        if (with_ce) {
          const int* active = a.active;
          const int* row_target = a.row_target;
          impl::pair_logits(
              exec, ce, active_count, KOKKOS_LAMBDA(impl::index_t k) { return impl::index_t(active[k]); },
              KOKKOS_LAMBDA(impl::index_t k) { return impl::index_t(row_target[active[k]]); }, a.target_logit);
        }
        call.row_losses(a.active, stats, a.target_logit, a.row_loss);
        impl::write_row_losses(exec, opts.reduction == Reduction::none, (const Acc*)a.row_loss, N, loss.data(),
                               a.total);
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
  impl::static_check_view<Exec, DHsV, 2>();
  impl::static_check_view<Exec, DWsV, 2>();
  impl::static_check_view<Exec, DHtV, 2>();
  impl::static_check_view<Exec, DWtV, 2>();
  static_assert(
      std::is_same<typename DHsV::value_type, T>::value && std::is_same<typename DWsV::value_type, T>::value &&
          std::is_same<typename DHtV::value_type, T>::value && std::is_same<typename DWtV::value_type, T>::value,
      "tlse::distillation_loss_backward: dHs, dWs, dHt and dWt are non-const views of the input scalar type");
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

}  // namespace tlse
