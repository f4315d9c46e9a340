#pragma once
// What the cross-entropy calls share (single-device and vocabulary-parallel): the checks of their
// arguments, the rows that are scored, the per-row loss under the options (class weights, label
// smoothing, z-loss) and its gradient coefficients, and the workspace arrays of each call.
//
// Row i (scored, target t) with class weights u (all 1 without them), W = sum_j u_j, V classes,
// label smoothing e and z-loss z has the loss
//   loss_i = (1 - e) u_t (lse_i - x_it) + (e / V) (W lse_i - S_i) + z lse_i^2,  S_i = sum_j u_j x_ij,
// F.cross_entropy's (weight, label_smoothing) plus the z-loss. Reduction::mean divides the first
// two terms by sum_i u_t(i) (PyTorch's rule) and the z-loss by the number of scored rows (as
// Liger-Kernel's lse_square_scale). With an upstream gradient c_i of the first two terms and
// c'_i of the z-loss, dL/dx_ij = g_i p_ij - [j == t] w_i - s_i u_j with
//   w_i = c_i (1 - e) u_t,  g_i = c_i ((1 - e) u_t + e W / V) + 2 z c'_i lse_i + dlse_i,  s_i = c_i e / V,
// dlse_i being the gradient reaching the returned LSE directly.
#include <tlse/cross_entropy_options.hpp>
#include <tlse/impl/backend_dispatch.hpp>
#include <tlse/impl/index_lists.hpp>
#include <tlse/impl/label_smoothing.hpp>
#include <tlse/impl/lse_forward.hpp>
#include <tlse/impl/pair_logits.hpp>
#include <tlse/impl/problem_builder.hpp>
#include <tlse/impl/weighted_sum.hpp>
#include <tlse/impl/workspace_carver.hpp>

#include <algorithm>

namespace tlse::impl {

template <class T>
double resolved_filter_eps(const CrossEntropyOptions& o) {
  return o.filter_eps == filter_eps_auto ? storage_epsilon<T>() / 32 : o.filter_eps;
}

/// The shape a backend's backward or step plans for: E (N x D) against C (V x D) under `o`.
template <class EV, class CV>
BackwardShape cross_entropy_shape(const EV& E, const CV& C, const CrossEntropyOptions& o) {
  return {index_t(E.extent(0)), index_t(C.extent(0)), index_t(E.extent(1)), o.precision, o.memory_budget, o.accumulate};
}

/// Whether label smoothing goes through the tile kernels (under a softcap: SoftmaxTerms::spread
/// and the forward's weighted row sums) rather than as vectors of the depth (label_smoothing.hpp).
inline bool smoothing_in_tiles(const CrossEntropyOptions& o) { return o.label_smoothing > 0 && o.softcap > 0; }
inline bool smoothing_by_vectors(const CrossEntropyOptions& o) { return o.label_smoothing > 0 && !(o.softcap > 0); }

/// Scratch of cross_entropy_with_gradients' fused step, 0 when the step runs as the forward then
/// the backward: the one decision that the call takes and cross_entropy_step_fuses reports.
template <class Exec, class EV, class CV>
std::size_t fused_step_scratch_bytes(const Exec& exec, const EV& E, const CV& C, const CrossEntropyOptions& o,
                                     bool want_dbias, bool want_argmax = false) {
  // The backends' steps compute no bias gradient, no argmax and no smoothing term per entry.
  if (want_dbias || want_argmax || smoothing_in_tiles(o)) return 0;
  return step_scratch_bytes<scalar_of<EV>>(exec, cross_entropy_shape(E, C, o));
}

/// The per-row denominators of the reduced loss: the first two terms of loss_i over ce, the
/// z-loss over z (1 and 1 unless Reduction::mean; an empty batch or a zero total weight gives 0).
template <class Acc>
struct LossScales {
  Acc ce = 1, z = 1;
};

/// The vectors of label smoothing by vectors (label_smoothing.hpp) for products over at most
/// `rows` rows: C^T u or E^T s, their partial sums, and two scalars (bias . u or sum_i s_i, and
/// a sum's workspace).
template <class Acc>
struct SmoothingVectors {
  Acc *v = nullptr, *partials = nullptr, *scalar = nullptr;
  template <class Exec>
  static SmoothingVectors carve(WorkspaceCarver& c, const Exec& exec, index_t rows, index_t depth, bool wanted) {
    SmoothingVectors s;
    s.v = c.take<Acc>(wanted ? depth : 0);
    s.partials = c.take<Acc>(wanted ? ColumnSumPlan::make(exec, rows).partials(depth) : 0);
    s.scalar = c.take<Acc>(wanted ? 2 : 0);
    return s;
  }
};

/// Everything forward and backward share: checked shapes, the problem, and the active rows.
template <class Exec, class EV, class CV, class BiasV, class TargetV>
struct CrossEntropyCall {
  using T = scalar_of<EV>;
  using Acc = accumulator_t<T>;
  using Mem = typename Exec::memory_space;
  const Exec& exec;
  const ArgumentChecker& check;
  const EV& E;
  const CV& C;
  const BiasV& bias;
  const TargetV& targets;
  const CrossEntropyOptions& o;
  const CrossEntropyExtras<Acc, Mem>& x;
  index_t N = 0, V = 0, scored = 0, active_count = 0;
  /// sum_j u_j over the classes (V without class weights) and sum_i u_t(i) over the scored rows
  /// (active_count without class weights); for a vocabulary shard, its own classes' (the
  /// distributed calls sum them over the ranks).
  double class_weight_total = 0, target_weight_total = 0;
  /// The vocabulary's size for label smoothing's 1 / V (the global one for a shard).
  index_t smoothing_classes = 0;

