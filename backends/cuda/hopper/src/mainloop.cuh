#pragma once
// The collective mainloop: the producer thread streams the A and B tiles of every K step of a
// unit into the stage ring with TMA (one mbarrier per stage counts the bytes in), the consumer
// warpgroups multiply each stage with wgmma into fp32 accumulators and hand the stage back as
// soon as the wgmma that read it has retired (one wgmma batch stays in flight). Both sides walk
// the same sequence of K steps, so a step the epilogue filters out (`keep` false) is neither
// loaded nor multiplied. The CTAs of a cluster load B tiles for one another (TileConfig), so
// they walk the same steps: every step (kernel.cuh's ClusterPlace).
#include "tile_config.cuh"
#include "tile_scheduler.cuh"

namespace tlse::hopper {

/// What the mainloop reads: the TMA descriptors and the problem's extents.
template <class Config>
struct MainloopParams {
  typename Config::TmaA tma_a;
  typename Config::TmaB tma_b;
  int32_t M, N, K;
  int32_t a_panel;  // with Config::PANELS_A: A's columns per panel
};

template <class Config>
struct Mainloop {
  using T = typename Config::Element;
  using Pipeline = typename Config::Pipeline;
  using PipelineState = typename Pipeline::PipelineState;
  static constexpr int BM = Config::BM, BN = Config::BN, BK = Config::BK;

  /// Producer (one thread): loads every kept K step of the unit's tiles, in the consumers' order.
  /// In a cluster, this CTA (`rank` in it) loads slice `rank` of each B tile into every CTA of
  /// the cluster.
  template <class Keep>
  __device__ static void load_unit(const MainloopParams<Config>& p, typename Config::MainloopStorage& smem,
                                   Pipeline& pipeline, PipelineState& write, const WorkUnit& u, int rank,
                                   Keep&& keep) {
    Tensor mA = p.tma_a.get_tma_tensor(Config::shape_a(p.M, p.K, p.a_panel));
    Tensor mB = p.tma_b.get_tma_tensor(make_shape(p.N, p.K));
    Tensor gA = local_tile(mA, make_shape(Int<BM>{}, Int<BK>{}), Config::a_tiles());  // (BM, BK, m, k[, panel])
    Tensor gB = local_tile(mB, make_shape(Int<BN>{}, Int<BK>{}), make_coord(_, _));  // (BN, BK, n, k)
    Tensor sA = make_tensor(make_smem_ptr(smem.A.begin()), typename Config::SmemLayoutA{});
    Tensor sB = make_tensor(make_smem_ptr(smem.B.begin()), typename Config::SmemLayoutB{});
    constexpr uint16_t everyone = uint16_t((1 << Config::CLUSTER_M) - 1);
    auto tma_a = p.tma_a.get_slice(0);
    auto tma_b = p.tma_b.get_slice(rank);
    Tensor tAgA = tma_a.partition_S(gA);  // (TMA, TMA_M, TMA_K, m, k[, panel])
    Tensor tAsA = tma_a.partition_D(sA);  // (TMA, TMA_M, TMA_K, stage)
    Tensor tBgB = tma_b.partition_S(gB);
    Tensor tBsB = tma_b.partition_D(sB);
    for (int m = u.m_begin; m < u.m_end; ++m)
      for (int n = u.n_begin; n < u.n_end; ++n)
        for (int k = u.k_begin; k < u.k_end; ++k) {
          if (!keep(m, k)) continue;
          pipeline.producer_acquire(write);
          auto* bar = pipeline.producer_get_barrier(write);
          const int stage = write.index();
          if constexpr (Config::PANELS_A) {
            const int steps = p.a_panel / BK;  // K steps per panel
            copy(p.tma_a.with(*bar), tAgA(_, _, _, m, k % steps, k / steps), tAsA(_, _, _, stage));
          } else {
            copy(p.tma_a.with(*bar), tAgA(_, _, _, m, k), tAsA(_, _, _, stage));
          }
          if constexpr (Config::CLUSTER_M > 1)
            copy(p.tma_b.with(*bar, everyone), tBgB(_, _, _, n, k), tBsB(_, _, _, stage));
          else
            copy(p.tma_b.with(*bar), tBgB(_, _, _, n, k), tBsB(_, _, _, stage));
          ++write;
        }
  }

  /// Consumers: acc = the sum over the kept K steps in [k_begin, k_end) of A_m,k B_n,k; zero when
  /// none is kept. Returns with every wgmma retired and every stage released.
  template <class TiledMma, class FragA, class FragB, class Acc, class Keep>
  __device__ static void mma_tile(TiledMma& tiled_mma, const FragA& tCrA, const FragB& tCrB, Acc& acc,
                                  Pipeline& pipeline, PipelineState& read, int m, int k_begin, int k_end, Keep&& keep) {
    PipelineState release = read;
    int issued = 0;
    // Zero first, unconditionally: clearing only when no step is kept joins two versions of the
    // accumulators after the loop, and ptxas then spilled half of them.
    clear(acc);
    tiled_mma.accumulate_ = GMMA::ScaleOut::Zero;
    warpgroup_fence_operand(acc);
    for (int k = k_begin; k < k_end; ++k) {
      if (!keep(m, k)) continue;
      pipeline.consumer_wait(read);
      const int stage = read.index();
      warpgroup_fence_operand(acc);
      warpgroup_arrive();
      CUTE_UNROLL
      for (int kb = 0; kb < size<2>(tCrA); ++kb) {
        cute::gemm(tiled_mma, tCrA(_, _, kb, stage), tCrB(_, _, kb, stage), acc);
        tiled_mma.accumulate_ = GMMA::ScaleOut::One;
      }
      warpgroup_commit_batch();
      warpgroup_wait<1>();  // the previous step's wgmma has retired: its stage can be refilled
      warpgroup_fence_operand(acc);
      if (issued > 0) {
        pipeline.consumer_release(release);
        ++release;
      }
      ++read;
      ++issued;
    }
    warpgroup_wait<0>();
    warpgroup_fence_operand(acc);
    if (issued > 0) pipeline.consumer_release(release);
  }
};

}  // namespace tlse::hopper
