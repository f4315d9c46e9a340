#pragma once
// Where faster paths plug in (the kokkos-kernels "spec_avail" pattern): the generic kernels ask
// a trait on the execution space whether a specialization takes the call, and a backend adds
// one by specializing the trait in its own header, listed below, without touching generic code.
#include <tlse/impl/tile_problem.hpp>
#include <tlse/options.hpp>

#include <cstddef>
#include <cstdlib>
#include <cstring>

namespace tlse::impl {

/// TLSE_GENERIC_ONLY=1 in the environment turns every specialization off, to compare a
/// specialization with the generic kernels (benchmarks, debugging). Read once.
inline bool specializations_enabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("TLSE_GENERIC_ONLY");
    return v == nullptr || std::strcmp(v, "1") != 0;
  }();
  return enabled;
}

/// Where a forward specialization writes the partial LSE states of one sweep over the tiles,
/// in the generic kernel's layout, and how many splits it may use.
template <class Acc>
struct ForwardPartials {
  Acc* rows;               // max, then sum: col_splits x rows.count
  Acc* cols;               // max, then sum: row_splits x cols.count; nullptr: no column LSE
  Acc* col_sums;           // row_splits x cols.count column logit sums; nullptr: not wanted
  index_t max_col_splits;  // column blocks, each giving every row one partial state
  index_t max_row_splits;  // row blocks, each giving every column one partial state
  index_t col_splits = 0, row_splits = 0;  // what `run` used
};

/// Forward LSE partials of the rows and, on request, of the columns from the same pass over the
/// tiles. `run` fills `parts` and returns true, or returns false to leave the call to the
/// generic kernel.
template <class Exec>
struct LseForwardSpecialization {
  template <class T, class Acc>
  static bool run(const Exec&, const TileProblem<T, Acc>&, ForwardPartials<Acc>&) {
    return false;
  }
};

/// One backward pass (a BackwardTiles functor `f`). `scratch_bytes` is what `run` needs in
/// f.scratch for a pass with `owned` x `other` rows; `run` returns false to leave the pass to
/// the generic kernel.
template <class Exec>
struct LseBackwardSpecialization {
  template <class T>
  static std::size_t scratch_bytes(const Exec&, index_t /*owned*/, index_t /*other*/, index_t /*depth*/,
                                   Precision) {
    return 0;
  }
  template <class F>
  static bool run(const Exec&, const F&) {
    return false;
  }
};

/// Scratch for both backward passes over a rows x cols problem, to carve from a call's workspace.
template <class T, class Exec>
std::size_t backward_scratch_bytes(const Exec& exec, index_t rows, index_t cols, index_t depth, Precision p) {
  if (!specializations_enabled()) return 0;
  using Spec = LseBackwardSpecialization<Exec>;
  const std::size_t by_rows = Spec::template scratch_bytes<T>(exec, rows, cols, depth, p);
  const std::size_t by_cols = Spec::template scratch_bytes<T>(exec, cols, rows, depth, p);
  return by_rows > by_cols ? by_rows : by_cols;
}

}  // namespace tlse::impl

#if defined(KOKKOS_ENABLE_CUDA)
#include <tlse/backends/cuda/cuda_specializations.hpp>
#endif