  const Acc* class_weight() const { return x.class_weight.extent(0) ? x.class_weight.data() : nullptr; }

  /// The checks of the options every call shares (no data read).
  void check_options() const {
    if (o.shift < 0) check.fail("shift", "must be >= 0, got " + std::to_string(o.shift));
    check.finite_nonnegative<Acc>("softcap", o.softcap, true);
    check.finite_nonnegative<Acc>("z_loss", o.z_loss);
    if (!(o.label_smoothing >= 0 && o.label_smoothing <= 1))
      check.fail("label_smoothing", "must be in [0, 1], got " + check.number(o.label_smoothing));
    const double eps = resolved_filter_eps<T>(o);
    if (!(eps >= 0 && eps <= 1))
      check.fail("filter_eps", "must be in [0, 1] or filter_eps_auto, got " + check.number(eps));
  }

  /// Validates everything the forward and the backward share; counts the active rows and the
  /// class weights' totals. `vocab` is the number of classes (C's rows, or the global vocabulary
  /// of a shard, `offset` its first class), for the targets.
  void validate() {
    check_operands(check, "E", E, "C", C);
    N = index_t(E.extent(0));
    V = index_t(C.extent(0));
    check.optional("bias", bias, V, "C's row count (the vocabulary)");
    check.vector("targets", targets);
    check.extent("targets", targets.extent(0), N, "E's row count");
    check_options();
    check.optional("class_weight", x.class_weight, V, "C's row count (the vocabulary)");
    if (o.ignore_index >= 0 && o.ignore_index < V)
      check.fail("ignore_index",
                 "is " + std::to_string(o.ignore_index) + ", a valid class in [0, " + std::to_string(V) + ")");
    check_finite(exec, check, "E", E, o.non_finite);
    check_finite(exec, check, "C", C, o.non_finite);
    check_finite(exec, check, "bias", bias, o.non_finite);
    class_weight_total = check_class_weight();
    scored = std::max<index_t>(0, N - o.shift);
    active_count = scored - check_indices(exec, check, "targets", targets, o.shift, scored, V, o.ignore_index, true);
    smoothing_classes = V;
    target_weight_total = class_weight() ? target_weights(0, V) : double(active_count);
  }

