#pragma once
/// \file distillation_loss.hpp
/// Vocabulary-parallel fused linear distillation: both heads' classifiers Ws and Wt are split by
/// rows across the ranks with the same class split, each rank owning a contiguous vocabulary range
/// (rank order, as the vocabulary-parallel cross-entropy); Hs, Ht and the targets are the same on
/// every rank.
///
/// Forward: each rank runs the tiled LSEs of both heads (and of the student at T = 1 when alpha >
/// 0) over its shard; two all-reduces of 3N numbers combine them (the max of the shards' LSEs per
/// row, then the sums of exp(lse_r - max) with the target logit from the rank that owns it); then
/// each rank sums its classes' divergence terms from the global LSEs and one all-reduce of 2N
/// numbers adds them. Only per-row statistics move.
/// Backward: each rank writes its dWs and dWt shards and partial dHs and dHt (its classes' share,
/// in the accumulator type), summed over the ranks (all-reduces of N x D_s and N x D_t): every
/// rank ends with the full dHs and dHt.
#include <tlse/distillation_loss.hpp>
#include <tlse/distributed/cross_entropy.hpp>
#include <tlse/distributed/impl/agreement.hpp>
#include <tlse/distributed/impl/ring.hpp>

#include <type_traits>

namespace tlse::distributed {

namespace impl {

/// The metadata every rank contributes, in this order.
enum DistillationField {
  d_rows,
  d_depth_s,
  d_depth_t,
  d_vocab,
  d_scalar,
  d_has_targets,
  d_reduction,
  d_shift,
  d_ignore,
  d_divergence,
  d_beta,
  d_temperature,
  d_alpha,
  d_want_dHs,
  d_want_dHt,
  distillation_fields
};

/// Runs the local checks, agrees on the shapes and options, then checks the targets against the
/// global vocabulary (into `call`). Throws the same error on every rank. The wanted row gradients
/// decide collectives, so every rank must agree on them.
template <class Comm, class Call, class Checks>
VocabShard agree_distillation(const Comm& comm, const tlse::impl::ArgumentChecker& check, Call& call, bool want_dHs,
                              bool want_dHt, const Checks& local_checks) {
  using T = typename Call::T;
  const auto& o = call.o;
  const std::vector<std::int64_t> meta = {std::int64_t(call.Hs.extent(0)),
                                          std::int64_t(call.Hs.extent(1)),
                                          std::int64_t(call.Ht.extent(1)),
                                          std::int64_t(call.Ws.extent(0)),
                                          scalar_code<T>(),
                                          call.targets.size() > 0,
                                          std::int64_t(o.reduction),
                                          o.shift,
                                          o.ignore_index,
                                          std::int64_t(o.divergence),
                                          double_bits(o.beta),
                                          double_bits(o.temperature),
                                          double_bits(o.alpha),
                                          want_dHs,
                                          want_dHt};
  Agreement shapes(comm, check.function(), meta, [&] {
    call.check_shapes();
    call.check_options();
    call.check_operands_finite();
    local_checks();
  });
  shapes.require_same(d_rows, "Hs", "rows (tokens)");
  shapes.require_same(d_depth_s, "Hs", "columns (features)");
  shapes.require_same(d_depth_t, "Ht", "columns (features)");
  shapes.require_same(d_scalar, "Hs", "scalar type", scalar_code_name);
  shapes.require_same(d_has_targets, "targets", "a non-empty flag (1: given, 0: empty)");
  shapes.require_same(d_reduction, "opts.reduction", "value");
  shapes.require_same(d_shift, "opts.shift", "value");
  shapes.require_same(d_ignore, "opts.ignore_index", "value");
  shapes.require_same(d_divergence, "opts.divergence", "value (0: forward_kl, 1: reverse_kl, 2: jsd)");
  shapes.require_same(d_beta, "opts.beta", "bit pattern");
  shapes.require_same(d_temperature, "opts.temperature", "bit pattern");
  shapes.require_same(d_alpha, "opts.alpha", "bit pattern");
  shapes.require_same(d_want_dHs, "dHs", "a non-empty flag (1: wanted, 0: empty)");
  shapes.require_same(d_want_dHt, "dHt", "a non-empty flag (1: wanted, 0: empty)");
  const RowLayout vocab(comm.rank(), comm.size(), [&](int r) { return shapes.value(r, d_vocab); });
  VocabShard shard{vocab.offset[vocab.rank], vocab.rows[vocab.rank], vocab.total, 0, 0, false};
  Agreement targets(comm, check.function(), {}, [&] { call.check_targets(vocab.total); });
  shard.active = call.active_count;
  shard.scored = call.scored;
  return shard;
}

/// out = the sum over the ranks of `part` (N x D in Acc), rounded to out's type once (added to
/// out's values when accumulating).
template <class Comm, class Part, class OutV>
void sum_partial_gradient(const Comm& comm, const Part& part, const OutV& out_view, bool accumulate) {
  using Exec = typename Comm::execution_space;
  using T = typename OutV::value_type;
  using Acc = typename Part::value_type;
  comm.allreduce(part, ReduceOp::sum);
  T* out = out_view.data();
  const Acc* p = part.data();
  Kokkos::parallel_for(
      "tlse::vocab_partial_gradient", Kokkos::RangePolicy<Exec>(comm.exec(), 0, index_t(part.size())),
      KOKKOS_LAMBDA(index_t i) {
        out[i] = tlse::impl::from_acc<T>((accumulate ? tlse::impl::to_acc<Acc>(out[i]) : Acc(0)) + p[i]);
      });
}

}  // namespace impl

/// Forward. Hs (N x D_s), Ht (N x D_t) and targets (N, global class ids or ignore_index; or empty
/// on every rank) the same on every rank; Ws (V_r x D_s) and Wt (V_r x D_t) this rank's shard of
/// both heads' classifiers (the same classes). loss ((N) for Reduction::none, (1) otherwise) and
/// row_stats (N x distillation_row_stats) come out the same on every rank. Options as
/// tlse::distillation_loss; workspace is not used. Collective: every rank of comm must call it.
/// \param comm the communicator (carries the execution space)
/// \param Hs, Ht the student's and the teacher's hidden states, replicated
/// \param Ws, Wt this rank's shards of the student's and the teacher's classifiers
/// \param targets (N) integer view, or empty
/// \param loss output view of accumulator_t<T>
/// \param row_stats (N x distillation_row_stats) output view of accumulator_t<T>, for the backward
/// \param opts see DistillationOptions
/// \throws std::invalid_argument on every rank, naming the argument, when any rank's arguments
///         fail tlse::distillation_loss's checks or the ranks disagree on shapes or options.
template <class Comm, class HsV, class WsV, class HtV, class WtV, class TargetV, class LossV, class StatsV>
void distillation_loss(const Comm& comm, const HsV& Hs, const WsV& Ws, const HtV& Ht, const WtV& Wt,
                       const TargetV& targets, const LossV& loss, const StatsV& row_stats,
                       const DistillationOptions& opts = {}) {
  using Exec = typename Comm::execution_space;
  using Mem = typename Exec::memory_space;
  using impl::index_t;
  namespace ti = tlse::impl;
  const ti::ArgumentChecker check("tlse::distributed::distillation_loss");
  auto call = ti::distillation_call(comm.exec(), check, Hs, Ws, Ht, Wt, targets, opts);
  using T = typename decltype(call)::T;
  using Acc = typename decltype(call)::Acc;
  ti::static_check_acc_vector<Exec, T, LossV>();
  ti::static_check_row_stats<Exec, T, StatsV>();
  const auto shard = impl::agree_distillation(comm, check, call, false, false, [&] {
    call.check_loss_shape("loss", loss);
    call.check_row_stats(row_stats);
  });
  Kokkos::Profiling::pushRegion("tlse::distributed::distillation_loss");
  const Exec& exec = comm.exec();
  const index_t N = call.N, Vr = shard.vocab, voff = shard.offset, n_active = shard.active;
  const bool ce = opts.alpha > 0;
  Kokkos::View<int*, Mem> row_target("tlse::row_target", N), active("tlse::active", N), position("tlse::position", N);
  call.prepare_rows(row_target.data(), active.data(), position.data());
  Acc* stats = row_stats.data();
  ti::fill(exec, stats, N * distillation_row_stats, Acc(0));
  const auto pp = call.problem(active.data(), position.data(), stats);
  auto ce_prob = pp.student;
  ce_prob.logit.scale = Acc(1);
  const auto grid = ti::ForwardGrid::plan(exec, n_active, Vr);
  Kokkos::View<Acc*, Mem> partials("tlse::partials", ti::forward_partials_size(grid, n_active, Vr, false, false));
  // local: this shard's LSEs [student | teacher | student at T = 1] by row id; shared: [sums of
  // exp(local - max) | the target logit at T = 1], then [term_s | term_t].
  const index_t heads = ce ? 3 : 2;
  Kokkos::View<Acc*, Mem> local("tlse::shard_lse", 3 * N), top("tlse::max_lse", 3 * N), shared("tlse::shared", 4 * N),
      pair("tlse::target_logit", ce ? n_active : 0);
  ti::fill(exec, local.data(), 3 * N, -ti::infinity<Acc>());
  Acc *lo = local.data(), *sh = shared.data();
  ti::fill(exec, sh, 4 * N, Acc(0));
  ti::lse_forward(exec, pp.student, grid, partials.data(), lo, (Acc*)nullptr, (Acc*)nullptr);
  ti::lse_forward(exec, pp.teacher, grid, partials.data(), lo + N, (Acc*)nullptr, (Acc*)nullptr);
  const int *act = active.data(), *rt = row_target.data();
  if (ce) {
    ti::lse_forward(exec, ce_prob, grid, partials.data(), lo + 2 * N, (Acc*)nullptr, (Acc*)nullptr);
    if (Vr > 0)
      ti::pair_logits(
          exec, ce_prob, n_active, KOKKOS_LAMBDA(index_t k) { return index_t(act[k]); },
          KOKKOS_LAMBDA(index_t k) {
            const index_t t = rt[act[k]] - voff;
            return t >= 0 && t < Vr ? t : index_t(0);  // another rank's class: discarded below
          },
          pair.data());
  }
  Kokkos::deep_copy(exec, top, local);
  comm.allreduce(Kokkos::subview(top, std::make_pair(index_t(0), heads * N)), ReduceOp::max);
  {
    const Acc *mx = top.data(), *pr = pair.data();
    Kokkos::parallel_for(
        "tlse::vocab_shard_lse_terms", Kokkos::RangePolicy<Exec>(exec, 0, heads * N),
        KOKKOS_LAMBDA(index_t i) { sh[i] = mx[i] == -ti::infinity<Acc>() ? Acc(0) : ti::exp(lo[i] - mx[i]); });
    if (ce)
      Kokkos::parallel_for(
          "tlse::vocab_shard_target", Kokkos::RangePolicy<Exec>(exec, 0, n_active), KOKKOS_LAMBDA(index_t k) {
            const index_t t = rt[act[k]] - voff;
            if (t >= 0 && t < Vr) sh[3 * N + act[k]] = pr[k];
          });
  }
  comm.allreduce(shared, ReduceOp::sum);
  {
    const Acc* mx = top.data();
    Kokkos::parallel_for(
        "tlse::vocab_global_lse", Kokkos::RangePolicy<Exec>(exec, 0, heads * N),
        KOKKOS_LAMBDA(index_t i) { lo[i] = mx[i] == -ti::infinity<Acc>() ? mx[i] : mx[i] + ti::log(sh[i]); });
  }
  ti::store_row_stat(exec, act, n_active, lo, ti::stat_lse_s, stats);
  ti::store_row_stat(exec, act, n_active, lo + N, ti::stat_lse_t, stats);
  if (ce) {
    ti::store_row_stat(exec, act, n_active, lo + 2 * N, ti::stat_lse_ce, stats);
    Acc* by_position = pair.data();  // the target logits, now every rank's, by position in `active`
    Kokkos::parallel_for(
        "tlse::vocab_target_logits", Kokkos::RangePolicy<Exec>(exec, 0, n_active),
        KOKKOS_LAMBDA(index_t k) { by_position[k] = sh[3 * N + act[k]]; });
  }
  // The divergence's sums over this shard's classes, from the global LSEs, then over the ranks.
  Kokkos::View<Acc*, Mem> terms("tlse::terms", 2 * N);
  ti::distillation_terms(exec, pp, grid, partials.data(), terms.data(), terms.data() + N);
  comm.allreduce(terms, ReduceOp::sum);
  ti::store_row_stat(exec, act, n_active, (const Acc*)terms.data(), ti::stat_term_s, stats);
  ti::store_row_stat(exec, act, n_active, (const Acc*)terms.data() + N, ti::stat_term_t, stats);
  Kokkos::View<Acc*, Mem> row_loss("tlse::row_loss", N), total("tlse::total", 1);
  call.row_losses(act, stats, pair.data(), row_loss.data());
  ti::write_row_losses(exec, opts.reduction == Reduction::none, (const Acc*)row_loss.data(), N, loss.data(),
                       total.data());
  exec.fence();  // the buffers die here
  Kokkos::Profiling::popRegion();
}

/// Backward. Takes the forward's inputs, its row_stats and dloss (shaped like the loss, the same on
/// every rank). Writes this rank's dWs (V_r x D_s) and dWt (V_r x D_t) shards and the full dHs (N
/// x D_s) and dHt (N x D_t), the same on every rank (the ranks' partial gradients are summed in
/// the accumulator type, then rounded once); any may be empty (dHs and dHt on every rank or none).
/// \param comm the communicator (carries the execution space)
/// \param Hs, Ws, Ht, Wt, targets the forward's inputs (Ws and Wt this rank's shards)
/// \param row_stats the forward's row_stats output
/// \param dloss gradient with respect to the loss, shaped like the loss
/// \param dHs (N x D_s) output view of T, or empty
/// \param dWs (V_r x D_s) output view of T, or empty
/// \param dHt (N x D_t) output view of T, or empty
/// \param dWt (V_r x D_t) output view of T, or empty
/// \param opts the forward's options; `accumulate` adds into the gradients
/// \throws std::invalid_argument on every rank, as distillation_loss.
template <class Comm, class HsV, class WsV, class HtV, class WtV, class TargetV, class StatsV, class DLossV, class DHsV,
          class DWsV, class DHtV, class DWtV>
void distillation_loss_backward(const Comm& comm, const HsV& Hs, const WsV& Ws, const HtV& Ht, const WtV& Wt,
                                const TargetV& targets, const StatsV& row_stats, const DLossV& dloss, const DHsV& dHs,
                                const DWsV& dWs, const DHtV& dHt, const DWtV& dWt,
                                const DistillationOptions& opts = {}) {
  using Exec = typename Comm::execution_space;
  using Mem = typename Exec::memory_space;
  using impl::index_t;
  namespace ti = tlse::impl;
  const ti::ArgumentChecker check("tlse::distributed::distillation_loss_backward");
  auto call = ti::distillation_call(comm.exec(), check, Hs, Ws, Ht, Wt, targets, opts);
  using T = typename decltype(call)::T;
  using Acc = typename decltype(call)::Acc;
  ti::static_check_row_stats<Exec, T, StatsV>();
  ti::static_check_acc_vector<Exec, T, DLossV>();
  ti::static_check_distillation_gradients<Exec, T, DHsV, DWsV, DHtV, DWtV>();
  typename decltype(call)::WantedGradients wanted{};
  const auto shard = impl::agree_distillation(comm, check, call, dHs.size() > 0, dHt.size() > 0, [&] {
    call.check_row_stats(row_stats);
    wanted = call.check_gradients(dloss, dHs, dWs, dHt, dWt);
  });
  Kokkos::Profiling::pushRegion("tlse::distributed::distillation_loss_backward");
  const Exec& exec = comm.exec();
  const index_t N = call.N, Vr = shard.vocab, voff = shard.offset;
  const index_t Ds = index_t(Hs.extent(1)), Dt = index_t(Ht.extent(1));
  Kokkos::View<int*, Mem> row_target("tlse::row_target", N), active("tlse::active", N), position("tlse::position", N),
      local_target("tlse::local_target", N);
  call.prepare_rows(row_target.data(), active.data(), position.data());
  Kokkos::View<Acc*, Mem> div("tlse::div", N), ce("tlse::ce", N);
  call.gradient_coefficients(active.data(), dloss, div.data(), ce.data());
  {
    const int* rt = row_target.data();
    int* lt = local_target.data();
    Kokkos::parallel_for(
        "tlse::vocab_local_targets", Kokkos::RangePolicy<Exec>(exec, 0, N), KOKKOS_LAMBDA(index_t i) {
          const index_t t = rt[i] - voff;  // the target as a column of this shard, or none
          lt[i] = rt[i] >= 0 && t >= 0 && t < Vr ? int(t) : -1;
        });
  }
  // This shard's share of dHs and dHt in Acc (0 for the rows not scored), summed over the ranks,
  // rounded to T once; dWs and dWt directly.
  using Part = Kokkos::View<Acc**, Kokkos::LayoutRight, Mem>;
  Part part_s("tlse::dHs_part", wanted.dHs ? N : 0, Ds), part_t("tlse::dHt_part", wanted.dHt ? N : 0, Dt);
  const auto pp = call.problem(active.data(), position.data(), row_stats.data());
  const ti::DistillationGradientTerms<Acc> g{div.data(), opts.alpha > 0 ? ce.data() : nullptr, local_target.data()};
  ti::distillation_backward(exec, pp, g, wanted.dHs ? part_s.data() : nullptr, wanted.dWs ? dWs.data() : nullptr,
                            wanted.dHt ? part_t.data() : nullptr, wanted.dWt ? dWt.data() : nullptr, opts.accumulate);
  if (wanted.dHs) impl::sum_partial_gradient(comm, part_s, dHs, opts.accumulate);
  if (wanted.dHt) impl::sum_partial_gradient(comm, part_t, dHt, opts.accumulate);
  exec.fence();  // the buffers die here
  Kokkos::Profiling::popRegion();
}

}  // namespace tlse::distributed
