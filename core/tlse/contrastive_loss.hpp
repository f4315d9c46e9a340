#pragma once
/// \file contrastive_loss.hpp
/// CLIP-style contrastive (InfoNCE) loss over image and text features (Inf-CL), and the
/// self-similarity form (NT-Xent), without the b x b logit matrix.
#include <tlse/impl/lse_backward.hpp>
#include <tlse/impl/lse_forward.hpp>
#include <tlse/impl/pair_logits.hpp>
#include <tlse/impl/problem_builder.hpp>
#include <tlse/impl/weighted_sum.hpp>
#include <tlse/impl/workspace_carver.hpp>
#include <tlse/options.hpp>

namespace tlse {

/// Options of the contrastive losses, forward and backward (pass the same to both).
struct ContrastiveOptions {
  double scale = 1.0;  ///< logit scale (1 / temperature); finite, >= 0
  Direction direction = Direction::symmetric;  ///< ignored by the self-similarity form
  bool accumulate = false;  ///< backward: dI += ..., dT += ..., dscale += ... instead of overwriting
  Precision precision = Precision::exact;  ///< float inputs: Precision::tf32 allows TF32 tensor cores
  /// NaN/Inf policy for the inputs (see NonFinite)
  NonFinite non_finite = NonFinite::propagate;
  /// bytes of workspace the calls may use; each picks the fastest algorithm that fits (see memory_budget_default)
  std::size_t memory_budget = memory_budget_default;
  /// memory lent to the call; empty: the call allocates and frees it
  Workspace workspace{};
};

/// The gradients reaching the LSEs the contrastive forward returned (a loss built from them),
/// for the backward; each an empty view (the default) when none reaches it. Acc is
/// accumulator_t of the inputs, Mem the memory space of the call's execution space.
template <class Acc, class Mem>
struct ContrastiveExtras {
  Kokkos::View<const Acc*, Mem> d_row_lse;  ///< (b): dL/d row_lse
  Kokkos::View<const Acc*, Mem> d_col_lse;  ///< (b): dL/d col_lse (the text-to-image direction's LSEs)
};

namespace impl {

/// Weights of the row (image-to-text) and column (text-to-image) terms in the loss.
struct DirectionWeights {
  double row, col;
  explicit DirectionWeights(Direction d)
      : row(d == Direction::text_to_image ? 0.0 : d == Direction::symmetric ? 0.5 : 1.0),
        col(d == Direction::image_to_text ? 0.0 : d == Direction::symmetric ? 0.5 : 1.0) {}
};

/// Shared by the paired (I, T) and self-similarity (Z, Z) forms: the positive of row i is
/// column positive[i]; with `paired`, the positive of column j is row positive[j].
template <class Exec, class T, class Acc>
struct ContrastiveCore {
  const Exec& exec;
  TileProblem<T, Acc> prob;
  index_t b;
  bool want_col;
  /// Positives on the diagonal (no labels): column j's positive logit x(j, j) is row j's, so the
  /// forward takes it from the rows' instead of a second pass over the operands.
  bool diagonal = false;

  /// The larger of the forward's and the backward's workspace.
  static std::size_t workspace_bytes(const Exec& exec, index_t b, index_t depth, bool want_col,
                                     const ContrastiveOptions& o) {
    WorkspaceCarver forward, backward;
    layout(exec, forward, b, depth, want_col, o, false);
    layout(exec, backward, b, depth, want_col, o, true);
    return std::max(forward.bytes(), backward.bytes());
  }
  struct Arrays {
    int* positive;
    Acc *row_lse, *col_lse, *row_pos, *col_pos, *terms, *g_row, *g_col, *total, *partials;
    char* scratch;  // backward only: for a backend's backward passes
    std::size_t scratch_bytes;
  };
  static Arrays layout(const Exec& exec, WorkspaceCarver& c, index_t b, index_t depth, bool want_col,
                       const ContrastiveOptions& o, bool backward) {
    Arrays a;
    a.positive = c.take<int>(b);
    a.row_lse = c.take<Acc>(b);
    a.col_lse = c.take<Acc>(want_col ? b : 0);
    a.row_pos = c.take<Acc>(b);
    a.col_pos = c.take<Acc>(want_col ? b : 0);
    a.terms = c.take<Acc>(b);
    a.g_row = c.take<Acc>(b);
    a.g_col = c.take<Acc>(want_col ? b : 0);
    a.total = c.take<Acc>(1);
    // The forward's split LSE partials (about 32 MiB at b = 65536 on an H100): the backward has none.
    a.partials =
        c.take<Acc>(backward ? 0 : forward_partials_size(ForwardGrid::plan(exec, b, b), b, b, want_col, false));
    const BackwardShape shape{b, b, depth, o.precision, o.memory_budget};
    a.scratch_bytes = backward ? backward_scratch_bytes<T>(exec, shape) : 0;
    a.scratch = c.take<char>(index_t(a.scratch_bytes));
    return a;
  }

