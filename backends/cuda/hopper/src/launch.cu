// The host side that the kernel families share, declared in launch.cuh: the error a call returns
// (and tlse_hop_error_string), the device queries (and tlse_hop_device_supported), the operand
// check, the split counts that keep the last wave full, and the tensor maps of the staged stores
// (StagedStore::describe, staged_store.cuh).
#include <algorithm>
#include <functional>
#include <map>
#include <mutex>
#include <utility>

#include "launch.cuh"
#include "staged_store.cuh"

namespace tlse::hopper {

std::string& last_error() {
  thread_local std::string error;
  return error;
}

int fail(int code, const std::string& why) {
  last_error() = why;
  return code;
}

namespace {
/// compute() of `device` for `key` (the function or kernel asking), computed once per process:
/// device attributes and occupancies do not change while it runs.
int once_per_device(int device, const void* key, const std::function<int()>& compute) {
  static std::mutex mutex;
  static std::map<std::pair<int, const void*>, int> known;
  std::lock_guard<std::mutex> lock(mutex);
  const auto found = known.find({device, key});
  if (found != known.end()) return found->second;
  return known[{device, key}] = compute();
}
}  // namespace

int multiprocessors() {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return 1;
  return once_per_device(device, reinterpret_cast<const void*>(&multiprocessors), [&] {
    int n = 0;
    cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device);
    return n > 0 ? n : 1;
  });
}

int active_clusters(const void* kernel, int block, int smem, int cluster) {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return 0;
  return once_per_device(device, kernel, [&] {
    cudaLaunchAttribute attributes[2];
    const cudaLaunchConfig_t config = dependent_config(attributes, cluster, block, smem, nullptr, cluster);
    int count = 0;
    if (cudaOccupancyMaxActiveClusters(&count, kernel, &config) != cudaSuccess) count = 0;
    return count;
  });
}

int check_operand(const char* call, const char* name, const void* data, int64_t rows, int64_t depth, int64_t ld,
                  int elem) {
  const auto why = [&](const std::string& s) {
    return fail(TLSE_HOP_E_ARGUMENT, std::string(call) + ": " + name + " " + s);
  };
  if (data == nullptr) return why("is NULL");
  if (reinterpret_cast<std::uintptr_t>(data) % 16 != 0) return why("is not 16-byte aligned");
  if (rows < 1 || rows >= (int64_t(1) << 31)) return why("has " + std::to_string(rows) + " rows, outside [1, 2^31)");
  if (depth < 1 || depth >= (int64_t(1) << 31))
    return why("has depth " + std::to_string(depth) + ", outside [1, 2^31)");
  if (ld < depth || (ld * elem) % 16 != 0)
    return why("has leading dimension " + std::to_string(ld) + ": below its depth " + std::to_string(depth) +
               " or not a multiple of 16 bytes");
  return TLSE_HOP_OK;
}

int balanced_splits(int64_t blocks_per_split, int64_t units, int64_t max_splits, int sms, int64_t overhead) {
  int64_t limit = max_splits < units ? max_splits : units;
  if (limit < 1) limit = 1;
  int64_t best = 1, best_cost = INT64_MAX;
  for (int64_t s = 1; s <= limit; ++s) {
    const int64_t waves = (blocks_per_split * s + sms - 1) / sms;
    const int64_t cost = waves * ((units + s - 1) / s + overhead);
    if (cost < best_cost) best_cost = cost, best = s;
  }
  return int(best);
}

/// Bytes of L2 the row panels of the CTAs running together may take.
constexpr int64_t L2_PANEL_BUDGET = int64_t(24) << 20;

/// K steps a sweep unit costs beyond its tiles' (its row state written, the next unit's first
/// stages loaded): about the pipeline's depth.
constexpr int64_t SWEEP_UNIT_OVERHEAD_STEPS = STAGES;

int sweep_splits(int64_t row_units, int64_t col_tiles, int64_t max_splits, int64_t depth, int64_t element_bytes,
                 int cluster) {
  const int sms = std::max(1, multiprocessors() / cluster);  // a unit's slots: clusters
  const int64_t panel = int64_t(cluster) * TILE_M * depth * element_bytes;
  int64_t min_splits = (int64_t(sms) * panel + L2_PANEL_BUDGET - 1) / L2_PANEL_BUDGET;
  const int64_t limit = std::max<int64_t>(1, std::min(max_splits, col_tiles));
  min_splits = std::clamp<int64_t>(min_splits, 1, limit);
  // Cost in K steps, of the split counts as they come out once a split holds whole tiles (6
  // splits of 20 tiles are 5 of 4): a unit's overhead weighs a fraction of a tile, not a whole one
  // as balanced_splits counts it. For the cross-entropy gradient panel (64 row tiles x 20 column
  // tiles of 64 steps) that is 10 splits of 2 tiles in 5 waves, where the tile count took 5 of 4
  // in 3 waves: 12 tile times instead of 10.
  const int64_t tile_steps = (depth * element_bytes + 127) / 128;  // 128 bytes of depth per step
  int64_t best = 0, best_cost = INT64_MAX;
  for (int64_t s = min_splits; s <= limit; ++s) {
    const int64_t per = (col_tiles + s - 1) / s, splits = (col_tiles + per - 1) / per;
    const int64_t waves = (row_units * splits + sms - 1) / sms;
    const int64_t cost = waves * (per * tile_steps + SWEEP_UNIT_OVERHEAD_STEPS);
    if (cost < best_cost) best_cost = cost, best = splits;
  }
  return int(best);
}

int StagedStore::describe(const char* call, CUtensorMap& map, CUtensorMapDataType type, void* data, int64_t rows,
                          int64_t cols, int64_t ld, int64_t layers, int64_t layer_stride) {
  const int element = type == CU_TENSOR_MAP_DATA_TYPE_FLOAT32 ? 4 : 2;
  const cuuint64_t dims[3] = {cuuint64_t(cols), cuuint64_t(rows), cuuint64_t(layers)};
  const cuuint64_t strides[2] = {cuuint64_t(ld * element),
                                 cuuint64_t((layer_stride > 0 ? layer_stride : rows * ld) * element)};
  const cuuint32_t box[3] = {cuuint32_t(LINE_BYTES / element), cuuint32_t(LINES), 1}, unit[3] = {1, 1, 1};
  const CUresult r = CUTLASS_CUDA_DRIVER_WRAPPER_CALL(cuTensorMapEncodeTiled)(
      &map, type, layers > 1 || layer_stride > 0 ? 3 : 2, data, dims, strides, box, unit, CU_TENSOR_MAP_INTERLEAVE_NONE,
      CU_TENSOR_MAP_SWIZZLE_64B, CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r == CUDA_SUCCESS) return TLSE_HOP_OK;
  return fail(TLSE_HOP_E_LAUNCH,
              std::string(call) + ": cuTensorMapEncodeTiled failed (CUresult " + std::to_string(int(r)) + ")");
}

}  // namespace tlse::hopper

using namespace tlse::hopper;

extern "C" int tlse_hop_device_supported(int device) {
  if (device < 0) return 0;
  return once_per_device(device, reinterpret_cast<const void*>(&tlse_hop_device_supported), [&] {
    int major = 0, minor = 0;
    return cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
           cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) == cudaSuccess && major == 9 &&
           minor == 0;
  });
}

extern "C" const char* tlse_hop_error_string(void) { return last_error().c_str(); }
