#pragma once
// What the distillation calls share (single-device and vocabulary-parallel): the checks of their
// arguments, the rows that are scored, the per-row loss and the gradient coefficients, and the
// workspace arrays of each call.
//
// Row i (scored) has the loss  alpha * CE_i + (1 - alpha) * div_i  with CE_i = lse1_i - x_i,t (the
// student's logits at T = 1) and div_i the divergence (distillation_tiles.hpp); Reduction::mean
// divides by the number of scored rows. With c_i the upstream gradient of the row (times that
// factor), dL/d(Hs_i . Ws_j) = c_i ((1 - alpha) / T ddiv/dz_s + alpha (p1_ij - [j == t])) and
// dL/d(Ht_i . Wt_j) = c_i (1 - alpha) / T ddiv/dz_t.
#include <tlse/distillation_options.hpp>
#include <tlse/impl/distillation_tiles.hpp>
#include <tlse/impl/index_lists.hpp>
#include <tlse/impl/pair_logits.hpp>
#include <tlse/impl/problem_builder.hpp>
#include <tlse/impl/weighted_sum.hpp>
#include <tlse/impl/workspace_carver.hpp>

#include <cmath>

namespace tlse::impl {

/// Everything forward and backward share: checked shapes and options, the problems of both heads
/// and the scored rows.
template <class Exec, class HsV, class WsV, class HtV, class WtV, class TargetV>
struct DistillationCall {
  using T = scalar_of<HsV>;
  using Acc = accumulator_t<T>;
  const Exec& exec;
  const ArgumentChecker& check;
  const HsV& Hs;
  const WsV& Ws;
  const HtV& Ht;
  const WtV& Wt;
  const TargetV& targets;
  const DistillationOptions& o;
  index_t N = 0, V = 0, scored = 0, active_count = 0;
  bool has_targets = false;

  /// The checks of the options (no data read).
  void check_options() const {
    if (!(o.beta >= 0 && o.beta <= 1)) check.fail("beta", "must be in [0, 1], got " + check.number(o.beta));
    if (!(o.temperature > 0) || !std::isfinite(o.temperature) || !std::isfinite(double(Acc(1.0 / o.temperature))) ||
        Acc(1.0 / o.temperature) == Acc(0))
      check.fail("temperature",
                 "must be finite and > 0 (with 1 / temperature finite and non-zero in the "
                 "accumulator type), got " +
                     check.number(o.temperature));
    if (!(o.alpha >= 0 && o.alpha <= 1)) check.fail("alpha", "must be in [0, 1], got " + check.number(o.alpha));
    if (o.shift < 0) check.fail("shift", "must be >= 0, got " + std::to_string(o.shift));
  }

  /// The checks of the operands' shapes and layouts and of the targets' shape (no data read);
  /// `vocab` names what the vocabulary is ("Ws's row count (the vocabulary)" or a shard's).
  void check_shapes() {
    check.matrix("Hs", Hs);
    check.matrix("Ws", Ws);
    check.matrix("Ht", Ht);
    check.matrix("Wt", Wt);
    if (Ws.extent(1) != Hs.extent(1))
      check.fail("Ws", "has " + std::to_string(Ws.extent(1)) + " columns (features) but 'Hs' has " +
                           std::to_string(Hs.extent(1)) + "; the student's depths must match");
    if (Wt.extent(1) != Ht.extent(1))
      check.fail("Wt", "has " + std::to_string(Wt.extent(1)) + " columns (features) but 'Ht' has " +
                           std::to_string(Ht.extent(1)) + "; the teacher's depths must match");
    if (Ht.extent(0) != Hs.extent(0))
      check.fail("Ht", "has " + std::to_string(Ht.extent(0)) + " rows (tokens) but 'Hs' has " +
                           std::to_string(Hs.extent(0)) + "; teacher and student score the same tokens");
    if (Wt.extent(0) != Ws.extent(0))
      check.fail("Wt", "has " + std::to_string(Wt.extent(0)) + " rows (classes) but 'Ws' has " +
                           std::to_string(Ws.extent(0)) + "; the vocabulary sizes differ");
    N = index_t(Hs.extent(0));
    V = index_t(Ws.extent(0));
    has_targets = targets.size() > 0;
    if (has_targets) {
      check.vector("targets", targets);
      check.extent("targets", targets.extent(0), N, "Hs's row count");
    } else if (o.alpha > 0) {
      check.fail("targets", "is empty but opts.alpha = " + check.number(o.alpha) +
                                " > 0 weighs the hard-label cross-entropy, which needs them");
    }
  }