  /// Checks the class weights (finite and >= 0) and returns their sum (V without them).
  double check_class_weight() const {
    const Acc* u = class_weight();
    if (u == nullptr) return double(C.extent(0));
    std::int64_t first_bad = INT64_MAX;
    Acc total = 0;
    Kokkos::parallel_reduce(
        "tlse::check_class_weight", Kokkos::RangePolicy<Exec>(exec, 0, std::int64_t(x.class_weight.extent(0))),
        KOKKOS_LAMBDA(std::int64_t j, std::int64_t & bad, Acc & s) {
          if (!(u[j] >= Acc(0) && impl::isfinite(u[j]))) bad = j < bad ? j : bad;
          s += u[j];
        },
        Kokkos::Min<std::int64_t>(first_bad), total);
    if (first_bad != INT64_MAX) {
      Acc value = 0;
      Kokkos::deep_copy(exec, Kokkos::View<Acc, Kokkos::HostSpace>(&value), Kokkos::subview(x.class_weight, first_bad));
      exec.fence();
      check.fail("class_weight", "has class_weight[" + std::to_string(first_bad) +
                                     "] = " + check.number(double(value)) + "; class weights must be finite and >= 0");
    }
    return double(total);
  }

  /// sum of u_t over the scored rows whose target lies in [offset, offset + classes) (a shard's
  /// classes; every target for a single device), after the targets were checked.
  double target_weights(index_t offset, index_t classes) const {
    const Acc* u = class_weight();
    const auto* t = targets.data();
    const index_t shift = o.shift, ignore = o.ignore_index;
    Acc total = 0;
    Kokkos::parallel_reduce(
        "tlse::target_weight_total", Kokkos::RangePolicy<Exec>(exec, 0, scored),
        KOKKOS_LAMBDA(index_t i, Acc & s) {
          const index_t c = index_t(t[i + shift]) - offset;
          if (index_t(t[i + shift]) != ignore && c >= 0 && c < classes) s += u ? u[c] : Acc(1);
        },
        total);
    return double(total);
  }

  /// The reduced loss's denominators (see LossScales) for the totals over every rank.
  LossScales<Acc> loss_scales() const {
    LossScales<Acc> s;
    if (o.reduction != Reduction::mean) return s;
    s.ce = target_weight_total > 0 ? Acc(1.0 / target_weight_total) : Acc(0);
    s.z = active_count > 0 ? Acc(1.0 / double(active_count)) : Acc(0);
    return s;
  }

  /// Checks the extras' roles and shapes: `role` "forward", "backward" or "step".
  void check_extras(const char* role) const {
    const bool forward = role[0] != 'b', backward = role[0] != 'f';
    if (!backward && x.dlse.extent(0))
      check.fail("dlse", "is an input of the backward (cross_entropy_backward, cross_entropy_with_gradients); "
                         "the forward takes none: leave it empty");
    if (!forward && (x.predicted.extent(0) || x.accuracy.extent(0)))
      check.fail(x.predicted.extent(0) ? "predicted" : "accuracy",
                 "is an output of the forward (cross_entropy, cross_entropy_with_gradients); the backward writes "
                 "none: leave it empty");
    if (check.optional("dlse", x.dlse, N, "E's row count")) check_finite(exec, check, "dlse", x.dlse, o.non_finite);
    check.optional("predicted", x.predicted, N, "E's row count");
    check.optional("accuracy", x.accuracy, 1, "a scalar (the fraction of scored rows predicted right)");
  }
  bool want_argmax() const { return x.predicted.extent(0) || x.accuracy.extent(0); }

  /// Checks a view shaped like the loss (loss, dloss): one value per row of E under
  /// Reduction::none, else one (after validate()).
  template <class LossV>
  void check_loss_shape(const char* name, const LossV& v) const {
    check.loss_shaped(name, v, o.reduction, N, "E");
  }

  /// Which gradients a backward call writes.
  struct WantedGradients {
    bool dE, dC, dbias;
  };

