#pragma once
// Every difference between Kokkos 3.4 (what Debian ships) and Kokkos 4.x that TiledLSE
// touches lives here, so the rest of the code is written once.
#include <Kokkos_Core.hpp>
#include <Kokkos_NumericTraits.hpp>
#if defined(KOKKOS_ENABLE_OPENMP)
#include <omp.h>
#endif

namespace tlse::impl {

#if KOKKOS_VERSION >= 40000
namespace kmath = ::Kokkos;
#else
namespace kmath = ::Kokkos::Experimental;
#endif

template <class T>
KOKKOS_INLINE_FUNCTION T exp(T x) { return kmath::exp(x); }
template <class T>
KOKKOS_INLINE_FUNCTION T log(T x) { return kmath::log(x); }
template <class T>
KOKKOS_INLINE_FUNCTION T tanh(T x) { return kmath::tanh(x); }
template <class T>
KOKKOS_INLINE_FUNCTION T sqrt(T x) { return kmath::sqrt(x); }
template <class T>
KOKKOS_INLINE_FUNCTION bool isfinite(T x) { return kmath::isfinite(x); }
template <class T>
KOKKOS_INLINE_FUNCTION T fabs(T x) { return x < T(0) ? -x : x; }

/// Usable in device code without --expt-relaxed-constexpr (std::numeric_limits is host-only there).
template <class T>
KOKKOS_INLINE_FUNCTION constexpr T infinity() { return Kokkos::Experimental::infinity<T>::value; }

/// std::min is a host function for nvcc; kernels use this one.
template <class T>
KOKKOS_INLINE_FUNCTION constexpr T min(T a, T b) { return b < a ? b : a; }

/// True when the execution space runs on the host (Serial, OpenMP, Threads, ...).
template <class Exec>
constexpr bool is_host_space() {
  return Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename Exec::memory_space>::accessible;
}

/// Whether the calling thread may launch parallel work on the default host execution space.
/// OpenMP refuses it inside a parallel region, and in Kokkos 3.4 on every thread but the one that
/// initialized Kokkos (its in_parallel() is true there); Kokkos 4 takes any thread outside a
/// parallel region (its launches lock the instance) and deprecates in_parallel(). Serial accepts
/// any thread.
inline bool host_space_accepts_work() {
#if defined(KOKKOS_ENABLE_OPENMP)
  if (std::is_same<Kokkos::DefaultHostExecutionSpace, Kokkos::OpenMP>::value) {
#if KOKKOS_VERSION >= 40000
    return omp_get_level() == 0;
#else
    return !Kokkos::OpenMP::in_parallel();
#endif
  }
#endif
  return true;
}

}  // namespace tlse::impl
