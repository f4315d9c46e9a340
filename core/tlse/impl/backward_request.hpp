#pragma once
// A whole backward step as the kernels see it: the implicit matrix, the saved softmax terms of
// each side, and which gradients and sums are wanted. lse_backward (lse_backward.hpp) runs it; a
// backend may take it whole (LseBackwardFusedSpecialization in backend_dispatch.hpp).
#include <cstddef>
#include <tlse/impl/tile_problem.hpp>

namespace tlse::impl {

/// A whole backward step: the gradients of both sides (either may be wanted or not), the row
/// sums for dscale and the column sums for dbias, from the saved softmax terms.
template <class T, class Acc>
struct BackwardRequest {
  TileProblem<T, Acc> prob;
  SoftmaxTerms<Acc> row_terms, col_terms;
  Acc filter_eps = 0;           // 0: no filtering
  T* grad_rows = nullptr;       // by row id (nullptr: not wanted)
  T* grad_cols = nullptr;       // by column id (nullptr: not wanted)
  bool cols_into_rows = false;  // self-similarity: the columns' gradient is added into grad_rows
  bool accumulate = false;      // grad += result instead of grad = result
  Acc* dscale_part = nullptr;   // per row position: sum over the columns of dL/dz * dot
  T* dbias = nullptr;           // per column id: sum over the rows of dL/dz
  char* scratch = nullptr;      // backward_scratch_bytes of the call's BackwardShape
  std::size_t scratch_bytes = 0;
};

}  // namespace tlse::impl
