#pragma once
// The warp-specialized persistent kernel every family shares: warpgroup 0 is the producer (one
// thread issues the TMA loads, the warpgroup gives its registers up with setmaxnreg), warpgroups
// 1 and 2 are the consumers (64 rows each of a 128 x 256 tile, wgmma, then the epilogue on the
// accumulators in registers). The epilogue is a template parameter: what happens to a finished
// tile (online LSE, G = dL/dx, a plain store) is its business, the mainloop and the schedule are
// the same for all.
//
// An Epilogue provides: Params, SharedStorage, a constructor (params, storage, consumer thread
// 0..255), static keep(params, m, k) (false: skip K step k of m tile m), begin_row(frag, unit,
// m), prefetch(unit, m, n) before a tile's products (global loads the epilogue will need, their
// latency hidden by the products), tile(acc, frag, unit, m, n) on the accumulators (Fragment says
// where each sits in the tile), and end_row(frag, unit, m). The consumers synchronize among themselves with
// consumer_sync() (named barrier 1); the producer never waits on them except through the pipeline.
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>

#include "dependent_launch.cuh"
#include "mainloop.cuh"
#include "staged_store.cuh"

namespace tlse::hopper {

/// Barrier among the 256 consumer threads (id 0 is __syncthreads).
__device__ __forceinline__ void consumer_sync() { cutlass::arch::NamedBarrier::sync(CONSUMER_THREADS, 1); }

/// Where a consumer thread's accumulators sit in the 128 x 256 tile. wgmma m64nNk16 gives
/// thread t of a warpgroup the values i = e + 2 h + 4 v (e, h in {0, 1}, v < N / 8) at row
/// 16 (warp % 4) + lane / 4 + 8 h and column 8 v + 2 (lane % 4) + e; the two consumer warpgroups
/// hold rows 0-63 and 64-127. Seen as (rows, cols) of the thread: 2 rows r = h, 64 columns
/// j = e + 2 v. Written out rather than taken from a CuTe identity tensor, whose per-element
/// coordinates the compiler kept live across the whole loop (1 KiB of spills).
struct Fragment {
  static constexpr int ROWS = 2, COLS = TILE_N / 4;
  int row_base, col_base;
  __device__ explicit Fragment(int consumer_thread)
      : row_base((consumer_thread >> 7) * 64 + ((consumer_thread >> 5) & 3) * 16 + ((consumer_thread & 31) >> 2)),
        col_base((consumer_thread & 3) * 2) {}
  __device__ __forceinline__ int row(int r) const { return row_base + 8 * r; }
  __device__ __forceinline__ int col(int j) const { return col_base + 8 * (j >> 1) + (j & 1); }
  /// Accumulator (r, j) of the fragment.
  template <class Acc>
  __device__ __forceinline__ static auto& at(Acc& acc, int r, int j) {
    return acc((j & 1) + 2 * r + 4 * (j >> 1));
  }
};

/// A CTA's place in the schedule: alone, it takes the units blockIdx.x, + gridDim.x, ...; in a
/// cluster, the cluster takes them and the CTA its rank-th row tiles of each. The CTAs of a
/// cluster load B tiles for one another, so they must walk the same K steps: clusters are for
/// epilogues whose keep() holds everywhere (product.cu: products without a tile mask).
template <class Config>
struct ClusterPlace {
  static constexpr int SIZE = Config::CLUSTER_M;
  int rank;

