#pragma once
// The tile geometry of the mma.sync kernels (mma/nt_sweep.hpp, mma/backward.hpp), which their host
// plans (mma/backward_plan.hpp) size their launches and buffers from: plain constants, no CUDA.

namespace tlse::impl::cuda {

// Shared-memory geometry in 16-bit units whatever the input type: a stage holds 128 bytes of
// depth per row, i.e. 64 bf16/fp16 values or 32 floats (depth_per_stage<T>).
constexpr int BM = 128, BN = 128, BK = 64, STAGES = 3, THREADS = 256;
constexpr int LDS = BK + 8;                    // shared row stride in halves: 144 bytes keeps ldmatrix conflict-free
constexpr int LDSB = BN + 8;                   // k-major B tile row stride of the gradient product (in its elements)
constexpr int CHUNKS = BM * BK / 8 / THREADS;  // 16-byte copies per thread per operand and stage
template <class T>
constexpr int depth_per_stage = BK * 2 / int(sizeof(T));
template <class T>
constexpr int per_16_bytes = 16 / int(sizeof(T));
constexpr int SWEEP_SMEM_BYTES = STAGES * (BM + BN) * LDS * 2;

}  // namespace tlse::impl::cuda
