#pragma once
// The one tile configuration every Hopper kernel uses: 128 x 256 output tiles (two consumer
// warpgroups of 64 rows, each issuing wgmma m64n256), 128 bytes of depth per pipeline stage (64
// bf16/fp16 or 32 TF32 values: one 128-byte swizzle atom), 4 stages (192 KiB of shared memory).
// An operand is K-major (depth contiguous: the inputs, G as stored) or MN-major (rows contiguous:
// G read transposed, the products' second operands); wgmma reads either from swizzled shared
// memory for 16-bit types, TF32 only K-major.
//
// ClusterM > 1: the CTAs of a cluster take row tiles next to each other with the same column
// tile and K steps, so they read the same B tiles; each loads a 1 / ClusterM slice of every B tile
// and TMA multicasts it into the shared memory of all of them (their pipelines' stages are
// released only when every CTA's consumers are done with them). L2 serves each CTA 1/3 fewer
// bytes per K step for ClusterM = 2 (128 rows of A and 128 of B, not 128 and 256).
//
// PanelsA: A (K-major) has its columns in panels of P (tlse_hop_product_args::a_panel), seen as
// M x P x panels, the batch mode of a three-dimensional TMA map: K step k is step k mod (P / BK)
// of panel k / (P / BK), P a multiple of BK.
#include <cutlass/numeric_types.h>

#include <cute/tensor.hpp>
#include <cutlass/gemm/collective/builders/sm90_common.inl>
#include <cutlass/pipeline/sm90_pipeline.hpp>
#include <type_traits>

namespace tlse::hopper {

using namespace cute;

constexpr int TILE_M = 128, TILE_N = 256, STAGES = 4;
constexpr int CONSUMER_THREADS = 256, THREADS = 384;  // one producer warpgroup, two consumers
static_assert(CONSUMER_THREADS == TILE_N, "the column epilogues give each consumer thread one column of a tile");
constexpr int PRODUCER_REGISTERS = 40, CONSUMER_REGISTERS = 232;

template <class T, bool TransposedA, bool TransposedB, int ClusterM = 1, bool PanelsA = false>
struct TileConfig {
  using Element = T;
  static constexpr int BM = TILE_M, BN = TILE_N, BK = 128 / int(sizeof(T));
  static constexpr int CLUSTER_M = ClusterM;
  static constexpr bool PANELS_A = PanelsA;
  static_assert(ClusterM == 1 || ClusterM == 2, "clusters of one or two CTAs along M");
  static_assert(!PanelsA || !TransposedA, "panels of A's columns for K-major A");
  using ClusterShape = Shape<Int<ClusterM>, _1, _1>;
  using CopyB = std::conditional_t<(ClusterM > 1), SM90_TMA_LOAD_MULTICAST, SM90_TMA_LOAD>;
  static constexpr GMMA::Major MajorA = TransposedA ? GMMA::Major::MN : GMMA::Major::K;
  static constexpr GMMA::Major MajorB = TransposedB ? GMMA::Major::MN : GMMA::Major::K;
  static_assert(sizeof(T) == 2 || (!TransposedA && !TransposedB), "wgmma reads TF32 operands K-major only");

  using TileShape = Shape<Int<BM>, Int<BN>, Int<BK>>;
  // Shapes and strides of A as (M, K) (with panels: (M, P, panels)) and of B as (N, K), in elements.
  using ShapeA = std::conditional_t<PanelsA, Shape<int32_t, int32_t, int32_t>, Shape<int32_t, int32_t>>;
  using StrideA = std::conditional_t<PanelsA, Stride<int64_t, _1, int64_t>,
                                     std::conditional_t<TransposedA, Stride<_1, int64_t>, Stride<int64_t, _1>>>;
  using StrideB = std::conditional_t<TransposedB, Stride<_1, int64_t>, Stride<int64_t, _1>>;

  using SmemAtomA = decltype(cutlass::gemm::collective::detail::ss_smem_selector<MajorA, T, Int<BM>, Int<BK>>());
  using SmemAtomB = decltype(cutlass::gemm::collective::detail::ss_smem_selector<MajorB, T, Int<BN>, Int<BK>>());
  using SmemLayoutA = decltype(tile_to_shape(SmemAtomA{}, make_shape(Int<BM>{}, Int<BK>{}, Int<STAGES>{}),
                                             std::conditional_t<TransposedA, Step<_2, _1, _3>, Step<_1, _2, _3>>{}));
  using SmemLayoutB = decltype(tile_to_shape(SmemAtomB{}, make_shape(Int<BN>{}, Int<BK>{}, Int<STAGES>{}),
                                             std::conditional_t<TransposedB, Step<_2, _1, _3>, Step<_1, _2, _3>>{}));

