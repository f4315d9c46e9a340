#pragma once
// How the backward on the Hopper kernels (hopper/backward.hpp) cuts a problem under a memory
// budget. It walks the columns in panels; per panel it recomputes the tiles once into
// G = scale * dL/dx (rows x panel, bf16) and multiplies G twice: dB_panel = G^T A is complete
// (every row is in the panel), dA += G B_panel goes to an fp32 accumulator (rows x depth) summed
// over the panels in order. 4 products per forward + backward step instead of 5, and among the
// panels the budget allows the one a wave model of the two products (cost()) finds fastest.
// Where the budget does not hold the accumulator, two passes on the same kernels (row_panel > 0):
// panels of rows, each recomputed against every column, give their rows' dA complete, then the
// column panels give dB without dA: 5 products, no accumulator.
// For float in TF32 (element 4) the same plans hold K-major copies besides, since wgmma reads TF32
// operands K-major only: G^T for dB (K = rows), the inputs transposed (A^T for dB; B_panel^T, or
// in the two passes B^T whole, for dA); G itself only where dA is summed from it.
// Where no plan holds its arrays whole (they grow with the rows, or in the row pass with the
// columns: contrastive B = 131072 in TF32 or 524288 in bf16 under 256 MiB), or where that lets the
// two passes' panels widen enough to pay for it, the products whose K is that long take it in
// blocks (row_block, col_block: halves, quarters, ... of the rows and columns), each block's G
// recomputed and multiplied in turn and the products summed over the blocks in order in fp32:
// the same flops and a fixed order, so still bitwise reproducible.
// Host arithmetic only, so that the host suite checks it.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <tlse/backends/cuda/launch_shape.hpp>
#include <tlse/impl/workspace_carver.hpp>

namespace tlse::impl::cuda {

struct FusedBackwardPlan {
  // The Hopper kernels' tiles (tlse_hopper.h) and the products' K step for bf16 (128 bytes).
  static constexpr std::int64_t TILE_M = 128, TILE_N = 256, K_STEP = 64;
  static constexpr int MAX_SWEEP_SPLITS = 16, MAX_K_SPLITS = 16;
  /// Past this many columns a wider panel saves nothing measurable (the accumulator's read and
  /// write per panel cost 2 / panel bytes per flop) and only takes memory.
  static constexpr std::int64_t MAX_PANEL = 16384;
  static constexpr std::int64_t BF16_BYTES = 2;

  std::int64_t rows = 0, cols = 0, depth = 0;
  std::int64_t element = BF16_BYTES;         // bytes of an operand element: 2 (bf16, fp16) or 4 (float in TF32)
  std::int64_t panel = 0, ldg = 0;           // panel width (a multiple of TILE_N unless it is every column)
  int k_splits_rows = 1, k_splits_cols = 1;  // of dA += G B_panel (K = panel) and dB = G^T A (K = rows)
  /// 0: dA summed over the column panels in the accumulator. Otherwise the two passes: panels
  /// of row_panel rows (a multiple of TILE_M, or every row) recomputed against every column into
  /// G (row_panel x ldg_rows), dA_panel = G B; then the column panels without dA.
  std::int64_t row_panel = 0, ldg_rows = 0;
  int k_splits_row_panel = 1;  // of dA_panel = G B (K = col_block)
  /// The K blocks (see the top): rows per block of the column panels' G and dB_panel = G^T A, and
  /// columns per block of the row panels' G and dA_panel = G B; every row / column where make()
  /// finds no reason for blocks. Multiples of TILE_M / TILE_N, so that a block's tiles are the
  /// whole problem's.
  std::int64_t row_block = 0, col_block = 0;
  std::size_t bytes = 0;                     // workspace of the plan
  bool fits = false;                         // within the budget

  std::int64_t row_tiles() const { return (rows + TILE_M - 1) / TILE_M; }
  std::int64_t panel_tiles() const { return (panel + TILE_N - 1) / TILE_N; }
  std::int64_t panels() const { return panel > 0 ? (cols + panel - 1) / panel : 0; }
  bool two_passes() const { return row_panel > 0; }
  bool row_blocks() const { return row_block < rows; }
  bool col_blocks() const { return col_block < cols; }
  bool tf32() const { return element == 4; }
  std::int64_t k_step() const { return 128 / element; }     // the products' K step: 128 bytes
  std::int64_t ldgt() const { return (row_block + 7) / 8 * 8; }  // of G^T and A^T (TF32): a block of rows

