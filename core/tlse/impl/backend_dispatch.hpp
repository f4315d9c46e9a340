#pragma once
// Where faster paths plug in (the kokkos-kernels "spec_avail" pattern): the generic kernels ask
// a trait on the execution space whether a specialization takes the call, and a backend adds
// one by specializing the trait in its own header, which the build registers in the generated
// <tlse/registered_backends.hpp> (backends/CMakeLists.txt), included at the end of this file.
// Without that header (headers used outside CMake) every call runs the generic kernels.
#include <tlse/impl/backward_request.hpp>
#include <tlse/impl/step_request.hpp>
#include <tlse/impl/tile_problem.hpp>
#include <tlse/options.hpp>

#include <cstddef>
#include <cstdlib>
#include <cstring>

namespace tlse::impl {

/// TLSE_GENERIC_ONLY=1 in the environment turns every specialization off, to compare a
/// specialization with the generic kernels (benchmarks, debugging). Read once.
inline bool specializations_enabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("TLSE_GENERIC_ONLY");
    return v == nullptr || std::strcmp(v, "1") != 0;
  }();
  return enabled;
}

/// Where a forward specialization writes the partial LSE states of one sweep over the tiles,
/// in the generic kernel's layout, and how many splits it may use.
template <class Acc>
struct ForwardPartials {
  Acc* rows;               // max, then sum: col_splits x rows.count
  Acc* cols;               // max, then sum: row_splits x cols.count; nullptr: no column LSE
  Acc* col_sums;           // row_splits x cols.count column logit sums; nullptr: not wanted
  index_t max_col_splits;  // column blocks, each giving every row one partial state
  index_t max_row_splits;  // row blocks, each giving every column one partial state
  index_t col_splits = 0, row_splits = 0;  // what `run` used
  // On request (non-null), per column split and row as the generic kernel gives them
  // (RowStatistics): the largest logit and its column id, and sum_j u_j x_ij. A specialization
  // that does not give them declines the call.
  Acc* row_best = nullptr;          // col_splits x rows.count
  int* row_best_id = nullptr;       // col_splits x rows.count
  Acc* row_weighted_sums = nullptr;  // col_splits x rows.count
  const Acc* col_weight = nullptr;   // u by column id, nullptr: 1
};

/// Forward LSE partials of the rows and, on request, of the columns from the same pass over the
/// tiles. `run` fills `parts` and returns true, or returns false to leave the call to the
/// generic kernel.
template <class Exec>
struct LseForwardSpecialization {
  template <class T, class Acc>
  static bool run(const Exec&, const TileProblem<T, Acc>&, ForwardPartials<Acc>&) {
    return false;
  }
};

/// What a backward's scratch is planned from: the stored rows of each side (a call may visit
/// fewer), the depth, the precision and the call's memory budget (which the fused
/// specialization plans within; the passes' scratch is what their kernels need).
struct BackwardShape {
  index_t rows = 0, cols = 0, depth = 0;
  Precision precision = Precision::exact;
  std::size_t memory_budget = memory_budget_default;
  bool accumulate = false;  // the call adds into the gradients (their storage holds nothing of its own)
};

/// The generic kernels' backward pass (lse_backward.hpp), which backends take as a pass's
/// description.
template <class T, class Acc, class Tile = GenericTile>
struct BackwardTiles;

/// One backward pass (a BackwardTiles functor `f`). `scratch_bytes` is what `run` needs in
/// f.scratch for a pass with `owned` x `other` rows; `run` returns false to leave the pass to
/// the generic kernel.
template <class Exec>
struct LseBackwardSpecialization {
  template <class T>
  static std::size_t scratch_bytes(const Exec&, index_t /*owned*/, index_t /*other*/, index_t /*depth*/,
                                   Precision) {
    return 0;
  }
  template <class F>
  static bool run(const Exec&, const F&) {
    return false;
  }
};

/// A whole backward step (a BackwardRequest: both gradients, dscale and dbias) in one go, before
/// the two passes are tried. `scratch_bytes` is its scratch for the shape, 0 when it does not take
/// such calls; `run` returns false to leave the step to the passes.
template <class Exec>
struct LseBackwardFusedSpecialization {
  template <class T>
  static std::size_t scratch_bytes(const Exec&, const BackwardShape&) {
    return 0;
  }
  template <class T, class Acc>
  static bool run(const Exec&, const BackwardRequest<T, Acc>&) {
    return false;
  }
};