  /// The NaN/Inf scan of the operands under NonFinite::detect.
  void check_operands_finite() const {
    check_finite(exec, check, "Hs", Hs, o.non_finite);
    check_finite(exec, check, "Ws", Ws, o.non_finite);
    check_finite(exec, check, "Ht", Ht, o.non_finite);
    check_finite(exec, check, "Wt", Wt, o.non_finite);
  }

  /// Checks the targets against `vocab` classes (the global vocabulary of a shard) and counts the
  /// scored rows.
  void check_targets(index_t vocab) {
    if (!has_targets) {
      scored = active_count = N;
      return;
    }
    if (o.ignore_index >= 0 && o.ignore_index < vocab)
      check.fail("ignore_index",
                 "is " + std::to_string(o.ignore_index) + ", a valid class in [0, " + std::to_string(vocab) + ")");
    scored = std::max<index_t>(0, N - o.shift);
    active_count =
        scored - check_indices(exec, check, "targets", targets, o.shift, scored, vocab, o.ignore_index, true);
  }

  /// Every check of the single-device calls but the outputs'.
  void validate() {
    check_shapes();
    check_options();
    check_operands_finite();
    check_targets(V);
  }

  /// Checks a view shaped like the loss (loss, dloss): one value per row of Hs under
  /// Reduction::none, else one.
  template <class LossV>
  void check_loss_shape(const char* name, const LossV& v) const {
    check.loss_shaped(name, v, o.reduction, N, "Hs");
  }

  /// Checks row_stats: (N x distillation_row_stats), row-major.
  template <class StatsV>
  void check_row_stats(const StatsV& s) const {
    check.matrix("row_stats", s);
    check.extent("row_stats", s.extent(0), N, "Hs's row count");
    check.extent("row_stats", s.extent(1), distillation_row_stats, "distillation_row_stats (the values saved per row)");
  }

  /// Which gradients a backward writes.
  struct WantedGradients {
    bool dHs, dWs, dHt, dWt;
  };

  /// The checks of dloss and of the gradient outputs (shapes of a single device: V classes).
  template <class DLossV, class DHsV, class DWsV, class DHtV, class DWtV>
  WantedGradients check_gradients(const DLossV& dloss, const DHsV& dHs, const DWsV& dWs, const DHtV& dHt,
                                  const DWtV& dWt) const {
    check_loss_shape("dloss", dloss);
    WantedGradients w;
    w.dHs = check.optional_matrix("dHs", dHs, N, Hs.extent(1), "Hs");
    w.dWs = check.optional_matrix("dWs", dWs, Ws.extent(0), Ws.extent(1), "Ws");
    w.dHt = check.optional_matrix("dHt", dHt, N, Ht.extent(1), "Ht");
    w.dWt = check.optional_matrix("dWt", dWt, Wt.extent(0), Wt.extent(1), "Wt");
    check_finite(exec, check, "dloss", dloss, o.non_finite);
    return w;
  }

  /// row_target[i] = the class row i is scored against, or -1 (no targets, or not scored);
  /// active = the rows that are scored; position = its inverse (row -> position in active, or -1)
  /// when some row is not scored.
  index_t prepare_rows(int* row_target, int* active, int* position) const {
    const bool given = has_targets;
    const auto* t = targets.data();
    const index_t shift = o.shift, n_scored = scored, ignore = o.ignore_index;
    Kokkos::parallel_for(
        "tlse::distillation_targets", Kokkos::RangePolicy<Exec>(exec, 0, N), KOKKOS_LAMBDA(index_t i) {
          const index_t c = given && i < n_scored ? index_t(t[i + shift]) : ignore;
          row_target[i] = c == ignore ? -1 : int(c);
        });
    const index_t count = compact_indices(
        exec, N, KOKKOS_LAMBDA(index_t i) { return !given || row_target[i] >= 0; }, active);
    if (count < N && position) invert_index(exec, active, count, N, position);
    return count;
  }