  /// loss = (1/b) sum_i [w_row (row_lse_i - x_{i,pos_i}) + w_col (col_lse_i - x_{pos_i,i})].
  void forward(const Arrays& a, DirectionWeights w, Acc* loss) const {
    const auto grid = ForwardGrid::plan(exec, b, b);
    lse_forward(exec, prob, grid, a.partials, a.row_lse, want_col ? a.col_lse : (Acc*)nullptr, (Acc*)nullptr);
    const int* pos = a.positive;
    pair_logits(
        exec, prob, b, KOKKOS_LAMBDA(index_t k) { return k; }, KOKKOS_LAMBDA(index_t k) { return index_t(pos[k]); },
        a.row_pos);
    if (want_col && !diagonal)
      pair_logits(
          exec, prob, b, KOKKOS_LAMBDA(index_t k) { return index_t(pos[k]); }, KOKKOS_LAMBDA(index_t k) { return k; },
          a.col_pos);
    const Acc wr = Acc(w.row), wc = Acc(w.col);
    const bool col = want_col;
    const Acc *row_lse = a.row_lse, *col_lse = a.col_lse, *row_pos = a.row_pos,
              *col_pos = diagonal ? a.row_pos : a.col_pos;
    Acc* terms = a.terms;
    Kokkos::parallel_for("tlse::contrastive_terms", Kokkos::RangePolicy<Exec>(exec, 0, b), KOKKOS_LAMBDA(index_t i) {
      Acc t = wr == Acc(0) ? Acc(0) : wr * (row_lse[i] - row_pos[i]);
      if (col && wc != Acc(0)) t += wc * (col_lse[i] - col_pos[i]);
      terms[i] = t;
    });
    weighted_sum(exec, a.terms, b, b > 0 ? Acc(1) / Acc(b) : Acc(0), loss, false, a.total);
  }

