#pragma once
// The forward LSE on the Hopper kernels (libtiledlse_hopper, tlse_hop_lse_forward): one
// warp-specialized TMA + wgmma sweep gives the row LSE partials and, from the same tiles, the
// column LSE partials and column logit sums, in the layout lse_forward merges (ForwardPartials).
// The rows side may visit its stored rows through an index when the caller gives the inverse
// (Side::position): the kernel then sweeps every stored row and drops the ones without a position.
#if defined(TLSE_HAVE_HOPPER)
#include <tlse_hopper.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <tlse/backends/cuda/kernel_path.hpp>
#include <tlse/impl/tile_problem.hpp>
#include <type_traits>

namespace tlse::impl::cuda {

/// The dtype code of an input type, 0 when the Hopper kernels do not take it (float only with TF32).
template <class T>
int hopper_dtype(bool tf32) {
  if (std::is_same<T, bfloat16>::value) return TLSE_HOP_BF16;
  if (std::is_same<T, float16>::value) return TLSE_HOP_FP16;
  if (std::is_same<T, float>::value && tf32) return TLSE_HOP_TF32;
  return 0;
}

/// Throws with the library's reason when a Hopper call failed after the dispatch chose it.
inline void check_hopper(int status, const char* call) {
  if (status != TLSE_HOP_OK) throw std::runtime_error(std::string("tlse: ") + call + ": " + tlse_hop_error_string());
}

/// A side as the Hopper kernels see it. Rows through an index need its inverse (`position`);
/// columns through an index are not taken (the kernels read rows with TMA, which cannot gather).
template <class T>
bool hopper_side(const Side<T>& s, index_t depth, bool rows, tlse_hop_side& out) {
  if (reinterpret_cast<std::uintptr_t>(s.data) % 16 != 0 || (depth * index_t(sizeof(T))) % 16 != 0) return false;
  out = tlse_hop_side{s.data, depth, s.count, nullptr, nullptr, 0};
  if (s.index == nullptr) return true;
  if (!rows || s.position == nullptr) return false;
  out.count = s.stored;  // sweep the stored rows; ids are rows, outputs go to positions
  out.position = s.position;
  out.positions = s.count;
  return true;
}

template <class T>
tlse_hop_logit_model hopper_logit(const LogitModel<T, float>& m) {
  return tlse_hop_logit_model{m.scale,           m.col_bias,  m.softcap, m.exclude_diagonal ? 1 : 0,
                              m.diagonal_offset, m.valid_cols};
}

struct LseForwardHopper {
  /// Fills `parts` and returns true, or returns false when the problem does not qualify.
  template <class T>
  static bool run(cudaStream_t stream, const TileProblem<T, float>& prob, ForwardPartials<float>& parts) {
    tlse_hop_forward_args a{};
    a.dtype = hopper_dtype<T>(prob.tf32);
    if (a.dtype == 0 || prob.depth <= 0 || !hopper_side(prob.rows, prob.depth, true, a.rows) ||
        !hopper_side(prob.cols, prob.depth, false, a.cols))
      return false;
    a.depth = prob.depth;
    a.logit = hopper_logit(prob.logit);
    a.max_col_splits = parts.max_col_splits;
    a.max_row_groups = parts.max_row_splits;
    // Placeholders for the plan (it only looks at which outputs are wanted).
    a.row_partials.max = a.row_partials.sum = parts.rows;
    a.col_partials.max = a.col_partials.sum = parts.cols;
    a.col_partials.logit_sum = parts.col_sums;
    a.argmax.best = parts.row_best;
    a.argmax.best_col = parts.row_best_id;
    check_hopper(tlse_hop_lse_forward_plan(&a), "tlse_hop_lse_forward_plan");
    const index_t na = prob.rows.count, nb = prob.cols.count;
    a.row_partials.sum = parts.rows + a.col_splits * na;
    if (parts.cols) a.col_partials.sum = parts.cols + a.row_groups * nb;
    parts.col_splits = a.col_splits;
    parts.row_splits = a.row_groups;
    check_hopper(tlse_hop_lse_forward(&a, stream), "tlse_hop_lse_forward");
    return true;
  }
};

}  // namespace tlse::impl::cuda
#endif
