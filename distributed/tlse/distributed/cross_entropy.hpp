#pragma once
/// \file cross_entropy.hpp
/// Vocabulary-parallel cut cross-entropy: the classifier C is split by rows across the ranks,
/// each owning a contiguous vocabulary range (rank order: rank r owns classes
/// [sum_{q<r} V_q, sum_{q<=r} V_q)); E and the targets are the same on every rank.
///
/// Forward: each rank runs the tiled LSE over its shard, then two all-reduces of 3N numbers in
/// all combine the shards: the max of the per-shard LSEs per token, then the sum of
/// exp(lse_r - max) and the target logit (non-zero on the rank owning the target).
/// Backward: each rank writes its dC (and dbias) shard and a partial dE (its classes' share),
/// and the partial dE are summed across ranks (an all-reduce of N x D accumulators): every rank
/// ends with the full dE.
#include <tlse/cross_entropy.hpp>
#include <tlse/distributed/impl/agreement.hpp>
#include <tlse/distributed/impl/ring.hpp>

#include <type_traits>

namespace tlse::distributed {

namespace impl {

/// The metadata every rank contributes, in this order.
enum CrossEntropyField {
  e_rows,
  e_depth,
  e_vocab,
  e_scalar,
  e_has_bias,
  e_reduction,
  e_shift,
  e_ignore,
  e_softcap,
  e_z_loss,
  e_precision,
  e_want_dE,
  cross_entropy_fields
};

/// What the forward and the backward share once the ranks agree.
struct VocabShard {
  index_t offset = 0, vocab = 0, active = 0, scored = 0;
};

/// Runs the local checks, agrees on the shapes and options, then checks the targets against
/// the global vocabulary. Throws the same error on every rank. `want_dE` (backward) decides an
/// all-reduce, so every rank must agree on it.
template <class Comm, class Call, class Checks>
VocabShard agree_cross_entropy(const Comm& comm, const tlse::impl::ArgumentChecker& check, Call& call, bool want_dE,
                               const Checks& local_checks) {
  using T = typename Call::T;
  const auto& o = call.o;
  const std::vector<std::int64_t> meta = {std::int64_t(call.E.extent(0)),
                                          std::int64_t(call.E.extent(1)),
                                          std::int64_t(call.C.extent(0)),
                                          scalar_code<T>(),
                                          call.C.extent(0) == 0 ? Agreement::any_value : call.bias.extent(0) > 0,
                                          std::int64_t(o.reduction),
                                          o.shift,
                                          o.ignore_index,
                                          double_bits(o.softcap),
                                          double_bits(o.z_loss),
                                          std::int64_t(o.precision),
                                          want_dE};
  Agreement shapes(comm, check.function(), meta, [&] {
    tlse::impl::check_operands(check, "E", call.E, "C", call.C);
    check.optional("bias", call.bias, call.C.extent(0), "this rank's shard of C");
    check.vector("targets", call.targets);
    check.extent("targets", call.targets.extent(0), call.E.extent(0), "E's row count");
    if (o.shift < 0) check.fail("shift", "must be >= 0, got " + std::to_string(o.shift));
    check.finite_nonnegative<typename Call::Acc>("softcap", o.softcap, true);
    check.finite_nonnegative<typename Call::Acc>("z_loss", o.z_loss);
    const double eps = tlse::impl::resolved_filter_eps<T>(o);
    if (!(eps >= 0 && eps <= 1))
      check.fail("filter_eps", "must be in [0, 1] or filter_eps_auto, got " + check.number(eps));
    tlse::impl::check_finite(comm.exec(), check, "E", call.E, o.non_finite);
    tlse::impl::check_finite(comm.exec(), check, "C", call.C, o.non_finite);
    tlse::impl::check_finite(comm.exec(), check, "bias", call.bias, o.non_finite);
    local_checks();
  });
  shapes.require_same(e_rows, "E", "rows (tokens)");
  shapes.require_same(e_depth, "E", "columns (features)");
  shapes.require_same(e_scalar, "E", "scalar type", scalar_code_name);
  shapes.require_same(e_has_bias, "bias", "a non-empty flag (1: bias given, 0: empty)");
  shapes.require_same(e_reduction, "opts.reduction", "value");
  shapes.require_same(e_shift, "opts.shift", "value");
  shapes.require_same(e_ignore, "opts.ignore_index", "value");
  shapes.require_same(e_softcap, "opts.softcap", "bit pattern");
  shapes.require_same(e_z_loss, "opts.z_loss", "bit pattern");
  shapes.require_same(e_precision, "opts.precision", "value (0: exact, 1: tf32)");
  shapes.require_same(e_want_dE, "dE", "a non-empty flag (1: wanted, 0: empty)");
  const RowLayout vocab(comm.rank(), comm.size(), [&](int r) { return shapes.value(r, e_vocab); });
  VocabShard shard{vocab.offset[vocab.rank], vocab.rows[vocab.rank], 0, 0};
  const index_t N = index_t(call.E.extent(0));
  shard.scored = std::max<index_t>(0, N - o.shift);
  Agreement targets(comm, check.function(), {}, [&] {
    if (o.ignore_index >= 0 && o.ignore_index < vocab.total)
      check.fail("ignore_index", "is " + std::to_string(o.ignore_index) + ", a valid class in [0, " +
                                     std::to_string(vocab.total) + ")");
    shard.active = shard.scored - tlse::impl::check_indices(comm.exec(), check, "targets", call.targets, o.shift,
                                                            shard.scored, vocab.total, o.ignore_index, true);
  });
  call.N = N;
  call.V = shard.vocab;
  call.scored = shard.scored;
  call.active_count = shard.active;
  return shard;
}

}  // namespace impl

/// Forward. E: (N x D) embeddings and targets (N, global class ids or ignore_index), the same
/// on every rank; C: (V_r x D) this rank's shard of the classifier, bias: (V_r) or empty.
/// loss ((N) for Reduction::none, (1) otherwise) and lse ((N) or empty, the global per-row LSE,
/// 0 for ignored rows) come out the same on every rank. Options as tlse::cross_entropy;
/// workspace is not used. Collective: every rank of comm must call it.
template <class Comm, class EV, class CV, class BiasV, class TargetV, class LossV, class LseV>
void cross_entropy(const Comm& comm, const EV& E, const CV& C, const BiasV& bias, const TargetV& targets,
                   const LossV& loss, const LseV& lse, const CrossEntropyOptions& opts = {}) {
  using Exec = typename Comm::execution_space;
  using Mem = typename Exec::memory_space;
  using impl::index_t;
  const tlse::impl::ArgumentChecker check("tlse::distributed::cross_entropy");
  auto call = tlse::impl::cross_entropy_call(comm.exec(), check, E, C, bias, targets, opts);
  using T = typename decltype(call)::T;
  using Acc = typename decltype(call)::Acc;
  tlse::impl::static_check_acc_vector<Exec, T, LossV>();
  tlse::impl::static_check_acc_vector<Exec, T, LseV>();
  bool want_lse = false;
  const auto shard = impl::agree_cross_entropy(comm, check, call, false, [&] {
    check.vector("loss", loss);
    check.extent("loss", loss.extent(0), opts.reduction == Reduction::none ? E.extent(0) : 1,
                 opts.reduction == Reduction::none ? "Reduction::none (one loss per row of E)" : "a reduced loss");
    want_lse = check.optional("lse", lse, E.extent(0), "E's row count");
  });
  Kokkos::Profiling::pushRegion("tlse::distributed::cross_entropy");
  const Exec& exec = comm.exec();
  const index_t N = call.N, Vr = shard.vocab, voff = shard.offset, n_active = shard.active;
  // position: the inverse of `active`, with which the Hopper kernels sweep calls with ignored rows.
  Kokkos::View<int*, Mem> row_target("tlse::row_target", N), active("tlse::active", N), position("tlse::position", N);
  call.prepare_rows(row_target.data(), active.data(), position.data());
  const auto prob = call.problem(active.data(), position.data(), nullptr);
  const auto grid = tlse::impl::ForwardGrid::plan(exec, n_active, Vr);
  Kokkos::View<Acc*, Mem> partials("tlse::partials",
                                   tlse::impl::forward_partials_size(grid, n_active, Vr, false, false));
  // local: this shard's LSE per row; shared: [sum_r exp(lse_r - max) | target logit], all-reduced.
  Kokkos::View<Acc*, Mem> local("tlse::shard_lse", N), top("tlse::max_lse", N), shared("tlse::shared", 2 * N),
      pair("tlse::target_logit", n_active);
  tlse::impl::fill(exec, local.data(), N, -tlse::impl::infinity<Acc>());
  tlse::impl::lse_forward(exec, prob, grid, partials.data(), local.data(), (Acc*)nullptr, (Acc*)nullptr);
  const int *act = active.data(), *rt = row_target.data();
  if (Vr > 0)
    tlse::impl::pair_logits(
        exec, prob, n_active, KOKKOS_LAMBDA(index_t k) { return index_t(act[k]); },
        KOKKOS_LAMBDA(index_t k) {
          const index_t t = rt[act[k]] - voff;
          return t >= 0 && t < Vr ? t : index_t(0);  // another rank's class: discarded below
        },
        pair.data());
  Kokkos::deep_copy(exec, top, local);
  comm.allreduce(top, ReduceOp::max);
  {
    Acc* sh = shared.data();
    const Acc *lo = local.data(), *mx = top.data(), *pr = pair.data();
    Kokkos::parallel_for(
        "tlse::vocab_shard_terms", Kokkos::RangePolicy<Exec>(exec, 0, N), KOKKOS_LAMBDA(index_t i) {
          sh[i] = mx[i] == -tlse::impl::infinity<Acc>() ? Acc(0) : tlse::impl::exp(lo[i] - mx[i]);
          sh[N + i] = 0;
        });
    Kokkos::parallel_for(
        "tlse::vocab_shard_target", Kokkos::RangePolicy<Exec>(exec, 0, n_active), KOKKOS_LAMBDA(index_t k) {
          const index_t t = rt[act[k]] - voff;
          if (t >= 0 && t < Vr) sh[N + act[k]] = pr[k];
        });
  }
  comm.allreduce(shared, ReduceOp::sum);
  Kokkos::View<Acc*, Mem> row_loss("tlse::row_loss", N), total("tlse::total", 1), scratch("tlse::scratch", 1);
  {
    const Acc z = Acc(opts.z_loss);
    Acc *rl = row_loss.data(), *glse = local.data();  // local now receives the global LSE
    const Acc *sh = shared.data(), *mx = top.data();
    Kokkos::parallel_for(
        "tlse::vocab_rows", Kokkos::RangePolicy<Exec>(exec, 0, N), KOKKOS_LAMBDA(index_t i) {
          if (rt[i] < 0) {
            rl[i] = glse[i] = 0;
            return;
          }
          const Acc l = mx[i] == -tlse::impl::infinity<Acc>() ? mx[i] : mx[i] + tlse::impl::log(sh[i]);
          glse[i] = l;
          rl[i] = l - sh[N + i] + z * l * l;
        });
  }
  if (opts.reduction == Reduction::none) {
    Kokkos::deep_copy(exec, loss, row_loss);
  } else {
    const Acc weight = opts.reduction == Reduction::sum ? Acc(1) : n_active > 0 ? Acc(1) / Acc(n_active) : Acc(0);
    tlse::impl::weighted_sum(exec, row_loss.data(), N, weight, loss.data(), false, scratch.data());
  }
  if (want_lse) Kokkos::deep_copy(exec, lse, local);
  exec.fence();  // the buffers die here
  Kokkos::Profiling::popRegion();
}

/// Backward. Takes the forward's inputs, its global lse and dloss (shaped like the loss, the
/// same on every rank). Writes this rank's dC (V_r x D) and dbias (V_r) shards and the full dE
/// (N x D, the same on every rank: the partial dE of the ranks are summed in the accumulator
/// type, then rounded once); any may be empty. Filtering (filter_eps) applies per shard;
/// opts.memory_budget bounds this rank's backward scratch over its shard.
template <class Comm, class EV, class CV, class BiasV, class TargetV, class LseV, class DLossV, class DEV, class DCV,
          class DBiasV>
void cross_entropy_backward(const Comm& comm, const EV& E, const CV& C, const BiasV& bias, const TargetV& targets,
                            const LseV& lse, const DLossV& dloss, const DEV& dE, const DCV& dC, const DBiasV& dbias,
                            const CrossEntropyOptions& opts = {}) {
  using Exec = typename Comm::execution_space;
  using Mem = typename Exec::memory_space;
  using impl::index_t;
  const tlse::impl::ArgumentChecker check("tlse::distributed::cross_entropy_backward");
  auto call = tlse::impl::cross_entropy_call(comm.exec(), check, E, C, bias, targets, opts);
  using T = typename decltype(call)::T;
  using Acc = typename decltype(call)::Acc;
  tlse::impl::static_check_acc_vector<Exec, T, LseV>();
  tlse::impl::static_check_acc_vector<Exec, T, DLossV>();
  tlse::impl::static_check_view<Exec, DEV, 2>();
  tlse::impl::static_check_view<Exec, DCV, 2>();
  tlse::impl::static_check_view<Exec, DBiasV, 1>();
  static_assert(
      std::is_same<typename DEV::value_type, T>::value && std::is_same<typename DCV::value_type, T>::value &&
          std::is_same<typename DBiasV::value_type, T>::value,
      "tlse::distributed::cross_entropy_backward: dE, dC and dbias are non-const views of the input scalar type");
  bool want_dE = false, want_dC = false, want_dbias = false;
  const auto shard = impl::agree_cross_entropy(comm, check, call, dE.size() > 0, [&] {
    const std::size_t N = E.extent(0), D = E.extent(1), V = C.extent(0);
    check.vector("lse", lse);
    check.extent("lse", lse.extent(0), N, "E's row count");
    check.vector("dloss", dloss);
    check.extent("dloss", dloss.extent(0), opts.reduction == Reduction::none ? N : 1,
                 opts.reduction == Reduction::none ? "Reduction::none (one loss per row of E)" : "a reduced loss");
    want_dE = check.optional_matrix("dE", dE, N, D, "E");
    want_dC = check.optional_matrix("dC", dC, V, D, "C");
    want_dbias = check.optional("dbias", dbias, V, "this rank's shard of C");
    tlse::impl::check_finite(comm.exec(), check, "dloss", dloss, opts.non_finite);
  });
  Kokkos::Profiling::pushRegion("tlse::distributed::cross_entropy_backward");
  const Exec& exec = comm.exec();
  const index_t N = call.N, D = index_t(E.extent(1)), Vr = shard.vocab, voff = shard.offset;
  Kokkos::View<int*, Mem> row_target("tlse::row_target", N), active("tlse::active", N), position("tlse::position", N),
      local_target("tlse::local_target", N);
  call.prepare_rows(row_target.data(), active.data(), position.data());
  Kokkos::View<Acc*, Mem> g("tlse::g", N), w("tlse::w", N);
  {
    const int *act = active.data(), *rt = row_target.data();
    int* lt = local_target.data();
    Acc *gp = g.data(), *wp = w.data();
    const Acc* saved = lse.data();
    const Acc* up = dloss.data();
    const bool per_row = opts.reduction == Reduction::none;
    const Acc weight =
        opts.reduction == Reduction::mean ? (shard.active > 0 ? Acc(1) / Acc(shard.active) : Acc(0)) : Acc(1);
    const Acc z = Acc(opts.z_loss);
    Kokkos::parallel_for(
        "tlse::vocab_coefficients", Kokkos::RangePolicy<Exec>(exec, 0, shard.active), KOKKOS_LAMBDA(index_t k) {
          const int i = act[k];
          const Acc coef = (per_row ? up[i] : up[0]) * weight;
          gp[i] = coef * (Acc(1) + Acc(2) * z * saved[i]);
          wp[i] = coef;
          const index_t t = rt[i] - voff;  // the target as a column of this shard, or none
          lt[i] = t >= 0 && t < Vr ? int(t) : -1;
        });
  }
  // This shard's share of dE, in Acc, summed over the ranks, rounded to T once; dC and dbias
  // directly. One backward request of the core: on Hopper GPUs the fused backward or its two
  // passes, whichever opts.memory_budget holds (as tlse::cross_entropy_backward).
  constexpr bool direct = std::is_same<T, Acc>::value;
  Kokkos::View<Acc**, Kokkos::LayoutRight, Mem> part("tlse::dE_part", want_dE ? N : 0, D);
  Kokkos::View<T**, Kokkos::LayoutRight, Mem> staged("tlse::dE_staged", want_dE && !direct ? N : 0, D);
  Kokkos::View<char*, Mem> scratch("tlse::backward_scratch",
                                   tlse::impl::backward_scratch_bytes<T>(exec, call.backward_shape()));
  tlse::impl::BackwardRequest<T, Acc> r{};
  r.prob = call.problem(active.data(), position.data(), nullptr);
  r.row_terms = {lse.data(), g.data(), local_target.data(), w.data()};
  r.filter_eps = Acc(tlse::impl::resolved_filter_eps<T>(opts));
  r.grad_rows = want_dE ? direct ? reinterpret_cast<T*>(part.data()) : staged.data() : nullptr;
  r.grad_cols = want_dC ? dC.data() : nullptr;
  r.dbias = want_dbias ? dbias.data() : nullptr;
  r.accumulate = opts.accumulate;  // onto dC and dbias; the rows' buffer starts at 0
  r.scratch = scratch.data();
  r.scratch_bytes = scratch.size();
  tlse::impl::lse_backward(exec, r);
  if (want_dE) {
    Acc* p = part.data();
    if (!direct) {
      const T* st = staged.data();
      Kokkos::parallel_for(
          "tlse::vocab_dE_widen", Kokkos::RangePolicy<Exec>(exec, 0, N * D),
          KOKKOS_LAMBDA(index_t i) { p[i] = tlse::impl::to_acc<Acc>(st[i]); });
    }
    comm.allreduce(part, ReduceOp::sum);
    T* out = dE.data();
    const bool acc = opts.accumulate;
    Kokkos::parallel_for(
        "tlse::vocab_dE", Kokkos::RangePolicy<Exec>(exec, 0, N * D), KOKKOS_LAMBDA(index_t i) {
          out[i] = tlse::impl::from_acc<T>((acc ? tlse::impl::to_acc<Acc>(out[i]) : Acc(0)) + p[i]);
        });
  }
  exec.fence();  // the buffers die here
  Kokkos::Profiling::popRegion();
}

}  // namespace tlse::distributed