  /// The checks of dloss and the gradient outputs that cross_entropy_backward and
  /// cross_entropy_with_gradients share (after validate()).
  template <class DLossV, class DEV, class DCV, class DBiasV>
  WantedGradients check_gradients(const DLossV& dloss, const DEV& dE, const DCV& dC, const DBiasV& dbias) const {
    static_check_acc_vector<Exec, T, DLossV>();
    static_check_view<Exec, DEV, 2>();
    static_check_view<Exec, DCV, 2>();
    static_check_view<Exec, DBiasV, 1>();
    static_assert(std::is_same<typename DEV::value_type, T>::value &&
                      std::is_same<typename DCV::value_type, T>::value &&
                      std::is_same<typename DBiasV::value_type, T>::value,
                  "tlse::cross_entropy_backward, cross_entropy_with_gradients: dE, dC and dbias are non-const views "
                  "of the input scalar type");
    check_loss_shape("dloss", dloss);
    const index_t D = index_t(E.extent(1));
    WantedGradients w;
    w.dE = check.optional_matrix("dE", dE, N, D, "E");
    w.dC = check.optional_matrix("dC", dC, V, D, "C");
    w.dbias = check.optional("dbias", dbias, V, "C's row count (the vocabulary)");
    check_finite(exec, check, "dloss", dloss, o.non_finite);
    return w;
  }

  /// row_target[i] = the class row i is scored against, or -1; active = the rows that are scored;
  /// position (optional) = its inverse (row -> position in active, or -1), when some row is not scored.
  index_t prepare_rows(int* row_target, int* active, int* position) const {
    const auto* t = targets.data();
    const index_t shift = o.shift, n_scored = scored, ignore = o.ignore_index;
    Kokkos::parallel_for("tlse::cross_entropy_targets", Kokkos::RangePolicy<Exec>(exec, 0, N),
                         KOKKOS_LAMBDA(index_t i) {
                           const index_t c = i < n_scored ? index_t(t[i + shift]) : ignore;
                           row_target[i] = c == ignore ? -1 : int(c);
                         });
    const index_t count = compact_indices(exec, N, KOKKOS_LAMBDA(index_t i) { return row_target[i] >= 0; }, active);
    if (count < N && position) invert_index(exec, active, count, N, position);
    return count;
  }

  /// out[i] = u_t for the rows whose target `target[i]` (a class of this call's C, else -1) is
  /// set, 0 for the others.
  void row_target_weights(const int* target, Acc* out) const {
    const Acc* u = class_weight();
    Kokkos::parallel_for("tlse::cross_entropy_target_weights", Kokkos::RangePolicy<Exec>(exec, 0, N),
                         KOKKOS_LAMBDA(index_t i) { out[i] = target[i] >= 0 ? (u ? u[target[i]] : Acc(1)) : Acc(0); });
  }

  /// a.target_logit[k] = x_i,target for the k-th scored row i (a.active), under the call's logit model.
  template <class Arrays>
  void target_logits(const Arrays& a, const TileProblem<T, Acc>& prob) const {
    const int* active = a.active;
    const int* row_target = a.row_target;
    impl::pair_logits(
        exec, prob, active_count, KOKKOS_LAMBDA(index_t k) { return index_t(active[k]); },
        KOKKOS_LAMBDA(index_t k) { return index_t(row_target[active[k]]); }, a.target_logit);
  }

  /// S_i = E_i . (C^T u) + bias . u for the scored rows (by row id, to `smooth`): label smoothing's
  /// row sums without a softcap.
  void smoothing_row_sums(const int* active, const SmoothingVectors<Acc>& s, Acc* smooth) const {
    const index_t D = index_t(E.extent(1));
    weighted_column_sums(exec, C.data(), V, D, class_weight(), s.partials, s.v);
    const Acc* add = nullptr;
    if (bias.extent(0)) {
      weighted_dot(exec, bias.data(), class_weight(), V, s.scalar);
      add = s.scalar;
    }
    row_dots(exec, E.data(), D, active_count, KOKKOS_LAMBDA(index_t k) { return index_t(active[k]); }, s.v, add,
             smooth);
  }

