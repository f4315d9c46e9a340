#pragma once
// Which kernels a Kokkos::Cuda call runs: the Hopper kernels (libtiledlse_hopper: TMA, wgmma,
// warp-specialized; sm_90 and a build with TLSE_HAVE_HOPPER), the mma.sync tensor-core kernels
// (sm_80 and later), or the generic Kokkos kernels. TLSE_CUDA_KERNELS=hopper|mma|generic in the
// environment forces one for every call of the process, to compare them (read once; a forced
// path a device cannot run falls back to the next: hopper -> mma -> generic). Unset or `auto`:
// the fastest path the device runs (the Hopper kernels on sm_90, which pass the GPU suite:
// docs/notes/2026-11-23.md, "Validation of the Hopper kernels (da0e14a), and auto taking them").
// TLSE_GENERIC_ONLY=1 still means generic.
// Exact float inputs (Precision::exact) have their own switch, TLSE_CUDA_EXACT_F32 (ExactF32).
#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tlse/impl/backend_dispatch.hpp>
#include <vector>

#if defined(TLSE_HAVE_HOPPER)
#include <tlse_hopper.h>
#endif

namespace tlse::impl::cuda {

enum class KernelPath { hopper, mma, generic };

/// Which kernels exact float inputs (Precision::exact) run where the kernel path is not generic:
/// the tile kernels with 3xTF32 products (SplitTf32, mma/nt_sweep.hpp: float's accuracy on tensor
/// cores, the default), with FFMA products (mma/ffma_product.hpp: float products summed in depth
/// order, as the generic kernels), or the generic kernels.
enum class ExactF32 { tf32x3, ffma, generic };

/// TLSE_CUDA_EXACT_F32=tf32x3|ffma|generic; unset or `auto`: tf32x3. Read once; throws on a
/// value it does not know.
inline ExactF32 exact_f32_kernels() {
  static const ExactF32 kernels = [] {
    const char* v = std::getenv("TLSE_CUDA_EXACT_F32");
    if (v == nullptr || *v == '\0' || std::strcmp(v, "auto") == 0 || std::strcmp(v, "tf32x3") == 0)
      return ExactF32::tf32x3;
    if (std::strcmp(v, "ffma") == 0) return ExactF32::ffma;
    if (std::strcmp(v, "generic") == 0) return ExactF32::generic;
    throw std::invalid_argument(std::string("tlse: TLSE_CUDA_EXACT_F32 is '") + v +
                                "'; expected auto, tf32x3, ffma or generic");
  }();
  return kernels;
}

/// What TLSE_CUDA_KERNELS asks for; throws on a value it does not know.
inline const char* requested_kernel_path() {
  static const char* requested = [] {
    const char* v = std::getenv("TLSE_CUDA_KERNELS");
    if (v == nullptr || *v == '\0' || std::strcmp(v, "auto") == 0) return "auto";
    for (const char* known : {"hopper", "mma", "generic"})
      if (std::strcmp(v, known) == 0) return known;
    throw std::invalid_argument(std::string("tlse: TLSE_CUDA_KERNELS is '") + v +
                                "'; expected auto, hopper, mma or generic");
  }();
  return requested;
}

inline int compute_capability(int device) {
  static std::mutex mutex;
  static std::vector<int> known;
  std::lock_guard<std::mutex> lock(mutex);
  if (device < 0) return 0;
  if (int(known.size()) <= device) known.resize(device + 1, -1);
  if (known[device] < 0) {
    int major = 0, minor = 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
    known[device] = 10 * major + minor;
  }
  return known[device];
}

/// The kernels calls on `device` run.
inline KernelPath kernel_path(int device) {
  if (!specializations_enabled()) return KernelPath::generic;
  const std::string requested = requested_kernel_path();
  if (requested == "generic") return KernelPath::generic;
#if defined(TLSE_HAVE_HOPPER)
  const bool hopper_wanted = requested == "hopper" || requested == "auto";
  if (hopper_wanted && tlse_hop_device_supported(device)) return KernelPath::hopper;
#endif
  return compute_capability(device) >= 80 ? KernelPath::mma : KernelPath::generic;
}

}  // namespace tlse::impl::cuda
