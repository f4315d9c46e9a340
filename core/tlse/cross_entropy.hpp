#pragma once
/// \file cross_entropy.hpp
/// Cut cross-entropy (CCE): loss_i = lse_i(C E_i + bias) - (C E_i + bias)_target(i), without the
/// N x V logit matrix.
#include <tlse/impl/lse_backward.hpp>
#include <tlse/impl/lse_forward.hpp>
#include <tlse/impl/problem_builder.hpp>
#include <tlse/impl/small_kernels.hpp>
#include <tlse/impl/vocabulary_sort.hpp>
#include <tlse/impl/workspace_carver.hpp>
#include <tlse/options.hpp>

#include <algorithm>
#include <vector>

namespace tlse {

/// Options of cross_entropy() and cross_entropy_backward() (pass the same to both).
struct CrossEntropyOptions {
  /// Rows whose target equals this add 0. The host and mma.sync kernels skip them, and so does
  /// the Hopper training step that keeps a chunk of rows' logits (it gathers the scored rows);
  /// the other Hopper kernels, which read contiguous rows (TMA), sweep them with the scored rows.
  std::int64_t ignore_index = -100;
  /// none (one loss per row), sum, or mean over the non-ignored rows
  Reduction reduction = Reduction::mean;
  std::int64_t shift = 0;            ///< row i is scored against targets(i + shift); the last `shift` rows are ignored
  double softcap = 0;                ///< logits become softcap * tanh(logit / softcap) (Gemma 2); 0: off
  double z_loss = 0;                 ///< adds z_loss * lse_i^2 to each row's loss
  double filter_eps = filter_eps_auto;  ///< backward: skip tiles whose softmax is all below this; 0: exact
  bool accumulate = false;           ///< backward: dE += ..., dC += ..., dbias += ... instead of overwriting
  Precision precision = Precision::exact;  ///< float inputs: Precision::tf32 allows TF32 tensor cores
  /// NaN/Inf policy for the inputs (see NonFinite)
  NonFinite non_finite = NonFinite::propagate;
  /// bytes of workspace the calls may use; each picks the fastest algorithm that fits (see memory_budget_default)
  std::size_t memory_budget = memory_budget_default;
  /// memory lent to the call; empty: the call allocates and frees it
  Workspace workspace{};
};

namespace impl {

template <class T>
double resolved_filter_eps(const CrossEntropyOptions& o) {
  return o.filter_eps == filter_eps_auto ? storage_epsilon<T>() / 32 : o.filter_eps;
}

/// The shape a backend's backward or step plans for: E (N x D) against C (V x D) under `o`.
template <class EV, class CV>
BackwardShape cross_entropy_shape(const EV& E, const CV& C, const CrossEntropyOptions& o) {
  return {index_t(E.extent(0)), index_t(C.extent(0)), index_t(E.extent(1)), o.precision, o.memory_budget, o.accumulate};
}

/// Scratch of cross_entropy_with_gradients' fused step, 0 when the step runs as the forward then
/// the backward: the one decision that the call takes and cross_entropy_step_fuses reports.
template <class Exec, class EV, class CV>
std::size_t fused_step_scratch_bytes(const Exec& exec, const EV& E, const CV& C, const CrossEntropyOptions& o,
                                     bool want_dbias) {
  if (want_dbias) return 0;  // the backends' steps compute no bias gradient
  return step_scratch_bytes<scalar_of<EV>>(exec, cross_entropy_shape(E, C, o));
}

/// Everything forward and backward share: checked shapes, the problem, and the active rows.
template <class Exec, class EV, class CV, class BiasV, class TargetV>
struct CrossEntropyCall {
  using T = scalar_of<EV>;
  using Acc = accumulator_t<T>;
  const Exec& exec;
  const ArgumentChecker& check;
  const EV& E;
  const CV& C;
  const BiasV& bias;
  const TargetV& targets;
  const CrossEntropyOptions& o;
  index_t N = 0, V = 0, scored = 0, active_count = 0;

