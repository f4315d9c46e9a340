#pragma once
/// \file cross_entropy.hpp
/// Vocabulary-parallel cut cross-entropy: the classifier C is split by rows across the ranks,
/// each owning a contiguous vocabulary range (rank order: rank r owns classes
/// [sum_{q<r} V_q, sum_{q<=r} V_q)); E and the targets are the same on every rank.
///
/// Forward: each rank runs the tiled LSE over its shard, then two all-reduces of 3N to 5N numbers
/// in all combine the shards: the max of the per-shard LSEs per token, then the sum of
/// exp(lse_r - max), the target logit and the target's class weight (non-zero on the rank owning
/// the target) and label smoothing's weighted logit sum; the argmax takes two more (the largest
/// logit, then the lowest class holding it).
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
  e_label_smoothing,
  e_precision,
  e_want_dE,
  e_has_weight,
  e_want_argmax,
  e_has_dlse,
  cross_entropy_fields
};

/// What the forward and the backward share once the ranks agree.
struct VocabShard {
  index_t offset = 0, vocab = 0, total = 0, active = 0, scored = 0;
  bool weighted = false;  // class weights given (a rank with no classes has none of its own)
};

/// Runs the local checks, agrees on the shapes and options, then checks the targets against
/// the global vocabulary and sums the class weights' totals over the ranks (into `call`).
/// Throws the same error on every rank. `want_dE` (backward) and the argmax decide collectives,
/// so every rank must agree on them.
template <class Comm, class Call, class Checks>
VocabShard agree_cross_entropy(const Comm& comm, const tlse::impl::ArgumentChecker& check, Call& call, bool want_dE,
                               const Checks& local_checks) {
  using T = typename Call::T;
  const auto& o = call.o;
  const auto& x = call.x;
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
                                          double_bits(o.label_smoothing),
                                          std::int64_t(o.precision),
                                          want_dE,
                                          call.C.extent(0) == 0 ? Agreement::any_value : x.class_weight.extent(0) > 0,
                                          call.want_argmax(),
                                          x.dlse.extent(0) > 0};
  double local_class_total = 0;
  Agreement shapes(comm, check.function(), meta, [&] {
    call.N = index_t(call.E.extent(0));
    tlse::impl::check_operands(check, "E", call.E, "C", call.C);
    check.optional("bias", call.bias, call.C.extent(0), "this rank's shard of C");
    check.optional("class_weight", x.class_weight, call.C.extent(0), "this rank's shard of C");
    check.vector("targets", call.targets);
    check.extent("targets", call.targets.extent(0), call.E.extent(0), "E's row count");
    call.check_options();
    tlse::impl::check_finite(comm.exec(), check, "E", call.E, o.non_finite);
    tlse::impl::check_finite(comm.exec(), check, "C", call.C, o.non_finite);
    tlse::impl::check_finite(comm.exec(), check, "bias", call.bias, o.non_finite);
    local_class_total = call.check_class_weight();
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
  shapes.require_same(e_label_smoothing, "opts.label_smoothing", "bit pattern");
  shapes.require_same(e_precision, "opts.precision", "value (0: exact, 1: tf32)");
  shapes.require_same(e_want_dE, "dE", "a non-empty flag (1: wanted, 0: empty)");
  shapes.require_same(e_has_weight, "class_weight", "a non-empty flag (1: given, 0: empty)");
  shapes.require_same(e_want_argmax, "predicted", "a flag (1: predicted or accuracy wanted, 0: neither)");
  shapes.require_same(e_has_dlse, "dlse", "a non-empty flag (1: given, 0: empty)");
  const RowLayout vocab(comm.rank(), comm.size(), [&](int r) { return shapes.value(r, e_vocab); });
  VocabShard shard{vocab.offset[vocab.rank], vocab.rows[vocab.rank], vocab.total, 0, 0, false};
  for (int r = 0; r < comm.size(); ++r)
    if (shapes.value(r, e_has_weight) != Agreement::any_value) shard.weighted = shapes.value(r, e_has_weight) != 0;
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
  call.smoothing_classes = shard.total;
  call.class_weight_total = double(shard.total);
  call.target_weight_total = double(shard.active);
  if (shard.weighted) {  // sum_j u_j and sum_i u_t over every rank's classes
    using Mem = typename Comm::execution_space::memory_space;
    Kokkos::View<double*, Mem> totals("tlse::weight_totals", 2);
    const double local[2] = {local_class_total, call.target_weights(shard.offset, shard.vocab)};
    Kokkos::deep_copy(comm.exec(), totals, Kokkos::View<const double*, Kokkos::HostSpace>(local, 2));
    comm.allreduce(totals, ReduceOp::sum);
    double global[2];
    Kokkos::deep_copy(comm.exec(), Kokkos::View<double*, Kokkos::HostSpace>(global, 2), totals);
    comm.exec().fence();
    call.class_weight_total = global[0];
    call.target_weight_total = global[1];
  }
  return shard;
}

/// Label smoothing's vectors (tlse::impl::SmoothingVectors) in views of their own, for products
/// over at most `rows` rows of `depth`.
template <class Acc, class Exec>
struct OwnedSmoothingVectors {
  Kokkos::View<Acc*, typename Exec::memory_space> storage;
  tlse::impl::SmoothingVectors<Acc> vectors;
  OwnedSmoothingVectors(const Exec& exec, index_t rows, index_t depth, bool wanted) {
    tlse::impl::WorkspaceCarver sizing;
    tlse::impl::SmoothingVectors<Acc>::carve(sizing, exec, rows, depth, wanted);
    storage = Kokkos::View<Acc*, typename Exec::memory_space>("tlse::smoothing_vectors",
                                                              wanted ? sizing.bytes() / sizeof(Acc) + 1 : 0);
    tlse::impl::WorkspaceCarver carver(tlse::impl::aligned_base(reinterpret_cast<char*>(storage.data())));
    if (wanted) vectors = tlse::impl::SmoothingVectors<Acc>::carve(carver, exec, rows, depth, wanted);
  }
};

}  // namespace impl

