// tlse_hop_lse_forward: the forward sweep (mainloop + LseForwardEpilogue) for bf16, fp16 and TF32.
#include <cstdlib>
#include <string>

#include "launch.cuh"
#include "lse_epilogue.cuh"

namespace tlse::hopper {
namespace {

/// CTAs per cluster of the rows-only forward: the pair shares its B tiles (TMA multicast), a third
/// fewer L2 reads per flop (TileConfig).
constexpr int FORWARD_CLUSTER_M = 2;

/// Row tiles per group and column tiles per split; fills a.col_splits and a.row_groups.
struct ForwardShape {
  int64_t row_tiles, col_tiles, per_group, per_split;
};

/// The kernel a forward takes. simple: every column takes x = scale * dot, or for the row LSE
/// alone x = capped(scale * dot), so the kernel needs no general logit model (whose per-entry ids,
/// bias and masks made the forward much slower under a softcap: docs/notes/2026-11-26.md, "The
/// softcap on the simple loops"). paired: the row LSE alone under the simple model, 16-bit inputs:
/// in clusters of two (TileConfig), unless TLSE_HOP_FORWARD=single.
struct ForwardKind {
  bool columns, simple, paired;
};

template <class Input>
ForwardKind forward_kind(const tlse_hop_forward_args& a) {
  ForwardKind k;
  k.columns = a.col_partials.max || a.col_partials.logit_sum;
  const DeviceLogitModel<Input> model = device_logit_model<Input>(a.logit, a.rows, a.cols);
  k.simple = model.all_simple(a.cols.count) || (!k.columns && model.capped_cols == a.cols.count);
  const char* forced = std::getenv("TLSE_HOP_FORWARD");
  k.paired = sizeof(Input) == 2 && !k.columns && k.simple && !(forced && std::string(forced) == "single");
  return k;
}

/// CTAs per cluster of the forward kernel, paired or not.
constexpr int forward_cluster(bool paired) { return paired ? FORWARD_CLUSTER_M : 1; }

/// The shape of a forward whose kernel keeps column states (columns) or not, in clusters of
/// `cluster` CTAs; sets a.col_splits and a.row_groups.
ForwardShape plan_forward(tlse_hop_forward_args& a, int64_t element_bytes, bool columns, int cluster) {
  ForwardShape s;
  s.row_tiles = (a.rows.count + TILE_M - 1) / TILE_M, s.col_tiles = (a.cols.count + TILE_N - 1) / TILE_N;
  s.per_group = 1;  // rows alone: a row tile a unit (in a cluster, one each of its CTAs)
  if (columns) {
    const int64_t groups = std::min<int64_t>(s.row_tiles, a.max_row_groups);
    s.per_group = (s.row_tiles + groups - 1) / groups;
  }
  // Every group has a first row tile.
  const int64_t groups = (s.row_tiles + s.per_group * cluster - 1) / (s.per_group * cluster);
  const int splits = sweep_splits(groups, s.col_tiles, a.max_col_splits, a.depth, element_bytes, cluster);
  s.per_split = (s.col_tiles + splits - 1) / splits;
  a.col_splits = (s.col_tiles + s.per_split - 1) / s.per_split;
  a.row_groups = groups;
  return s;
}

/// The columns whose exponentials are kept: those below kept.cols, or every one.
int64_t kept_columns(const tlse_hop_forward_args& a) { return a.kept.cols > 0 ? a.kept.cols : a.cols.count; }

/// The layers of the exponentials' TMA maps: the panels of kept.panel kept columns, or one
/// layer of them all without panels.
int64_t kept_layers(const tlse_hop_forward_args& a) {
  return a.kept.panel > 0 ? (kept_columns(a) + a.kept.panel - 1) / a.kept.panel : 1;
}

template <class Input, ForwardVariant Variant>
int run_forward(tlse_hop_forward_args& a, cudaStream_t stream) {
  constexpr int cluster = forward_cluster(has(Variant, ForwardVariant::Paired));
  using Config = TileConfig<MmaElement<Input>, false, false, cluster>;
  using Epilogue = LseForwardEpilogue<Input, Variant>;
  const ForwardShape s = plan_forward(a, sizeof(Input), Epilogue::Columns, cluster);
  const int64_t row_tiles = s.row_tiles, col_tiles = s.col_tiles, per_group = s.per_group, per_split = s.per_split;
  const int64_t k_tiles = (a.depth + Config::BK - 1) / Config::BK;

  KernelParams<Config, Epilogue> kp;
  kp.mainloop = {Config::tma_a(a.rows.data, a.rows.count, a.depth, a.rows.ld),
                 Config::tma_b(a.cols.data, a.cols.count, a.depth, a.cols.ld),
                 int32_t(a.rows.count),
                 int32_t(a.cols.count),
                 int32_t(a.depth),
                 0};
  kp.schedule = TileSchedule::make(int(row_tiles), int(col_tiles), int(k_tiles), int(per_group), int(per_split),
                                   int(k_tiles), 1, cluster);
  const int64_t kept = kept_columns(a);
  kp.epilogue = {device_side(a.rows),
                 device_side(a.cols),
                 device_logit_model<Input>(a.logit, a.rows, a.cols),
                 a.row_partials.max,
                 a.row_partials.sum,
                 a.col_partials.max,
                 a.col_partials.sum,
                 a.col_partials.logit_sum,
                 CUtensorMap{},
                 a.kept.shift,
                 4 * ((kept + TILE_N - 1) / TILE_N),
                 a.kept.row_shift,
                 kept,
                 int32_t(a.kept.panel > 0 ? a.kept.panel / TILE_N : col_tiles),
                 CUtensorMap{},
                 INT32_MAX,
                 a.argmax.best,
                 a.argmax.best_col};
  if constexpr (Epilogue::KeepExponentials) {
    // A three-dimensional map in every case: the panels are its layers (one without panels), and
    // the tail's panels those of a second map.
    const bool panels = a.kept.panel > 0;
    const int64_t layers = kept_layers(a);
    const int64_t first_layers = a.kept.tail ? a.kept.tail_panel : layers;
    if (first_layers > 0)
      if (int error = StagedStore::describe("tlse_hop_lse_forward: kept.data", kp.epilogue.exponentials_map,
                                            StagedStore::type_of<Input>(), a.kept.data, a.rows.count,
                                            panels ? a.kept.panel : kept, a.kept.ld, first_layers,
                                            panels ? a.kept.panel_stride : a.rows.count * a.kept.ld))
        return error;
    if (a.kept.tail) {
      kp.epilogue.exponentials_tail_panel = int32_t(a.kept.tail_panel);
      if (int error = StagedStore::describe("tlse_hop_lse_forward: kept.tail", kp.epilogue.exponentials_tail_map,
                                            StagedStore::type_of<Input>(), a.kept.tail, a.rows.count, a.kept.panel,
                                            a.kept.ld, layers - first_layers, a.rows.count * a.kept.ld))
        return error;
    }
  }
  return launch("tlse_hop_lse_forward", kp, stream);
}

}  // namespace
}  // namespace tlse::hopper

