#pragma once
// Where faster paths plug in (the kokkos-kernels "spec_avail" pattern): the generic kernels ask
// a trait on the execution space whether a specialization takes the call, and a backend adds
// one by specializing the trait in its own header, listed below, without touching generic code.
#include <tlse/impl/tile_problem.hpp>

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

/// Forward row LSE partials. `run` returns the number of column splits whose partial states
/// (max, then sum, each splits x rows) it wrote to `partials`, or 0 to leave the call to the
/// generic kernel. It may use at most `max_splits` splits.
template <class Exec>
struct RowLseSpecialization {
  template <class T, class Acc>
  static int run(const Exec&, const TileProblem<T, Acc>&, index_t /*max_splits*/, Acc* /*partials*/) {
    return 0;
  }
};

}  // namespace tlse::impl

#if defined(KOKKOS_ENABLE_CUDA)
#include <tlse/backends/cuda/row_lse_cuda.hpp>
#endif
