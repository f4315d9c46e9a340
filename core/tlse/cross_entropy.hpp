#pragma once
/// \file cross_entropy.hpp
/// Cut cross-entropy (CCE): loss_i = lse_i(C E_i + bias) - (C E_i + bias)_target(i), without the
/// N x V logit matrix; with F.cross_entropy's class weights and label smoothing, a z-loss, and the
/// argmax of each row from the same tiles.
#include <tlse/cross_entropy_options.hpp>
#include <tlse/impl/cross_entropy_call.hpp>
#include <tlse/impl/lse_backward.hpp>
#include <tlse/impl/lse_forward.hpp>
#include <tlse/impl/vocabulary_sort.hpp>

#include <algorithm>
#include <vector>

namespace tlse {

/// Workspace bytes cross_entropy, cross_entropy_backward and cross_entropy_with_gradients need
/// (the largest of the three), whatever CrossEntropyExtras they get.
/// \param exec execution space instance the calls will run on (the size depends on its concurrency)
/// \param E (N x D) embeddings
/// \param C (V x D) classifier
/// \return bytes for CrossEntropyOptions::workspace: O(N + V) (docs/api.md, Memory).
/// \param opts the options the calls will get (the precision, label smoothing and budget change the size)
template <class Exec, class EV, class CV>
std::size_t cross_entropy_workspace_bytes(const Exec& exec, const EV& E, const CV& C,
                                          const CrossEntropyOptions& opts = {}) {
  using T = impl::scalar_of<EV>;
  using Acc = accumulator_t<T>;
  const impl::index_t N = E.extent(0), V = C.extent(0), D = E.extent(1);
  impl::WorkspaceCarver forward, backward;
  impl::CrossEntropyForwardArrays<Acc>::carve(forward, exec, N, V, D, opts, true);
  const impl::BackwardShape shape = impl::cross_entropy_shape(E, C, opts);
  impl::CrossEntropyBackwardArrays<Acc>::carve(backward, exec, N, V, D, opts,
                                               impl::backward_scratch_bytes<T>(exec, shape));
  const std::size_t step_scratch = impl::fused_step_scratch_bytes(exec, E, C, opts, false);
  impl::WorkspaceCarver step;
  if (step_scratch > 0) impl::CrossEntropyStepArrays<Acc>::carve(step, exec, N, V, D, opts, step_scratch);
  return std::max({forward.bytes(), backward.bytes(), step.bytes()});
}

/// Whether cross_entropy_with_gradients runs the training step fused (one backend call: the
/// forward's logits become the gradient, 3 matrix products instead of 4) for these shapes and
/// options, rather than as cross_entropy then cross_entropy_backward. It lets a caller decide
/// beforehand whether computing the gradients with the loss pays (e.g. an autograd forward that
/// would otherwise hold them until a backward that may never run). It fuses with a Hopper GPU,
/// bf16 or fp16, no dbias, no argmax (CrossEntropyExtras::predicted or accuracy), no label smoothing
/// under a softcap, and an opts.memory_budget that holds the logits of a chunk of rows, or (with
/// opts.accumulate off) one that holds the backward's buffers, the step then keeping the logits
/// of a part of the vocabulary in dC's storage, and in its workspace as far as the budget allows
/// (cross_entropy_with_gradients); never on the host. The call itself may still run the pair for
/// reasons only its data shows: every row ignored, or operands a backend cannot take (e.g. not
/// 16-byte aligned); and in the second case where dE or dC is not wanted.
/// \param exec execution space instance the call will run on
/// \param E (N x D) embeddings (only the extents are read)
/// \param C (V x D) classifier (only the extents are read)
/// \param opts the options the call will get (memory_budget, precision, softcap and label_smoothing matter)
/// \param want_dbias whether the call will be given a non-empty dbias
/// \param want_argmax whether the call will be given CrossEntropyExtras::predicted or accuracy
/// \return true when the step runs fused
template <class Exec, class EV, class CV>
bool cross_entropy_step_fuses(const Exec& exec, const EV& E, const CV& C, const CrossEntropyOptions& opts,
                              bool want_dbias, bool want_argmax = false) {
  return impl::fused_step_scratch_bytes(exec, E, C, opts, want_dbias, want_argmax) > 0;
}

namespace impl {

/// The forward of a call whose rows are prepared (a.row_target, a.active, a.position): LSE, target
/// logits, label smoothing's row sums, the loss, and the argmax and accuracy where the extras
/// want them. `step` runs the tile sweep instead of lse_forward when given (the fused training
/// step, which writes a.row_lse itself); returns false when it declined, before anything was written.
template <class Call, class LossV, class Step>
bool cross_entropy_forward_rows(const Call& call, const CrossEntropyForwardArrays<typename Call::Acc>& a,
                                const TileProblem<typename Call::T, typename Call::Acc>& prob, const LossV& loss,
                                const Step& step) {
  using Acc = typename Call::Acc;
  const ForwardRowArrays<Acc>& r = a.rows;
  const CrossEntropyOptions& o = call.o;
  const Acc* target_weight = call.class_weight() ? r.target_weight : nullptr;
  if (target_weight) call.row_target_weights(a.row_target, r.target_weight);
  call.target_logits(a, prob);  // the loss's and a fused step's target term share them
  if (!step(target_weight)) return false;
  const bool smoothing = o.label_smoothing > 0;
  if (smoothing_by_vectors(o)) call.smoothing_row_sums(a.active, r.vectors, r.smooth);
  call.row_losses(a.active, a.row_lse, a.target_logit, target_weight, smoothing ? r.smooth : nullptr,
                  call.loss_scales(), a.row_loss);
  call.write_loss(a.row_loss, a.total, loss);
  return true;
}

/// RowStatistics of the forward's tile sweep for the call's extras and options.
template <class Call>
RowStatistics<typename Call::Acc> forward_statistics(const Call& call, const ForwardRowArrays<typename Call::Acc>& r) {
  RowStatistics<typename Call::Acc> stats = r.stats;
  stats.argmax = call.want_argmax()
                     ? (call.x.predicted.extent(0) ? call.x.predicted.data() : r.argmax)
                     : nullptr;
  if (smoothing_in_tiles(call.o)) {
    stats.weighted_sum = r.smooth;
    stats.col_weight = call.class_weight();
  }
  return stats;
}

}  // namespace impl

/// Forward. E: (N x D) embeddings, C: (V x D) classifier, row-major, same scalar type T;
/// bias: (V) or empty; targets: (N) of any integer type, each in [0, V) or ignore_index.
/// Outputs (accumulator_t<T>): loss (N) for Reduction::none, (1) otherwise; lse (N) or empty:
/// the per-row LSE (0 for ignored rows), needed by the backward; vocab_order (V, int) or empty:
/// the vocabulary sorted by average logit, for the backward's vocabulary sorting. `extras`: the
/// class weights (input), the predicted classes and the accuracy (outputs), each optional.
/// Extra memory: O(N + V) workspace (cross_entropy_workspace_bytes), no N x V buffer.
/// \param exec execution space instance; kernels are enqueued on it
/// \param E (N x D) row-major view of T (float, double, tlse::bfloat16, tlse::float16)
/// \param C (V x D) row-major view of T
/// \param bias (V) view of T added to every logit of class j (-inf masks it), or empty
/// \param targets (N) integer view, each in [0, V) or opts.ignore_index
/// \param loss output view of accumulator_t<T>: (N) with Reduction::none, (1) otherwise
/// \param lse (N) output view of accumulator_t<T>, or empty
/// \param vocab_order (V) output view of int, or empty
/// \param extras class_weight, predicted and accuracy (CrossEntropyExtras); dlse must be empty
/// \param opts see CrossEntropyOptions
/// \throws std::invalid_argument naming the call, the argument and the values on a wrong shape,
///         layout, target, class weight, option or workspace size (and on NaN/Inf with
///         NonFinite::detect), before any output is written.
template <class Exec, class EV, class CV, class BiasV, class TargetV, class LossV, class LseV, class OrderV>
void cross_entropy(const Exec& exec, const EV& E, const CV& C, const BiasV& bias, const TargetV& targets,
                   const LossV& loss, const LseV& lse, const OrderV& vocab_order,
                   const CrossEntropyExtras<accumulator_t<impl::scalar_of<EV>>, typename Exec::memory_space>& extras,
                   const CrossEntropyOptions& opts = {}) {
  const impl::ArgumentChecker check("tlse::cross_entropy");
  auto call = impl::cross_entropy_call(exec, check, E, C, bias, targets, opts, extras);
  using T = typename decltype(call)::T;
  using Acc = typename decltype(call)::Acc;
  impl::static_check_acc_vector<Exec, T, LossV>();
  impl::static_check_acc_vector<Exec, T, LseV>();
  impl::static_check_view<Exec, OrderV, 1>();
  static_assert(std::is_same<typename OrderV::value_type, int>::value, "tlse: vocab_order is a view of int");
  call.validate();
  call.check_extras("forward");
  call.check_loss_shape("loss", loss);
  const bool want_lse = check.optional("lse", lse, E.extent(0), "E's row count");
  const bool want_order = check.optional("vocab_order", vocab_order, C.extent(0), "C's row count (the vocabulary)");
  const impl::index_t N = call.N, V = call.V, D = impl::index_t(E.extent(1));
  Kokkos::Profiling::pushRegion("tlse::cross_entropy");
  using Arrays = impl::CrossEntropyForwardArrays<Acc>;
  impl::with_workspace(
      check.function(), exec, opts.workspace,
      [&](impl::WorkspaceCarver& c) { return Arrays::carve(c, exec, N, V, D, opts, want_order); },
      [&](const Arrays& a) {
        call.prepare_rows(a.row_target, a.active, a.position);
        const auto prob = call.problem(a.active, a.position, nullptr);
        const auto stats = impl::forward_statistics(call, a.rows);
        if (stats.argmax) impl::fill(exec, stats.argmax, N, std::int64_t(-1));
        impl::cross_entropy_forward_rows(call, a, prob, loss, [&](const Acc*) {
          const auto grid = impl::ForwardGrid::plan(exec, prob.rows.count, V);
          impl::lse_forward(exec, prob, grid, a.partials, a.row_lse, (Acc*)nullptr, want_order ? a.logit_sum : nullptr,
                            stats);
          return true;
        });
        if (stats.argmax) call.write_accuracy(a.row_target, stats.argmax, a.rows.hits, a.total);
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

/// Forward without extras (see the overload with CrossEntropyExtras).
/// \param exec execution space instance
/// \param E, C, bias, targets, loss, lse, vocab_order as for the overload with extras
/// \param opts see CrossEntropyOptions
/// \throws std::invalid_argument as the overload with extras.
template <class Exec, class EV, class CV, class BiasV, class TargetV, class LossV, class LseV, class OrderV>
void cross_entropy(const Exec& exec, const EV& E, const CV& C, const BiasV& bias, const TargetV& targets,
                   const LossV& loss, const LseV& lse, const OrderV& vocab_order,
                   const CrossEntropyOptions& opts = {}) {
  cross_entropy(exec, E, C, bias, targets, loss, lse, vocab_order,
                CrossEntropyExtras<accumulator_t<impl::scalar_of<EV>>, typename Exec::memory_space>{}, opts);
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

namespace impl {

/// The vocabulary order a backward visits the classes in (the forward's vocab_order) and its
/// inverse (class -> place in the order), or none.
struct VocabularyOrder {
  const int* order = nullptr;
  const int* position = nullptr;
};

/// The gradients of a call whose rows and coefficients are prepared, by the two passes (or a
/// backend's fused backward) from the saved LSE, then label smoothing's rank-one share.
template <class Call, class DEV, class DCV, class DBiasV>
void cross_entropy_backward_rows(const Call& call, const int* row_target, const int* active, const int* position,
                                 const VocabularyOrder& order, const typename Call::Acc* saved_lse,
                                 typename Call::Acc* g, const CoefficientArrays<typename Call::Acc>& coef,
                                 const SmoothingVectors<typename Call::Acc>& vectors, char* scratch,
                                 std::size_t scratch_bytes, const DEV& dE, const DCV& dC, const DBiasV& dbias) {
  using T = typename Call::T;
  using Acc = typename Call::Acc;
  const CrossEntropyOptions& o = call.o;
  call.softmax_weights(active, coef.softmax, coef.lse_factor, saved_lse, g);
  if (dE.extent(0)) call.zero_unscored_rows(row_target, dE);
  BackwardRequest<T, Acc> r;
  r.prob = call.problem(active, position, order.order);
  r.prob.cols.position = order.position;
  r.row_terms = {saved_lse, g, row_target, coef.w};
  if (smoothing_in_tiles(o)) r.row_terms.spread = coef.spread, r.row_terms.spread_weight = call.class_weight();
  r.filter_eps = Acc(resolved_filter_eps<T>(o));
  r.grad_rows = dE.extent(0) ? dE.data() : nullptr;
  r.grad_cols = dC.extent(0) ? dC.data() : nullptr;
  r.dbias = dbias.extent(0) ? dbias.data() : nullptr;
  r.accumulate = o.accumulate;
  r.scratch = scratch;
  r.scratch_bytes = scratch_bytes;
  lse_backward(call.exec, r);
  if (smoothing_by_vectors(o)) call.smoothing_gradients(active, coef.spread, vectors, dE, dC, dbias);
}

}  // namespace impl

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
/// \param extras the forward's class_weight, and dlse (the gradient reaching the lse output), each
///        optional; predicted and accuracy must be empty
/// \param opts the forward's options; `accumulate` adds into dE, dC and dbias
/// \throws std::invalid_argument naming the call, the argument and the values on a wrong shape,
///         layout, target, option or workspace size (and on NaN/Inf with NonFinite::detect),
///         before any output is written.
template <class Exec, class EV, class CV, class BiasV, class TargetV, class LseV, class OrderV, class DLossV, class DEV,
          class DCV, class DBiasV>
void cross_entropy_backward(
    const Exec& exec, const EV& E, const CV& C, const BiasV& bias, const TargetV& targets, const LseV& lse,
    const OrderV& vocab_order, const DLossV& dloss, const DEV& dE, const DCV& dC, const DBiasV& dbias,
    const CrossEntropyExtras<accumulator_t<impl::scalar_of<EV>>, typename Exec::memory_space>& extras,
    const CrossEntropyOptions& opts = {}) {
  const impl::ArgumentChecker check("tlse::cross_entropy_backward");
  auto call = impl::cross_entropy_call(exec, check, E, C, bias, targets, opts, extras);
  using T = typename decltype(call)::T;
  using Acc = typename decltype(call)::Acc;
  impl::static_check_acc_vector<Exec, T, LseV>();
  call.validate();
  call.check_extras("backward");
  const impl::index_t N = call.N, V = call.V, D = impl::index_t(E.extent(1));
  check.vector("lse", lse);
  check.extent("lse", lse.extent(0), N, "E's row count");
  impl::check_vocab_order(exec, check, vocab_order, V);
  call.check_gradients(dloss, dE, dC, dbias);
  Kokkos::Profiling::pushRegion("tlse::cross_entropy_backward");
  using Arrays = impl::CrossEntropyBackwardArrays<Acc>;
  impl::with_workspace(
      check.function(), exec, opts.workspace,
      [&](impl::WorkspaceCarver& c) {
        return Arrays::carve(c, exec, N, V, D, opts, impl::backward_scratch_bytes<T>(exec, call.backward_shape()));
      },
      [&](const Arrays& a) {
        call.prepare_rows(a.row_target, a.active, a.position);
        const Acc* target_weight = call.class_weight() ? a.coef.target_weight : nullptr;
        if (target_weight) call.row_target_weights(a.row_target, a.coef.target_weight);
        call.gradient_coefficients(a.active, dloss, target_weight, a.coef.w, a.coef.softmax, a.coef.lse_factor,
                                   opts.label_smoothing > 0 ? a.coef.spread : nullptr);
        impl::VocabularyOrder order;
        if (vocab_order.extent(0)) {
          order.order = vocab_order.data();
          impl::invert_index(exec, order.order, V, V, a.order_position);
          impl::check_vocab_order_inverse(exec, check, a.order_position, V);
          order.position = a.order_position;
        }
        impl::cross_entropy_backward_rows(call, a.row_target, a.active, a.position, order, lse.data(), a.g, a.coef,
                                          a.vectors, a.scratch, a.scratch_bytes, dE, dC, dbias);
      });
  Kokkos::Profiling::popRegion();
}

/// Backward without extras (see the overload with CrossEntropyExtras).
/// \param exec execution space instance
/// \param E, C, bias, targets, lse, vocab_order, dloss, dE, dC, dbias as for the overload with extras
/// \param opts the forward's options
/// \throws std::invalid_argument as the overload with extras.
template <class Exec, class EV, class CV, class BiasV, class TargetV, class LseV, class OrderV, class DLossV,
          class DEV, class DCV, class DBiasV>
void cross_entropy_backward(const Exec& exec, const EV& E, const CV& C, const BiasV& bias, const TargetV& targets,
                            const LseV& lse, const OrderV& vocab_order, const DLossV& dloss, const DEV& dE,
                            const DCV& dC, const DBiasV& dbias, const CrossEntropyOptions& opts = {}) {
  cross_entropy_backward(exec, E, C, bias, targets, lse, vocab_order, dloss, dE, dC, dbias,
                         CrossEntropyExtras<accumulator_t<impl::scalar_of<EV>>, typename Exec::memory_space>{}, opts);
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
/// \param extras class_weight, dlse (the gradient reaching the LSE, known beforehand), predicted
///        and accuracy, each optional (CrossEntropyExtras)
/// \param opts see CrossEntropyOptions; `accumulate` adds into dE, dC and dbias; a lent workspace
///        holds cross_entropy_workspace_bytes(exec, E, C, opts)
/// \throws std::invalid_argument naming the call, the argument and the values on a wrong shape,
///         layout, target, option or workspace size (and on NaN/Inf with NonFinite::detect),
///         before any output is written.
template <class Exec, class EV, class CV, class BiasV, class TargetV, class DLossV, class LossV, class DEV, class DCV,
          class DBiasV>
void cross_entropy_with_gradients(
    const Exec& exec, const EV& E, const CV& C, const BiasV& bias, const TargetV& targets, const DLossV& dloss,
    const LossV& loss, const DEV& dE, const DCV& dC, const DBiasV& dbias,
    const CrossEntropyExtras<accumulator_t<impl::scalar_of<EV>>, typename Exec::memory_space>& extras,
    const CrossEntropyOptions& opts = {}) {
  const impl::ArgumentChecker check("tlse::cross_entropy_with_gradients");
  auto call = impl::cross_entropy_call(exec, check, E, C, bias, targets, opts, extras);
  using T = typename decltype(call)::T;
  using Acc = typename decltype(call)::Acc;
  using Mem = typename EV::memory_space;
  impl::static_check_acc_vector<Exec, T, LossV>();
  call.validate();
  call.check_extras("step");
  const impl::index_t N = call.N, V = call.V, D = impl::index_t(E.extent(1));
  call.check_loss_shape("loss", loss);
  const auto wanted = call.check_gradients(dloss, dE, dC, dbias);
  // The fallback below checks a lent workspace in each of its two calls, and its forward writes
  // the loss before its backward checks: one the backward finds too small (its scratch on GPUs)
  // would fail the call after a write. So the workspace is checked against both (and the step) here.
  check.lent_workspace(opts.workspace, "cross_entropy_workspace_bytes",
                       [&] { return cross_entropy_workspace_bytes(exec, E, C, opts); });

  const std::size_t step_scratch =
      impl::fused_step_scratch_bytes(exec, E, C, opts, wanted.dbias, call.want_argmax());
  bool done = false;
  if (step_scratch > 0 && call.active_count > 0) {
    Kokkos::Profiling::pushRegion("tlse::cross_entropy_with_gradients");
    using Arrays = impl::CrossEntropyStepArrays<Acc>;
    impl::with_workspace(
        check.function(), exec, opts.workspace,
        [&](impl::WorkspaceCarver& c) { return Arrays::carve(c, exec, N, V, D, opts, step_scratch); },
        [&](const Arrays& a) {
          const impl::CrossEntropyForwardArrays<Acc>& f = a.forward;
          call.prepare_rows(f.row_target, f.active, f.position);
          const auto prob = call.problem(f.active, f.position, nullptr);
          done = impl::cross_entropy_forward_rows(call, f, prob, loss, [&](const Acc* target_weight) {
            call.gradient_coefficients(f.active, dloss, target_weight, a.coef.w, a.coef.softmax, a.coef.lse_factor,
                                       opts.label_smoothing > 0 ? a.coef.spread : nullptr);
            if (wanted.dE) call.zero_unscored_rows(f.row_target, dE);
            impl::StepRequest<T, Acc> r;
            r.prob = prob;
            r.target = f.row_target;
            r.target_logit = f.target_logit;
            r.coef = {a.coef.w, a.coef.softmax, a.coef.lse_factor};
            r.lse = f.row_lse;
            r.grad_rows = wanted.dE ? dE.data() : nullptr;
            r.grad_cols = wanted.dC ? dC.data() : nullptr;
            r.accumulate = opts.accumulate;
            r.scratch = a.scratch;
            r.scratch_bytes = a.scratch_bytes;
            return impl::LseStepSpecialization<Exec>::run(exec, r);
          });
          if (done && impl::smoothing_by_vectors(opts))
            call.smoothing_gradients(f.active, a.coef.spread, a.vectors, dE, dC, dbias, f.rows.vectors.v);
        });
    Kokkos::Profiling::popRegion();
  }
  if (done) return;
  // The two calls; their checks pass (the same as above). The forward's saved LSEs live here.
  Kokkos::View<Acc*, Mem> lse(
      Kokkos::view_alloc(Kokkos::WithoutInitializing, "tlse::cross_entropy_with_gradients::lse"), N);
  CrossEntropyExtras<Acc, typename Exec::memory_space> forward_extras = extras, backward_extras;
  forward_extras.dlse = {};
  backward_extras.class_weight = extras.class_weight;
  backward_extras.dlse = extras.dlse;
  cross_entropy(exec, E, C, bias, targets, loss, lse, Kokkos::View<int*, Mem>(), forward_extras, opts);
  cross_entropy_backward(exec, E, C, bias, targets, lse, Kokkos::View<const int*, Mem>(), dloss, dE, dC, dbias,
                         backward_extras, opts);
}

/// The training step without extras (see the overload with CrossEntropyExtras).
/// \param exec execution space instance
/// \param E, C, bias, targets, dloss, loss, dE, dC, dbias as for the overload with extras
/// \param opts see CrossEntropyOptions
/// \throws std::invalid_argument as the overload with extras.
template <class Exec, class EV, class CV, class BiasV, class TargetV, class DLossV, class LossV, class DEV, class DCV,
          class DBiasV>
void cross_entropy_with_gradients(const Exec& exec, const EV& E, const CV& C, const BiasV& bias, const TargetV& targets,
                                  const DLossV& dloss, const LossV& loss, const DEV& dE, const DCV& dC,
                                  const DBiasV& dbias, const CrossEntropyOptions& opts = {}) {
  cross_entropy_with_gradients(exec, E, C, bias, targets, dloss, loss, dE, dC, dbias,
                               CrossEntropyExtras<accumulator_t<impl::scalar_of<EV>>, typename Exec::memory_space>{},
                               opts);
}

}  // namespace tlse
