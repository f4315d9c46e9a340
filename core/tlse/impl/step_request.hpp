#pragma once
// A whole training step of a loss over the row softmax with targets (cross-entropy): the forward's
// row LSEs and the backward's gradients in one call, as the kernels see it. The generic path runs
// the forward and the backward one after the other; a backend may take the step whole
// (LseStepSpecialization in backend_dispatch.hpp) and share work between the two halves.
#include <cstddef>
#include <tlse/impl/tile_problem.hpp>

namespace tlse::impl {

/// Row i's share of dL/dx_ij is g_i exp(x_ij - lse_i) - (j == target_i ? w_i : 0) with
/// w_i = coef_i and g_i = coef_i (1 + 2 z_loss lse_i): the backward's softmax terms once lse_i
/// is known (cross_entropy_backward's coefficients).
template <class T, class Acc>
struct StepRequest {
  TileProblem<T, Acc> prob;           // the scored rows (through an index when some are not) against every column
  const int* target = nullptr;        // by row id
  const Acc* target_logit = nullptr;  // x(row, target) under prob.logit, by position in prob's rows
  const Acc* coef = nullptr;          // by row id
  Acc z_loss = 0;
  Acc* lse = nullptr;           // out, by row id (scored rows only)
  T* grad_rows = nullptr;       // by row id (nullptr: not wanted)
  T* grad_cols = nullptr;       // by column id (nullptr: not wanted)
  bool accumulate = false;      // grad += result instead of grad = result
  char* scratch = nullptr;      // step_scratch_bytes of the call's BackwardShape
  std::size_t scratch_bytes = 0;
};

}  // namespace tlse::impl
