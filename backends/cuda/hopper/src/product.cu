// tlse_hop_product: the backward's products (mainloop + ProductEpilogue). bf16 and fp16: G as
// operand A stored (dA += G B) or transposed (dB = G^T A), the other operand rows-contiguous (K x N);
// or both operands K-major (the distillation's logit panels, A B^T as the forward's tiles). TF32:
// both operands K-major (the caller passes G^T and the transposed inputs), wgmma's only TF32 form.
// Without a tile mask, pairs of CTAs (clusters along M) share the loads of B (TileConfig). A's
// columns may lie in panels (a_panel: the training step's kept exponentials, TileConfig's PanelsA).
#include "launch.cuh"
#include "product_epilogue.cuh"

namespace tlse::hopper {
namespace {

constexpr int PRODUCT_M_GROUP = 8;    // m tiles per swizzle group (L2 reuse of both operands)
constexpr int PRODUCT_CLUSTER_M = 2;  // CTAs per cluster without a tile mask, sharing their B tiles

struct ProductShape {
  int64_t m_tiles, n_tiles, k_tiles;
  int k_splits, k_per_split;
};

ProductShape product_shape(int64_t M, int64_t N, int64_t K, int64_t k_step, int64_t max_k_splits, int sms) {
  ProductShape s;
  s.m_tiles = (M + TILE_M - 1) / TILE_M, s.n_tiles = (N + TILE_N - 1) / TILE_N, s.k_tiles = (K + k_step - 1) / k_step;
  // A split adds an fp32 partial of the output to write and sum: count it as two K steps.
  s.k_splits = balanced_splits(s.m_tiles * s.n_tiles, s.k_tiles, max_k_splits, sms, 2);
  s.k_per_split = int((s.k_tiles + s.k_splits - 1) / s.k_splits);
  s.k_splits = int((s.k_tiles + s.k_per_split - 1) / s.k_per_split);
  return s;
}

template <class Input, bool TransposedA, bool TransposedB, int ClusterM, bool PanelsA = false>
int run_product(tlse_hop_product_args& a, cudaStream_t stream) {
  using Config = TileConfig<MmaElement<Input>, TransposedA, TransposedB, ClusterM, PanelsA>;
  ProductShape shape = product_shape(a.M, a.N, a.K, Config::BK, a.max_k_splits, multiprocessors());
  const size_t partial_bytes = size_t(a.M) * size_t(a.N) * sizeof(float);
  if (shape.k_splits > 1 && a.workspace_bytes < partial_bytes * size_t(shape.k_splits)) {
    // Fewer splits in a smaller workspace (the caller sized it with tlse_hop_product_workspace).
    const int64_t fit = int64_t(a.workspace_bytes / partial_bytes);
    shape.k_splits = fit < 1 ? 1 : int(fit);
    shape.k_per_split = int((shape.k_tiles + shape.k_splits - 1) / shape.k_splits);
    shape.k_splits = int((shape.k_tiles + shape.k_per_split - 1) / shape.k_per_split);
  }
  a.k_splits = shape.k_splits;

  const MainloopParams<Config> mainloop = {Config::tma_a(a.a, a.M, a.K, a.lda, a.a_panel, a.a_panel_stride),
                                           Config::tma_b(a.b, a.N, a.K, a.ldb),
                                           int32_t(a.M),
                                           int32_t(a.N),
                                           int32_t(a.K),
                                           int32_t(a.a_panel)};
  const TileSchedule schedule = TileSchedule::make(int(shape.m_tiles), int(shape.n_tiles), int(shape.k_tiles), 1, 1,
                                                   shape.k_per_split, PRODUCT_M_GROUP / ClusterM, ClusterM);
  ProductParams<Input> e;
  e.M = a.M, e.N = a.N;
  e.mask = a.mask, e.mask_ld = a.mask_ld, e.mask_of_a_transposed = a.mask_of_a_transposed != 0;
  e.row_scale = a.row_scale, e.out_factor = a.out_factor;
  e.k_step = Config::BK;
  e.out_f32 = a.out_f32, e.out = static_cast<Input*>(a.out), e.out_index = a.out_index, e.ldo = a.ldo;
  e.accumulate = a.accumulate != 0;
  e.partials = shape.k_splits > 1 ? static_cast<float*>(a.workspace) : nullptr;
  const auto launch_with = [&](auto store) {
    const KernelParams<Config, ProductEpilogue<Input, decltype(store)::value>> kp{mainloop, schedule, e};
    return launch("tlse_hop_product", kp, stream);
  };
  // TMA writes whole 16-byte chunks of a row: the staged stores take outputs whose rows are.
  const auto whole_chunks = [&](const void* data, int64_t row_bytes, int64_t ld_bytes) {
    return row_bytes % 16 == 0 && ld_bytes % 16 == 0 && reinterpret_cast<uintptr_t>(data) % 16 == 0;
  };
  constexpr int64_t elem = sizeof(Input);
  const auto launch_product = [&]() -> int {
    using Store = ProductStore;
    if (e.out_f32 && e.accumulate && !e.partials)
      return launch_with(std::integral_constant<Store, Store::InPlaceF32>{});
    if (e.partials && whole_chunks(e.partials, a.N * 4, a.N * 4)) {
      if (int error = StagedStore::describe("tlse_hop_product: partials", e.out_map, StagedStore::type_of<float>(),
                                            e.partials, a.M, a.N, a.N, shape.k_splits))
        return error;
      return launch_with(std::integral_constant<Store, Store::StagedPartials>{});
    }
    if (e.out && !e.accumulate && !e.partials && !e.out_index && whole_chunks(a.out, a.N * elem, a.ldo * elem)) {
      if (int error = StagedStore::describe("tlse_hop_product: out", e.out_map, StagedStore::type_of<Input>(), a.out,
                                            a.M, a.N, a.ldo))
        return error;
      return launch_with(std::integral_constant<Store, Store::Staged>{});
    }
    return launch_with(std::integral_constant<Store, Store::Registers>{});
  };
  if (int err = launch_product()) return err;
  if (shape.k_splits == 1) return TLSE_HOP_OK;
  const int64_t pairs = a.M * a.N / 2;
  const int blocks = int(std::min<int64_t>((pairs + 255) / 256, int64_t(multiprocessors()) * 8));
  const cudaError_t err = launch_dependent(&split_reduce_kernel<Input>, blocks, 256, 0, stream, e, shape.k_splits);
  return err == cudaSuccess ? TLSE_HOP_OK
                            : fail(TLSE_HOP_E_LAUNCH,
                                   std::string("tlse_hop_product: reduce launch failed: ") + cudaGetErrorString(err));
}

}  // namespace
}  // namespace tlse::hopper

