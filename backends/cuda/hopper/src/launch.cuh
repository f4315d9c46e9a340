#pragma once
// Host side shared by the entry points: the error a call returns, argument checks, the launch of
// the persistent kernel (one CTA per SM at most, alone or in clusters) and the split counts that
// keep the last wave full.
#include <cstdint>
#include <cstdio>
#include <string>

#include "kernel.cuh"
#include "logit_model.cuh"

namespace tlse::hopper {

/// The reason of this thread's last failure (tlse_hop_error_string).
std::string& last_error();

/// Records the reason and returns the code.
int fail(int code, const std::string& why);

/// Multiprocessors of the current device (cached per device).
int multiprocessors();

/// Clusters of `cluster` CTAs of `kernel` (`block` threads, `smem` bytes of dynamic shared memory)
/// the current device runs at once (cached per kernel and device); 0 where it cannot say.
int active_clusters(const void* kernel, int block, int smem, int cluster);

/// TLSE_HOP_E_ARGUMENT unless an operand of `rows` rows of depth `depth` at `data` with leading
/// dimension `ld` (elements of `elem` bytes) can be read by TMA: 16-byte aligned start and rows,
/// counts and depth in [1, 2^31).
int check_operand(const char* call, const char* name, const void* data, int64_t rows, int64_t depth, int64_t ld,
                  int elem);

/// Number of splits s in [1, max_splits] of `units` work units for a launch of blocks_per_split x s
/// persistent CTAs' work on `sms` SMs (one CTA each): minimizes waves(s) x (ceil(units / s) + overhead),
/// the launch's time when a unit costs 1 and a split `overhead` more. Ties go to fewer splits.
int balanced_splits(int64_t blocks_per_split, int64_t units, int64_t max_splits, int sms, int64_t overhead);

/// Column splits of a sweep over col_tiles column tiles by `row_units` row units (a unit re-reads
/// its row panel, TILE_M x depth elements of element_bytes, for every column tile; in clusters of
/// `cluster` CTAs, a unit is a cluster's, its panels cluster x as many rows): at least
/// enough that the panels of the CTAs running together fit L2_PANEL_BUDGET (units are numbered
/// split-fastest, so the CTAs of one wave share sms / splits panels), then the fewest K steps on
/// the busiest SM (waves x the unit's steps and overhead). The count returned splits col_tiles
/// into equal whole-tile ranges (the last one shorter).
int sweep_splits(int64_t row_units, int64_t col_tiles, int64_t max_splits, int64_t depth, int64_t element_bytes,
                 int cluster = 1);

/// Launches the kernel over the schedule's units on `stream` as a dependent launch (its setup
/// overlaps the previous kernel's tail); 0 or a TLSE_HOP_E_LAUNCH failure.
template <class Config, class Epilogue>
int launch(const char* name, const KernelParams<Config, Epilogue>& kp, cudaStream_t stream) {
  constexpr int smem = kernel_smem_bytes<Config, Epilogue>();
  static_assert(smem + 1024 <= 227 * 1024, "a CTA's shared memory (and 1 KiB of static) must fit Hopper's 227 KiB");
  auto* kernel = &warp_specialized_kernel<Config, Epilogue>;
  // Per call: the attribute belongs to the current device's context.
  const cudaError_t configured = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (configured != cudaSuccess)
    return fail(TLSE_HOP_E_LAUNCH, std::string(name) + ": cannot raise the shared memory limit to " +
                                       std::to_string(smem) + " bytes: " + cudaGetErrorString(configured));
  const int units = kp.schedule.units();
  if (units == 0) return TLSE_HOP_OK;
  // One CTA per SM, or in clusters as many clusters as fit at once (GPCs may leave an SM out).
  constexpr int cluster = Config::CLUSTER_M;
  int slots = multiprocessors();
  if (cluster > 1) {
    slots = active_clusters(reinterpret_cast<const void*>(kernel), THREADS, smem, cluster);
    if (slots < 1)
      return fail(TLSE_HOP_E_LAUNCH, std::string(name) + ": no cluster of " + std::to_string(cluster) + " CTAs with " +
                                         std::to_string(smem) + " bytes of shared memory fits the device");
  }
  const int grid = (units < slots ? units : slots) * cluster;
  const cudaError_t e = launch_dependent_clusters(kernel, grid, THREADS, smem, stream, cluster, kp);
  if (e != cudaSuccess) return fail(TLSE_HOP_E_LAUNCH, std::string(name) + ": launch failed: " + cudaGetErrorString(e));
  return TLSE_HOP_OK;
}

/// Calls f with the input type of `dtype` (cutlass::bfloat16_t, cutlass::half_t, or float for TF32).
template <class F>
int with_input_type(int32_t dtype, const char* call, F&& f) {
  switch (dtype) {
    case TLSE_HOP_BF16:
      return f(cutlass::bfloat16_t{});
    case TLSE_HOP_FP16:
      return f(cutlass::half_t{});
    case TLSE_HOP_TF32:
      return f(float{});
    default:
      return fail(TLSE_HOP_E_ARGUMENT,
                  std::string(call) + ": dtype " + std::to_string(dtype) + " is not a TLSE_HOP_* type");
  }
}

}  // namespace tlse::hopper