  /// Runs the backward step. `grad_row`/`grad_col` may be null; `self` adds the columns'
  /// gradient into grad_row (Z receives both G Z and G^T Z). d_row_lse/d_col_lse (nullptr:
  /// none) add the gradients reaching the LSEs to the softmax terms (their positives' terms stay
  /// the loss's, in the arrays of the forward's positive logits, unused by the backward).
  void backward(const Arrays& a, DirectionWeights w, const Acc* row_lse, const Acc* col_lse, const Acc* dloss,
                T* grad_row, T* grad_col, Acc* dscale, bool accumulate, bool self, const Acc* d_row_lse = nullptr,
                const Acc* d_col_lse = nullptr) const {
    const Acc wr = Acc(w.row) / Acc(b > 0 ? b : 1), wc = Acc(w.col) / Acc(b > 0 ? b : 1);
    Acc *g_row = a.g_row, *g_col = a.g_col, *w_row = a.row_pos, *w_col = a.col_pos;
    const bool col = want_col;
    Kokkos::parallel_for("tlse::contrastive_coefficients", Kokkos::RangePolicy<Exec>(exec, 0, b),
                         KOKKOS_LAMBDA(index_t i) {
                           w_row[i] = wr * dloss[0];
                           g_row[i] = w_row[i] + (d_row_lse ? d_row_lse[i] : Acc(0));
                           if (col) {
                             w_col[i] = wc * dloss[0];
                             g_col[i] = w_col[i] + (d_col_lse ? d_col_lse[i] : Acc(0));
                           }
                         });
    BackwardRequest<T, Acc> r;
    r.prob = prob;
    if (w.row != 0 || d_row_lse) r.row_terms = {row_lse, a.g_row, a.positive, w_row};
    if (want_col && (w.col != 0 || d_col_lse)) r.col_terms = {col_lse, a.g_col, a.positive, w_col};
    r.grad_rows = grad_row;
    r.grad_cols = self ? nullptr : grad_col;
    r.cols_into_rows = self;
    r.accumulate = accumulate;
    r.dscale_part = dscale ? a.terms : nullptr;
    r.scratch = a.scratch;
    r.scratch_bytes = a.scratch_bytes;
    lse_backward(exec, r);
    if (dscale) weighted_sum(exec, a.terms, b, Acc(1), dscale, accumulate, a.total);
  }
};

template <class V>
void check_scalar_output(const ArgumentChecker& check, const char* name, const V& v, bool required) {
  if (!required && v.size() == 0) return;
  check.vector(name, v);
  check.extent(name, v.extent(0), 1, "a scalar");
}

template <class Exec, class IV, class TV, class LabelV>
void check_pair(const Exec& exec, const ArgumentChecker& check, const IV& I, const TV& Tx, const LabelV& labels,
                const ContrastiveOptions& o) {
  check_operands(check, "I", I, "T", Tx);
  if (I.extent(0) != Tx.extent(0))
    check.fail("T", "has " + std::to_string(Tx.extent(0)) + " rows but 'I' has " + std::to_string(I.extent(0)) +
                        "; image and text batches must match");
  check.finite_nonnegative<accumulator_t<scalar_of<IV>>>("scale", o.scale);
  check_finite(exec, check, "I", I, o.non_finite);
  check_finite(exec, check, "T", Tx, o.non_finite);
  if (check.optional("labels", labels, I.extent(0), "the batch size"))
    check_indices(exec, check, "labels", labels, 0, I.extent(0), I.extent(0), 0, false);
}

/// positive[i] = labels[i], or i when no labels are given.
template <class Exec, class LabelV>
void fill_positives(const Exec& exec, const LabelV& labels, index_t b, int* positive) {
  const auto* l = labels.extent(0) ? labels.data() : nullptr;
  Kokkos::parallel_for("tlse::contrastive_positives", Kokkos::RangePolicy<Exec>(exec, 0, b),
                       KOKKOS_LAMBDA(index_t i) { positive[i] = l ? int(l[i]) : int(i); });
}

template <class Exec, class Acc>
void copy_out(const Exec& exec, const Acc* from, Acc* to, index_t n) {
  if (!to) return;
  Kokkos::parallel_for("tlse::copy_out", Kokkos::RangePolicy<Exec>(exec, 0, n),
                       KOKKOS_LAMBDA(index_t i) { to[i] = from[i]; });
}

}  // namespace impl

/// Workspace bytes contrastive_loss and contrastive_loss_backward need for batch b.
/// \param exec execution space instance the calls will run on (the size depends on its concurrency)
/// \param I (b x c) image features; T is not read (same shape)
/// \return bytes for ContrastiveOptions::workspace: O(b) (docs/api.md, Memory).
/// \param opts the options the calls will get (the precision can change the size)
template <class Exec, class IV, class TV>
std::size_t contrastive_loss_workspace_bytes(const Exec& exec, const IV& I, const TV&,
                                             const ContrastiveOptions& opts = {}) {
  using T = impl::scalar_of<IV>;
  return impl::ContrastiveCore<Exec, T, accumulator_t<T>>::workspace_bytes(exec, I.extent(0), I.extent(1), true, opts);
}

/// Forward. I, T: (b x c) image and text features, row-major, same scalar type; labels: (b)
/// integers or empty (the positive of image i is text labels[i], of text j image labels[j];
/// default i <-> i). loss: (1). row_lse, col_lse: (b) or empty; the backward needs them.
/// x_ij = scale * I_i . T_j is computed once per tile for both the row and the column LSE.
/// Empty batch: loss 0. Extra memory: O(b) workspace (contrastive_loss_workspace_bytes), no b x b buffer.
/// \param exec execution space instance; kernels are enqueued on it
/// \param I (b x c) image features, row-major view of T (float, double, tlse::bfloat16, tlse::float16)
/// \param Tx (b x c) text features, row-major view of T
/// \param labels (b) integer view, each in [0, b), or an empty view (diagonal positives)
/// \param loss (1) output view of accumulator_t<T>: the mean loss over the batch
/// \param row_lse (b) output view of accumulator_t<T> (image-to-text LSEs), or empty
/// \param col_lse (b) output view of accumulator_t<T> (text-to-image LSEs), or empty
/// \param opts scale, direction, non-finite policy, workspace
/// \throws std::invalid_argument naming the call, the argument and the values on a wrong shape,
///         layout, label, option or workspace size (and on NaN/Inf with NonFinite::detect),
///         before any output is written.
template <class Exec, class IV, class TV, class LabelV, class LossV, class RowLseV, class ColLseV>
void contrastive_loss(const Exec& exec, const IV& I, const TV& Tx, const LabelV& labels, const LossV& loss,
                      const RowLseV& row_lse, const ColLseV& col_lse, const ContrastiveOptions& opts = {}) {
  using T = impl::scalar_of<IV>;
  using Acc = accumulator_t<T>;
  impl::static_check_operands<Exec, IV, TV>();
  impl::static_check_index_vector<Exec, LabelV>();
  impl::static_check_acc_vector<Exec, T, LossV>();
  impl::static_check_acc_vector<Exec, T, RowLseV>();
  impl::static_check_acc_vector<Exec, T, ColLseV>();
  const impl::ArgumentChecker check("tlse::contrastive_loss");
  impl::check_pair(exec, check, I, Tx, labels, opts);
  impl::check_scalar_output(check, "loss", loss, true);
  const impl::index_t b = I.extent(0);
  const bool want_row = check.optional("row_lse", row_lse, b, "the batch size");
  const bool want_col = check.optional("col_lse", col_lse, b, "the batch size");
  Kokkos::Profiling::pushRegion("tlse::contrastive_loss");
  const impl::DirectionWeights w(opts.direction);
  using Core = impl::ContrastiveCore<Exec, T, Acc>;
  const Core core{exec, impl::make_problem<T, Acc>(I, Tx, opts.scale, opts.precision), b, w.col != 0,
                  labels.extent(0) == 0};
  impl::with_workspace(
      check.function(), exec, opts.workspace,
      [&](impl::WorkspaceCarver& c) { return Core::layout(exec, c, b, I.extent(1), core.want_col, opts, false); },
      [&](const typename Core::Arrays& a) {
        impl::fill_positives(exec, labels, b, a.positive);
        core.forward(a, w, loss.data());
        impl::copy_out(exec, a.row_lse, want_row ? row_lse.data() : nullptr, b);
        impl::copy_out(exec, a.col_lse, want_col && core.want_col ? col_lse.data() : nullptr, b);
      });
  Kokkos::Profiling::popRegion();
}

/// Forward with diagonal positives and no saved LSEs (nothing to run a backward from).
/// \param exec execution space instance
/// \param I (b x c) image features
/// \param Tx (b x c) text features
/// \param loss (1) output view of accumulator_t<T>
/// \param opts see ContrastiveOptions
/// \throws std::invalid_argument naming the call, the argument and the values on a wrong shape,
///         layout, label, option or workspace size (and on NaN/Inf with NonFinite::detect),
///         before any output is written.
template <class Exec, class IV, class TV, class LossV>
void contrastive_loss(const Exec& exec, const IV& I, const TV& Tx, const LossV& loss,
                      const ContrastiveOptions& opts = {}) {
  using Mem = typename IV::memory_space;
  using Acc = accumulator_t<impl::scalar_of<IV>>;
  contrastive_loss(exec, I, Tx, Kokkos::View<const int*, Mem>(), loss, Kokkos::View<Acc*, Mem>(),
                   Kokkos::View<Acc*, Mem>(), opts);
}

/// Backward. Takes the forward's inputs and LSEs (col_lse may be empty for image_to_text) and
/// dloss (1). Writes dI, dT (b x c, or empty views) and dscale (1, or empty), the gradient with
/// respect to the logit scale. Tiles are recomputed from the saved LSEs; no atomics, bitwise
/// reproducible. Extra memory: the workspace (O(b) for the generic kernels; a backend's backward may
/// add a bounded buffer, counted by contrastive_loss_workspace_bytes) plus Kokkos team scratch.
/// \param exec execution space instance
/// \param I, Tx, labels the forward's inputs
/// \param row_lse, col_lse the forward's saved LSEs
/// \param dloss (1) gradient of the objective with respect to the loss, accumulator_t<T>
/// \param dI (b x c) output view of T, or empty
/// \param dT (b x c) output view of T, or empty
/// \param dscale (1) output view of accumulator_t<T>, or empty
/// \param opts the forward's options; `accumulate` adds into dI, dT and dscale
/// \throws std::invalid_argument naming the call, the argument and the values on a wrong shape,
///         layout, label, option or workspace size (and on NaN/Inf with NonFinite::detect),
///         before any output is written.
template <class Exec, class IV, class TV, class LabelV, class RowLseV, class ColLseV, class DLossV, class DIV,
          class DTV, class DScaleV>
void contrastive_loss_backward(const Exec& exec, const IV& I, const TV& Tx, const LabelV& labels,
                               const RowLseV& row_lse, const ColLseV& col_lse, const DLossV& dloss, const DIV& dI,
                               const DTV& dT, const DScaleV& dscale, const ContrastiveOptions& opts = {}) {
  contrastive_loss_backward(exec, I, Tx, labels, row_lse, col_lse, dloss, dI, dT, dscale,
                            ContrastiveExtras<accumulator_t<impl::scalar_of<IV>>, typename Exec::memory_space>{},
                            opts);
}

/// Backward with the gradients reaching the returned LSEs (`extras`, ContrastiveExtras): a loss
/// built from row_lse or col_lse trains through them (d lse_i / d x_ij = softmax_ij). Otherwise
/// as the overload without extras.
/// \param exec execution space instance
/// \param I, Tx, labels, row_lse, col_lse, dloss, dI, dT, dscale as for the overload without extras
/// \param extras d_row_lse and d_col_lse (b), each optional
/// \param opts the forward's options
/// \throws std::invalid_argument as the overload without extras, and on extras of the wrong
///         extent (or d_col_lse without the text-to-image direction's col_lse).
template <class Exec, class IV, class TV, class LabelV, class RowLseV, class ColLseV, class DLossV, class DIV,
          class DTV, class DScaleV>
void contrastive_loss_backward(
    const Exec& exec, const IV& I, const TV& Tx, const LabelV& labels, const RowLseV& row_lse, const ColLseV& col_lse,
    const DLossV& dloss, const DIV& dI, const DTV& dT, const DScaleV& dscale,
    const ContrastiveExtras<accumulator_t<impl::scalar_of<IV>>, typename Exec::memory_space>& extras,
    const ContrastiveOptions& opts = {}) {
  using T = impl::scalar_of<IV>;
  using Acc = accumulator_t<T>;
  impl::static_check_operands<Exec, IV, TV>();
  impl::static_check_index_vector<Exec, LabelV>();
  impl::static_check_acc_vector<Exec, T, RowLseV>();
  impl::static_check_acc_vector<Exec, T, ColLseV>();
  impl::static_check_acc_vector<Exec, T, DLossV>();
  impl::static_check_acc_vector<Exec, T, DScaleV>();
  impl::static_check_view<Exec, DIV, 2>();
  impl::static_check_view<Exec, DTV, 2>();
  static_assert(std::is_same<typename DIV::value_type, T>::value && std::is_same<typename DTV::value_type, T>::value,
                "tlse::contrastive_loss_backward: dI and dT are non-const views of the input scalar type");
  const impl::ArgumentChecker check("tlse::contrastive_loss_backward");
  impl::check_pair(exec, check, I, Tx, labels, opts);
  const impl::index_t b = I.extent(0);
  const impl::DirectionWeights w(opts.direction);
  if (w.row != 0) {
    check.vector("row_lse", row_lse);
    check.extent("row_lse", row_lse.extent(0), b, "the batch size (the image-to-text direction)");
  }
  if (w.col != 0) {
    check.vector("col_lse", col_lse);
    check.extent("col_lse", col_lse.extent(0), b, "the batch size (the text-to-image direction)");
  }
  impl::check_scalar_output(check, "dloss", dloss, true);
  impl::check_scalar_output(check, "dscale", dscale, false);
  const bool want_dI = check.optional_matrix("dI", dI, b, I.extent(1), "I");
  const bool want_dT = check.optional_matrix("dT", dT, b, I.extent(1), "T");
  impl::check_finite(exec, check, "dloss", dloss, opts.non_finite);
  const bool d_row = check.optional("d_row_lse", extras.d_row_lse, b, "the batch size");
  const bool d_col = check.optional("d_col_lse", extras.d_col_lse, b, "the batch size");
  if (d_col && w.col == 0)
    check.fail("d_col_lse", "is given but the direction has no text-to-image term (no col_lse to differentiate)");
  if (d_row && w.row == 0) {  // the rows' LSE is then an input of the backward too
    check.vector("row_lse", row_lse);
    check.extent("row_lse", row_lse.extent(0), b, "the batch size (d_row_lse is given)");
  }
  impl::check_finite(exec, check, "d_row_lse", extras.d_row_lse, opts.non_finite);
  impl::check_finite(exec, check, "d_col_lse", extras.d_col_lse, opts.non_finite);
  Kokkos::Profiling::pushRegion("tlse::contrastive_loss_backward");
  using Core = impl::ContrastiveCore<Exec, T, Acc>;
  const Core core{exec, impl::make_problem<T, Acc>(I, Tx, opts.scale, opts.precision), b, w.col != 0};
  impl::with_workspace(
      check.function(), exec, opts.workspace,
      [&](impl::WorkspaceCarver& c) { return Core::layout(exec, c, b, I.extent(1), core.want_col, opts, true); },
      [&](const typename Core::Arrays& a) {
        impl::fill_positives(exec, labels, b, a.positive);
        core.backward(a, w, row_lse.data(), col_lse.data(), dloss.data(), want_dI ? dI.data() : nullptr,
                      want_dT ? dT.data() : nullptr, dscale.extent(0) ? dscale.data() : nullptr, opts.accumulate,
                      false, d_row ? extras.d_row_lse.data() : nullptr, d_col ? extras.d_col_lse.data() : nullptr);
      });
  Kokkos::Profiling::popRegion();
}

/// Workspace bytes self_contrastive_loss and its backward need for Z.
/// \param exec execution space instance the calls will run on
/// \param Z (2B x c) features
/// \return bytes for ContrastiveOptions::workspace: O(B).
/// \param opts the options the calls will get (the precision can change the size)
template <class Exec, class ZV>
std::size_t self_contrastive_loss_workspace_bytes(const Exec& exec, const ZV& Z,
                                                  const ContrastiveOptions& opts = {}) {
  using T = impl::scalar_of<ZV>;
  return impl::ContrastiveCore<Exec, T, accumulator_t<T>>::workspace_bytes(exec, Z.extent(0), Z.extent(1), false, opts);
}

namespace impl {
template <class Exec, class ZV>
index_t check_self(const Exec& exec, const ArgumentChecker& check, const ZV& Z, const ContrastiveOptions& o) {
  check.matrix("Z", Z);
  if (Z.extent(0) % 2 != 0)
    check.fail("Z", "has " + std::to_string(Z.extent(0)) +
                        " rows; the self-similarity form needs 2B rows (two views of B samples)");
  check.finite_nonnegative<accumulator_t<scalar_of<ZV>>>("scale", o.scale);
  check_finite(exec, check, "Z", Z, o.non_finite);
  return index_t(Z.extent(0));
}

template <class T, class Acc, class ZV>
TileProblem<T, Acc> self_problem(const ZV& Z, const ContrastiveOptions& o) {
  auto p = make_problem<T, Acc>(Z, Z, o.scale, o.precision);
  p.logit.exclude_diagonal = true;
  return p;
}

/// positive[i] = (i + n/2) mod n: the other view of the same sample.
template <class Exec>
void fill_self_positives(const Exec& exec, index_t n, int* positive) {
  Kokkos::parallel_for("tlse::self_positives", Kokkos::RangePolicy<Exec>(exec, 0, n),
                       KOKKOS_LAMBDA(index_t i) { positive[i] = int((i + n / 2) % n); });
}
}  // namespace impl

/// Self-similarity InfoNCE / NT-Xent forward. Z: (2B x c), rows i and i+B are two views of one
/// sample; x_ij = scale * Z_i . Z_j with the diagonal excluded; loss (1) = mean_i (lse_i - x_{i,i+B mod 2B}).
/// lse: (2B) or empty (the backward needs it). Extra memory: O(B) workspace.
/// \param exec execution space instance
/// \param Z (2B x c) row-major view of T
/// \param loss (1) output view of accumulator_t<T>
/// \param lse (2B) output view of accumulator_t<T>, or empty
/// \param opts scale, non-finite policy, workspace (direction is ignored)
/// \throws std::invalid_argument naming the call, the argument and the values on a wrong shape,
///         layout, label, option or workspace size (and on NaN/Inf with NonFinite::detect),
///         before any output is written.
template <class Exec, class ZV, class LossV, class LseV>
void self_contrastive_loss(const Exec& exec, const ZV& Z, const LossV& loss, const LseV& lse,
                           const ContrastiveOptions& opts = {}) {
  using T = impl::scalar_of<ZV>;
  using Acc = accumulator_t<T>;
  impl::static_check_operands<Exec, ZV, ZV>();
  impl::static_check_acc_vector<Exec, T, LossV>();
  impl::static_check_acc_vector<Exec, T, LseV>();
  const impl::ArgumentChecker check("tlse::self_contrastive_loss");
  const impl::index_t n = impl::check_self(exec, check, Z, opts);
  impl::check_scalar_output(check, "loss", loss, true);
  const bool want_lse = check.optional("lse", lse, n, "Z's row count");
  Kokkos::Profiling::pushRegion("tlse::self_contrastive_loss");
  using Core = impl::ContrastiveCore<Exec, T, Acc>;
  const Core core{exec, impl::self_problem<T, Acc>(Z, opts), n, false};
  impl::with_workspace(
      check.function(), exec, opts.workspace,
      [&](impl::WorkspaceCarver& c) { return Core::layout(exec, c, n, Z.extent(1), false, opts, false); },
      [&](const typename Core::Arrays& a) {
        impl::fill_self_positives(exec, n, a.positive);
        core.forward(a, impl::DirectionWeights(Direction::image_to_text), loss.data());
        impl::copy_out(exec, a.row_lse, want_lse ? lse.data() : nullptr, n);
      });
  Kokkos::Profiling::popRegion();
}

/// Self-similarity backward: dZ = scale (G + G^T) Z with G = dL/dx, and dscale.
/// \param exec execution space instance
/// \param Z the forward's input
/// \param lse (2B) the forward's saved LSEs
/// \param dloss (1) gradient with respect to the loss
/// \param dZ (2B x c) output view of T, or empty
/// \param dscale (1) output view of accumulator_t<T>, or empty
/// \param opts the forward's options; `accumulate` adds into dZ and dscale
/// \throws std::invalid_argument naming the call, the argument and the values on a wrong shape,
///         layout, label, option or workspace size (and on NaN/Inf with NonFinite::detect),
///         before any output is written.
template <class Exec, class ZV, class LseV, class DLossV, class DZV, class DScaleV>
void self_contrastive_loss_backward(const Exec& exec, const ZV& Z, const LseV& lse, const DLossV& dloss, const DZV& dZ,
                                    const DScaleV& dscale, const ContrastiveOptions& opts = {}) {
  using T = impl::scalar_of<ZV>;
  using Acc = accumulator_t<T>;
  impl::static_check_operands<Exec, ZV, ZV>();
  impl::static_check_acc_vector<Exec, T, LseV>();
  impl::static_check_acc_vector<Exec, T, DLossV>();
  impl::static_check_acc_vector<Exec, T, DScaleV>();
  impl::static_check_view<Exec, DZV, 2>();
  static_assert(std::is_same<typename DZV::value_type, T>::value,
                "tlse::self_contrastive_loss_backward: dZ is a non-const view of the input scalar type");
  const impl::ArgumentChecker check("tlse::self_contrastive_loss_backward");
  const impl::index_t n = impl::check_self(exec, check, Z, opts);
  check.vector("lse", lse);
  check.extent("lse", lse.extent(0), n, "Z's row count");
  impl::check_scalar_output(check, "dloss", dloss, true);
  impl::check_scalar_output(check, "dscale", dscale, false);
  const bool want_dZ = check.optional_matrix("dZ", dZ, n, Z.extent(1), "Z");
  impl::check_finite(exec, check, "dloss", dloss, opts.non_finite);
  Kokkos::Profiling::pushRegion("tlse::self_contrastive_loss_backward");
  using Core = impl::ContrastiveCore<Exec, T, Acc>;
  const Core core{exec, impl::self_problem<T, Acc>(Z, opts), n, false};
  impl::with_workspace(
      check.function(), exec, opts.workspace,
      [&](impl::WorkspaceCarver& c) { return Core::layout(exec, c, n, Z.extent(1), false, opts, true); },
      [&](const typename Core::Arrays& a) {
        impl::fill_self_positives(exec, n, a.positive);
        core.backward(a, impl::DirectionWeights(Direction::image_to_text), lse.data(), nullptr, dloss.data(),
                      want_dZ ? dZ.data() : nullptr, nullptr, dscale.extent(0) ? dscale.data() : nullptr,
                      opts.accumulate, true);
      });
  Kokkos::Profiling::popRegion();
}

}  // namespace tlse