using namespace tlse::hopper;

extern "C" size_t tlse_hop_product_workspace(int32_t dtype, int64_t M, int64_t N, int64_t K, int64_t max_k_splits,
                                             int device) {
  int64_t k_step = 0;  // the depth of a stage, as run_product takes it
  const auto stage_depth = [&](auto input) {
    k_step = TileConfig<MmaElement<decltype(input)>, false, false>::BK;
    return TLSE_HOP_OK;
  };
  if (with_input_type(dtype, "tlse_hop_product_workspace", stage_depth) != TLSE_HOP_OK || M < 1 || N < 1 || K < 1)
    return 0;
  int sms = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess || sms < 1) sms = 1;
  const ProductShape s = product_shape(M, N, K, k_step, max_k_splits < 1 ? 1 : max_k_splits, sms);
  return s.k_splits > 1 ? size_t(s.k_splits) * size_t(M) * size_t(N) * sizeof(float) : 0;
}

extern "C" int tlse_hop_product(tlse_hop_product_args* a, void* stream) {
  static constexpr const char* call = "tlse_hop_product";
  if (a == nullptr) return fail(TLSE_HOP_E_ARGUMENT, std::string(call) + ": args is NULL");
  return with_input_type(a->dtype, call, [&](auto input) {
    using Input = decltype(input);
    constexpr bool tf32 = std::is_same_v<Input, float>;
    if (tf32 && (a->a_transposed || a->b_transposed))
      return fail(TLSE_HOP_E_ARGUMENT, std::string(call) +
                                           ": TF32 operands must be K-major (a_transposed = b_transposed = 0): "
                                           "wgmma reads TF32 from shared memory K-major only");
    if (!tf32 && !a->b_transposed && a->a_transposed)
      return fail(TLSE_HOP_E_ARGUMENT,
                  std::string(call) + ": 16-bit B stored K-major (N x K rows) takes A as stored (a_transposed = 0)");
    const int elem = int(sizeof(Input));
    const bool panels = a->a_panel != 0;
    if (panels && (tf32 || a->a_transposed || a->mask || a->a_panel < 0 || a->a_panel % 64 != 0 ||
                   a->K % a->a_panel != 0 || a->a_panel_stride < 1 || a->a_panel_stride % 8 != 0))
      return fail(TLSE_HOP_E_ARGUMENT,
                  std::string(call) +
                      ": A in panels takes bf16 or fp16 A as stored (a_transposed = 0) without a mask, a_panel a "
                      "multiple of 64 that divides K, a_panel_stride a positive multiple of 8; got a_panel " +
                      std::to_string(a->a_panel) + ", K " + std::to_string(a->K) + ", a_panel_stride " +
                      std::to_string(a->a_panel_stride));
    const int64_t a_rows = a->a_transposed ? a->K : a->M, a_depth = panels ? a->a_panel : a->a_transposed ? a->M : a->K;
    const int64_t b_rows = a->b_transposed ? a->K : a->N, b_depth = a->b_transposed ? a->N : a->K;
    if (int e = check_operand(call, "a", a->a, a_rows, a_depth, a->lda, elem)) return e;
    if (int e = check_operand(call, "b", a->b, b_rows, b_depth, a->ldb, elem)) return e;
    if ((a->out_f32 == nullptr) == (a->out == nullptr))
      return fail(TLSE_HOP_E_ARGUMENT, std::string(call) + ": exactly one of out_f32 and out is the output");
    // The epilogue writes pairs of columns: an odd N's last pair reaches column N, which B's
    // bounds make 0, and which only a plain fp32 output of one K split may take within ldo.
    const bool odd_n_fits = a->out_f32 && !a->accumulate && a->max_k_splits == 1 && a->ldo > a->N;
    if ((a->N % 2 != 0 && !odd_n_fits) || a->ldo < a->N || a->ldo % 2 != 0)
      return fail(TLSE_HOP_E_ARGUMENT, std::string(call) +
                                           ": N and ldo must be even, ldo >= N (an odd N: out_f32 written, not "
                                           "accumulated, max_k_splits 1 and ldo > N); got N " +
                                           std::to_string(a->N) + ", ldo " + std::to_string(a->ldo));
    if (a->max_k_splits < 1) return fail(TLSE_HOP_E_ARGUMENT, std::string(call) + ": max_k_splits must be >= 1");
    const auto s = static_cast<cudaStream_t>(stream);
    // Pairs of CTAs share their B tiles where every K step is kept (TileConfig, ClusterPlace); with
    // a tile mask, the two row tiles of a pair keep different steps (in cross-entropy, few and
    // apart: walking the steps either keeps made the masked backward slower; docs/notes/2026-11-27.md,
    // "Pairs of CTAs share the products' B tiles").
    const auto run = [&](auto cluster) {
      constexpr int c = decltype(cluster)::value;
      if constexpr (tf32)
        return run_product<float, false, false, c>(*a, s);
      else if (!a->b_transposed)
        return run_product<Input, false, false, c>(*a, s);
      else
        return a->a_transposed ? run_product<Input, true, true, c>(*a, s) : run_product<Input, false, true, c>(*a, s);
    };
    if constexpr (!tf32)
      if (panels) return run_product<Input, false, true, PRODUCT_CLUSTER_M, true>(*a, s);
    return a->mask ? run(std::integral_constant<int, 1>{}) : run(std::integral_constant<int, PRODUCT_CLUSTER_M>{});
  });
}