  /// The per-row loss (by row id, 0 for rows not scored) to row_loss, scaled by the reduction's
  /// denominators `scales` (LossScales; 1 for the loss of each row): from the LSEs (lse, by row
  /// id), the target logits (target_logit, by position in `active`), the rows' target weights
  /// (by row id, nullptr: 1) and label smoothing's row sums (smooth, by row id, with it).
  void row_losses(const int* active, const Acc* lse, const Acc* target_logit, const Acc* target_weight,
                  const Acc* smooth, const LossScales<Acc>& scales, Acc* row_loss) const {
    const Acc z = Acc(o.z_loss), e = Acc(o.label_smoothing);
    const Acc e_per_class = Acc(o.label_smoothing / double(std::max<index_t>(smoothing_classes, 1)));
    const Acc W = Acc(class_weight_total);
    const Acc ce = scales.ce, zs = scales.z;
    impl::fill(exec, row_loss, N, Acc(0));
    Kokkos::parallel_for("tlse::cross_entropy_rows", Kokkos::RangePolicy<Exec>(exec, 0, active_count),
                         KOKKOS_LAMBDA(index_t k) {
                           const index_t i = active[k];
                           const Acc l = lse[i], u = target_weight ? target_weight[i] : Acc(1);
                           Acc r = (Acc(1) - e) * u * (l - target_logit[k]);
                           if (smooth) r += e_per_class * (W * l - smooth[i]);
                           row_loss[i] = ce * r + zs * z * l * l;
                         });
  }

  /// Writes the loss from the per-row losses: per row under Reduction::none, else their sum
  /// (row_losses scaled them already). `total` is one Acc of workspace.
  template <class LossV>
  void write_loss(const Acc* row_loss, Acc* total, const LossV& loss) const {
    write_row_losses(exec, o.reduction == Reduction::none, row_loss, N, loss.data(), total);
  }

  /// The gradient coefficients of the scored rows (by row id) for the upstream gradient dloss
  /// (one per row, or the reduced loss's): w, the StepCoefficients' softmax and lse factors
  /// (g = softmax + lse l) and label smoothing's spread s (nullptr: not wanted; 0 for the rows
  /// not scored, which are set first). dlse, when the extras hold one, goes into softmax.
  template <class DLossV>
  void gradient_coefficients(const int* active, const DLossV& dloss, const Acc* target_weight, Acc* w,
                             Acc* softmax, Acc* lse_factor, Acc* spread) const {
    const Acc* up = dloss.data();
    const Acc* dlse = x.dlse.extent(0) ? x.dlse.data() : nullptr;
    const bool per_row = o.reduction == Reduction::none;
    const LossScales<Acc> scales = loss_scales();
    const Acc ce = scales.ce, zs = scales.z, z2 = Acc(2 * o.z_loss), e = Acc(o.label_smoothing);
    const Acc e_per_class = Acc(o.label_smoothing / double(std::max<index_t>(smoothing_classes, 1)));
    const Acc uniform = e_per_class * Acc(class_weight_total);
    if (spread) impl::fill(exec, spread, N, Acc(0));
    Kokkos::parallel_for("tlse::cross_entropy_coefficients", Kokkos::RangePolicy<Exec>(exec, 0, active_count),
                         KOKKOS_LAMBDA(index_t k) {
                           const int i = active[k];
                           const Acc c = per_row ? up[i] : up[0];
                           const Acc u = target_weight ? target_weight[i] : Acc(1);
                           w[i] = c * ce * (Acc(1) - e) * u;
                           softmax[i] = c * ce * ((Acc(1) - e) * u + uniform) + (dlse ? dlse[i] : Acc(0));
                           lse_factor[i] = c * zs * z2;
                           if (spread) spread[i] = c * ce * e_per_class;
                         });
  }

