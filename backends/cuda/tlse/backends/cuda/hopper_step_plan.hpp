#pragma once
// How the training step on the Hopper kernels (hopper_step.hpp: cross-entropy's loss and
// gradients in one call) cuts a problem under a memory budget. It takes 3 products where a
// forward followed by the fused backward takes 4: per chunk of rows, the forward keeps the
// chunk's exponentials (bf16 exp(x - s), chunk x V, s a shift per row or part of a tile) instead
// of having the backward recompute them; once the rows' LSEs are known, G is their row-scaled
// multiple (with a softcap, a pass turns them into G in place), then dA_chunk = G B is complete
// (every column is in the chunk) and dB (+)= G^T A_chunk. dB goes to an fp32 accumulator (cols x depth)
// summed over the chunks in order, unless one chunk holds every row. Host arithmetic only, so
// that the host suite checks it.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <tlse/backends/cuda/hopper_backward_plan.hpp>
#include <tlse/impl/workspace_carver.hpp>

namespace tlse::impl::cuda {

struct StepPlan {
  static constexpr std::int64_t TILE_M = FusedBackwardPlan::TILE_M;
  /// Below this many rows per chunk the accumulator's read and write (8 bytes per element of dB
  /// per chunk, 4 / chunk bytes per flop of dB's product) cost more than the product saved:
  /// the fused backward is then the faster plan.
  static constexpr std::int64_t MIN_CHUNK = 2048;
  static constexpr int MAX_SWEEP_SPLITS = FusedBackwardPlan::MAX_SWEEP_SPLITS;

  std::int64_t rows = 0, cols = 0, depth = 0;
  std::int64_t chunk = 0;                    // rows per chunk: every row, or a multiple of TILE_M
  std::int64_t ld_exponentials = 0;          // bf16 values per row: cols rounded up to 8 (16-byte rows)
  int k_splits_rows = 1, k_splits_cols = 1;  // of dA = G B (K = cols) and dB (+)= G^T A (K = chunk)
  std::size_t bytes = 0;                     // workspace of the plan
  bool fits = false;                         // within the budget

  std::int64_t chunks() const { return chunk > 0 ? (rows + chunk - 1) / chunk : 0; }
  /// bf16 elements per row of G or E': either overwrites the exponentials it comes from.
  std::int64_t ldg() const { return ld_exponentials; }
  /// Floats per row of shifts: one per column tile and quad lane (tlse_hopper.h).
  std::int64_t ld_shifts() const { return 4 * ((cols + FusedBackwardPlan::TILE_N - 1) / FusedBackwardPlan::TILE_N); }

  struct Buffers {
    void* exponentials;  // chunk x ld_exponentials (bf16): the chunk's exponentials, then E' or G (ldg)
    float* shifts;       // chunk x ld_shifts: the shifts the exponentials are under (exponentials_shift)
    float* row_scale;    // chunk: G's row factors c (G = diag(c) E')
    float* partials;     // MAX_SWEEP_SPLITS x 2 x chunk: the forward's row LSE states
    char* chunk_rows;    // chunk x depth bf16: the chunk's rows gathered through the row index, then times c
    float* acc;          // cols x depth: dB over the chunks (only with several chunks)
    float* k_partials;   // the products' K-split partials
  };
  Buffers carve(WorkspaceCarver& c) const {
    Buffers b;
    b.exponentials = c.take<std::uint16_t>(chunk * ld_exponentials);
    b.shifts = c.take<float>(chunk * ld_shifts());
    b.row_scale = c.take<float>(chunk);
    b.partials = c.take<float>(std::int64_t(MAX_SWEEP_SPLITS) * 2 * chunk);
    b.chunk_rows = c.take<char>(chunk * depth * FusedBackwardPlan::BF16_BYTES);
    b.acc = c.take<float>(chunks() > 1 ? cols * depth : 0);
    b.k_partials = c.take<float>(k_partial_floats());
    return b;
  }
  std::int64_t k_partial_floats() const {
    return std::max<std::int64_t>(k_splits_rows > 1 ? k_splits_rows * chunk * depth : 0,
                                  k_splits_cols > 1 ? k_splits_cols * cols * depth : 0);
  }

  static StepPlan with_chunk(std::int64_t rows, std::int64_t cols, std::int64_t depth, std::int64_t chunk, int sms) {
    StepPlan p;
    p.rows = rows, p.cols = cols, p.depth = depth, p.chunk = chunk;
    p.ld_exponentials = (cols + 7) / 8 * 8;
    p.k_splits_rows = FusedBackwardPlan::product_k_splits(chunk, depth, cols, sms, FusedBackwardPlan::K_STEP);
    p.k_splits_cols = FusedBackwardPlan::product_k_splits(cols, depth, chunk, sms, FusedBackwardPlan::K_STEP);
    WorkspaceCarver sizing;
    p.carve(sizing);
    p.bytes = sizing.bytes();
    return p;
  }

  /// One chunk of every row when it fits `budget`, else the largest chunk (a multiple of TILE_M,
  /// at least MIN_CHUNK) that does; fits = false when none does.
  static StepPlan make(std::int64_t rows, std::int64_t cols, std::int64_t depth, std::size_t budget, int sms) {
    if (rows <= 0 || cols <= 0 || depth <= 0) return StepPlan{};
    StepPlan p = with_chunk(rows, cols, depth, rows, sms);
    if (p.bytes <= budget) {
      p.fits = true;
      return p;
    }
    for (std::int64_t tiles = (rows - 1) / TILE_M; tiles * TILE_M >= MIN_CHUNK; --tiles) {
      p = with_chunk(rows, cols, depth, tiles * TILE_M, sms);
      if (p.bytes <= budget) {
        p.fits = true;
        return p;
      }
    }
    return StepPlan{};
  }
};

}  // namespace tlse::impl::cuda