/// A whole training step (a StepRequest: the row LSEs and the gradients) in one go, before the
/// forward and the backward are run one after the other. `scratch_bytes` is its scratch for the
/// shape, 0 when it does not take such calls; `run` returns false to leave the step to them.
template <class Exec>
struct LseStepSpecialization {
  template <class T>
  static std::size_t scratch_bytes(const Exec&, const BackwardShape&) {
    return 0;
  }
  template <class T, class Acc>
  static bool run(const Exec&, const StepRequest<T, Acc>&) {
    return false;
  }
};

/// What a distillation call's scratch is planned from: the stored rows (tokens), the columns
/// (vocabulary), both heads' depths and the call's memory budget.
struct DistillationShape {
  index_t rows = 0, cols = 0, depth_s = 0, depth_t = 0;
  std::size_t memory_budget = memory_budget_default;
};

/// A training step's shape (distillation_loss_with_gradients): also which row gradients it writes
/// and whether dWs's storage may hold what the forward keeps (dWs wanted, not added into).
struct DistillationStepShape : DistillationShape {
  bool dHs = true, dHt = false, dWs_storage = false;
};

/// The distillation's tile pairs (distillation_tiles.hpp): the whole forward in one sweep (a
/// PairStatisticsRequest), or the forward's divergence sums after the LSE sweeps (a
/// PairTermsRequest), the backward (a PairBackwardRequest) and the training step (a
/// PairStepRequest: the forward's sweep and the backward's, the second reusing what the first
/// keeps). `scratch_bytes` is the scratch a call carves for them (0: the generic kernels, which
/// need none); `step_kept_columns` the columns a step keeps the teacher's logits of (0: none, its
/// two sweeps cost what the two calls do); `statistics`, `terms`, `backward` and `step` return
/// false to leave the request to the generic kernels (the step: to the two calls).
template <class Exec>
struct DistillationSpecialization {
  template <class T>
  static std::size_t scratch_bytes(const Exec&, const DistillationShape&) {
    return 0;
  }
  template <class Request>
  static bool statistics(const Exec&, const Request&) {
    return false;
  }
  template <class Request>
  static bool terms(const Exec&, const Request&) {
    return false;
  }
  template <class Request>
  static bool backward(const Exec&, const Request&) {
    return false;
  }
  template <class T>
  static index_t step_kept_columns(const Exec&, const DistillationStepShape&) {
    return 0;
  }
  template <class Request>
  static bool step(const Exec&, const Request&) {
    return false;
  }
};

/// Scratch of the distillation's specialization for the shape within its budget (0: none).
template <class T, class Exec>
std::size_t distillation_scratch_bytes(const Exec& exec, const DistillationShape& shape) {
  if (!specializations_enabled()) return 0;
  return DistillationSpecialization<Exec>::template scratch_bytes<T>(exec, shape);
}

/// Scratch of a training step's specialization (0: the step runs as a forward and a backward).
template <class T, class Exec>
std::size_t step_scratch_bytes(const Exec& exec, const BackwardShape& shape) {
  if (!specializations_enabled()) return 0;
  return LseStepSpecialization<Exec>::template scratch_bytes<T>(exec, shape);
}

/// Scratch of the two backward passes (lse_backward_pass, run one after the other).
template <class T, class Exec>
std::size_t pass_scratch_bytes(const Exec& exec, const BackwardShape& shape) {
  if (!specializations_enabled()) return 0;
  using Spec = LseBackwardSpecialization<Exec>;
  const std::size_t by_rows =
      Spec::template scratch_bytes<T>(exec, shape.rows, shape.cols, shape.depth, shape.precision);
  const std::size_t by_cols =
      Spec::template scratch_bytes<T>(exec, shape.cols, shape.rows, shape.depth, shape.precision);
  return by_rows > by_cols ? by_rows : by_cols;
}

/// Scratch of the fused specialization for the shape within its budget; 0 when it does not take it.
template <class T, class Exec>
std::size_t fused_scratch_bytes(const Exec& exec, const BackwardShape& shape) {
  if (!specializations_enabled()) return 0;
  return LseBackwardFusedSpecialization<Exec>::template scratch_bytes<T>(exec, shape);
}

/// Scratch of a backward step (lse_backward), to carve from a call's workspace: the fused
/// specialization's when it takes the shape, else the passes'.
template <class T, class Exec>
std::size_t backward_scratch_bytes(const Exec& exec, const BackwardShape& shape) {
  const std::size_t fused = fused_scratch_bytes<T>(exec, shape);
  return fused > 0 ? fused : pass_scratch_bytes<T>(exec, shape);
}

}  // namespace tlse::impl

#if __has_include(<tlse/registered_backends.hpp>)
#include <tlse/registered_backends.hpp>
#endif