/// Forward. E: (N x D) embeddings and targets (N, global class ids or ignore_index), the same
/// on every rank; C: (V_r x D) this rank's shard of the classifier, bias: (V_r) or empty.
/// loss ((N) for Reduction::none, (1) otherwise) and lse ((N) or empty, the global per-row LSE,
/// 0 for ignored rows) come out the same on every rank. extras: class_weight is this rank's
/// shard (V_r; given on every rank or none); predicted (global class ids) and accuracy come out
/// the same on every rank (asked for on every rank or none). Options as tlse::cross_entropy;
/// workspace is not used. Collective: every rank of comm must call it.
template <class Comm, class EV, class CV, class BiasV, class TargetV, class LossV, class LseV>
void cross_entropy(const Comm& comm, const EV& E, const CV& C, const BiasV& bias, const TargetV& targets,
                   const LossV& loss, const LseV& lse,
                   const CrossEntropyExtras<accumulator_t<tlse::impl::scalar_of<EV>>,
                                            typename Comm::execution_space::memory_space>& extras,
                   const CrossEntropyOptions& opts = {}) {
  using Exec = typename Comm::execution_space;
  using Mem = typename Exec::memory_space;
  using impl::index_t;
  const tlse::impl::ArgumentChecker check("tlse::distributed::cross_entropy");
  auto call = tlse::impl::cross_entropy_call(comm.exec(), check, E, C, bias, targets, opts, extras);
  using T = typename decltype(call)::T;
  using Acc = typename decltype(call)::Acc;
  tlse::impl::static_check_acc_vector<Exec, T, LossV>();
  tlse::impl::static_check_acc_vector<Exec, T, LseV>();
  bool want_lse = false;
  const auto shard = impl::agree_cross_entropy(comm, check, call, false, [&] {
    call.check_extras("forward");
    call.check_loss_shape("loss", loss);
    want_lse = check.optional("lse", lse, E.extent(0), "E's row count");
  });
  Kokkos::Profiling::pushRegion("tlse::distributed::cross_entropy");
  const Exec& exec = comm.exec();
  const index_t N = call.N, Vr = shard.vocab, voff = shard.offset, n_active = shard.active, D = index_t(E.extent(1));
  const bool smoothing = opts.label_smoothing > 0, want_argmax = call.want_argmax();
  // position: the inverse of `active`, with which the Hopper kernels sweep calls with ignored rows.
  Kokkos::View<int*, Mem> row_target("tlse::row_target", N), active("tlse::active", N), position("tlse::position", N);
  call.prepare_rows(row_target.data(), active.data(), position.data());
  const auto prob = call.problem(active.data(), position.data(), nullptr);
  const auto grid = tlse::impl::ForwardGrid::plan(exec, n_active, Vr);
  Kokkos::View<Acc*, Mem> partials("tlse::partials",
                                   tlse::impl::forward_partials_size(grid, n_active, Vr, false, false));
  // local: this shard's LSE per row; shared: [sum_r exp(lse_r - max) | target logit | target
  // weight | label smoothing's row sums over the shard], all-reduced.
  const index_t fields = smoothing ? 4 : 3;
  Kokkos::View<Acc*, Mem> local("tlse::shard_lse", N), top("tlse::max_lse", N), shared("tlse::shared", fields * N),
      pair("tlse::target_logit", n_active);
  // The shard's row statistics: the argmax (local ids; the largest logit) and, under a softcap,
  // label smoothing's weighted logit sums.
  const index_t parts = want_argmax || tlse::impl::smoothing_in_tiles(opts) ? grid.grid_cols * n_active : 0;
  Kokkos::View<Acc*, Mem> best("tlse::row_best", want_argmax ? parts : 0),
      best_value("tlse::best_value", want_argmax ? N : 0),
      sum_parts("tlse::row_sum_parts", tlse::impl::smoothing_in_tiles(opts) ? parts : 0);
  Kokkos::View<int*, Mem> best_id("tlse::row_best_id", want_argmax ? parts : 0);
  Kokkos::View<std::int64_t*, Mem> local_argmax("tlse::local_argmax", want_argmax ? N : 0);
  Acc* sh = shared.data();
  tlse::impl::fill(exec, sh, fields * N, Acc(0));
  tlse::impl::RowStatistics<Acc> stats;
  if (want_argmax) {
    stats.argmax = local_argmax.data(), stats.max = best_value.data();
    stats.best = best.data(), stats.best_id = best_id.data();
    tlse::impl::fill(exec, best_value.data(), N, -tlse::impl::infinity<Acc>());
  }
  if (tlse::impl::smoothing_in_tiles(opts)) {
    stats.weighted_sum = sh + 3 * N, stats.sum_parts = sum_parts.data(), stats.col_weight = call.class_weight();
  }
  tlse::impl::fill(exec, local.data(), N, -tlse::impl::infinity<Acc>());
  tlse::impl::lse_forward(exec, prob, grid, partials.data(), local.data(), (Acc*)nullptr, (Acc*)nullptr, stats);
  const int *act = active.data(), *rt = row_target.data();
  if (Vr > 0)
    tlse::impl::pair_logits(
        exec, prob, n_active, KOKKOS_LAMBDA(index_t k) { return index_t(act[k]); },
        KOKKOS_LAMBDA(index_t k) {
          const index_t t = rt[act[k]] - voff;
          return t >= 0 && t < Vr ? t : index_t(0);  // another rank's class: discarded below
        },
        pair.data());
  impl::OwnedSmoothingVectors<Acc, Exec> smoothing_vectors(exec, Vr, D, tlse::impl::smoothing_by_vectors(opts));
  if (tlse::impl::smoothing_by_vectors(opts) && Vr > 0)
    call.smoothing_row_sums(act, smoothing_vectors.vectors, sh + 3 * N);
  Kokkos::deep_copy(exec, top, local);
  comm.allreduce(top, ReduceOp::max);
  {
    const Acc *lo = local.data(), *mx = top.data(), *pr = pair.data();
    const Acc* u = call.class_weight();
    Kokkos::parallel_for(
        "tlse::vocab_shard_terms", Kokkos::RangePolicy<Exec>(exec, 0, N), KOKKOS_LAMBDA(index_t i) {
          sh[i] = mx[i] == -tlse::impl::infinity<Acc>() ? Acc(0) : tlse::impl::exp(lo[i] - mx[i]);
        });
    Kokkos::parallel_for(
        "tlse::vocab_shard_target", Kokkos::RangePolicy<Exec>(exec, 0, n_active), KOKKOS_LAMBDA(index_t k) {
          const index_t t = rt[act[k]] - voff;
          if (t >= 0 && t < Vr) sh[N + act[k]] = pr[k], sh[2 * N + act[k]] = u ? u[t] : Acc(1);
        });
  }
  comm.allreduce(shared, ReduceOp::sum);
  Kokkos::View<Acc*, Mem> row_loss("tlse::row_loss", N), total("tlse::total", 1), glse("tlse::global_lse", N);
  {
    Acc* gl = glse.data();
    const Acc* mx = top.data();
    Kokkos::parallel_for(
        "tlse::vocab_rows", Kokkos::RangePolicy<Exec>(exec, 0, N), KOKKOS_LAMBDA(index_t i) {
          gl[i] = rt[i] < 0 ? Acc(0) : mx[i] == -tlse::impl::infinity<Acc>() ? mx[i] : mx[i] + tlse::impl::log(sh[i]);
        });
    Acc* by_position = pair.data();  // the target logits, now every rank's, by position in `active`
    Kokkos::parallel_for(
        "tlse::vocab_target_logits", Kokkos::RangePolicy<Exec>(exec, 0, n_active),
        KOKKOS_LAMBDA(index_t k) { by_position[k] = sh[N + act[k]]; });
  }
  call.row_losses(act, glse.data(), pair.data(), shard.weighted ? sh + 2 * N : nullptr,
                  smoothing ? sh + 3 * N : nullptr, call.loss_scales(), row_loss.data());
  call.write_loss(row_loss.data(), total.data(), loss);
  if (want_argmax) {
    // The largest logit over the ranks, then the lowest global class holding it (the all-reduce's
    // max of minus the ids of the ranks that hold it).
    Kokkos::View<std::int64_t*, Mem> winner("tlse::argmax_winner", N);
    const Acc* mine = best_value.data();
    const std::int64_t* la = local_argmax.data();
    std::int64_t* w = winner.data();
    Kokkos::deep_copy(exec, top, best_value);
    comm.allreduce(top, ReduceOp::max);
    const Acc* mx = top.data();
    Kokkos::parallel_for(
        "tlse::vocab_argmax_candidates", Kokkos::RangePolicy<Exec>(exec, 0, N), KOKKOS_LAMBDA(index_t i) {
          w[i] = Vr > 0 && rt[i] >= 0 && mine[i] == mx[i] ? -(la[i] + voff) : -INT64_MAX;
        });
    comm.allreduce(winner, ReduceOp::max);
    std::int64_t* pred = extras.predicted.extent(0) ? extras.predicted.data() : local_argmax.data();
    Kokkos::parallel_for(
        "tlse::vocab_argmax", Kokkos::RangePolicy<Exec>(exec, 0, N), KOKKOS_LAMBDA(index_t i) {
          pred[i] = rt[i] < 0 ? -1 : w[i] == -INT64_MAX ? 0 : -w[i];  // every logit NaN: class 0
        });
    call.write_accuracy(rt, pred, row_loss.data(), total.data());
  }
  if (want_lse) Kokkos::deep_copy(exec, lse, glse);
  exec.fence();  // the buffers die here
  Kokkos::Profiling::popRegion();
}