  /// Both heads over the scored rows (through `active` unless every row is scored), at scale 1 / T.
  PairProblem<T, Acc> problem(const int* active, const int* position, const Acc* stats) const {
    PairProblem<T, Acc> pp;
    pp.student = make_problem<T, Acc>(Hs, Ws, 1.0 / o.temperature, Precision::exact);
    pp.teacher = make_problem<T, Acc>(Ht, Wt, 1.0 / o.temperature, Precision::exact);
    for (TileProblem<T, Acc>* p : {&pp.student, &pp.teacher}) {
      if (active_count < N) {
        p->rows.index = active;
        p->rows.position = position;
      }
      p->rows.count = active_count;
    }
    pp.model = DivergenceModel<Acc>::make(o.divergence, o.beta);
    pp.stats = stats;
    return pp;
  }

  /// The reduction's factor of every row's loss.
  Acc loss_scale() const {
    if (o.reduction != Reduction::mean) return Acc(1);
    return active_count > 0 ? Acc(1.0 / double(active_count)) : Acc(0);
  }

  /// row_loss (by row id, 0 for the rows not scored) from the saved statistics (by row id) and
  /// the target logits at T = 1 (by position in `active`; read when alpha > 0).
  void row_losses(const int* active, const Acc* stats, const Acc* target_logit, Acc* row_loss) const {
    const DivergenceModel<Acc> model = DivergenceModel<Acc>::make(o.divergence, o.beta);
    const Acc alpha = Acc(o.alpha), scale = loss_scale();
    impl::fill(exec, row_loss, N, Acc(0));
    Kokkos::parallel_for(
        "tlse::distillation_rows", Kokkos::RangePolicy<Exec>(exec, 0, active_count), KOKKOS_LAMBDA(index_t k) {
          const index_t i = active[k];
          const Acc* st = stats + i * distillation_row_stats;
          // A weight of 0 drops its term whole (an infinite divergence times 0).
          Acc r = 0;
          if (alpha < Acc(1)) r += (Acc(1) - alpha) * model.row(st[stat_term_s], st[stat_term_t]);
          if (alpha > Acc(0)) r += alpha * (st[stat_lse_ce] - target_logit[k]);
          row_loss[i] = scale * r;
        });
  }

  /// The gradient coefficients (DistillationGradientTerms) of the scored rows, by row id, for the
  /// upstream gradient dloss (one per row, or the reduced loss's).
  template <class DLossV>
  void gradient_coefficients(const int* active, const DLossV& dloss, Acc* div, Acc* ce) const {
    const Acc* up = dloss.data();
    const bool per_row = o.reduction == Reduction::none;
    const Acc alpha = Acc(o.alpha), scale = loss_scale();
    Kokkos::parallel_for(
        "tlse::distillation_coefficients", Kokkos::RangePolicy<Exec>(exec, 0, active_count), KOKKOS_LAMBDA(index_t k) {
          const int i = active[k];
          const Acc c = (per_row ? up[i] : up[0]) * scale;
          div[i] = c * (Acc(1) - alpha);
          ce[i] = c * alpha;
        });
  }

