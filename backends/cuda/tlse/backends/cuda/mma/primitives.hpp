#pragma once
// The PTX building blocks of the tensor-core kernels (sm_80+ instructions, which CUDA 11.8
// compiles for sm_90): mma.sync m16n8k16 with fp32 accumulation, cp.async 16-byte copies into
// shared memory, ldmatrix (plain and transposed) and the reductions over a quad of lanes that
// share a row of an mma accumulator.
#include <tlse/impl/tile_problem.hpp>

#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>

namespace tlse::impl::cuda {

/// One tensor-core step over 16 bytes of depth per operand row: m16n8k16 for 16-bit inputs,
/// m16n8k8 TF32 for float inputs. The fragments are loaded the same way for both (ldmatrix sees
/// a float as two 16-bit halves, which puts every float where the TF32 layout wants it);
/// `prepare` rounds float fragments to TF32 once, before they are reused across mma calls.
template <class T>
struct MmaOp;
template <>
struct MmaOp<bfloat16> {
  static __device__ __forceinline__ void prepare(unsigned*, int) {}
  static __device__ __forceinline__ void run(float* d, const unsigned* a, const unsigned* b) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
};
template <>
struct MmaOp<float16> {
  static __device__ __forceinline__ void prepare(unsigned*, int) {}
  static __device__ __forceinline__ void run(float* d, const unsigned* a, const unsigned* b) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
};

/// v rounded to TF32 (10-bit mantissa, to nearest, ties away from zero), as a float.
__device__ __forceinline__ float round_to_tf32(float v) {
  unsigned r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(v));
  return __uint_as_float(r);
}

template <>
struct MmaOp<float> {
  static __device__ __forceinline__ void prepare(unsigned* r, int n) {
    for (int i = 0; i < n; ++i) r[i] = __float_as_uint(round_to_tf32(__uint_as_float(r[i])));
  }
  static __device__ __forceinline__ void run(float* d, const unsigned* a, const unsigned* b) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
};

__device__ __forceinline__ unsigned smem_address(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
/// 16-byte asynchronous copy; src_bytes = 0 zero-fills (edges of the matrix).
__device__ __forceinline__ void cp_async16(unsigned dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}
__device__ __forceinline__ void ldmatrix_x4(unsigned* r, unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
/// Transposed: for an operand stored k-major ([k][n], n contiguous) this yields the "col"
/// fragments mma.sync expects for B.
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned* r, unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ float quad_max(float v) {
  for (int o = 1; o < 4; o <<= 1) v = nan_max(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float quad_sum(float v) {
  for (int o = 1; o < 4; o <<= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
/// The same over the 8 lanes that share lane % 4 (the rows of an mma accumulator's column).
__device__ __forceinline__ float column_lanes_max(float v) {
  for (int o = 4; o < 32; o <<= 1) v = nan_max(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float column_lanes_sum(float v) {
  for (int o = 4; o < 32; o <<= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

/// Stores two adjacent values, converted to T, with one store; `at` is even.
template <class T>
__device__ __forceinline__ void store_pair(T* base, index_t at, float lo, float hi) {
  if constexpr (sizeof(T) == 2) {
    *reinterpret_cast<unsigned*>(base + at) = unsigned(from_acc<T>(lo).bits) | (unsigned(from_acc<T>(hi).bits) << 16);
  } else {
    *reinterpret_cast<float2*>(base + at) = make_float2(lo, hi);
  }
}

/// Throws with the kernel's name when a launch failed.
inline void check_launch(const char* kernel) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) throw std::runtime_error(std::string("tlse: ") + kernel + ": " + cudaGetErrorString(err));
}

/// Raises a kernel's dynamic shared-memory limit once; throws if the device refuses.
template <class Kernel>
void raise_smem_limit(Kernel kernel, int bytes, const char* name) {
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) != cudaSuccess)
    throw std::runtime_error(std::string("tlse: cannot raise the shared-memory limit of ") + name);
}

inline int multiprocessors(int device) {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  return sms > 0 ? sms : 1;
}

}  // namespace tlse::impl::cuda
