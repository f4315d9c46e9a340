#pragma once
// How the training step on the Hopper kernels (hopper/step.hpp: cross-entropy's loss and
// gradients in one call) cuts a problem under a memory budget. It takes 3 products where a
// forward followed by the fused backward takes 4: per chunk of rows, the forward keeps the
// chunk's exponentials (exp(x - s) in the input type, bf16 or fp16, chunk x V, s a shift per row
// or part of a tile) instead of having the backward recompute them; once the rows' LSEs are
// known, G is their row-scaled multiple (with a softcap, a pass turns them into G in place), then
// dA_chunk = G B is complete (every column is in the chunk) and dB (+)= G^T A_chunk. dB goes to an
// fp32 accumulator (cols x depth) summed over the chunks in order, unless one chunk holds every
// row. Under a budget that holds no chunk, or several whose accumulator costs more than the
// recomputation they save (kept_columns_first), KeptColumnsPlan keeps a part of the columns
// instead (below). Host arithmetic only, so that the host suite checks it.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <tlse/backends/cuda/hopper/backward_plan.hpp>
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
  std::int64_t ld_exponentials = 0;          // 16-bit values per row: cols rounded up to 8 (16-byte rows)
  int k_splits_rows = 1, k_splits_cols = 1;  // of dA = G B (K = cols) and dB (+)= G^T A (K = chunk)
  std::size_t bytes = 0;                     // workspace of the plan
  bool fits = false;                         // within the budget

  std::int64_t chunks() const { return chunk > 0 ? (rows + chunk - 1) / chunk : 0; }
  /// 16-bit elements per row of G or E': either overwrites the exponentials it comes from.
  std::int64_t ldg() const { return ld_exponentials; }
  /// Floats per row of shifts: one per column tile and quad lane (tlse_hopper.h).
  std::int64_t ld_shifts() const { return 4 * ((cols + FusedBackwardPlan::TILE_N - 1) / FusedBackwardPlan::TILE_N); }

  struct Buffers {
    float* factor;       // FACTOR_FLOATS: fp16's power of two for G and A', its inverse (hopper/step.hpp)
    void* exponentials;  // chunk x ld_exponentials (16-bit): the chunk's exponentials, then E' or G (ldg)
    float* shifts;       // chunk x ld_shifts: the shifts the exponentials are under (tlse_hop_kept_exponentials::shift)
    float* row_scale;    // chunk: G's row factors c (G = diag(c) E')
    float* partials;     // MAX_SWEEP_SPLITS x 2 x chunk: the forward's row LSE states
    char* chunk_rows;    // chunk x depth 16-bit: the chunk's rows gathered through the row index, then times c
    float* acc;          // cols x depth: dB over the chunks (only with several chunks)
    float* k_partials;   // the products' K-split partials
  };
  Buffers carve(WorkspaceCarver& c) const {
    Buffers b;
    b.factor = c.take<float>(FusedBackwardPlan::FACTOR_FLOATS);
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

  /// The plan of chunks of `chunk` rows; dA's product in one piece unless split_rows_product.
  static StepPlan with_chunk(std::int64_t rows, std::int64_t cols, std::int64_t depth, std::int64_t chunk, int sms,
                             bool split_rows_product = true) {
    StepPlan p;
    p.rows = rows, p.cols = cols, p.depth = depth, p.chunk = chunk;
    p.ld_exponentials = (cols + 7) / 8 * 8;
    // dA_chunk = G B runs K over every column (thousands of K steps): where its output has more
    // tiles than SMs, two splits when they fill the last wave better (N=8192 D=2304 V=256000: 576
    // tiles, 4.36 waves on 132 SMs, 8.73 in two). Never more than two there: more ran slower, the
    // units running together reading different K ranges (docs/notes/2026-11-28.md, "dE in two K
    // splits where its tiles leave the last wave short").
    p.k_splits_rows = split_rows_product
                          ? FusedBackwardPlan::product_k_splits(chunk, depth, cols, sms, FusedBackwardPlan::K_STEP, 2)
                          : 1;
    p.k_splits_cols = FusedBackwardPlan::product_k_splits(cols, depth, chunk, sms, FusedBackwardPlan::K_STEP);
    WorkspaceCarver sizing;
    p.carve(sizing);
    p.bytes = sizing.bytes();
    return p;
  }

  /// One chunk of every row when it fits `budget`, else the largest chunk (a multiple of TILE_M,
  /// at least MIN_CHUNK) that does; fits = false when none does. dA's product is split where
  /// product_k_splits says so and its partials fit too: a larger chunk comes first.
  static StepPlan make(std::int64_t rows, std::int64_t cols, std::int64_t depth, std::size_t budget, int sms) {
    if (rows <= 0 || cols <= 0 || depth <= 0) return StepPlan{};
    const auto fitting = [&](std::int64_t chunk, StepPlan& p) {
      for (const bool split : {true, false}) {
        p = with_chunk(rows, cols, depth, chunk, sms, split);
        if (p.bytes <= budget) return p.fits = true;
      }
      return false;
    };
    StepPlan p;
    if (fitting(rows, p)) return p;
    for (std::int64_t tiles = (rows - 1) / TILE_M; tiles * TILE_M >= MIN_CHUNK; --tiles)
      if (fitting(tiles * TILE_M, p)) return p;
    return StepPlan{};
  }
};