  /// K splits of a product with an M x N output over K, as libtiledlse_hopper chooses them (one
  /// CTA per SM; a split costs two K steps of partial writes and sums): up to MAX_K_SPLITS when the
  /// output has fewer tiles than the device has SMs, else up to `most_with_many_tiles` (by default
  /// none: a split's fp32 partial of the whole output costs memory that a better last wave does
  /// not repay, but for the training step's long dA product, StepPlan).
  static int product_k_splits(std::int64_t M, std::int64_t N, std::int64_t K, int sms, std::int64_t k_step,
                              int most_with_many_tiles = 1) {
    const std::int64_t out_tiles = ((M + TILE_M - 1) / TILE_M) * ((N + TILE_N - 1) / TILE_N);
    return balanced_splits(out_tiles, (K + k_step - 1) / k_step, out_tiles >= sms ? most_with_many_tiles : MAX_K_SPLITS,
                           sms, 2, 1);
  }
  int product_k_splits(std::int64_t M, std::int64_t N, std::int64_t K, int sms) const {
    return product_k_splits(M, N, K, sms, k_step());
  }

  /// fp16's factor of G, its inverse and the two sides' term bounds it comes from
  /// (hopper/backward.hpp): first in both passes' layouts, so that the passes share it.
  static constexpr std::int64_t FACTOR_FLOATS = 4;

  /// The arrays of the column panels, carved in this order (the sizes are worst cases: every
  /// output wanted, the columns visited through an index, so one plan serves every call of the
  /// shape; the two passes take no accumulator).
  struct Buffers {
    float* factor;        // FACTOR_FLOATS
    float* acc;           // rows x depth: dA, summed over the panels
    char* G;              // row_block x ldg elements (TF32 two passes: none, dB reads G^T)
    unsigned char* mask;  // row tiles x panel tiles: the tiles gradient filtering kept
    float* row_dot;       // MAX_SWEEP_SPLITS x row_block: a panel's row sums of dL/dz * dot (dscale)
    float* col_sums;      // row tiles x panel: a panel's column sums of dL/dz (dbias)
    char* panel_rows;     // panel x depth elements: the panel's columns gathered through the index
    int* panel_targets;   // rows: each row's target as a column of the gathered panel, or -1
    float* GT;            // TF32: panel x ldgt, G^T
    float* At;            // TF32: depth x ldgt, the rows transposed (dB's K-major operand)
    float* Bt;            // TF32 with the accumulator: depth x ldg, the panel's columns transposed
    float* panel_acc;     // with row blocks: panel x depth, dB_panel summed over the blocks
    int* ids;             // with row blocks: rows, 0, 1, ... (the blocks' row ids, as in the row pass)
    float* partials;      // the products' K-split partials
  };
  Buffers carve(WorkspaceCarver& c) const {
    Buffers b;
    b.factor = c.take<float>(FACTOR_FLOATS);
    b.acc = c.take<float>(two_passes() ? 0 : rows * depth);
    b.G = c.take<char>(tf32() && two_passes() ? 0 : row_block * ldg * element);
    b.mask = c.take<unsigned char>(row_tiles() * panel_tiles());
    b.row_dot = c.take<float>(MAX_SWEEP_SPLITS * row_block);
    b.col_sums = c.take<float>(row_tiles() * panel);
    b.panel_rows = c.take<char>(panel * depth * element);
    b.panel_targets = c.take<int>(rows);
    b.GT = c.take<float>(tf32() ? panel * ldgt() : 0);
    b.At = c.take<float>(tf32() ? depth * ldgt() : 0);
    b.Bt = c.take<float>(tf32() && !two_passes() ? depth * ldg : 0);
    b.panel_acc = c.take<float>(row_blocks() ? panel * depth : 0);
    b.ids = c.take<int>(row_blocks() ? rows : 0);
    b.partials = c.take<float>(partial_floats());
    return b;
  }
  std::int64_t partial_floats() const {
    return std::max<std::int64_t>(k_splits_rows > 1 ? k_splits_rows * row_block * depth : 0,
                                  k_splits_cols > 1 ? k_splits_cols * panel * depth : 0);
  }