using namespace tlse::hopper;

namespace {
/// The checks both entry points share; 0 or the failure.
int check_forward(const char* call, const tlse_hop_forward_args* a, int elem) {
  if (int e = check_operand(call, "rows", a->rows.data, a->rows.count, a->depth, a->rows.ld, elem)) return e;
  if (int e = check_operand(call, "cols", a->cols.data, a->cols.count, a->depth, a->cols.ld, elem)) return e;
  if (!a->row_partials.max || !a->row_partials.sum)
    return fail(TLSE_HOP_E_ARGUMENT, std::string(call) + ": row_partials.max/sum is NULL");
  if ((a->col_partials.max == nullptr) != (a->col_partials.sum == nullptr))
    return fail(TLSE_HOP_E_ARGUMENT, std::string(call) + ": col_partials.max and col_partials.sum go together");
  if (a->kept.data && (a->dtype == TLSE_HOP_TF32 || a->col_partials.max || a->col_partials.logit_sum))
    return fail(TLSE_HOP_E_ARGUMENT,
                std::string(call) + ": exponentials are kept for bf16 and fp16 inputs without column outputs only");
  if (a->kept.data && a->dtype == TLSE_HOP_FP16 && a->kept.row_shift)
    return fail(TLSE_HOP_E_ARGUMENT, std::string(call) +
                                         ": fp16 exponentials are kept under shifts of their own (a power of two "
                                         "below each part's max), kept.row_shift must be NULL");
  if (a->kept.data && a->rows.position)
    return fail(TLSE_HOP_E_ARGUMENT, std::string(call) + ": exponentials are kept by row, rows.position must be NULL");
  if (a->kept.data && (a->kept.cols < 0 || a->kept.cols > a->cols.count || a->kept.cols % TILE_N != 0))
    return fail(TLSE_HOP_E_ARGUMENT, std::string(call) + ": kept.cols must be 0 or a multiple of " +
                                         std::to_string(TILE_N) + " up to cols.count (" +
                                         std::to_string(a->cols.count) + "), got " + std::to_string(a->kept.cols));
  if (a->kept.data && (a->kept.panel < 0 || a->kept.panel % TILE_N != 0))
    return fail(TLSE_HOP_E_ARGUMENT, std::string(call) + ": kept.panel must be 0 or a multiple of " +
                                         std::to_string(TILE_N) + ", got " + std::to_string(a->kept.panel));
  const int64_t row_values = a->kept.panel > 0 ? a->kept.panel : kept_columns(*a);
  if (a->kept.data &&
      (a->kept.ld < row_values || a->kept.ld % 8 != 0 || reinterpret_cast<std::uintptr_t>(a->kept.data) % 16 != 0))
    return fail(TLSE_HOP_E_ARGUMENT, std::string(call) +
                                         ": kept.data must be 16-byte aligned with kept.ld >= the kept "
                                         "columns of a row (or panel: " +
                                         std::to_string(row_values) + ") and a multiple of 8, got " +
                                         std::to_string(a->kept.ld));
  if (a->kept.data && a->kept.panel > 0 &&
      (a->kept.panel_stride < a->rows.count * a->kept.ld || a->kept.panel_stride % 8 != 0))
    return fail(TLSE_HOP_E_ARGUMENT, std::string(call) +
                                         ": kept.panel_stride must be a multiple of 8 of at "
                                         "least rows.count * kept.ld (" +
                                         std::to_string(a->rows.count * a->kept.ld) + "), got " +
                                         std::to_string(a->kept.panel_stride));
  if (a->kept.data && a->kept.tail) {
    const int64_t panels = a->kept.panel > 0 ? kept_layers(*a) : 0;
    if (panels == 0 || a->kept.tail_panel < 0 || a->kept.tail_panel >= panels ||
        reinterpret_cast<std::uintptr_t>(a->kept.tail) % 16 != 0)
      return fail(TLSE_HOP_E_ARGUMENT, std::string(call) +
                                           ": kept.tail takes panels (kept.panel > 0), 16-byte "
                                           "aligned, from kept.tail_panel in [0, " +
                                           std::to_string(panels) + "), got " + std::to_string(a->kept.tail_panel));
  }
  if ((a->argmax.best == nullptr) != (a->argmax.best_col == nullptr))
    return fail(TLSE_HOP_E_ARGUMENT, std::string(call) + ": argmax.best and argmax.best_col go together");
  if (a->argmax.best && (a->kept.data || a->col_partials.max || a->col_partials.logit_sum))
    return fail(TLSE_HOP_E_ARGUMENT, std::string(call) +
                                         ": the argmax (argmax.best) comes with the rows alone: no column outputs, no "
                                         "exponentials kept");
  if (a->kept.data && !a->kept.shift)
    return fail(TLSE_HOP_E_ARGUMENT,
                std::string(call) + ": exponentials are kept with their kept.shift, which is NULL");
  if (a->max_col_splits < 1 || a->max_row_groups < 1)
    return fail(TLSE_HOP_E_ARGUMENT, std::string(call) + ": max_col_splits and max_row_groups must be >= 1");
  return TLSE_HOP_OK;
}
}  // namespace