/// The step under a budget that holds no chunk of rows (StepPlan) but does hold the fused
/// backward's buffers, for a call that writes dA and dB (not adding into them): the forward keeps
/// the exponentials of the first `kept` columns only, in panels of `panel` columns, first in dB's
/// storage (cols x depth 16-bit, the caller's, written only at the end of its use here), then, as
/// far as the budget allows, in the workspace (the tail). Panel k's exponentials (rows x panel)
/// in dB's storage lie past dB's rows of panels 0..k, since dB_k = E_k'^T A' writes those rows
/// while it reads them: at panel x depth + k x stride, stride = panel x max(rows, depth) elements;
/// the tail's panels follow each other, rows x panel elements apart, and their dB_k overwrite only
/// panels already used. A' = diag(c) A lives in dA's storage until dA is written from the
/// accumulator. The kept columns take 3 products (the forward, dB_k, and their part of acc = the
/// sum of G_k B_k, one product over the panels in dB's storage and one over the tail's), the others
/// the fused backward's panels (4), which add into the same accumulator in order.
struct KeptColumnsPlan {
  static constexpr std::int64_t TILE_N = FusedBackwardPlan::TILE_N;
  static constexpr int MAX_SWEEP_SPLITS = FusedBackwardPlan::MAX_SWEEP_SPLITS;
  /// Below cols / MIN_KEPT_PART kept columns the recomputation saved no longer pays for the
  /// exponentials' pass over the rows and the extra products' launches.
  static constexpr std::int64_t MIN_KEPT_PART = 8;
  /// What a kept panel costs besides its products, in columns of recomputation: when each panel
  /// had its own accumulating product, its extra read and write of the rows x depth fp32
  /// accumulator (8 bytes per element at HBM's rate) against recomputing a column (2 flops per
  /// element at the tensor cores' rate) was 400-800 columns whatever the shape, plus two launches.
  /// A model (make()), not a measurement; not revised since the panels share one product.
  static constexpr std::int64_t PANEL_COST_COLS = 512;

  std::int64_t rows = 0, cols = 0, depth = 0;
  std::int64_t panel = 0;                    // kept columns per panel: a multiple of TILE_N
  std::int64_t kept = 0;                     // panels x panel, below cols
  std::int64_t panels_in_gradient = 0;       // the first kept panels, in dB's storage; the others in the tail
  FusedBackwardPlan panels;                  // for the columns past `kept`
  int k_splits_rows = 1, k_splits_cols = 1;  // of acc (+)= the panels' G_k B_k (at most) and dB_k (K = rows)
  std::size_t bytes = 0;                     // workspace of the plan
  bool fits = false;

  std::int64_t kept_panels() const { return panel > 0 ? kept / panel : 0; }
  std::int64_t tail_panels() const { return kept_panels() - panels_in_gradient; }
  /// Elements from a panel of exponentials in the tail to the next.
  std::int64_t tail_stride() const { return rows * panel; }
  std::int64_t ld_exponentials() const { return panel; }
  std::int64_t ld_shifts() const { return 4 * kept / TILE_N; }
  /// Elements from a panel of exponentials to the next: past the next panel's rows of dB.
  std::int64_t panel_stride() const { return panel * std::max(rows, depth); }
  /// Where the exponentials start in dB's storage, in elements: past dB's rows of the first panel.
  std::int64_t exponentials_offset() const { return panel * depth; }
  /// The columns kept in panels of `panel`: as many whole panels as fit in dB's storage.
  static std::int64_t kept_in_panels(std::int64_t rows, std::int64_t cols, std::int64_t depth, std::int64_t panel) {
    if (panel >= cols) return 0;
    return (cols - panel) * depth / (panel * std::max(rows, depth)) * panel;
  }