  /// The arrays of the row panels (two passes), carved from the same base as the column
  /// panels' (one pass after the other): the plan takes the larger of the two.
  struct RowPanelBuffers {
    float* factor;        // FACTOR_FLOATS, where the column panels' is
    char* G;              // row_panel x ldg_rows elements
    unsigned char* mask;  // row tiles of a panel x column tiles of a block
    int* ids;             // rows: 0, 1, ..., the rows' ids as the gradient kernel reads them
    float* Bt;            // TF32: depth x ldg_rows, a block of columns transposed (dA's K-major operand)
    float* rows_acc;      // with column blocks: row_panel x depth, dA_panel summed over the blocks
    float* partials;      // dA_panel's K-split partials
  };
  RowPanelBuffers carve_row_panels(WorkspaceCarver& c) const {
    RowPanelBuffers b;
    b.factor = c.take<float>(FACTOR_FLOATS);
    b.G = c.take<char>(row_panel * ldg_rows * element);
    b.mask = c.take<unsigned char>((row_panel + TILE_M - 1) / TILE_M * ((col_block + TILE_N - 1) / TILE_N));
    b.ids = c.take<int>(rows);
    b.Bt = c.take<float>(tf32() ? depth * ldg_rows : 0);
    b.rows_acc = c.take<float>(col_blocks() ? row_panel * depth : 0);
    b.partials = c.take<float>(row_panel_partial_floats());
    return b;
  }
  std::int64_t row_panel_partial_floats() const {
    return k_splits_row_panel > 1 ? k_splits_row_panel * row_panel * depth : 0;
  }
  std::size_t row_panel_bytes() const {
    WorkspaceCarver sizing;
    carve_row_panels(sizing);
    return sizing.bytes();
  }

  /// The plan for `panel` columns per panel of operands of `element` bytes; with row_panel > 0,
  /// the two passes with that many rows per row panel, their products split (split) or not; K
  /// blocks of row_block rows and col_block columns (0: every row, every column).
  static FusedBackwardPlan with_panel(std::int64_t rows, std::int64_t cols, std::int64_t depth, std::int64_t panel,
                                      int sms, std::int64_t row_panel = 0, bool split = true,
                                      std::int64_t element = BF16_BYTES, std::int64_t row_block = 0,
                                      std::int64_t col_block = 0) {
    FusedBackwardPlan p;
    p.rows = rows, p.cols = cols, p.depth = depth, p.panel = panel, p.row_panel = row_panel;
    p.element = element;
    p.row_block = row_block > 0 && row_block < rows ? row_block : rows;
    p.col_block = col_block > 0 && col_block < cols ? col_block : cols;
    p.ldg = (panel + 7) / 8 * 8;
    p.k_splits_rows = row_panel > 0 ? 1 : p.product_k_splits(p.row_block, depth, panel, sms);
    p.k_splits_cols = split ? p.product_k_splits(panel, depth, p.row_block, sms) : 1;
    if (row_panel > 0) {
      p.ldg_rows = (p.col_block + 7) / 8 * 8;
      p.k_splits_row_panel = split ? p.product_k_splits(row_panel, depth, p.col_block, sms) : 1;
    }
    WorkspaceCarver sizing;
    p.carve(sizing);
    p.bytes = std::max(sizing.bytes(), row_panel > 0 ? p.row_panel_bytes() : 0);
    return p;
  }

  /// What an output tile of dA += G B_panel costs besides its K steps, in K steps: the fp32
  /// accumulator's read and write and the tile's pipeline start. Measured with a read-add-store
  /// epilogue, and kept for the one that adds with red.global, which costs less: the narrower
  /// panels that a smaller value makes the model pick ran slower where they differ
  /// (docs/notes/2026-11-23.md, "What an accumulating output tile costs: ACCUMULATE_STEPS").
  static constexpr std::int64_t ACCUMULATE_STEPS = 36;
  /// A launch's start and drain, in K steps (a few microseconds per kernel).
  static constexpr std::int64_t LAUNCH_STEPS = 8;
  /// Bytes HBM moves in one K step: what TF32's transpose of a block (read and written, 8 bytes an
  /// element) costs in K steps. A model, not a measurement (docs/notes/2026-11-28.md, "The bytes of
  /// a K step: BYTES_PER_STEP").
  static constexpr std::int64_t BYTES_PER_STEP = std::int64_t(3) << 20;
  /// The transpose of `count` operand rows that K blocks repeat (TF32 only), in K steps.
  std::int64_t block_transpose_steps(std::int64_t count) const {
    return tf32() ? count * depth * 8 / BYTES_PER_STEP : 0;
  }