extern "C" int tlse_hop_lse_forward_plan(tlse_hop_forward_args* a) {
  static constexpr const char* call = "tlse_hop_lse_forward_plan";
  if (a == nullptr) return fail(TLSE_HOP_E_ARGUMENT, std::string(call) + ": args is NULL");
  return with_input_type(a->dtype, call, [&](auto input) {
    using Input = decltype(input);
    if (int e = check_forward(call, a, sizeof(Input))) return e;
    const ForwardKind kind = forward_kind<Input>(*a);
    plan_forward(*a, sizeof(Input), kind.columns, forward_cluster(kind.paired));
    return int(TLSE_HOP_OK);
  });
}

extern "C" int tlse_hop_lse_forward(tlse_hop_forward_args* a, void* stream) {
  static constexpr const char* call = "tlse_hop_lse_forward";
  if (a == nullptr) return fail(TLSE_HOP_E_ARGUMENT, std::string(call) + ": args is NULL");
  return with_input_type(a->dtype, call, [&](auto input) {
    using Input = decltype(input);
    if (int e = check_forward(call, a, sizeof(Input))) return e;
    const ForwardKind kind = forward_kind<Input>(*a);
    const bool columns = kind.columns, simple = kind.simple;
    const auto s = static_cast<cudaStream_t>(stream);
    using V = ForwardVariant;
    if (a->argmax.best) {  // rows alone (check_forward)
      if constexpr (sizeof(Input) == 2)
        if (kind.paired) return run_forward<Input, V::Paired | V::Simple | V::ArgMax>(*a, s);
      return simple ? run_forward<Input, V::Simple | V::ArgMax>(*a, s) : run_forward<Input, V::ArgMax>(*a, s);
    }
    if constexpr (sizeof(Input) == 2) {
      if (kind.paired)
        return a->kept.data ? run_forward<Input, V::Paired | V::Simple | V::KeepExponentials>(*a, s)
                            : run_forward<Input, V::Paired | V::Simple>(*a, s);
      if (a->kept.data)
        return simple ? run_forward<Input, V::Simple | V::KeepExponentials>(*a, s)
                      : run_forward<Input, V::KeepExponentials>(*a, s);
    }
    if (columns)
      return simple ? run_forward<Input, V::Columns | V::Simple>(*a, s) : run_forward<Input, V::Columns>(*a, s);
    return simple ? run_forward<Input, V::Simple>(*a, s) : run_forward<Input, V::RowsOnly>(*a, s);
  });
}