/// Forward without extras (see the overload with CrossEntropyExtras).
/// \param comm, E, C, bias, targets, loss, lse, opts as for the overload with extras
template <class Comm, class EV, class CV, class BiasV, class TargetV, class LossV, class LseV>
void cross_entropy(const Comm& comm, const EV& E, const CV& C, const BiasV& bias, const TargetV& targets,
                   const LossV& loss, const LseV& lse, const CrossEntropyOptions& opts = {}) {
  cross_entropy(comm, E, C, bias, targets, loss, lse,
                CrossEntropyExtras<accumulator_t<tlse::impl::scalar_of<EV>>,
                                   typename Comm::execution_space::memory_space>{},
                opts);
}

/// Backward. Takes the forward's inputs, its global lse and dloss (shaped like the loss, the
/// same on every rank). Writes this rank's dC (V_r x D) and dbias (V_r) shards and the full dE
/// (N x D, the same on every rank: the partial dE of the ranks are summed in the accumulator
/// type, then rounded once); any may be empty. extras: the forward's class_weight shard and dlse
/// (N, the same on every rank), each optional. Filtering (filter_eps) applies per shard;
/// opts.memory_budget bounds this rank's backward scratch over its shard.
template <class Comm, class EV, class CV, class BiasV, class TargetV, class LseV, class DLossV, class DEV, class DCV,
          class DBiasV>