  /// Validates everything the forward and the backward share; counts the active rows.
  void validate() {
    check_operands(check, "E", E, "C", C);
    N = index_t(E.extent(0));
    V = index_t(C.extent(0));
    check.optional("bias", bias, V, "C's row count (the vocabulary)");
    check.vector("targets", targets);
    check.extent("targets", targets.extent(0), N, "E's row count");
    if (o.shift < 0) check.fail("shift", "must be >= 0, got " + std::to_string(o.shift));
    check.finite_nonnegative<Acc>("softcap", o.softcap, true);
    check.finite_nonnegative<Acc>("z_loss", o.z_loss);
    const double eps = resolved_filter_eps<T>(o);
    if (!(eps >= 0 && eps <= 1)) check.fail("filter_eps", "must be in [0, 1] or filter_eps_auto, got " + check.number(eps));
    if (o.ignore_index >= 0 && o.ignore_index < V)
      check.fail("ignore_index", "is " + std::to_string(o.ignore_index) + ", a valid class in [0, " + std::to_string(V) + ")");
    check_finite(exec, check, "E", E, o.non_finite);
    check_finite(exec, check, "C", C, o.non_finite);
    check_finite(exec, check, "bias", bias, o.non_finite);
    scored = std::max<index_t>(0, N - o.shift);
    active_count = scored - check_indices(exec, check, "targets", targets, o.shift, scored, V, o.ignore_index, true);
  }

