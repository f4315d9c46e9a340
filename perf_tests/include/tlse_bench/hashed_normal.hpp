#pragma once
/// \file hashed_normal.hpp
/// Benchmark inputs made on the device from each element's index, for the benchmarks whose
/// problems are too large to draw on the host (random_inputs.hpp): deterministic, and the same
/// values whatever the device or the number of ranks that makes them.
#include <Kokkos_Core.hpp>

namespace tlse::perf {

/// Roughly N(0, 1) from an element's global index: four uniforms from a 64-bit finalizer hash
/// (MurmurHash3's fmix64), summed and scaled to unit variance.
KOKKOS_INLINE_FUNCTION float hashed_normal(unsigned long index) {
  auto uniform = [](unsigned long x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdUL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53UL;
    x ^= x >> 33;
    return float(x >> 40) / float(1 << 24);
  };
  return (uniform(4 * index) + uniform(4 * index + 1) + uniform(4 * index + 2) + uniform(4 * index + 3) - 2.0f) *
         1.7320508f;
}

}  // namespace tlse::perf