void cross_entropy_backward(const Comm& comm, const EV& E, const CV& C, const BiasV& bias, const TargetV& targets,
                            const LseV& lse, const DLossV& dloss, const DEV& dE, const DCV& dC, const DBiasV& dbias,
                            const CrossEntropyExtras<accumulator_t<tlse::impl::scalar_of<EV>>,
                                                     typename Comm::execution_space::memory_space>& extras,
                            const CrossEntropyOptions& opts = {}) {
  using Exec = typename Comm::execution_space;
  using Mem = typename Exec::memory_space;
  using impl::index_t;
  const tlse::impl::ArgumentChecker check("tlse::distributed::cross_entropy_backward");
  auto call = tlse::impl::cross_entropy_call(comm.exec(), check, E, C, bias, targets, opts, extras);
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
    call.check_extras("backward");
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
  const int *act = active.data(), *rt = row_target.data();
  // Each row's target weight, from the rank that owns the target.
  Kokkos::View<Acc*, Mem> target_weight("tlse::target_weight", shard.weighted ? N : 0);
  if (shard.weighted) {
    Acc* tw = target_weight.data();
    const Acc* u = call.class_weight();
    Kokkos::parallel_for(
        "tlse::vocab_target_weight", Kokkos::RangePolicy<Exec>(exec, 0, N), KOKKOS_LAMBDA(index_t i) {
          const index_t t = rt[i] - voff;
          tw[i] = rt[i] >= 0 && t >= 0 && t < Vr ? u[t] : Acc(0);
        });
    comm.allreduce(target_weight, ReduceOp::sum);
  }
  Kokkos::View<Acc*, Mem> g("tlse::g", N), w("tlse::w", N), softmax("tlse::softmax", N),
      lse_factor("tlse::lse_factor", N), spread("tlse::spread", opts.label_smoothing > 0 ? N : 0);
  call.gradient_coefficients(act, dloss, shard.weighted ? target_weight.data() : nullptr, w.data(), softmax.data(),
                             lse_factor.data(), opts.label_smoothing > 0 ? spread.data() : nullptr);
  call.softmax_weights(act, softmax.data(), lse_factor.data(), lse.data(), g.data());
  {
    int* lt = local_target.data();
    Kokkos::parallel_for(
        "tlse::vocab_local_targets", Kokkos::RangePolicy<Exec>(exec, 0, N), KOKKOS_LAMBDA(index_t i) {
          const index_t t = rt[i] - voff;  // the target as a column of this shard, or none
          lt[i] = rt[i] >= 0 && t >= 0 && t < Vr ? int(t) : -1;
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
  if (tlse::impl::smoothing_in_tiles(opts))
    r.row_terms.spread = spread.data(), r.row_terms.spread_weight = call.class_weight();
  r.filter_eps = Acc(tlse::impl::resolved_filter_eps<T>(opts));
  r.grad_rows = want_dE ? direct ? reinterpret_cast<T*>(part.data()) : staged.data() : nullptr;
  r.grad_cols = want_dC ? dC.data() : nullptr;
  r.dbias = want_dbias ? dbias.data() : nullptr;
  r.accumulate = opts.accumulate;  // onto dC and dbias; the rows' buffer starts at 0
  r.scratch = scratch.data();
  r.scratch_bytes = scratch.size();
  tlse::impl::lse_backward(exec, r);
  if (want_dE && !direct) {
    Acc* p = part.data();
    const T* st = staged.data();
    Kokkos::parallel_for(
        "tlse::vocab_dE_widen", Kokkos::RangePolicy<Exec>(exec, 0, N * D),
        KOKKOS_LAMBDA(index_t i) { p[i] = tlse::impl::to_acc<Acc>(st[i]); });
  }
  if (tlse::impl::smoothing_by_vectors(opts) && Vr > 0) {  // this shard's share, before dE's sum
    impl::OwnedSmoothingVectors<Acc, Exec> vectors(exec, std::max(N, Vr), D, true);
    call.smoothing_gradients(act, spread.data(), vectors.vectors, part, want_dC ? dC : DCV(),
                             want_dbias ? dbias : DBiasV());
  }
  if (want_dE) {
    Acc* p = part.data();
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

/// Backward without extras (see the overload with CrossEntropyExtras).
/// \param comm, E, C, bias, targets, lse, dloss, dE, dC, dbias, opts as for the overload with extras
template <class Comm, class EV, class CV, class BiasV, class TargetV, class LseV, class DLossV, class DEV, class DCV,
          class DBiasV>
void cross_entropy_backward(const Comm& comm, const EV& E, const CV& C, const BiasV& bias, const TargetV& targets,
                            const LseV& lse, const DLossV& dloss, const DEV& dE, const DCV& dC, const DBiasV& dbias,
                            const CrossEntropyOptions& opts = {}) {
  cross_entropy_backward(comm, E, C, bias, targets, lse, dloss, dE, dC, dbias,
                         CrossEntropyExtras<accumulator_t<tlse::impl::scalar_of<EV>>,
                                            typename Comm::execution_space::memory_space>{},
                         opts);
}

}  // namespace tlse::distributed
