#pragma once
// Whether the tool can run on this machine. A CUDA build initializes Kokkos::Cuda, which on a
// machine without a usable GPU throws from inside Kokkos::initialize (std::terminate, a
// multi-line message ending in "Traceback functionality not available"): the CUDA runtime is
// asked first, so that the tool can fail with one line instead.
#include <Kokkos_Core.hpp>

#if defined(KOKKOS_ENABLE_CUDA)
#include <cuda_runtime_api.h>
#endif

#include <string>

namespace tlse::app {

/// Empty when the tool can run here; else why not, in one line.
inline std::string usable_device_problem() {
#if defined(KOKKOS_ENABLE_CUDA)
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status == cudaSuccess && count > 0) return {};
  const std::string why = status != cudaSuccess
                              ? std::string(cudaGetErrorName(status)) + ": " + cudaGetErrorString(status)
                              : std::string("0 devices");
  return "this tlse was built for CUDA but finds no usable GPU (" + why +
         "); on a machine without a GPU use a host build (scripts/quickstart.sh)";
#else
  return {};
#endif
}

}  // namespace tlse::app
