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

/// Forward LSE partials of the rows (or, `transposed`, of the columns). `run` returns the
/// number of splits whose partial states (max, then sum, each splits x count) it wrote to
/// `partials`, or 0 to leave the call to the generic kernel. It may use at most `max_splits`.
template <class Exec>
struct LseForwardSpecialization {
  template <class T, class Acc>
  static int run(const Exec&, const TileProblem<T, Acc>&, bool /*transposed*/, index_t /*max_splits*/,
                 Acc* /*partials*/) {
    return 0;
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
