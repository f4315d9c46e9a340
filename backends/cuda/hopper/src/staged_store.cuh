#pragma once
// An epilogue's results leave through TMA: each consumer warp stages its part of a tile in shared
// memory, one 1 KiB box at a time (16 lines of 64 bytes in TMA's 64-byte swizzle, under which the
// fragment's stores meet at most two-way bank conflicts), and one lane stores the box with
// cp.async.bulk.tensor. The warp's two boxes alternate: a box is refilled once the store before
// the last has read it. Stored from the registers instead, a warp's 4-byte stores each filled
// four 32-byte sectors of different lines (G^T) or eight (G in bf16), and the gradient sweeps of
// TF32 took several times their mainloop's time per tile (docs/notes/2026-11-25.md, "Float in
// TF32 on the Hopper kernels"). Plain PTX on the device: CuTe's copy objects in the epilogue's
// unrolled loops went to local memory, many times slower (docs/notes/2026-11-25.md, "Staged
// stores of G and G^T").
#include <cuda.h>

#include <cstdint>

#include "tile_config.cuh"

namespace tlse::hopper {

struct StagedStore {
  static constexpr int LINES = 16, LINE_BYTES = 64, BOX_BYTES = LINES * LINE_BYTES;
  static constexpr int WARPS = CONSUMER_THREADS / 32;
  struct Storage {
    alignas(1024) char box[2 * WARPS][BOX_BYTES];
  };

  /// The element type of T's tensor maps.
  template <class T>
  static constexpr CUtensorMapDataType type_of() {
    static_assert(std::is_same_v<T, float> || std::is_same_v<T, cutlass::bfloat16_t> ||
                      std::is_same_v<T, cutlass::half_t>,
                  "bf16, fp16 or float");
    return std::is_same_v<T, float>                 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32
           : std::is_same_v<T, cutlass::half_t> ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                                    : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  }

  /// The tensor map of a row-major matrix (rows x cols elements of `type`, leading dimension ld
  /// elements, 16-byte aligned) in boxes of 16 rows of 64 bytes; 0, or the failure (named after `call`).
  /// With layers > 1, that many such matrices one after the other (layer_stride elements apart,
  /// or rows x ld for 0), a box in one of them: TMA clips a box at its own matrix's last row. A
  /// layer_stride > 0 makes the map three-dimensional even for one layer (put's Layers).
  static int describe(const char* call, CUtensorMap& map, CUtensorMapDataType type, void* data, int64_t rows,
                      int64_t cols, int64_t ld, int64_t layers = 1, int64_t layer_stride = 0);

  /// Byte offset of (line, byte) in a box under the 64-byte swizzle (bits 4-5 ^= bits 7-8).
  __device__ __forceinline__ static uint32_t offset(int line, int byte) {
    const uint32_t o = uint32_t(line * LINE_BYTES + byte);
    return o ^ (((o >> 7) & 3u) << 4);
  }

  /// Stages one box of the warp (fill(address of the box in shared memory) writes it) in buffer
  /// `parity` and stores it at column x, row y (of layer z, for a map of layers) of `map`; TMA
  /// clips what lies outside the matrix, except that a row's last 16-byte chunk is written whole
  /// (seen on the H100: a float row of 2050 columns got 2052), so the leading dimension pads each
  /// row to 16 bytes and what lands in that padding is not to be read.
  template <bool Layers = false, class Fill>
  __device__ __forceinline__ static void put(Storage& s, int warp, int lane, int parity, const CUtensorMap& map,
                                             int32_t x, int32_t y, int32_t z, Fill&& fill) {
    const uint32_t box = uint32_t(__cvta_generic_to_shared(s.box[2 * warp + parity]));
    if (lane == 0) asm volatile("cp.async.bulk.wait_group.read 1;" ::: "memory");  // the box is free
    __syncwarp();
    fill(box);
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // the writes are visible to TMA
    __syncwarp();
    if (lane != 0) return;
    if constexpr (Layers)
      asm volatile(
          "cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%2, %3, %4}], [%1];\n"
          "cp.async.bulk.commit_group;" ::"l"(reinterpret_cast<uint64_t>(&map)),
          "r"(box), "r"(x), "r"(y), "r"(z)
          : "memory");
    else
      asm volatile(
          "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];\n"
          "cp.async.bulk.commit_group;" ::"l"(reinterpret_cast<uint64_t>(&map)),
          "r"(box), "r"(x), "r"(y)
          : "memory");
  }

  /// A warp's 16 rows of a tile (the wgmma fragment `c` of thread `lane`: rows lane / 4 + 8 r,
  /// column pairs c.col_base + 8 v) stored as T at tile (m, n) of `map`, a row per line: box b
  /// holds tile columns [b W, (b + 1) W), W = 64 bytes of T, and the thread's adjacent pairs go as
  /// one 4-byte (16-bit T) or 8-byte (float) store. value(r, j) is fragment entry (r, j) as a
  /// float, already rounded as it is to be stored when T is float. Layers: into layer z of `map`.
  template <class T, bool Layers = false, class Frag, class Value>
  __device__ __forceinline__ static void put_rows(Storage& s, int warp, int lane, const CUtensorMap& map, int m, int n,
                                                  const Frag& c, Value&& value, int32_t z = 0) {
    static_assert(sizeof(T) == 2 || sizeof(T) == 4, "16-bit types or float");
    constexpr int W = LINE_BYTES / int(sizeof(T)), PAIRS = W / 8;  // per row of a box
#pragma unroll
    for (int b = 0; b < TILE_N / W; ++b)
      put<Layers>(s, warp, lane, b & 1, map, n * TILE_N + b * W, m * TILE_M + LINES * warp, z, [&](uint32_t box) {
#pragma unroll
        for (int r = 0; r < Frag::ROWS; ++r)
#pragma unroll
          for (int u = 0; u < PAIRS; ++u) {
            const int j = 2 * (b * PAIRS + u);  // the pair's first fragment column
            const float v0 = value(r, j), v1 = value(r, j + 1);
            const uint32_t at = box + offset((lane >> 2) + 8 * r, (c.col_base + 8 * u) * int(sizeof(T)));
            if constexpr (sizeof(T) == 2) {
              cutlass::Array<T, 2> pair;
              pair[0] = T(v0), pair[1] = T(v1);
              store4(at, reinterpret_cast<const uint32_t&>(pair));
            } else {
              store8(at, v0, v1);
            }
          }
      });
  }

  /// The warp's stores have read their boxes (before the CTA's shared memory goes away).
  __device__ __forceinline__ static void drain(int lane) {
    if (lane == 0) asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
  }

  __device__ __forceinline__ static void store4(uint32_t at, uint32_t v) {
    asm volatile("st.shared.b32 [%0], %1;" ::"r"(at), "r"(v) : "memory");
  }
  __device__ __forceinline__ static void store8(uint32_t at, float a, float b) {
    asm volatile("st.shared.v2.f32 [%0], {%1, %2};" ::"r"(at), "f"(a), "f"(b) : "memory");
  }
};

}  // namespace tlse::hopper
