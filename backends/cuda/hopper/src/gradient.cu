// tlse_hop_gradient: a panel of G = scale * dL/dx (mainloop + GradientEpilogue), bf16, fp16 (times
// g_factor) and TF32.
#include "gradient_epilogue.cuh"
#include "launch.cuh"

namespace tlse::hopper {
namespace {

template <class Input, GradientVariant Variant>
int run_gradient(tlse_hop_gradient_args& a, cudaStream_t stream) {
  using Config = TileConfig<MmaElement<Input>, false, false>;
  using Epilogue = GradientEpilogue<Input, Variant>;
  const int64_t width = a.col_end - a.col_begin;
  const int64_t row_tiles = (a.rows.count + TILE_M - 1) / TILE_M, col_tiles = (width + TILE_N - 1) / TILE_N;
  const int64_t k_tiles = (a.depth + Config::BK - 1) / Config::BK;
  const int splits = sweep_splits(row_tiles, col_tiles, a.max_col_splits, a.depth, sizeof(Input));
  const int64_t per_split = (col_tiles + splits - 1) / splits;
  a.col_splits = (col_tiles + per_split - 1) / per_split;

  const Input* panel = static_cast<const Input*>(a.cols.data) + a.col_begin * a.cols.ld;
  KernelParams<Config, Epilogue> kp;
  kp.mainloop = {Config::tma_a(a.rows.data, a.rows.count, a.depth, a.rows.ld),
                 Config::tma_b(panel, width, a.depth, a.cols.ld),
                 int32_t(a.rows.count),
                 int32_t(width),
                 int32_t(a.depth),
                 0};
  kp.schedule = TileSchedule::make(int(row_tiles), int(col_tiles), int(k_tiles), 1, int(per_split), int(k_tiles), 1);
  auto& e = kp.epilogue;
  e.rows = device_side(a.rows), e.cols = device_side(a.cols);
  e.logit = device_logit_model<Input>(a.logit, a.rows, a.cols);
  e.row_terms = device_terms(a.row_terms), e.col_terms = device_terms(a.col_terms);
  e.filter_eps = a.filter_eps;
  e.col_begin = a.col_begin, e.col_end = a.col_end;
  e.G = static_cast<Input*>(a.G), e.GT = static_cast<Input*>(a.GT);
  e.g_factor = a.g_factor;
  constexpr CUtensorMapDataType type = StagedStore::type_of<Input>();
  if (a.G)
    if (int error = StagedStore::describe("tlse_hop_gradient: G", e.g_map, type, a.G, a.rows.count, width, a.ldg))
      return error;
  if (a.GT)
    if (int error = StagedStore::describe("tlse_hop_gradient: G^T", e.gt_map, type, a.GT, width, a.rows.count, a.ldgt))
      return error;
  e.tile_mask = a.filter_eps > 0.f ? a.tile_mask : nullptr;
  e.mask_ld = col_tiles;
  e.row_dot_sums = a.row_dot_sums, e.col_sums = a.col_sums;
  return launch("tlse_hop_gradient", kp, stream);
}

}  // namespace
}  // namespace tlse::hopper

using namespace tlse::hopper;

extern "C" int tlse_hop_gradient(tlse_hop_gradient_args* a, void* stream) {
  static constexpr const char* call = "tlse_hop_gradient";
  if (a == nullptr) return fail(TLSE_HOP_E_ARGUMENT, std::string(call) + ": args is NULL");
  return with_input_type(a->dtype, call, [&](auto input) {
    using Input = decltype(input);
    const int elem = int(sizeof(Input));
    if (int e = check_operand(call, "rows", a->rows.data, a->rows.count, a->depth, a->rows.ld, elem)) return e;
    if (int e = check_operand(call, "cols", a->cols.data, a->cols.count, a->depth, a->cols.ld, elem)) return e;
    if (a->col_begin < 0 || a->col_end > a->cols.count || a->col_begin >= a->col_end || a->col_begin % 8 != 0)
      return fail(TLSE_HOP_E_ARGUMENT, std::string(call) + ": panel [" + std::to_string(a->col_begin) + ", " +
                                           std::to_string(a->col_end) + ") is empty, outside [0, " +
                                           std::to_string(a->cols.count) + ") or does not start at a multiple of 8");
    if (a->G && (a->ldg < a->col_end - a->col_begin || a->ldg % 8 != 0 || reinterpret_cast<std::uintptr_t>(a->G) % 16))
      return fail(TLSE_HOP_E_ARGUMENT,
                  std::string(call) + ": G must be 16-byte aligned with ldg >= the panel width, a multiple of 8");
    if (a->GT && a->dtype != TLSE_HOP_TF32)
      return fail(TLSE_HOP_E_ARGUMENT,
                  std::string(call) + ": GT is written for TLSE_HOP_TF32 only (16-bit products read G transposed)");
    if (a->GT && (a->ldgt < a->rows.count || a->ldgt % 8 != 0 || reinterpret_cast<std::uintptr_t>(a->GT) % 16))
      return fail(TLSE_HOP_E_ARGUMENT,
                  std::string(call) + ": GT must be 16-byte aligned with ldgt >= the rows, a multiple of 8");
    if (a->filter_eps > 0.f && a->tile_mask == nullptr)
      return fail(TLSE_HOP_E_ARGUMENT, std::string(call) + ": filtering needs tile_mask");
    if (a->max_col_splits < 1) return fail(TLSE_HOP_E_ARGUMENT, std::string(call) + ": max_col_splits must be >= 1");
    // Every column of the panel takes x = scale * dot: the kernel without the general logit model;
    // or, for the row side alone with gradient filtering (the cross-entropy's default),
    // x = capped(scale * dot): that kernel's softcap variant; or x = scale * dot but on the excluded
    // diagonal, without filtering (the self-similarity form): its diagonal variant.
    const DeviceLogitModel<Input> model = device_logit_model<Input>(a->logit, a->rows, a->cols);
    const bool capped = a->row_terms.g != nullptr && a->col_terms.g == nullptr && a->filter_eps > 0.f &&
                        model.capped_cols >= a->col_end;
    const bool simple = model.all_simple(a->col_end);
    const auto s = static_cast<cudaStream_t>(stream);
    using V = GradientVariant;
    if (capped) return run_gradient<Input, V::Simple | V::Filter | V::Capped>(*a, s);
    if (model.simple_but_diagonal(a->col_end) && !(a->filter_eps > 0.f))
      return run_gradient<Input, V::Simple | V::Diagonal>(*a, s);
    if (!simple) return run_gradient<Input, V::General | V::Filter>(*a, s);
    return a->filter_eps > 0.f ? run_gradient<Input, V::Simple | V::Filter>(*a, s)
                               : run_gradient<Input, V::Simple>(*a, s);
  });
}