  /// The time of a product with `out_tiles` output tiles over `k_steps` K steps in `splits` K
  /// splits on `sms` SMs, in K steps of one CTA: waves times the steps of one unit (a split adds
  /// its partial's write and sum, two steps).
  static std::int64_t product_steps(std::int64_t out_tiles, std::int64_t k_steps, int splits, int sms,
                                    std::int64_t tile_overhead) {
    const std::int64_t waves = (out_tiles * splits + sms - 1) / sms;
    return waves * ((k_steps + splits - 1) / splits + (splits > 1 ? 2 : 0) + tile_overhead);
  }

  /// Estimated time of the two products over every panel (and block of rows), in K steps of one
  /// CTA. The gradient kernel's sweep costs about the same at any width and is left out. What a
  /// width changes is how well dB's output tiles (panel / TILE_M x depth / TILE_N) fill the last
  /// wave, and how often dA's accumulator (and with blocks dB's) is read and written.
  std::int64_t cost(int sms) const {
    const std::int64_t depth_tiles = (depth + TILE_N - 1) / TILE_N;
    const auto panel_cost = [&](std::int64_t width) {
      const std::int64_t width_tiles = (width + TILE_M - 1) / TILE_M;
      return over_panels(rows, row_block, [&](std::int64_t height) {
        return product_steps(width_tiles * depth_tiles, (height + k_step() - 1) / k_step(),
                             product_k_splits(width, depth, height, sms), sms, row_blocks() ? ACCUMULATE_STEPS : 0) +
               product_steps((height + TILE_M - 1) / TILE_M * depth_tiles, (width + k_step() - 1) / k_step(),
                             product_k_splits(height, depth, width, sms), sms, ACCUMULATE_STEPS) +
               2 * LAUNCH_STEPS + (row_blocks() ? block_transpose_steps(height) : 0);
      });
    };
    return over_panels(cols, panel, panel_cost);
  }

  /// One sweep of the gradient kernel over every tile, in K steps of one CTA (a tile's logits
  /// cost what a product's output tile of the same K costs).
  std::int64_t sweep_steps(int sms) const {
    const std::int64_t tiles = row_tiles() * ((cols + TILE_N - 1) / TILE_N);
    return (tiles + sms - 1) / sms * ((depth + k_step() - 1) / k_step());
  }
  /// cost() or two_pass_cost() with the sweeps they leave out (one, or two): what plans of
  /// either kind are compared by where they differ in blocks.
  std::int64_t total_cost(int sms) const {
    return two_passes() ? two_pass_cost(sms) + 2 * sweep_steps(sms) : cost(sms) + sweep_steps(sms);
  }

  /// The two passes' products in K steps of one CTA, as cost(): dB per column panel, dA per row
  /// panel (the recomputing sweeps cost the same at any width and are left out).
  std::int64_t two_pass_cost(int sms) const {
    const std::int64_t depth_tiles = (depth + TILE_N - 1) / TILE_N;
    // A complete M x depth output over K in blocks of `block`, split at most `most_splits` ways.
    const auto complete = [&](std::int64_t M, std::int64_t K, std::int64_t block, int most_splits) {
      return over_panels(K, block, [&](std::int64_t k) {
        return product_steps((M + TILE_M - 1) / TILE_M * depth_tiles, (k + k_step() - 1) / k_step(),
                             std::min(most_splits, product_k_splits(M, depth, k, sms)), sms,
                             block < K ? ACCUMULATE_STEPS : 0) +
               2 * LAUNCH_STEPS + (block < K ? block_transpose_steps(k) : 0);
      });
    };
    return over_panels(cols, panel,
                       [&](std::int64_t width) { return complete(width, rows, row_block, k_splits_cols); }) +
           over_panels(rows, row_panel,
                       [&](std::int64_t height) { return complete(height, cols, col_block, k_splits_row_panel); });
  }