  // Two warpgroups stacked along M, each a 64 x 256 wgmma.
  using TiledMma = decltype(make_tiled_mma(
      GMMA::ss_op_selector<T, T, float, Shape<_64, Int<BN>, Int<BK>>, MajorA, MajorB>(), Layout<Shape<_2, _1, _1>>{}));

  using TmaA = decltype(make_tma_copy(SM90_TMA_LOAD{},
                                      make_tensor(make_gmem_ptr(static_cast<T const*>(nullptr)), ShapeA{}, StrideA{}),
                                      SmemLayoutA{}(_, _, 0), make_shape(Int<BM>{}, Int<BK>{}), Int<1>{}));
  using TmaB = decltype(make_tma_copy(
      CopyB{},
      make_tensor(make_gmem_ptr(static_cast<T const*>(nullptr)), make_shape(int32_t(0), int32_t(0)), StrideB{}),
      SmemLayoutB{}(_, _, 0), make_shape(Int<BN>{}, Int<BK>{}), Int<ClusterM>{}));

  using Pipeline = cutlass::PipelineTmaAsync<STAGES>;
  static constexpr uint32_t STAGE_BYTES = uint32_t((BM + BN) * BK * sizeof(T));

  struct alignas(128) MainloopStorage {
    alignas(128) ArrayEngine<T, cosize_v<SmemLayoutA>> A;
    alignas(128) ArrayEngine<T, cosize_v<SmemLayoutB>> B;
    typename Pipeline::SharedStorage pipeline;
  };

  /// A's shape as its TMA map sees it (panel: A's columns per panel, with PanelsA).
  __host__ __device__ static ShapeA shape_a(int32_t M, int32_t K, int32_t panel) {
    if constexpr (PanelsA)
      return make_shape(M, panel, K / panel);
    else
      return make_shape(M, K);
  }
  /// The K step tiles of A in local_tile: (m, k), or (m, k within a panel, panel).
  __host__ __device__ static auto a_tiles() {
    if constexpr (PanelsA)
      return make_coord(_, _, _);
    else
      return make_coord(_, _);
  }

  /// The TMA descriptors for A (M x K) and B (N x K) at these addresses and leading dimensions
  /// (with PanelsA, A's panels of `panel` columns, panel_stride elements apart).
  static TmaA tma_a(const void* a, int64_t M, int64_t K, int64_t ld, int64_t panel = 0, int64_t panel_stride = 0) {
    auto stride = [&] {
      if constexpr (PanelsA)
        return make_stride(ld, _1{}, panel_stride);
      else if constexpr (TransposedA)
        return make_stride(_1{}, ld);
      else
        return make_stride(ld, _1{});
    }();
    auto g =
        make_tensor(make_gmem_ptr(static_cast<T const*>(a)), shape_a(int32_t(M), int32_t(K), int32_t(panel)), stride);
    return make_tma_copy(SM90_TMA_LOAD{}, g, SmemLayoutA{}(_, _, 0), make_shape(Int<BM>{}, Int<BK>{}), Int<1>{});
  }
  static TmaB tma_b(const void* b, int64_t N, int64_t K, int64_t ld) {
    auto stride = [&] {
      if constexpr (TransposedB)
        return make_stride(_1{}, ld);
      else
        return make_stride(ld, _1{});
    }();
    auto g = make_tensor(make_gmem_ptr(static_cast<T const*>(b)), make_shape(int32_t(N), int32_t(K)), stride);
    return make_tma_copy(CopyB{}, g, SmemLayoutB{}(_, _, 0), make_shape(Int<BN>{}, Int<BK>{}), Int<ClusterM>{});
  }
};

/// The element type the tensor cores see for each input type (float is read as TF32).
template <class Input>
using MmaElement = std::conditional_t<std::is_same_v<Input, float>, tfloat32_t, Input>;

}  // namespace tlse::hopper