  struct Buffers {
    float* g;                           // rows: the rows' softmax weights g = coef (1 + 2 z lse), the panels' row terms
    FusedBackwardPlan::Buffers panels;  // its factor and accumulator first: dA over every column
    // Before the first panel, over the panels' arrays past the accumulator:
    float* shifts;      // rows x ld_shifts: the shifts the kept exponentials are under
    float* row_scale;   // rows: G's row factors c (G = diag(c) E')
    float* partials;    // MAX_SWEEP_SPLITS x 2 x rows: the forward's row LSE states
    float* k_partials;  // the kept products' K-split partials
    float* row_target_logit;  // rows: the target logits by row, where some rows are not scored
    void* tail;               // tail_panels x rows x panel (16-bit): the kept panels past dB's storage
  };
  Buffers carve(WorkspaceCarver& c) const {
    Buffers b;
    b.g = c.take<float>(rows);
    char* shared = c.take<char>(0);
    WorkspaceCarver panel_side(shared), kept_side(shared);
    b.panels = panels.carve(panel_side);
    carve_kept_side(kept_side, b);
    c.take<char>(std::int64_t(std::max(panel_side.bytes(), kept_side.bytes())));
    return b;
  }
  /// The arrays used before the fused backward's panels, over their space.
  void carve_kept_side(WorkspaceCarver& kept_side, Buffers& b) const {
    // The panels' factor and accumulator, carved first on both sides.
    kept_side.take<float>(FusedBackwardPlan::FACTOR_FLOATS);
    kept_side.take<float>(rows * depth);
    b.shifts = kept_side.take<float>(rows * ld_shifts());
    b.row_scale = kept_side.take<float>(rows);
    b.partials = kept_side.take<float>(std::int64_t(MAX_SWEEP_SPLITS) * 2 * rows);
    b.k_partials = kept_side.take<float>(k_partial_floats());
    b.row_target_logit = kept_side.take<float>(rows);
    b.tail = kept_side.take<std::uint16_t>(tail_panels() * tail_stride());
  }
  std::int64_t k_partial_floats() const {
    return std::max<std::int64_t>(k_splits_rows > 1 ? k_splits_rows * rows * depth : 0,
                                  k_splits_cols > 1 ? k_splits_cols * panel * depth : 0);
  }

  /// The plan keeping panels of `panel` columns, `in_gradient` of them in dB's storage and `tail`
  /// more in the workspace, its products split in K where few output tiles ask for it (split) or
  /// not, the panels' the one FusedBackwardPlan picks for the rest under what the budget leaves;
  /// fits = false where those are the two passes (no accumulator) or the whole exceeds the budget.
  static KeptColumnsPlan with_kept(std::int64_t rows, std::int64_t cols, std::int64_t depth, std::int64_t panel,
                                   std::int64_t in_gradient, std::int64_t tail, std::size_t budget, int sms,
                                   bool split = true) {
    KeptColumnsPlan p;
    p.rows = rows, p.cols = cols, p.depth = depth, p.panel = panel;
    p.kept = (in_gradient + tail) * panel, p.panels_in_gradient = in_gradient;
    if (split) {
      p.k_splits_rows = FusedBackwardPlan::product_k_splits(rows, depth, panel, sms, FusedBackwardPlan::K_STEP);
      p.k_splits_cols = FusedBackwardPlan::product_k_splits(panel, depth, rows, sms, FusedBackwardPlan::K_STEP);
    }
    WorkspaceCarver g_only;
    g_only.take<float>(rows);
    if (budget <= g_only.bytes()) return p;
    p.panels = FusedBackwardPlan::make(rows, cols - p.kept, depth, budget - g_only.bytes(), sms);
    WorkspaceCarver sizing;
    p.carve(sizing);
    p.bytes = sizing.bytes();
    p.fits = p.panels.fits && !p.panels.two_passes() && p.bytes <= budget;
    return p;
  }