  /// The panel (up to MAX_PANEL) whose workspace fits `budget` and whose cost() is least, the
  /// wider one on a tie. Where no panel of min_one_pass_panel() columns fits with the accumulator,
  /// the two passes of least two_pass_cost() that fit, else the narrower one-pass panel. K blocks
  /// (of half the rows and columns, a quarter, ... down to one tile) are weighed where the plan
  /// without them is not one pass: among the two passes at every size of block the least costly
  /// (the blocks let the panels widen), and where nothing fits without blocks, the least
  /// total_cost() among the plans of either kind with blocks (per size of block, make_blocked's
  /// choice and the two passes); fits = false (and the narrowest plan) when nothing does.
  static FusedBackwardPlan make(std::int64_t rows, std::int64_t cols, std::int64_t depth, std::size_t budget, int sms,
                                std::int64_t element = BF16_BYTES);

  /// make()'s choice among the plans with K blocks of row_block rows and col_block columns.
  static FusedBackwardPlan make_blocked(std::int64_t rows, std::int64_t cols, std::int64_t depth, std::size_t budget,
                                        int sms, std::int64_t element, std::int64_t row_block, std::int64_t col_block);

  /// The two passes: the column panel and the row panel are chosen apart (they share the
  /// workspace one after the other), each the least costly that fits, split products first.
  static FusedBackwardPlan make_two_passes(std::int64_t rows, std::int64_t cols, std::int64_t depth, std::size_t budget,
                                           int sms, std::int64_t element = BF16_BYTES, std::int64_t row_block = 0,
                                           std::int64_t col_block = 0);

  /// TF32's one-pass plans narrower than this many columns (unless that is every column) lose to
  /// its two passes, which cost() does not see: per panel the sweep writes G and G^T in fp32 and
  /// the accumulator is read and written (docs/notes/2026-11-25.md, "Float in TF32 on the Hopper
  /// kernels").
  static constexpr std::int64_t MIN_TF32_PANEL = 1024;
  /// The same for bf16: per panel the accumulating product dA += G B_panel adds a whole rows x
  /// depth fp32 tile set (ACCUMULATE_STEPS a tile) for K = panel, so that narrower one-pass panels
  /// ran slower than the two passes that a smaller budget holds (docs/notes/2026-11-28.md, "A larger
  /// budget no longer runs slower: bf16 one-pass panels of fewer than 512 columns give way to the
  /// two passes").
  static constexpr std::int64_t MIN_BF16_PANEL = 512;
  /// One-pass panels narrower than this (unless that is every column) are taken only where the
  /// two passes do not fit.
  static std::int64_t min_one_pass_panel(std::int64_t cols, std::int64_t element) {
    return std::min(cols, element == 4 ? MIN_TF32_PANEL : MIN_BF16_PANEL);
  }

  /// Past this many rows a row panel's G (rows x every column) only takes memory: its product
  /// (K = every column) fills the device from a few hundred rows.
  static constexpr std::int64_t MAX_ROW_PANEL = 4096;