  /// g_i = softmax_i + lse_factor_i lse_i for the scored rows (the backward's, from the saved LSE).
  void softmax_weights(const int* active, const Acc* softmax, const Acc* lse_factor, const Acc* lse, Acc* g) const {
    Kokkos::parallel_for("tlse::cross_entropy_softmax_weights", Kokkos::RangePolicy<Exec>(exec, 0, active_count),
                         KOKKOS_LAMBDA(index_t k) {
                           const int i = active[k];
                           g[i] = softmax[i] + lse_factor[i] * lse[i];
                         });
  }

  /// Label smoothing's rank-one share of the gradients (without a softcap): dE_i -= s_i C^T u
  /// for the scored rows, dC_j -= u_j E^T s, dbias_j -= u_j sum_i s_i (spread s by row id, 0 for
  /// rows not scored). Each output may be empty. `c_u`: C^T u as smoothing_row_sums left it in
  /// its vectors' v (the training step's forward), or nullptr: computed here.
  template <class DEV, class DCV, class DBiasV>
  void smoothing_gradients(const int* active, const Acc* spread, const SmoothingVectors<Acc>& s, const DEV& dE,
                           const DCV& dC, const DBiasV& dbias, const Acc* c_u = nullptr) const {
    const index_t D = index_t(E.extent(1));
    const Acc* u = class_weight();
    const auto all = KOKKOS_LAMBDA(index_t j) { return j; };
    if (dE.extent(0)) {
      if (!c_u) {
        weighted_column_sums(exec, C.data(), V, D, u, s.partials, s.v);
        c_u = s.v;
      }
      subtract_outer(
          exec, dE.data(), D, active_count, KOKKOS_LAMBDA(index_t k) { return index_t(active[k]); }, spread, c_u);
    }
    if (dC.extent(0)) {
      weighted_column_sums(exec, E.data(), N, D, spread, s.partials, s.v);
      subtract_outer(exec, dC.data(), D, V, all, u, s.v);
    }
    if (dbias.extent(0)) {
      impl::weighted_sum(exec, spread, N, Acc(1), s.scalar, false, s.scalar + 1);
      subtract_outer(exec, dbias.data(), 1, V, all, u, s.scalar);
    }
  }

  /// The forward's argmax (predicted, by row id: -1 for rows not scored, filled first) and the
  /// accuracy over the scored rows (`hits`: N values of workspace; `total` one).
  void write_accuracy(const int* row_target, const std::int64_t* predicted, Acc* hits, Acc* total) const {
    if (!x.accuracy.extent(0)) return;
    Kokkos::parallel_for("tlse::cross_entropy_hits", Kokkos::RangePolicy<Exec>(exec, 0, N), KOKKOS_LAMBDA(index_t i) {
      hits[i] = row_target[i] >= 0 && predicted[i] == row_target[i] ? Acc(1) : Acc(0);
    });
    const Acc per_row = active_count > 0 ? Acc(1) / Acc(active_count) : Acc(0);
    impl::weighted_sum(exec, hits, N, per_row, x.accuracy.data(), false, total);
  }

  /// Zeroes the gradient rows of the rows that are not scored (never visited), unless accumulating.
  template <class DEV>
  void zero_unscored_rows(const int* row_target, const DEV& dE) const {
    if (o.accumulate || dE.extent(0) == 0 || active_count == N) return;  // a pass over dE for nothing
    zero_unlisted_rows(exec, row_target, dE.data(), N, index_t(dE.extent(1)));
  }

  BackwardShape backward_shape() const { return cross_entropy_shape(E, C, o); }