  /// The panel width (up to FusedBackwardPlan::MAX_PANEL) whose kept columns in dB's storage
  /// save the most (the wider on a tie), then the most of its panels that fit there and the
  /// budget (at least cols / MIN_KEPT_PART columns), each with as many more in the tail as the
  /// budget holds (leaving at least one column to the fused backward), the products split or
  /// not, whichever keeps more columns (split on a tie: the splits' partials take space the
  /// tail could use); fits = false when none do. A kept column saves its recomputation but for
  /// what dB_k's last wave leaves idle (efficiency e: its tiles over whole waves of the device, 1
  /// where K splits fill it): 2 - 1/e columns' worth of products, less PANEL_COST_COLS per panel.
  static KeptColumnsPlan make(std::int64_t rows, std::int64_t cols, std::int64_t depth, std::size_t budget, int sms) {
    if (rows <= 0 || cols <= 0 || depth <= 0 || sms <= 0) return KeptColumnsPlan{};
    std::int64_t panel = 0;
    double best = 0;
    for (std::int64_t width = TILE_N; width <= FusedBackwardPlan::MAX_PANEL; width += TILE_N) {
      const std::int64_t kept = kept_in_panels(rows, cols, depth, width);
      const std::int64_t tiles = (width + FusedBackwardPlan::TILE_M - 1) / FusedBackwardPlan::TILE_M *
                                 ((depth + FusedBackwardPlan::TILE_N - 1) / FusedBackwardPlan::TILE_N);
      const double e = tiles < sms ? 1.0 : double(tiles) / double((tiles + sms - 1) / sms * sms);
      const double worth = double(kept) * (2 - 1 / e) - double(kept / width * PANEL_COST_COLS);
      if (kept > 0 && worth >= best) panel = width, best = worth;
    }
    if (panel == 0) return KeptColumnsPlan{};
    for (std::int64_t kept = kept_in_panels(rows, cols, depth, panel); kept > 0 && kept * MIN_KEPT_PART >= cols;
         kept -= panel) {
      KeptColumnsPlan best;
      for (bool split : {true, false}) {
        const KeptColumnsPlan p = with_kept(rows, cols, depth, panel, kept / panel, 0, budget, sms, split);
        if (!p.fits) continue;
        const KeptColumnsPlan longer = with_longest_tail(p, budget, sms, split);
        if (!best.fits || longer.kept > best.kept) best = longer;
      }
      if (best.fits) return best;
    }
    return KeptColumnsPlan{};
  }

 private:
  /// `p` (no tail, fits) with the longest tail that fits: what the budget leaves past g and the
  /// kept side's other arrays, in whole panels (the panels' side only shrinks with the columns
  /// it covers), then fewer while the whole does not fit.
  static KeptColumnsPlan with_longest_tail(const KeptColumnsPlan& p, std::size_t budget, int sms, bool split) {
    WorkspaceCarver kept_side;
    Buffers unused;
    p.carve_kept_side(kept_side, unused);
    const std::size_t before_tail =
        kept_side.bytes() + std::size_t(p.rows) * sizeof(float) + WorkspaceCarver::alignment;
    const std::int64_t panel_bytes = p.rows * p.panel * std::int64_t(sizeof(std::uint16_t));
    for (std::int64_t tail = std::min((p.cols - 1) / p.panel - p.panels_in_gradient,
                                      budget > before_tail ? std::int64_t(budget - before_tail) / panel_bytes : 0);
         tail > 0; --tail) {
      const KeptColumnsPlan longer =
          with_kept(p.rows, p.cols, p.depth, p.panel, p.panels_in_gradient, tail, budget, sms, split);
      if (longer.fits) return longer;
    }
    return p;
  }
};

/// Whether the step takes the kept columns (`kept`) rather than chunks of rows (`chunks`), both
/// planned for the same budget: where only one fits, that one; one chunk of every row, which has
/// no accumulator, whenever it fits; several chunks only where their accumulator costs less than
/// what the kept columns recompute. Several chunks read and write dB's fp32 accumulator once per
/// chunk ((2 chunks - 1) x cols x depth x 4 bytes: the first only writes), while the kept columns
/// recompute the columns past `kept` (a fourth product over rows x (cols - kept) x depth) and pay
/// PANEL_COST_COLS per kept panel. So a budget that holds a few chunks runs no slower than a
/// smaller one that holds only the kept columns (docs/notes/2026-12-06-budgets.md).
inline bool kept_columns_first(const StepPlan& chunks, const KeptColumnsPlan& kept) {
  if (!kept.fits) return false;
  if (!chunks.fits) return true;
  if (chunks.chunks() <= 1) return false;
  // Flops of the tensor cores per byte of HBM in the same time: about 750 TFLOP/s of bf16
  // products against 3.35 TB/s on an H100 (220), 4.8 TB/s on an H200 (155).
  constexpr double FLOPS_PER_HBM_BYTE = 200;
  const double accumulator =
      FLOPS_PER_HBM_BYTE * double(2 * chunks.chunks() - 1) * 4.0 * double(chunks.cols) * double(chunks.depth);
  const double recomputed_cols = double(kept.cols - kept.kept + kept.kept_panels() * KeptColumnsPlan::PANEL_COST_COLS);
  const double recomputation = 2.0 * double(kept.rows) * double(kept.depth) * recomputed_cols;
  return recomputation < accumulator;
}

}  // namespace tlse::impl::cuda