  __device__ static ClusterPlace here() { return {SIZE > 1 ? int(cute::block_rank_in_cluster()) : 0}; }
  __device__ int first_unit() const { return int(blockIdx.x) / SIZE; }
  __device__ int unit_stride() const { return int(gridDim.x) / SIZE; }
  __device__ WorkUnit unit(const TileSchedule& sched, int u) const { return sched.template unit<SIZE>(u, rank); }
};

template <class Config, class Epilogue>
struct KernelParams {
  MainloopParams<Config> mainloop;
  TileSchedule schedule;
  typename Epilogue::Params epilogue;
};

template <class Config, class Epilogue>
struct KernelStorage {
  typename Config::MainloopStorage mainloop;
  typename Epilogue::SharedStorage epilogue;
};

template <class Config, class Epilogue>
__global__ void __launch_bounds__(THREADS, 1)
    warp_specialized_kernel(const __grid_constant__ KernelParams<Config, Epilogue> kp) {
  using Pipeline = typename Config::Pipeline;
  using Loop = Mainloop<Config>;
  extern __shared__ __align__(128) char smem_raw[];
  auto& ss = *reinterpret_cast<KernelStorage<Config, Epilogue>*>(smem_raw);
  const int warp_group = threadIdx.x / 128;

  typename Pipeline::Params pp;
  pp.transaction_bytes = Config::STAGE_BYTES;
  pp.role = warp_group == 0 ? Pipeline::ThreadCategory::Producer : Pipeline::ThreadCategory::Consumer;
  pp.is_leader = threadIdx.x == 0;
  pp.num_consumers = CONSUMER_THREADS;
  Pipeline pipeline(ss.mainloop.pipeline, pp, typename Config::ClusterShape{});
  wait_for_previous_grid();  // nothing above touched global memory (launch(): dependent launch)
  allow_next_grid();
  // The barriers are initialized before anyone waits on them, or, in a cluster, multicasts to them.
  if constexpr (Config::CLUSTER_M > 1) {
    cute::cluster_arrive_relaxed();
    cute::cluster_wait();
  } else {
    __syncthreads();
  }

  const TileSchedule& sched = kp.schedule;
  auto keep = [&](int m, int k) { return Epilogue::keep(kp.epilogue, m, k); };
  if (warp_group == 0) {
    cutlass::arch::warpgroup_reg_dealloc<PRODUCER_REGISTERS>();
    if (threadIdx.x == 0) {
      // Each role reads its place after setmaxnreg: a value live across it went to the stack.
      const auto at = ClusterPlace<Config>::here();
      auto write = cutlass::make_producer_start_state<Pipeline>();
      for (int u = at.first_unit(); u < sched.units(); u += at.unit_stride())
        Loop::load_unit(kp.mainloop, ss.mainloop, pipeline, write, at.unit(sched, u), at.rank, keep);
      pipeline.producer_tail(write);
    }
  } else {
    cutlass::arch::warpgroup_reg_alloc<CONSUMER_REGISTERS>();
    const int ct = threadIdx.x - 128;
    typename Config::TiledMma tiled_mma;
    auto thr = tiled_mma.get_thread_slice(ct);
    Tensor sA = make_tensor(make_smem_ptr(ss.mainloop.A.begin()), typename Config::SmemLayoutA{});
    Tensor sB = make_tensor(make_smem_ptr(ss.mainloop.B.begin()), typename Config::SmemLayoutB{});
    Tensor tCrA = thr.make_fragment_A(thr.partition_A(sA));  // descriptors, (MMA, MMA_M, MMA_K, stage)
    Tensor tCrB = thr.make_fragment_B(thr.partition_B(sB));
    Tensor acc = partition_fragment_C(tiled_mma, make_shape(Int<Config::BM>{}, Int<Config::BN>{}));
    static_assert(decltype(size(acc))::value == Fragment::ROWS * Fragment::COLS, "64 x 256 wgmma per warpgroup");
    const Fragment frag(ct);
    Epilogue epi(kp.epilogue, ss.epilogue, ct);
    typename Pipeline::PipelineState read;
    const auto at = ClusterPlace<Config>::here();
    for (int u = at.first_unit(); u < sched.units(); u += at.unit_stride()) {
      const WorkUnit w = at.unit(sched, u);
      for (int m = w.m_begin; m < w.m_end; ++m) {
        epi.begin_row(frag, w, m);
        for (int n = w.n_begin; n < w.n_end; ++n) {
          epi.prefetch(w, m, n);
          Loop::mma_tile(tiled_mma, tCrA, tCrB, acc, pipeline, read, m, w.k_begin, w.k_end, keep);
          epi.tile(acc, frag, w, m, n);
        }
        epi.end_row(frag, w, m);
      }
    }
    StagedStore::drain(ct & 31);  // an epilogue's TMA stores have read their boxes before the CTA ends
  }
}

/// Shared memory of one CTA of the kernel.
template <class Config, class Epilogue>
constexpr int kernel_smem_bytes() {
  return int(sizeof(KernelStorage<Config, Epilogue>));
}

}  // namespace tlse::hopper