  /// The scored rows of E (through `active` unless every row is scored) against C, visited in
  /// `vocab_order` when given.
  TileProblem<T, Acc> problem(const int* active, const int* position, const int* vocab_order) const {
    auto p = make_problem<T, Acc>(E, C, 1.0, o.precision);
    if (active_count < N) {
      p.rows.index = active;
      p.rows.position = position;
    }
    p.rows.count = active_count;
    p.cols.index = vocab_order;
    p.logit.col_bias = bias.extent(0) ? bias.data() : nullptr;
    p.logit.softcap = Acc(o.softcap);
    return p;
  }
};

template <class Exec, class EV, class CV, class BiasV, class TargetV>
CrossEntropyCall<Exec, EV, CV, BiasV, TargetV> cross_entropy_call(
    const Exec& exec, const ArgumentChecker& check, const EV& E, const CV& C, const BiasV& bias, const TargetV& targets,
    const CrossEntropyOptions& o,
    const CrossEntropyExtras<accumulator_t<scalar_of<EV>>, typename Exec::memory_space>& extras) {
  static_check_operands<Exec, EV, CV>();
  static_check_view<Exec, BiasV, 1>();
  static_check_index_vector<Exec, TargetV>();
  static_assert(std::is_same<scalar_of<BiasV>, scalar_of<EV>>::value, "tlse: bias has the scalar type of E and C");
  return {exec, check, E, C, bias, targets, o, extras};
}

template <class Exec, class V>
void check_vocab_order(const Exec& exec, const ArgumentChecker& check, const V& order, index_t vocab) {
  static_check_view<Exec, V, 1>();
  static_assert(std::is_same<scalar_of<V>, int>::value, "tlse: vocab_order is a view of int");
  if (check.optional("vocab_order", order, vocab, "C's row count (the vocabulary)"))
    check_indices(exec, check, "vocab_order", order, 0, vocab, vocab, 0, false);
}

/// Throws naming vocab_order unless it is a permutation: `position` is its inverse (invert_index),
/// -1 at a class the order does not list (it lists another twice instead).
template <class Exec>
void check_vocab_order_inverse(const Exec& exec, const ArgumentChecker& check, const int* position, index_t vocab) {
  index_t first_missing = vocab;
  Kokkos::parallel_reduce(
      "tlse::check_vocab_order_inverse", Kokkos::RangePolicy<Exec>(exec, 0, vocab),
      KOKKOS_LAMBDA(index_t c, index_t & first) {
        if (position[c] < 0 && c < first) first = c;
      },
      Kokkos::Min<index_t>(first_missing));
  if (first_missing < vocab)
    check.fail("vocab_order", "is not a permutation of [0, " + std::to_string(vocab) + "): class " +
                                  std::to_string(first_missing) + " is missing (another is listed twice)");
}

/// The row arrays of the forward's options: the rows' target weights, label smoothing's row sums
/// and vectors, and the argmax (its per-split partials, and the rows' classes when the caller
/// wants the accuracy alone).
template <class Acc>
struct ForwardRowArrays {
  Acc *target_weight, *smooth, *hits;
  std::int64_t* argmax;
  RowStatistics<Acc> stats;  // partials only; the call sets what it wants
  SmoothingVectors<Acc> vectors;
  template <class Exec>
  static ForwardRowArrays carve(WorkspaceCarver& c, const Exec& exec, index_t N, index_t V, index_t D,
                                const CrossEntropyOptions& o) {
    ForwardRowArrays a;
    const bool smoothing = o.label_smoothing > 0;
    a.target_weight = c.take<Acc>(N);
    a.smooth = c.take<Acc>(smoothing ? N : 0);
    a.hits = c.take<Acc>(N);
    a.argmax = c.take<std::int64_t>(N);
    const index_t parts = row_partials_bound(exec, N);
    a.stats.best = c.take<Acc>(parts);
    a.stats.best_id = c.take<int>(parts);
    a.stats.sum_parts = c.take<Acc>(smoothing_in_tiles(o) ? parts : 0);
    a.vectors = SmoothingVectors<Acc>::carve(c, exec, V, D, smoothing_by_vectors(o));
    return a;
  }
};

/// The workspace arrays of the forward and of the backward (one layout serves the call and
/// cross_entropy_workspace_bytes).
template <class Acc>
struct CrossEntropyForwardArrays {
  int *row_target, *active, *position;
  Acc *row_lse, *target_logit, *row_loss, *total, *partials, *logit_sum;
  ForwardRowArrays<Acc> rows;
  template <class Exec>
  static CrossEntropyForwardArrays carve(WorkspaceCarver& c, const Exec& exec, index_t N, index_t V, index_t D,
                                         const CrossEntropyOptions& o, bool sums) {
    CrossEntropyForwardArrays a;
    a.row_target = c.take<int>(N);
    a.active = c.take<int>(N);
    a.position = c.take<int>(N);
    a.row_lse = c.take<Acc>(N);
    a.target_logit = c.take<Acc>(N);
    a.row_loss = c.take<Acc>(N);
    a.total = c.take<Acc>(1);
    a.partials = c.take<Acc>(forward_partials_bound(exec, N, V, false, sums));
    a.logit_sum = c.take<Acc>(sums ? V : 0);
    a.rows = ForwardRowArrays<Acc>::carve(c, exec, N, V, D, o);
    return a;
  }
};

/// The gradient coefficients of the scored rows (CrossEntropyCall::gradient_coefficients): w,
/// softmax and lse factors, label smoothing's spread, and the rows' target weights.
template <class Acc>
struct CoefficientArrays {
  Acc *w, *softmax, *lse_factor, *spread, *target_weight;
  static CoefficientArrays carve(WorkspaceCarver& c, index_t N, const CrossEntropyOptions& o) {
    CoefficientArrays a;
    a.w = c.take<Acc>(N);
    a.softmax = c.take<Acc>(N);
    a.lse_factor = c.take<Acc>(N);
    a.spread = c.take<Acc>(o.label_smoothing > 0 ? N : 0);
    a.target_weight = c.take<Acc>(N);
    return a;
  }
};

template <class Acc>
struct CrossEntropyBackwardArrays {
  int *row_target, *active, *position;
  int* order_position;  // V: where each class sits in the vocabulary order, when the call gives one
  Acc* g;
  CoefficientArrays<Acc> coef;
  SmoothingVectors<Acc> vectors;
  char* scratch;  // for a backend's backward
  std::size_t scratch_bytes;
  template <class Exec>
  static CrossEntropyBackwardArrays carve(WorkspaceCarver& c, const Exec& exec, index_t N, index_t V, index_t D,
                                          const CrossEntropyOptions& o, std::size_t scratch_bytes) {
    CrossEntropyBackwardArrays a;
    a.row_target = c.take<int>(N);
    a.active = c.take<int>(N);
    a.position = c.take<int>(N);
    a.order_position = c.take<int>(V);
    a.g = c.take<Acc>(N);
    a.coef = CoefficientArrays<Acc>::carve(c, N, o);
    a.vectors = SmoothingVectors<Acc>::carve(c, exec, std::max(N, V), D, smoothing_by_vectors(o));
    a.scratch = c.take<char>(index_t(scratch_bytes));
    a.scratch_bytes = scratch_bytes;
    return a;
  }
};

/// The workspace arrays of cross_entropy_with_gradients when a backend takes the step whole: the
/// forward's (for the loss), the gradient coefficients, label smoothing's vectors and the
/// backend's scratch.
template <class Acc>
struct CrossEntropyStepArrays {
  CrossEntropyForwardArrays<Acc> forward;
  CoefficientArrays<Acc> coef;
  SmoothingVectors<Acc> vectors;
  char* scratch;
  std::size_t scratch_bytes;
  template <class Exec>
  static CrossEntropyStepArrays carve(WorkspaceCarver& c, const Exec& exec, index_t N, index_t V, index_t D,
                                      const CrossEntropyOptions& o, std::size_t scratch_bytes) {
    CrossEntropyStepArrays a;
    a.forward = CrossEntropyForwardArrays<Acc>::carve(c, exec, N, V, D, o, false);
    a.coef = CoefficientArrays<Acc>::carve(c, N, o);
    a.vectors = SmoothingVectors<Acc>::carve(c, exec, std::max(N, V), D, smoothing_by_vectors(o));
    a.scratch = c.take<char>(index_t(scratch_bytes));
    a.scratch_bytes = scratch_bytes;
    return a;
  }
};

}  // namespace tlse::impl
