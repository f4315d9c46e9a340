#pragma once
// A whole training step of a loss over the row softmax with targets (cross-entropy): the forward's
// row LSEs and the backward's gradients in one call, as the kernels see it. The generic path runs
// the forward and the backward one after the other; a backend may take the step whole
// (LseStepSpecialization in backend_dispatch.hpp) and share work between the two halves.
#include <cstddef>
#include <tlse/impl/tile_problem.hpp>

namespace tlse::impl {

/// Row i's softmax terms once its LSE l_i is known: dL/dx_ij = g_i exp(x_ij - l_i) - (j == target_i
/// ? w_i : 0) with w_i = target[i] and g_i = softmax[i] + lse[i] l_i (the cross-entropy's
/// coefficients under its weights, label smoothing, z-loss and an upstream dlse; lse nullptr: 0),
/// indexed by row id; a row without a target weighs nothing (w = g = 0).
template <class Acc>
struct StepCoefficients {
  const Acc* target = nullptr;
  const Acc* softmax = nullptr;
  const Acc* lse = nullptr;
  KOKKOS_INLINE_FUNCTION Acc w(const int* row_target, index_t id) const {
    return row_target[id] >= 0 ? target[id] : Acc(0);
  }
  KOKKOS_INLINE_FUNCTION Acc g(const int* row_target, index_t id, Acc l) const {
    return row_target[id] >= 0 ? softmax[id] + (lse ? lse[id] * l : Acc(0)) : Acc(0);
  }
};

/// A training step: the row LSEs and the gradients of sum_i [w_i (lse_i - x_i,target) + ...] as
/// StepCoefficients give them, in one call.
template <class T, class Acc>
struct StepRequest {
  TileProblem<T, Acc> prob;           // the scored rows (through an index when some are not) against every column
  const int* target = nullptr;        // by row id
  const Acc* target_logit = nullptr;  // x(row, target) under prob.logit, by position in prob's rows
  StepCoefficients<Acc> coef;         // by row id
  Acc* lse = nullptr;           // out, by row id (scored rows only)
  T* grad_rows = nullptr;       // by row id (nullptr: not wanted)
  T* grad_cols = nullptr;       // by column id (nullptr: not wanted)
  bool accumulate = false;      // grad += result instead of grad = result
  char* scratch = nullptr;      // step_scratch_bytes of the call's BackwardShape
  std::size_t scratch_bytes = 0;
};

}  // namespace tlse::impl