  /// Checks a view shaped like the loss (loss, dloss): one value per row of E under
  /// Reduction::none, else one (after validate()).
  template <class LossV>
  void check_loss_shape(const char* name, const LossV& v) const {
    const bool none = o.reduction == Reduction::none;
    check.vector(name, v);
    check.extent(name, v.extent(0), none ? N : 1, none ? "Reduction::none (one loss per row of E)" : "a reduced loss");
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
    static_assert(std::is_same<typename DEV::value_type, T>::value && std::is_same<typename DCV::value_type, T>::value &&
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

  /// a.target_logit[k] = x_i,target for the k-th scored row i (a.active), under the call's logit model.
  template <class Arrays>
  void target_logits(const Arrays& a, const TileProblem<T, Acc>& prob) const {
    const int* active = a.active;
    const int* row_target = a.row_target;
    impl::pair_logits(
        exec, prob, active_count, KOKKOS_LAMBDA(index_t k) { return index_t(active[k]); },
        KOKKOS_LAMBDA(index_t k) { return index_t(row_target[active[k]]); }, a.target_logit);
  }

  /// The loss from the row LSEs in a.row_lse (by row id) and the target logits (target_logits):
  /// loss_i = lse_i - x_i,target + z lse_i^2, per row or reduced.
  template <class Arrays, class LossV>
  void write_loss(const Arrays& a, const LossV& loss) const {
    const int* active = a.active;
    const Acc z = Acc(o.z_loss);
    Acc* row_loss = a.row_loss;
    const Acc* row_lse = a.row_lse;
    const Acc* target_logit = a.target_logit;
    impl::fill(exec, row_loss, N, Acc(0));
    Kokkos::parallel_for("tlse::cross_entropy_rows", Kokkos::RangePolicy<Exec>(exec, 0, active_count),
                         KOKKOS_LAMBDA(index_t k) {
                           const Acc l = row_lse[active[k]];
                           row_loss[active[k]] = l - target_logit[k] + z * l * l;
                         });
    if (o.reduction == Reduction::none) {
      Acc* out = loss.data();
      Kokkos::parallel_for("tlse::cross_entropy_loss", Kokkos::RangePolicy<Exec>(exec, 0, N),
                           KOKKOS_LAMBDA(index_t i) { out[i] = row_loss[i]; });
    } else {
      const Acc weight = o.reduction == Reduction::sum ? Acc(1)
                         : active_count > 0            ? Acc(1) / Acc(active_count)
                                                       : Acc(0);
      impl::weighted_sum(exec, row_loss, N, weight, loss.data(), false, a.total);
    }
  }

  /// coef[i] = dL/dloss_i for the scored rows: dloss (one per row, or the reduced loss's) times
  /// the reduction's weight.
  template <class DLossV>
  void gradient_coefficients(const int* active, const DLossV& dloss, Acc* coef) const {
    const Acc* up = dloss.data();
    const bool per_row = o.reduction == Reduction::none;
    const Acc weight =
        o.reduction == Reduction::mean ? (active_count > 0 ? Acc(1) / Acc(active_count) : Acc(0)) : Acc(1);
    Kokkos::parallel_for("tlse::cross_entropy_coefficients", Kokkos::RangePolicy<Exec>(exec, 0, active_count),
                         KOKKOS_LAMBDA(index_t k) {
                           const int i = active[k];
                           coef[i] = (per_row ? up[i] : up[0]) * weight;
                         });
  }

  /// Zeroes the gradient rows of the rows that are not scored (never visited), unless accumulating.
  template <class DEV>
  void zero_unscored_rows(const int* row_target, const DEV& dE) const {
    if (o.accumulate || dE.extent(0) == 0 || active_count == N) return;  // a pass over dE for nothing
    T* out = dE.data();
    const index_t D = index_t(dE.extent(1));
    Kokkos::parallel_for("tlse::cross_entropy_zero_ignored", Kokkos::RangePolicy<Exec>(exec, 0, N * D),
                         KOKKOS_LAMBDA(index_t idx) {
                           if (row_target[idx / D] < 0) out[idx] = T(0.0f);
                         });
  }

  /// The scored rows of E (through `active` unless every row is scored) against C, visited in
  /// `vocab_order` when given.
  BackwardShape backward_shape() const { return cross_entropy_shape(E, C, o); }

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
CrossEntropyCall<Exec, EV, CV, BiasV, TargetV> cross_entropy_call(const Exec& exec, const ArgumentChecker& check,
                                                                  const EV& E, const CV& C, const BiasV& bias,
                                                                  const TargetV& targets,
                                                                  const CrossEntropyOptions& o) {
  static_check_operands<Exec, EV, CV>();
  static_check_view<Exec, BiasV, 1>();
  static_check_index_vector<Exec, TargetV>();
  static_assert(std::is_same<scalar_of<BiasV>, scalar_of<EV>>::value, "tlse: bias has the scalar type of E and C");
  return {exec, check, E, C, bias, targets, o};
}

template <class Exec, class V>
void check_vocab_order(const Exec& exec, const ArgumentChecker& check, const V& order, index_t vocab) {
  static_check_view<Exec, V, 1>();
  static_assert(std::is_same<scalar_of<V>, int>::value, "tlse: vocab_order is a view of int");
  if (check.optional("vocab_order", order, vocab, "C's row count (the vocabulary)"))
    check_indices(exec, check, "vocab_order", order, 0, vocab, vocab, 0, false);
}

/// The workspace arrays of the forward and of the backward (one layout serves the call and
/// cross_entropy_workspace_bytes).
template <class Acc>
struct CrossEntropyForwardArrays {
  int *row_target, *active, *position;
  Acc *row_lse, *target_logit, *row_loss, *total, *partials, *logit_sum;
  template <class Exec>
  static CrossEntropyForwardArrays carve(WorkspaceCarver& c, const Exec& exec, index_t N, index_t V, bool sums) {
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
    return a;
  }
};
template <class Acc>
struct CrossEntropyBackwardArrays {
  int *row_target, *active, *position;
  Acc *g, *w;
  char* scratch;  // for a backend's backward
  std::size_t scratch_bytes;
  static CrossEntropyBackwardArrays carve(WorkspaceCarver& c, index_t N, std::size_t scratch_bytes) {
    CrossEntropyBackwardArrays a;
    a.row_target = c.take<int>(N);
    a.active = c.take<int>(N);
    a.position = c.take<int>(N);
    a.g = c.take<Acc>(N);
    a.w = c.take<Acc>(N);
    a.scratch = c.take<char>(index_t(scratch_bytes));
    a.scratch_bytes = scratch_bytes;
    return a;
  }
};

/// The workspace arrays of cross_entropy_with_gradients when a backend takes the step whole: the
/// forward's (for the loss), the gradient coefficients and the backend's scratch.
template <class Acc>
struct CrossEntropyStepArrays {
  CrossEntropyForwardArrays<Acc> forward;
  Acc* coef;
  char* scratch;
  std::size_t scratch_bytes;
  template <class Exec>
  static CrossEntropyStepArrays carve(WorkspaceCarver& c, const Exec& exec, index_t N, index_t V,
                                      std::size_t scratch_bytes) {
    CrossEntropyStepArrays a;
    a.forward = CrossEntropyForwardArrays<Acc>::carve(c, exec, N, V, false);
    a.coef = c.take<Acc>(N);
    a.scratch = c.take<char>(index_t(scratch_bytes));
    a.scratch_bytes = scratch_bytes;
    return a;
  }
};

}  // namespace impl

/// Workspace bytes cross_entropy, cross_entropy_backward and cross_entropy_with_gradients need
/// (the largest of the three).
/// \param exec execution space instance the calls will run on (the size depends on its concurrency)
/// \param E (N x D) embeddings
/// \param C (V x D) classifier
/// \return bytes for CrossEntropyOptions::workspace: O(N + V) (docs/api.md, Memory).
/// \param opts the options the calls will get (the precision can change the size)
template <class Exec, class EV, class CV>
std::size_t cross_entropy_workspace_bytes(const Exec& exec, const EV& E, const CV& C,
                                          const CrossEntropyOptions& opts = {}) {
  using T = impl::scalar_of<EV>;
  using Acc = accumulator_t<T>;
  const impl::index_t N = E.extent(0), V = C.extent(0);
  impl::WorkspaceCarver forward, backward;
  impl::CrossEntropyForwardArrays<Acc>::carve(forward, exec, N, V, true);
  const impl::BackwardShape shape = impl::cross_entropy_shape(E, C, opts);
  impl::CrossEntropyBackwardArrays<Acc>::carve(backward, N, impl::backward_scratch_bytes<T>(exec, shape));
  const std::size_t step_scratch = impl::step_scratch_bytes<T>(exec, shape);
  impl::WorkspaceCarver step;
  if (step_scratch > 0) impl::CrossEntropyStepArrays<Acc>::carve(step, exec, N, V, step_scratch);
  return std::max({forward.bytes(), backward.bytes(), step.bytes()});
}

/// Whether cross_entropy_with_gradients runs the training step fused (one backend call: the
/// forward's logits become the gradient, 3 matrix products instead of 4) for these shapes and
/// options, rather than as cross_entropy then cross_entropy_backward. It lets a caller decide
/// beforehand whether computing the gradients with the loss pays (e.g. an autograd forward that
/// would otherwise hold them until a backward that may never run). Today: a Hopper GPU, bf16 or
/// fp16, no dbias, and an opts.memory_budget that holds the logits of a chunk of rows, or (with
/// opts.accumulate off) one that holds the backward's buffers, the step then keeping the logits
/// of a part of the vocabulary in dC's storage, and in its workspace as far as the budget allows
/// (cross_entropy_with_gradients); never on the host. The call itself may still run the pair for
/// reasons only its data shows: every row ignored, or operands a backend cannot take (e.g. not
/// 16-byte aligned); and in the second case where dE or dC is not wanted.
/// \param exec execution space instance the call will run on
/// \param E (N x D) embeddings (only the extents are read)
/// \param C (V x D) classifier (only the extents are read)
/// \param opts the options the call will get (memory_budget and precision matter)
/// \param want_dbias whether the call will be given a non-empty dbias
/// \return true when the step runs fused
template <class Exec, class EV, class CV>
bool cross_entropy_step_fuses(const Exec& exec, const EV& E, const CV& C, const CrossEntropyOptions& opts,
                              bool want_dbias) {
  return impl::fused_step_scratch_bytes(exec, E, C, opts, want_dbias) > 0;
}

/// Forward. E: (N x D) embeddings, C: (V x D) classifier, row-major, same scalar type T;
/// bias: (V) or empty; targets: (N) of any integer type, each in [0, V) or ignore_index.
/// Outputs (accumulator_t<T>): loss (N) for Reduction::none, (1) otherwise; lse (N) or empty:
/// the per-row LSE (0 for ignored rows), needed by the backward; vocab_order (V, int) or empty:
/// the vocabulary sorted by average logit, for the backward's vocabulary sorting.
/// Extra memory: O(N + V) workspace (cross_entropy_workspace_bytes), no N x V buffer.
/// \param exec execution space instance; kernels are enqueued on it
/// \param E (N x D) row-major view of T (float, double, tlse::bfloat16, tlse::float16)
/// \param C (V x D) row-major view of T
/// \param bias (V) view of T added to every logit of class j (-inf masks it), or empty
/// \param targets (N) integer view, each in [0, V) or opts.ignore_index
/// \param loss output view of accumulator_t<T>: (N) with Reduction::none, (1) otherwise
/// \param lse (N) output view of accumulator_t<T>, or empty
/// \param vocab_order (V) output view of int, or empty
/// \param opts see CrossEntropyOptions
/// \throws std::invalid_argument naming the call, the argument and the values on a wrong shape,
///         layout, target, option or workspace size (and on NaN/Inf with NonFinite::detect),
///         before any output is written.
template <class Exec, class EV, class CV, class BiasV, class TargetV, class LossV, class LseV, class OrderV>
void cross_entropy(const Exec& exec, const EV& E, const CV& C, const BiasV& bias, const TargetV& targets,
                   const LossV& loss, const LseV& lse, const OrderV& vocab_order, const CrossEntropyOptions& opts = {}) {
  const impl::ArgumentChecker check("tlse::cross_entropy");
  auto call = impl::cross_entropy_call(exec, check, E, C, bias, targets, opts);
  using T = typename decltype(call)::T;
  using Acc = typename decltype(call)::Acc;
  impl::static_check_acc_vector<Exec, T, LossV>();
  impl::static_check_acc_vector<Exec, T, LseV>();
  impl::static_check_view<Exec, OrderV, 1>();
  static_assert(std::is_same<typename OrderV::value_type, int>::value, "tlse: vocab_order is a view of int");
  call.validate();
  call.check_loss_shape("loss", loss);
  const bool want_lse = check.optional("lse", lse, E.extent(0), "E's row count");
  const bool want_order = check.optional("vocab_order", vocab_order, C.extent(0), "C's row count (the vocabulary)");
  const impl::index_t N = call.N, V = call.V;
  Kokkos::Profiling::pushRegion("tlse::cross_entropy");
  using Arrays = impl::CrossEntropyForwardArrays<Acc>;
  impl::with_workspace(
      check.function(), exec, opts.workspace,
      [&](impl::WorkspaceCarver& c) { return Arrays::carve(c, exec, N, V, want_order); },
      [&](const Arrays& a) {
        call.prepare_rows(a.row_target, a.active, a.position);
        const auto prob = call.problem(a.active, a.position, nullptr);
        const auto grid = impl::ForwardGrid::plan(exec, prob.rows.count, V);
        impl::lse_forward(exec, prob, grid, a.partials, a.row_lse, (Acc*)nullptr, want_order ? a.logit_sum : nullptr);
        call.target_logits(a, prob);
        call.write_loss(a, loss);
        const int* row_target = a.row_target;
        const Acc* row_lse = a.row_lse;
        if (want_lse) {
          Acc* out = lse.data();
          Kokkos::parallel_for("tlse::cross_entropy_lse", Kokkos::RangePolicy<Exec>(exec, 0, N),
                               KOKKOS_LAMBDA(impl::index_t i) { out[i] = row_target[i] >= 0 ? row_lse[i] : Acc(0); });
        }
        if (want_order) impl::sort_vocabulary(exec, a.logit_sum, V, vocab_order);
      });
  Kokkos::Profiling::popRegion();
}

/// Forward without bias, saved LSE or vocabulary order: loss only.
/// \param exec execution space instance
/// \param E (N x D) embeddings
/// \param C (V x D) classifier
/// \param targets (N) integer view
/// \param loss output view of accumulator_t<T>: (N) with Reduction::none, (1) otherwise
/// \param opts see CrossEntropyOptions
/// \throws std::invalid_argument naming the call, the argument and the values on a wrong shape,
///         layout, target, option or workspace size (and on NaN/Inf with NonFinite::detect),
///         before any output is written.
template <class Exec, class EV, class CV, class TargetV, class LossV>
void cross_entropy(const Exec& exec, const EV& E, const CV& C, const TargetV& targets, const LossV& loss,
                   const CrossEntropyOptions& opts = {}) {
  using T = impl::scalar_of<EV>;
  using Mem = typename EV::memory_space;
  cross_entropy(exec, E, C, Kokkos::View<const T*, Mem>(), targets, loss, Kokkos::View<accumulator_t<T>*, Mem>(),
                Kokkos::View<int*, Mem>(), opts);
}

/// Backward. Takes the forward's inputs, its lse output, optionally its vocab_order, and dloss
/// (shaped like the forward's loss). Writes dE (N x D), dC (V x D) and dbias (V); any of them may
/// be an empty view (not computed). Rows that are ignored get zero gradient. Tiles whose softmax
/// entries are all below filter_eps are skipped (CCE gradient filtering); filter_eps = 0 is exact.
/// No atomics: bitwise reproducible. Extra memory: the workspace (O(N) for the generic kernels; a
/// backend's backward may add a bounded buffer, counted by cross_entropy_workspace_bytes) plus
/// Kokkos team scratch (32 x D accumulators per running team).
/// \param exec execution space instance
/// \param E, C, bias, targets the forward's inputs
/// \param lse (N) the forward's lse output
/// \param vocab_order (V) the forward's vocab_order output, or empty (natural order)
/// \param dloss gradient with respect to the loss, shaped like the forward's loss
/// \param dE (N x D) output view of T, or empty
/// \param dC (V x D) output view of T, or empty
/// \param dbias (V) output view of T, or empty
/// \param opts the forward's options; `accumulate` adds into dE, dC and dbias
/// \throws std::invalid_argument naming the call, the argument and the values on a wrong shape,
///         layout, target, option or workspace size (and on NaN/Inf with NonFinite::detect),
///         before any output is written.
template <class Exec, class EV, class CV, class BiasV, class TargetV, class LseV, class OrderV, class DLossV,
          class DEV, class DCV, class DBiasV>
void cross_entropy_backward(const Exec& exec, const EV& E, const CV& C, const BiasV& bias, const TargetV& targets,
                            const LseV& lse, const OrderV& vocab_order, const DLossV& dloss, const DEV& dE,
                            const DCV& dC, const DBiasV& dbias, const CrossEntropyOptions& opts = {}) {
  const impl::ArgumentChecker check("tlse::cross_entropy_backward");
  auto call = impl::cross_entropy_call(exec, check, E, C, bias, targets, opts);
  using T = typename decltype(call)::T;
  using Acc = typename decltype(call)::Acc;
  impl::static_check_acc_vector<Exec, T, LseV>();
  call.validate();
  const impl::index_t N = call.N, V = call.V;
  check.vector("lse", lse);
  check.extent("lse", lse.extent(0), N, "E's row count");
  impl::check_vocab_order(exec, check, vocab_order, V);
  const auto wanted = call.check_gradients(dloss, dE, dC, dbias);
  const bool want_dE = wanted.dE, want_dC = wanted.dC, want_dbias = wanted.dbias;
  Kokkos::Profiling::pushRegion("tlse::cross_entropy_backward");
  using Arrays = impl::CrossEntropyBackwardArrays<Acc>;
  impl::with_workspace(
      check.function(), exec, opts.workspace,
      [&](impl::WorkspaceCarver& c) {
        return Arrays::carve(c, N, impl::backward_scratch_bytes<T>(exec, call.backward_shape()));
      },
      [&](const Arrays& a) {
        call.prepare_rows(a.row_target, a.active, a.position);
        const int* order = vocab_order.extent(0) ? vocab_order.data() : nullptr;
        const int* active = a.active;
        const int* row_target = a.row_target;
        Acc *g = a.g, *w = a.w;
        const Acc* saved_lse = lse.data();
        call.gradient_coefficients(active, dloss, w);
        const Acc z = Acc(opts.z_loss);
        Kokkos::parallel_for("tlse::cross_entropy_softmax_weights",
                             Kokkos::RangePolicy<Exec>(exec, 0, call.active_count), KOKKOS_LAMBDA(impl::index_t k) {
                               const int i = active[k];
                               g[i] = w[i] * (Acc(1) + Acc(2) * z * saved_lse[i]);
                             });
        if (want_dE) call.zero_unscored_rows(row_target, dE);
        impl::BackwardRequest<T, Acc> r;
        r.prob = call.problem(active, a.position, order);
        r.row_terms = {saved_lse, g, row_target, w};
        r.filter_eps = Acc(impl::resolved_filter_eps<T>(opts));
        r.grad_rows = want_dE ? dE.data() : nullptr;
        r.grad_cols = want_dC ? dC.data() : nullptr;
        r.dbias = want_dbias ? dbias.data() : nullptr;
        r.accumulate = opts.accumulate;
        r.scratch = a.scratch;
        r.scratch_bytes = a.scratch_bytes;
        impl::lse_backward(exec, r);
      });
  Kokkos::Profiling::popRegion();
}

/// Loss and gradients in one call: a training step. The same results as cross_entropy followed
/// by cross_entropy_backward with `dloss` (up to rounding), and the same checks; one call lets a
/// backend share work between the two halves. On Hopper GPUs (bf16, no dbias wanted) when
/// opts.memory_budget holds the logits of a chunk of rows (at least 2048 rows, or every row; see
/// docs/performance.md), the forward's logits are kept and become the gradient: 3 products
/// instead of the 4 of the two calls. Under a smaller budget that holds the backward's buffers,
/// when dE and dC are both wanted and opts.accumulate is off (ignored rows or not), the logits of
/// the first part of the vocabulary are kept in dC's storage (its values are written after
/// them; about V D / max(N, D) classes, 59136 of 128256 at N=8192 D=4096) and, as far as the
/// budget allows, in the workspace (109824 classes in all at 1 GiB), and only the rest is
/// recomputed (docs/api.md, Memory). Those paths
/// compute every softmax entry (no gradient filtering, as with filter_eps = 0); otherwise the two
/// calls run as documented, in the natural vocabulary order. cross_entropy_step_fuses tells
/// beforehand which of the two will run.
/// \param exec execution space instance
/// \param E, C, bias, targets as for cross_entropy
/// \param dloss gradient with respect to the loss, shaped like the loss (1 for the mean loss of a
///        training step)
/// \param loss output view of accumulator_t<T>: (N) with Reduction::none, (1) otherwise
/// \param dE, dC, dbias output views of T, (N x D), (V x D) and (V); each may be empty (not computed)
/// \param opts see CrossEntropyOptions; `accumulate` adds into dE, dC and dbias; a lent workspace
///        holds cross_entropy_workspace_bytes(exec, E, C, opts)
/// \throws std::invalid_argument naming the call, the argument and the values on a wrong shape,
///         layout, target, option or workspace size (and on NaN/Inf with NonFinite::detect),
///         before any output is written.
template <class Exec, class EV, class CV, class BiasV, class TargetV, class DLossV, class LossV, class DEV, class DCV,
          class DBiasV>
void cross_entropy_with_gradients(const Exec& exec, const EV& E, const CV& C, const BiasV& bias, const TargetV& targets,
                                  const DLossV& dloss, const LossV& loss, const DEV& dE, const DCV& dC,
                                  const DBiasV& dbias, const CrossEntropyOptions& opts = {}) {
  const impl::ArgumentChecker check("tlse::cross_entropy_with_gradients");
  auto call = impl::cross_entropy_call(exec, check, E, C, bias, targets, opts);
  using T = typename decltype(call)::T;
  using Acc = typename decltype(call)::Acc;
  using Mem = typename EV::memory_space;
  impl::static_check_acc_vector<Exec, T, LossV>();
  call.validate();
  const impl::index_t N = call.N, V = call.V;
  call.check_loss_shape("loss", loss);
  const auto wanted = call.check_gradients(dloss, dE, dC, dbias);
  const bool want_dE = wanted.dE, want_dC = wanted.dC, want_dbias = wanted.dbias;
  // The fallback below checks a lent workspace in each of its two calls, and its forward writes
  // the loss before its backward checks: one the backward finds too small (its scratch on GPUs)
  // would fail the call after a write. So the workspace is checked against both (and the step) here.
  if (opts.workspace.data) {
    const std::size_t need = cross_entropy_workspace_bytes(exec, E, C, opts);
    if (opts.workspace.bytes < need)
      check.fail("workspace", "holds " + std::to_string(opts.workspace.bytes) + " bytes but this call needs " +
                                  std::to_string(need) + " (cross_entropy_workspace_bytes)");
  }

  const std::size_t step_scratch = impl::fused_step_scratch_bytes(exec, E, C, opts, want_dbias);
  bool done = false;
  if (step_scratch > 0 && call.active_count > 0) {
    Kokkos::Profiling::pushRegion("tlse::cross_entropy_with_gradients");
    using Arrays = impl::CrossEntropyStepArrays<Acc>;
    impl::with_workspace(
        check.function(), exec, opts.workspace,
        [&](impl::WorkspaceCarver& c) { return Arrays::carve(c, exec, N, V, step_scratch); },
        [&](const Arrays& a) {
          const impl::CrossEntropyForwardArrays<Acc>& f = a.forward;
          call.prepare_rows(f.row_target, f.active, f.position);
          call.gradient_coefficients(f.active, dloss, a.coef);
          if (want_dE) call.zero_unscored_rows(f.row_target, dE);
          impl::StepRequest<T, Acc> r;
          r.prob = call.problem(f.active, f.position, nullptr);
          call.target_logits(f, r.prob);  // the loss's and the gradient's target term share them
          r.target = f.row_target;
          r.target_logit = f.target_logit;
          r.coef = a.coef;
          r.z_loss = Acc(opts.z_loss);
          r.lse = f.row_lse;
          r.grad_rows = want_dE ? dE.data() : nullptr;
          r.grad_cols = want_dC ? dC.data() : nullptr;
          r.accumulate = opts.accumulate;
          r.scratch = a.scratch;
          r.scratch_bytes = a.scratch_bytes;
          done = impl::LseStepSpecialization<Exec>::run(exec, r);
          if (done) call.write_loss(f, loss);
        });
    Kokkos::Profiling::popRegion();
  }
  if (done) return;
  // The two calls; their checks pass (the same as above). The forward's saved LSEs live here.
  Kokkos::View<Acc*, Mem> lse(Kokkos::view_alloc(Kokkos::WithoutInitializing, "tlse::cross_entropy_with_gradients::lse"),
                              N);
  cross_entropy(exec, E, C, bias, targets, loss, lse, Kokkos::View<int*, Mem>(), opts);
  cross_entropy_backward(exec, E, C, bias, targets, lse, Kokkos::View<const int*, Mem>(), dloss, dE, dC, dbias, opts);
}

}  // namespace tlse
