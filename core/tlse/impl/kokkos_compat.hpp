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

/// What host_space_accepts_work() asks of the calling thread, for the message of a refused call.
inline const char* host_space_work_rule() {
#if KOKKOS_VERSION >= 40000
  return "it takes work only from outside any parallel region; call from outside one";
#else
  return "it accepts work only from the thread that initialized Kokkos (the thread of the first "
         "tlse_context_create), outside any parallel region; call from that thread";
#endif
}

/// Initializes Kokkos without its warnings (e.g. OMP_PROC_BIND: the host program's business, not
/// a library's) on CUDA device `cuda_device` (-1: Kokkos' default). Kokkos 3.7 replaced
/// InitArguments with InitializationSettings.
inline void initialize_kokkos(int cuda_device) {
#if KOKKOS_VERSION >= 30700
  Kokkos::InitializationSettings settings;
  settings.set_disable_warnings(true);
  if (cuda_device >= 0) settings.set_device_id(cuda_device);
  Kokkos::initialize(settings);
#else
  Kokkos::InitArguments args;
  args.disable_warnings = true;
  args.device_id = cuda_device;
  Kokkos::initialize(args);
#endif
}

}  // namespace tlse::impl