  /// Zeroes the gradient rows (dHs, dHt) of the rows that are not scored (never visited), unless
  /// accumulating.
  template <class DV>
  void zero_unscored_rows(const int* active_position, const DV& d) const {
    if (o.accumulate || d.extent(0) == 0 || active_count == N) return;
    zero_unlisted_rows(exec, active_position, d.data(), N, index_t(d.extent(1)));
  }
};

template <class Exec, class HsV, class WsV, class HtV, class WtV, class TargetV>
DistillationCall<Exec, HsV, WsV, HtV, WtV, TargetV> distillation_call(const Exec& exec, const ArgumentChecker& check,
                                                                      const HsV& Hs, const WsV& Ws, const HtV& Ht,
                                                                      const WtV& Wt, const TargetV& targets,
                                                                      const DistillationOptions& o) {
  static_check_operands<Exec, HsV, WsV>();
  static_check_operands<Exec, HtV, WtV>();
  static_assert(std::is_same<scalar_of<HsV>, scalar_of<HtV>>::value,
                "tlse::distillation_loss: the student's and the teacher's operands have the same scalar type");
  static_check_index_vector<Exec, TargetV>();
  return {exec, check, Hs, Ws, Ht, Wt, targets, o};
}

/// The scratch a single-device call lends the backend's tile pairs (distillation_scratch_bytes
/// within opts.memory_budget; 0 on the generic kernels).
template <class T, class Exec, class HsV, class WsV, class HtV>
std::size_t distillation_pair_scratch_bytes(const Exec& exec, const HsV& Hs, const WsV& Ws, const HtV& Ht,
                                            const DistillationOptions& o) {
  DistillationShape shape;
  shape.rows = index_t(Hs.extent(0));
  shape.cols = index_t(Ws.extent(0));
  shape.depth_s = index_t(Hs.extent(1));
  shape.depth_t = index_t(Ht.extent(1));
  shape.memory_budget = o.memory_budget;
  return distillation_scratch_bytes<T>(exec, shape);
}

/// The saved statistics as an (N x distillation_row_stats) matrix of Acc.
template <class Exec, class T, class V>
constexpr void static_check_row_stats() {
  static_check_view<Exec, V, 2>();
  static_assert(std::is_same<scalar_of<V>, accumulator_t<T>>::value,
                "tlse: row_stats is a view of accumulator_t<T> (double for double inputs, float otherwise)");
}

/// The workspace arrays of the forward (one layout serves the call and
/// distillation_loss_workspace_bytes).
template <class Acc>
struct DistillationForwardArrays {
  int *row_target, *active, *position;
  Acc *lse, *term_s, *term_t, *target_logit, *row_loss, *total, *partials;
  char* pair_scratch;  // the backend's tile pairs' (distillation_pair_scratch_bytes)
  std::size_t pair_scratch_bytes;
  template <class Exec>
  static DistillationForwardArrays carve(WorkspaceCarver& c, const Exec& exec, index_t N, index_t V,
                                         std::size_t pair_scratch_bytes) {
    DistillationForwardArrays a;
    a.pair_scratch = c.take<char>(index_t(pair_scratch_bytes));
    a.pair_scratch_bytes = pair_scratch_bytes;
    a.row_target = c.take<int>(N);
    a.active = c.take<int>(N);
    a.position = c.take<int>(N);
    a.lse = c.take<Acc>(N);
    a.term_s = c.take<Acc>(N);
    a.term_t = c.take<Acc>(N);
    a.target_logit = c.take<Acc>(N);
    a.row_loss = c.take<Acc>(N);
    a.total = c.take<Acc>(1);
    // lse_forward's partials, then distillation_terms' (both 2 per row and column split).
    a.partials = c.take<Acc>(forward_partials_bound(exec, N, V, false, false));
    return a;
  }
};

template <class Acc>
struct DistillationBackwardArrays {
  int *row_target, *active, *position;
  Acc *div, *ce;
  char* pair_scratch;  // the backend's tile pairs' (distillation_pair_scratch_bytes)
  std::size_t pair_scratch_bytes;
  static DistillationBackwardArrays carve(WorkspaceCarver& c, index_t N, std::size_t pair_scratch_bytes) {
    DistillationBackwardArrays a;
    a.pair_scratch = c.take<char>(index_t(pair_scratch_bytes));
    a.pair_scratch_bytes = pair_scratch_bytes;
    a.row_target = c.take<int>(N);
    a.active = c.take<int>(N);
    a.position = c.take<int>(N);
    a.div = c.take<Acc>(N);
    a.ce = c.take<Acc>(N);
    return a;
  }
};

/// The workspace arrays of a training step (distillation_loss_with_gradients): the forward's,
/// the backward's coefficients and the statistics the forward saves for the backward.
template <class Acc>
struct DistillationStepArrays {
  DistillationForwardArrays<Acc> forward;
  Acc *div, *ce, *stats;
  template <class Exec>
  static DistillationStepArrays carve(WorkspaceCarver& c, const Exec& exec, index_t N, index_t V,
                                      std::size_t pair_scratch_bytes) {
    DistillationStepArrays a;
    a.forward = DistillationForwardArrays<Acc>::carve(c, exec, N, V, pair_scratch_bytes);
    a.div = c.take<Acc>(N);
    a.ce = c.take<Acc>(N);
    a.stats = c.take<Acc>(N * distillation_row_stats);
    return a;
  }
};

/// out[i * distillation_row_stats + field] = value[i] for the scored rows (by row id; `active`
/// lists them).
template <class Exec, class Acc>
void store_row_stat(const Exec& exec, const int* active, index_t active_count, const Acc* value, int field, Acc* out) {
  Kokkos::parallel_for(
      "tlse::distillation_store_stat", Kokkos::RangePolicy<Exec>(exec, 0, active_count), KOKKOS_LAMBDA(index_t k) {
        const index_t i = active[k];
        out[i * distillation_row_stats + field] = value[i];
      });
}

}  // namespace tlse::impl