 private:
  struct Cheapest;  // defined below the class, which it holds
  /// The widest panel of n rows or columns to try: all of them up to one tile, else whole tiles
  /// covering them, at most `most`; then each narrower by a tile.
  static std::int64_t widest(std::int64_t n, std::int64_t tile, std::int64_t most) {
    return std::min(most, n <= tile ? n : (n + tile - 1) / tile * tile);
  }
  static std::int64_t narrower(std::int64_t width, std::int64_t tile) { return width > tile ? width - tile : 0; }
  /// K blocks of n rows or columns at halving `level`: all of them at 0, else n / 2^level rounded
  /// up to whole tiles, at least one tile (and at most n).
  static std::int64_t block_at(std::int64_t n, std::int64_t tile, int level) {
    const std::int64_t part = level == 0 ? n : ((n - 1) >> level) + 1;
    return std::min(n, std::max(tile, (part + tile - 1) / tile * tile));
  }
  /// The sum of one(width) over the panels of n (the last one partial).
  template <class One>
  static std::int64_t over_panels(std::int64_t n, std::int64_t width, const One& one) {
    const std::int64_t full = n / width, last = n - full * width;
    return full * one(width) + (last > 0 ? one(last) : 0);
  }
};

/// The least costly of the plans offered that fit the budget (the first on a tie), fits = true.
struct FusedBackwardPlan::Cheapest {
  FusedBackwardPlan plan;
  std::int64_t cost = 0;
  template <class Cost>
  void offer(FusedBackwardPlan p, std::size_t budget, const Cost& cost_of) {
    if (p.bytes > budget) return;
    p.fits = true;
    const std::int64_t c = cost_of(p);
    if (!plan.fits || c < cost) plan = p, cost = c;
  }
};

inline FusedBackwardPlan FusedBackwardPlan::make(std::int64_t rows, std::int64_t cols, std::int64_t depth,
                                                 std::size_t budget, int sms, std::int64_t element) {
  const FusedBackwardPlan whole = make_blocked(rows, cols, depth, budget, sms, element, rows, cols);
  if (whole.fits && !whole.two_passes()) return whole;
  // Against the whole two passes only other two passes (the same sweeps); where nothing fits
  // whole, both kinds, with their sweeps (blocks: the larger on a tie).
  const auto cost = [&](const FusedBackwardPlan& p) { return whole.fits ? p.two_pass_cost(sms) : p.total_cost(sms); };
  FusedBackwardPlan best = whole, last = whole;
  const auto offer = [&](const FusedBackwardPlan& p) {
    last = p;
    if (p.fits && (!best.fits || cost(p) < cost(best))) best = p;
  };
  for (int level = 1;; ++level) {
    const std::int64_t row_block = block_at(rows, TILE_M, level), col_block = block_at(cols, TILE_N, level);
    if (!whole.fits) offer(make_blocked(rows, cols, depth, budget, sms, element, row_block, col_block));
    offer(make_two_passes(rows, cols, depth, budget, sms, element, row_block, col_block));
    if (row_block <= TILE_M && col_block <= TILE_N) return best.fits ? best : last;
  }
}

inline FusedBackwardPlan FusedBackwardPlan::make_blocked(std::int64_t rows, std::int64_t cols, std::int64_t depth,
                                                         std::size_t budget, int sms, std::int64_t element,
                                                         std::int64_t row_block, std::int64_t col_block) {
  const std::int64_t wide = min_one_pass_panel(cols, element);
  Cheapest wide_best, narrow_best;
  for (std::int64_t panel = widest(cols, TILE_N, MAX_PANEL); panel > 0; panel = narrower(panel, TILE_N))
    (panel >= wide ? wide_best : narrow_best)
        .offer(with_panel(rows, cols, depth, std::min(panel, cols), sms, 0, true, element, row_block), budget,
               [&](const FusedBackwardPlan& p) { return p.cost(sms); });
  if (wide_best.plan.fits) return wide_best.plan;
  const FusedBackwardPlan two = make_two_passes(rows, cols, depth, budget, sms, element, row_block, col_block);
  return two.fits || !narrow_best.plan.fits ? two : narrow_best.plan;
}

inline FusedBackwardPlan FusedBackwardPlan::make_two_passes(std::int64_t rows, std::int64_t cols, std::int64_t depth,
                                                            std::size_t budget, int sms, std::int64_t element,
                                                            std::int64_t row_block, std::int64_t col_block) {
  const auto cost = [&](const FusedBackwardPlan& p) { return p.two_pass_cost(sms); };
  for (bool split : {true, false}) {
    // Columns first, with the narrowest row panel; then the row panel under that column panel.
    Cheapest columns;
    for (std::int64_t panel = widest(cols, TILE_N, MAX_PANEL); panel > 0; panel = narrower(panel, TILE_N))
      columns.offer(with_panel(rows, cols, depth, std::min(panel, cols), sms, std::min(rows, TILE_M), split, element,
                               row_block, col_block),
                    budget, cost);
    if (!columns.plan.fits) continue;
    Cheapest best;
    for (std::int64_t height = widest(rows, TILE_M, MAX_ROW_PANEL); height > 0; height = narrower(height, TILE_M))
      best.offer(with_panel(rows, cols, depth, columns.plan.panel, sms, std::min(height, rows), split, element,
                            row_block, col_block),
                 budget, cost);
    if (best.plan.fits) return best.plan;
  }
  return with_panel(rows, cols, depth, std::min(TILE_N, cols), sms, 0, true, element);  // fits = false
}

}  // namespace tlse::impl::cuda
