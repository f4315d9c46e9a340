#pragma once
// Programmatic dependent launch (sm_90): a backward runs hundreds of short kernels back to back
// on one stream (the contrastive case within 128 MiB: 172 sweeps, 172 products and their split
// reductions; docs/notes/2026-11-26.md, "The contrastive backward's short kernels"), so their
// launch latency counts. Launched with programmatic stream serialization, a kernel's CTAs may
// start on the SMs the previous kernel has left while its last CTAs still run, and set up their
// shared memory (barriers, the pipeline) meanwhile; each thread then waits for the previous grid
// to complete, its memory visible, before touching global memory. The order of the results is
// that of plain launches; only the launch latency and the setup overlap.
#include <cuda_runtime.h>

#include <utility>

namespace tlse::hopper {

/// Blocks until the grid launched before this one on the stream has completed and its writes are
/// visible (returns at once where this grid was launched without the attribute). Every thread
/// calls it before its first global load or store.
__device__ __forceinline__ void wait_for_previous_grid() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

/// Lets the next grid on the stream be scheduled once every CTA of this grid has called it or
/// exited (so its CTAs only take SMs that this grid's CTAs were given or have left); they then
/// wait in wait_for_previous_grid() for this grid to complete.
__device__ __forceinline__ void allow_next_grid() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }

/// The launch of `grid` CTAs of `block` threads in clusters of `cluster` CTAs (1: no clusters)
/// with programmatic stream serialization. `attributes` holds what config.attrs points to.
inline cudaLaunchConfig_t dependent_config(cudaLaunchAttribute (&attributes)[2], int grid, int block, int smem,
                                           cudaStream_t stream, int cluster) {
  attributes[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attributes[0].val.programmaticStreamSerializationAllowed = 1;
  attributes[1].id = cudaLaunchAttributeClusterDimension;
  attributes[1].val.clusterDim.x = unsigned(cluster);
  attributes[1].val.clusterDim.y = attributes[1].val.clusterDim.z = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(unsigned(grid));
  config.blockDim = dim3(unsigned(block));
  config.dynamicSmemBytes = size_t(smem);
  config.stream = stream;
  config.attrs = attributes;
  config.numAttrs = cluster > 1 ? 2 : 1;
  return config;
}

/// kernel<<<grid, block, smem, stream>>>(args...) with programmatic stream serialization, in
/// clusters of `cluster` CTAs along x (grid a multiple of it): the kernel must call
/// wait_for_previous_grid() before it touches global memory.
template <class... Params, class... Args>
cudaError_t launch_dependent_clusters(void (*kernel)(Params...), int grid, int block, int smem, cudaStream_t stream,
                                      int cluster, Args&&... args) {
  cudaLaunchAttribute attributes[2];
  const cudaLaunchConfig_t config = dependent_config(attributes, grid, block, smem, stream, cluster);
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

/// launch_dependent_clusters without clusters.
template <class... Params, class... Args>
cudaError_t launch_dependent(void (*kernel)(Params...), int grid, int block, int smem, cudaStream_t stream,
                             Args&&... args) {
  return launch_dependent_clusters(kernel, grid, block, smem, stream, 1, std::forward<Args>(args)...);
}

}  // namespace tlse::hopper
