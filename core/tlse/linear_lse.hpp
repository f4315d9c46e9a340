#pragma once
/// \file linear_lse.hpp
/// The primitive: lse_i = log sum_j exp(scale * A_i . B_j + bias_j) without forming the matrix.
#include <tlse/impl/lse_backward.hpp>
#include <tlse/impl/lse_forward.hpp>
#include <tlse/impl/problem_builder.hpp>
#include <tlse/impl/workspace_carver.hpp>
#include <tlse/options.hpp>

/// Everything TiledLSE users call lives in this namespace; internals are in `tlse::impl`.
namespace tlse {

/// Options of linear_lse() and linear_lse_backward() (pass the same to both).
struct LinearLseOptions {
  double scale = 1.0;                   ///< multiplies every dot product; finite, >= 0
  bool exclude_diagonal = false;        ///< drop entries with i + diagonal_offset == j (self-similarity)
  /// with exclude_diagonal: entry (i, j) is dropped when i + diagonal_offset == j
  std::int64_t diagonal_offset = 0;
  std::int64_t valid_cols = -1;         ///< only columns j < valid_cols take part; -1: all
  bool accumulate = false;              ///< backward: dA += ..., dB += ... instead of overwriting
  Precision precision = Precision::exact;  ///< float inputs: Precision::tf32 allows TF32 tensor cores
  /// NaN/Inf policy for the inputs (see NonFinite)
  NonFinite non_finite = NonFinite::propagate;
  /// bytes of workspace the calls may use; each picks the fastest algorithm that fits (see memory_budget_default)
  std::size_t memory_budget = memory_budget_default;
  /// memory lent to the call; empty: the call allocates and frees it
  Workspace workspace{};
};

namespace impl {
template <class T, class Acc, class AV, class BV, class BiasV>
TileProblem<T, Acc> linear_problem(const AV& A, const BV& B, const BiasV& bias, const LinearLseOptions& o) {
  auto p = make_problem<T, Acc>(A, B, o.scale, o.precision);
  p.logit.col_bias = bias.extent(0) ? bias.data() : nullptr;
  p.logit.exclude_diagonal = o.exclude_diagonal;
  p.logit.diagonal_offset = o.diagonal_offset;
  if (o.valid_cols >= 0) p.logit.valid_cols = o.valid_cols;
  return p;
}

template <class Exec, class AV, class BV, class BiasV>
void check_linear(const Exec& exec, const ArgumentChecker& check, const AV& A, const BV& B, const BiasV& bias,
                  const LinearLseOptions& o) {
  check_operands(check, "A", A, "B", B);
  check.optional("bias", bias, B.extent(0), "B's row count");
  check.finite_nonnegative<accumulator_t<scalar_of<AV>>>("scale", o.scale);
  if (o.valid_cols < -1 || o.valid_cols > std::int64_t(B.extent(0)))
    check.fail("valid_cols",
               "is " + std::to_string(o.valid_cols) + ", outside [-1, " + std::to_string(B.extent(0)) + "]");
  check_finite(exec, check, "A", A, o.non_finite);
  check_finite(exec, check, "B", B, o.non_finite);
  check_finite(exec, check, "bias", bias, o.non_finite);
}

template <class AV, class BV>
BackwardShape linear_shape(const AV& A, const BV& B, const LinearLseOptions& o) {
  return {index_t(A.extent(0)), index_t(B.extent(0)), index_t(A.extent(1)), o.precision, o.memory_budget};
}

/// The forward's only workspace array.
template <class Acc, class Exec>
Acc* carve_linear_partials(WorkspaceCarver& c, const Exec& exec, index_t rows, index_t cols) {
  return c.take<Acc>(forward_partials_size(ForwardGrid::plan(exec, rows, cols), rows, cols, false, false));
}
}  // namespace impl

/// Workspace bytes linear_lse and linear_lse_backward need for these operands (the larger).
/// \param exec execution space instance the calls will run on (the size depends on its concurrency)
/// \param A (rows x depth) operand, as passed to linear_lse
/// \param B (cols x depth) operand
/// \return bytes for LinearLseOptions::workspace: O(rows + cols) (docs/api.md, Memory).
/// \param opts the options the calls will get (the precision can change the size)
template <class Exec, class AV, class BV>
std::size_t linear_lse_workspace_bytes(const Exec& exec, const AV& A, const BV& B,
                                       const LinearLseOptions& opts = {}) {
  using T = impl::scalar_of<AV>;
  impl::WorkspaceCarver forward, backward;
  impl::carve_linear_partials<accumulator_t<T>>(forward, exec, A.extent(0), B.extent(0));
  // The backward's only workspace array: scratch for a backend's backward (often none).
  backward.take<char>(impl::index_t(impl::backward_scratch_bytes<T>(exec, impl::linear_shape(A, B, opts))));
  return std::max(forward.bytes(), backward.bytes());
}

/// Forward: lse(i) = log sum_{j valid} exp(scale * A(i,:) . B(j,:) + bias(j)) for every row i of A.
/// A: (rows x depth), B: (cols x depth), row-major, same scalar type T; bias: (cols) or empty;
/// lse: (rows) of accumulator_t<T>. A row whose entries are all masked gets -inf.
/// Extra memory: O(rows + cols) workspace, no rows x cols buffer.
/// \param exec execution space instance; the kernels are enqueued on it
/// \param A (rows x depth) row-major view of T (float, double, tlse::bfloat16, tlse::float16)
/// \param B (cols x depth) row-major view of T
/// \param bias (cols) view of T added to every logit of column j (-inf masks the column), or an empty view
/// \param lse (rows) output view of accumulator_t<T>
/// \param opts scale, diagonal exclusion, valid columns, non-finite policy, workspace
/// \throws std::invalid_argument naming the argument on a shape, layout, option or workspace
///         mismatch (and on NaN/Inf with NonFinite::detect), before anything is written.
template <class Exec, class AV, class BV, class BiasV, class LseV>
void linear_lse(const Exec& exec, const AV& A, const BV& B, const BiasV& bias, const LseV& lse,
                const LinearLseOptions& opts = {}) {
  using T = impl::scalar_of<AV>;
  using Acc = accumulator_t<T>;
  impl::static_check_operands<Exec, AV, BV>();
  impl::static_check_view<Exec, BiasV, 1>();
  impl::static_check_acc_vector<Exec, T, LseV>();
  const impl::ArgumentChecker check("tlse::linear_lse");
  impl::check_linear(exec, check, A, B, bias, opts);
  check.vector("lse", lse);
  check.extent("lse", lse.extent(0), A.extent(0), "A's row count");
  Kokkos::Profiling::pushRegion("tlse::linear_lse");
  const auto prob = impl::linear_problem<T, Acc>(A, B, bias, opts);
  const auto grid = impl::ForwardGrid::plan(exec, prob.rows.count, prob.cols.count);
  impl::with_workspace(
      check.function(), exec, opts.workspace,
      [&](impl::WorkspaceCarver& c) {
        return impl::carve_linear_partials<Acc>(c, exec, prob.rows.count, prob.cols.count);
      },
      [&](Acc* partials) { impl::lse_forward(exec, prob, grid, partials, lse.data(), (Acc*)nullptr, (Acc*)nullptr); });
  Kokkos::Profiling::popRegion();
}

/// linear_lse() without a bias: lse(i) = log sum_j exp(scale * A(i,:) . B(j,:)).
/// \param exec execution space instance
/// \param A (rows x depth) row-major view of T
/// \param B (cols x depth) row-major view of T
/// \param lse (rows) output view of accumulator_t<T>
/// \param opts see LinearLseOptions
/// \throws std::invalid_argument as the overload with a bias.
template <class Exec, class AV, class BV, class LseV>
void linear_lse(const Exec& exec, const AV& A, const BV& B, const LseV& lse, const LinearLseOptions& opts = {}) {
  linear_lse(exec, A, B, Kokkos::View<const impl::scalar_of<AV>*, typename AV::memory_space>(), lse, opts);
}

/// Backward: given lse from the forward and its gradient dlse, writes
/// dA(i,:) = scale * sum_j dlse(i) p_ij B(j,:) and dB(j,:) = scale * sum_i dlse(i) p_ij A(i,:)
/// with p_ij = exp(x_ij - lse(i)). dA or dB may be empty views (not computed). With
/// opts.accumulate the results are added to dA and dB, otherwise they overwrite them.
/// The bias gradient is sum_i dlse(i) p_ij; it is not returned here (cross_entropy_backward does).
/// Tiles are recomputed (on Hopper GPUs once, when opts.memory_budget allows; otherwise in two
/// passes: one owns rows and writes dA, one owns columns and writes dB); no atomics are used and
/// results are bitwise reproducible.
/// Extra memory: the workspace (a backend's backward may use it; the generic one needs none) and
/// Kokkos team scratch of 32 x depth accumulators per running team.
/// \param exec execution space instance
/// \param A, B, bias the forward's inputs
/// \param lse (rows) the forward's output
/// \param dlse (rows) gradient of the loss with respect to lse, accumulator_t<T>
/// \param dA (rows x depth) output view of T, or empty
/// \param dB (cols x depth) output view of T, or empty
/// \param opts the forward's options; `accumulate` adds into dA and dB
/// \throws std::invalid_argument naming the argument on a mismatch, before anything is written.
template <class Exec, class AV, class BV, class BiasV, class LseV, class DLseV, class DAV, class DBV>
void linear_lse_backward(const Exec& exec, const AV& A, const BV& B, const BiasV& bias, const LseV& lse,
                         const DLseV& dlse, const DAV& dA, const DBV& dB, const LinearLseOptions& opts = {}) {
  using T = impl::scalar_of<AV>;
  using Acc = accumulator_t<T>;
  impl::static_check_operands<Exec, AV, BV>();
  impl::static_check_view<Exec, BiasV, 1>();
  impl::static_check_acc_vector<Exec, T, LseV>();
  impl::static_check_acc_vector<Exec, T, DLseV>();
  impl::static_check_view<Exec, DAV, 2>();
  impl::static_check_view<Exec, DBV, 2>();
  static_assert(std::is_same<typename DAV::value_type, T>::value && std::is_same<typename DBV::value_type, T>::value,
                "tlse::linear_lse_backward: dA and dB are non-const views of the input scalar type");
  const impl::ArgumentChecker check("tlse::linear_lse_backward");
  impl::check_linear(exec, check, A, B, bias, opts);
  check.extent("lse", lse.extent(0), A.extent(0), "A's row count");
  check.extent("dlse", dlse.extent(0), A.extent(0), "A's row count");
  check.vector("lse", lse);
  check.vector("dlse", dlse);
  const bool want_dA = check.optional_matrix("dA", dA, A.extent(0), A.extent(1), "A");
  const bool want_dB = check.optional_matrix("dB", dB, B.extent(0), B.extent(1), "B");
  impl::check_finite(exec, check, "dlse", dlse, opts.non_finite);
  Kokkos::Profiling::pushRegion("tlse::linear_lse_backward");
  const std::size_t scratch_bytes = impl::backward_scratch_bytes<T>(exec, impl::linear_shape(A, B, opts));
  impl::with_workspace(
      check.function(), exec, opts.workspace,
      [&](impl::WorkspaceCarver& c) { return c.take<char>(impl::index_t(scratch_bytes)); },
      [&](char* scratch) {
        impl::BackwardRequest<T, Acc> r;
        r.prob = impl::linear_problem<T, Acc>(A, B, bias, opts);
        r.row_terms.lse = lse.data();
        r.row_terms.g = dlse.data();
        r.accumulate = opts.accumulate;
        r.grad_rows = want_dA ? dA.data() : nullptr;
        r.grad_cols = want_dB ? dB.data() : nullptr;
        r.scratch = scratch;
        r.scratch_bytes = scratch_bytes;
        impl::lse_backward(exec, r);
      });
  Kokkos::Profiling::popRegion();
}

}  // namespace tlse
