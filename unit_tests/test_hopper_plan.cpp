// The plans of the fused Hopper backward (hopper/backward_plan.hpp) and training step (hopper/step_plan.hpp) are
// host arithmetic: checked here on every build, GPU or not. A plan must fit its budget, take the
// panel of least modelled cost among those that do, and size exactly what it carves.
#include <gtest/gtest.h>

#include <tlse/backends/cuda/hopper/backward_plan.hpp>
#include <tlse/backends/cuda/hopper/step_plan.hpp>

namespace {

using tlse::impl::cuda::FusedBackwardPlan;
constexpr int H200_SMS = 132;
constexpr std::size_t MiB = std::size_t(1) << 20;

TEST(HopperPlan, CheapestPanelWithinTheBudget) {
  struct Case {
    std::int64_t rows, cols, depth;
    std::size_t budget;
  };
  for (const Case c :
       {Case{8192, 128256, 4096, 256 * MiB}, Case{8192, 128256, 4096, 1024 * MiB}, Case{4096, 128256, 4096, 256 * MiB},
        Case{8192, 256000, 2304, 256 * MiB}, Case{65536, 65536, 512, 256 * MiB}, Case{1000, 777, 136, 64 * MiB},
        Case{300, 100, 64, 64 * MiB}}) {
    SCOPED_TRACE(std::to_string(c.rows) + " x " + std::to_string(c.cols) + " x " + std::to_string(c.depth) + ", " +
                 std::to_string(c.budget / MiB) + " MiB");
    const FusedBackwardPlan p = FusedBackwardPlan::make(c.rows, c.cols, c.depth, c.budget, H200_SMS);
    ASSERT_TRUE(p.fits);
    EXPECT_LE(p.bytes, c.budget);
    EXPECT_TRUE(p.panel == c.cols || p.panel % FusedBackwardPlan::TILE_N == 0) << p.panel;
    EXPECT_LE(p.panel, std::min(c.cols, FusedBackwardPlan::MAX_PANEL));
    EXPECT_EQ(p.ldg % 8, 0);
    EXPECT_GE(p.ldg, p.panel);
    // No width that fits costs less, and none wider costs as little.
    for (std::int64_t w = FusedBackwardPlan::TILE_N;
         w < c.cols + FusedBackwardPlan::TILE_N && w <= FusedBackwardPlan::MAX_PANEL; w += FusedBackwardPlan::TILE_N) {
      const auto other = FusedBackwardPlan::with_panel(c.rows, c.cols, c.depth, std::min(w, c.cols), H200_SMS);
      if (other.bytes > c.budget || other.panel == p.panel) continue;
      if (other.panel > p.panel)
        EXPECT_GT(other.cost(H200_SMS), p.cost(H200_SMS)) << other.panel;
      else
        EXPECT_GE(other.cost(H200_SMS), p.cost(H200_SMS)) << other.panel;
    }
    // What it sizes is what it carves.
    tlse::impl::WorkspaceCarver sizing;
    p.carve(sizing);
    EXPECT_EQ(sizing.bytes(), p.bytes);
    // The scratch sized for the budget gives the same plan back (the call plans from its scratch).
    const FusedBackwardPlan again = FusedBackwardPlan::make(c.rows, c.cols, c.depth, p.bytes, H200_SMS);
    EXPECT_EQ(again.panel, p.panel);
    EXPECT_EQ(again.bytes, p.bytes);
  }
}

TEST(HopperPlan, PanelWhoseOutputTilesFillTheWaves) {
  // N=8192 D=4096 V=128256 at 256 MiB: 5376 columns fit, but dB's 672 output tiles make 5.09
  // waves on 132 SMs (6 run); 5120 columns make 640 (4.85), one more panel, less time.
  const FusedBackwardPlan p = FusedBackwardPlan::make(8192, 128256, 4096, 256 * MiB, H200_SMS);
  EXPECT_EQ(p.panel, 5120);
  EXPECT_LT(p.cost(H200_SMS), FusedBackwardPlan::with_panel(8192, 128256, 4096, 5376, H200_SMS).cost(H200_SMS));
  EXPECT_LE(FusedBackwardPlan::with_panel(8192, 128256, 4096, 5376, H200_SMS).bytes, 256 * MiB);
}

TEST(HopperPlan, BudgetWithoutTheAccumulatorTakesTwoPasses) {
  struct Case {
    std::int64_t rows, cols, depth;
    std::size_t budget;
  };
  // The contrastive accumulator alone (65536 x 512 floats) is 128 MiB, the cross-entropy one
  // (8192 x 4096) too; 700 x 520 floats are 1.4 MiB.
  for (const Case c : {Case{65536, 65536, 512, 128 * MiB}, Case{8192, 128256, 4096, 128 * MiB},
                       Case{8192, 128256, 4096, 40 * MiB}, Case{700, 1500, 520, MiB}}) {
    SCOPED_TRACE(std::to_string(c.rows) + " x " + std::to_string(c.cols) + " x " + std::to_string(c.depth) + ", " +
                 std::to_string(c.budget) + " bytes");
    const FusedBackwardPlan p = FusedBackwardPlan::make(c.rows, c.cols, c.depth, c.budget, H200_SMS);
    ASSERT_TRUE(p.fits);
    EXPECT_TRUE(p.two_passes());
    EXPECT_LE(p.bytes, c.budget);
    EXPECT_TRUE(p.row_panel == c.rows || p.row_panel % FusedBackwardPlan::TILE_M == 0) << p.row_panel;
    EXPECT_LE(p.row_panel, FusedBackwardPlan::MAX_ROW_PANEL);
    EXPECT_EQ(p.ldg_rows % 8, 0);
    EXPECT_GE(p.ldg_rows, p.col_block);
    EXPECT_EQ(p.k_splits_rows, 1);  // no accumulator product
    // The two passes carve from the same base: the plan takes the larger, and both find fp16's
    // factor of G, computed once before the row panels, at the same place.
    tlse::impl::WorkspaceCarver columns;
    p.carve(columns);
    EXPECT_EQ(p.bytes, std::max(columns.bytes(), p.row_panel_bytes()));
    char* base = reinterpret_cast<char*>(std::uintptr_t(1) << 20);
    tlse::impl::WorkspaceCarver column_side(base), row_side(base);
    EXPECT_EQ(p.carve(column_side).factor, p.carve_row_panels(row_side).factor);
    // No row panel that fits under the same column panel costs less.
    for (std::int64_t h = FusedBackwardPlan::TILE_M; h <= std::min(c.rows, FusedBackwardPlan::MAX_ROW_PANEL);
         h += FusedBackwardPlan::TILE_M) {
      for (bool split : {true, false}) {
        const auto other = FusedBackwardPlan::with_panel(c.rows, c.cols, c.depth, p.panel, H200_SMS, h, split,
                                                         FusedBackwardPlan::BF16_BYTES, p.row_block, p.col_block);
        if (other.bytes <= c.budget) {
          EXPECT_GE(other.two_pass_cost(H200_SMS), p.two_pass_cost(H200_SMS)) << h;
        }
      }
    }
    // The scratch sized for the budget gives the same plan back.
    const FusedBackwardPlan again = FusedBackwardPlan::make(c.rows, c.cols, c.depth, p.bytes, H200_SMS);
    EXPECT_EQ(again.panel, p.panel);
    EXPECT_EQ(again.row_panel, p.row_panel);
    EXPECT_EQ(again.bytes, p.bytes);
  }
  // Where the accumulator fits, the fused plan.
  EXPECT_FALSE(FusedBackwardPlan::make(8192, 128256, 4096, 192 * MiB, H200_SMS).two_passes());
}

TEST(HopperPlan, BudgetBelowTheTwoPassesTakesKBlocks) {
  // One row panel of 128 rows against 128256 columns is 31 MiB of G alone: the row panels take
  // the columns in blocks (and the column panels the rows), whole tiles each.
  const FusedBackwardPlan p = FusedBackwardPlan::make(8192, 128256, 4096, 16 * MiB, H200_SMS);
  ASSERT_TRUE(p.fits);
  EXPECT_TRUE(p.two_passes());
  EXPECT_TRUE(p.col_blocks());
  EXPECT_EQ(p.col_block % FusedBackwardPlan::TILE_N, 0);
  EXPECT_TRUE(!p.row_blocks() || p.row_block % FusedBackwardPlan::TILE_M == 0) << p.row_block;
  EXPECT_LE(p.bytes, 16 * MiB);
  tlse::impl::WorkspaceCarver columns;
  p.carve(columns);
  EXPECT_EQ(p.bytes, std::max(columns.bytes(), p.row_panel_bytes()));
  const FusedBackwardPlan again = FusedBackwardPlan::make(8192, 128256, 4096, p.bytes, H200_SMS);
  EXPECT_EQ(again.panel, p.panel);
  EXPECT_EQ(again.row_panel, p.row_panel);
  EXPECT_EQ(again.row_block, p.row_block);
  EXPECT_EQ(again.col_block, p.col_block);
  // Below what one tile of each block takes, nothing fits.
  const FusedBackwardPlan none = FusedBackwardPlan::make(8192, 128256, 4096, MiB, H200_SMS);
  EXPECT_FALSE(none.fits);
  EXPECT_GT(none.bytes, MiB);
}

TEST(HopperPlan, KBlocksWhereTheWholeOperandsDoNotFit) {
  // The plans grow with the rows: contrastive B = 524288 in bf16 (G of 256 columns is 256 MiB) and
  // B = 131072 in TF32 (A^T is 256 MiB) fit 256 MiB only with K blocks; every K block but the last
  // is whole tiles, and the panels are wide ones.
  struct Case {
    std::int64_t rows;
    std::int64_t element;
  };
  for (const Case c : {Case{524288, 2}, Case{131072, 4}, Case{1048576, 2}, Case{1048576, 4}}) {
    SCOPED_TRACE(std::to_string(c.rows) + " rows, element " + std::to_string(c.element));
    const FusedBackwardPlan p = FusedBackwardPlan::make(c.rows, c.rows, 512, 256 * MiB, H200_SMS, c.element);
    ASSERT_TRUE(p.fits);
    EXPECT_TRUE(p.row_blocks());
    EXPECT_EQ(p.row_block % FusedBackwardPlan::TILE_M, 0);
    EXPECT_TRUE(!p.col_blocks() || p.col_block % FusedBackwardPlan::TILE_N == 0) << p.col_block;
    EXPECT_GE(p.panel, FusedBackwardPlan::min_one_pass_panel(c.rows, c.element));
    EXPECT_LE(p.bytes, 256 * MiB);
    tlse::impl::WorkspaceCarver columns;
    p.carve(columns);
    EXPECT_EQ(p.bytes, std::max(columns.bytes(), p.two_passes() ? p.row_panel_bytes() : 0));
    const FusedBackwardPlan again = FusedBackwardPlan::make(c.rows, c.rows, 512, p.bytes, H200_SMS, c.element);
    EXPECT_EQ(again.panel, p.panel);
    EXPECT_EQ(again.row_block, p.row_block);
    EXPECT_EQ(again.col_block, p.col_block);
    EXPECT_EQ(again.bytes, p.bytes);
  }
}

TEST(HopperPlan, KBlocksOnlyWhereTheyBeatTheWholePlan) {
  // Where one pass fits whole, no blocks (contrastive B = 65536 bf16 at 256 MiB, the
  // cross-entropy at 256 MiB); nor where the whole two passes cost least (B = 65536 at 128 MiB).
  EXPECT_FALSE(FusedBackwardPlan::make(65536, 65536, 512, 256 * MiB, H200_SMS).row_blocks());
  EXPECT_FALSE(FusedBackwardPlan::make(8192, 128256, 4096, 256 * MiB, H200_SMS).row_blocks());
  const FusedBackwardPlan two = FusedBackwardPlan::make(65536, 65536, 512, 128 * MiB, H200_SMS);
  EXPECT_TRUE(two.two_passes());
  EXPECT_FALSE(two.row_blocks() || two.col_blocks());
  // B = 262144 bf16 at 256 MiB: whole, G holds panels of 256 columns only; blocks of 131072 rows
  // let them widen, at less modelled cost.
  const FusedBackwardPlan whole =
      FusedBackwardPlan::make_blocked(262144, 262144, 512, 256 * MiB, H200_SMS, 2, 262144, 262144);
  const FusedBackwardPlan blocked = FusedBackwardPlan::make(262144, 262144, 512, 256 * MiB, H200_SMS);
  ASSERT_TRUE(whole.fits && whole.two_passes());
  ASSERT_TRUE(blocked.fits && blocked.two_passes());
  EXPECT_TRUE(blocked.row_blocks());
  EXPECT_GT(blocked.panel, whole.panel);
  EXPECT_LT(blocked.two_pass_cost(H200_SMS), whole.two_pass_cost(H200_SMS));
}

TEST(HopperPlan, OnePassInKBlocksWhereItsModelWins) {
  // Cross-entropy 1000 rows x 8000 classes x 64 in bf16 at 1752 KiB (a window of 1736-1776 KiB on
  // 132 SMs): the accumulator fits, G for every row against a panel does not, and one pass whose
  // column panels take the rows in blocks beats the two passes by make()'s model. The GPU test
  // CrossEntropy.BackwardInKBlocksUnderATinyBudget runs this shape and budget: this pins the kind
  // of plan it covers.
  const FusedBackwardPlan p = FusedBackwardPlan::make(1000, 8000, 64, 1752 << 10, H200_SMS);
  ASSERT_TRUE(p.fits);
  EXPECT_FALSE(p.two_passes());
  EXPECT_TRUE(p.row_blocks());
  EXPECT_FALSE(p.col_blocks());
  EXPECT_EQ(p.row_block % FusedBackwardPlan::TILE_M, 0);
  EXPECT_LE(p.bytes, std::size_t(1752) << 10);
  const FusedBackwardPlan again = FusedBackwardPlan::make(1000, 8000, 64, p.bytes, H200_SMS);
  EXPECT_EQ(again.panel, p.panel);
  EXPECT_EQ(again.row_block, p.row_block);
  EXPECT_EQ(again.bytes, p.bytes);
}

TEST(HopperPlan, SplitsOnlyProductsWithFewerTilesThanSMs) {
  // 8192 x 2304 outputs have 576 tiles: never split, whatever the panel (a split's partials
  // would be 72 MiB each).
  for (std::int64_t panel : {256, 1792, 8192})
    EXPECT_EQ(FusedBackwardPlan::with_panel(8192, 256000, 2304, panel, H200_SMS).k_splits_rows, 1);
}

TEST(HopperPlan, SplitsTheProductsThatHaveFewTiles) {
  // dB = G^T A of a narrow panel has few output tiles and a long K: split; dA has many tiles: not.
  const auto p = FusedBackwardPlan::with_panel(65536, 65536, 512, 1024, H200_SMS);
  EXPECT_EQ(p.k_splits_rows, 1);
  EXPECT_GT(p.k_splits_cols, 1);
  EXPECT_LE(p.k_splits_cols, FusedBackwardPlan::MAX_K_SPLITS);
  EXPECT_EQ(p.partial_floats(), std::int64_t(p.k_splits_cols) * 1024 * 512);
}

TEST(HopperPlan, KBlocksWeighBothKindsWithTheirSweeps) {
  // Contrastive B = 65536 in TF32 at 160 MiB: nothing fits whole; one pass fits only with blocks of
  // 512 rows (launch after launch of a few tiles), the two passes with blocks of 8192, several
  // times faster. One pass saves a sweep, which total_cost() counts, and loses it many times over
  // to its blocks. Measured:
  // docs/notes/2026-11-28.md, "K blocks: the Hopper backward where its operands do not fit whole (H200, 2026-11-28)"
  const FusedBackwardPlan p = FusedBackwardPlan::make(65536, 65536, 512, 160 * MiB, H200_SMS, 4);
  ASSERT_TRUE(p.fits);
  EXPECT_TRUE(p.two_passes());
  EXPECT_GE(p.row_block, 8192);
  const FusedBackwardPlan one = FusedBackwardPlan::make_blocked(65536, 65536, 512, 160 * MiB, H200_SMS, 4, 512, 512);
  ASSERT_TRUE(one.fits);
  EXPECT_FALSE(one.two_passes());
  EXPECT_LT(p.total_cost(H200_SMS), one.total_cost(H200_SMS));
  EXPECT_EQ(p.total_cost(H200_SMS), p.two_pass_cost(H200_SMS) + 2 * p.sweep_steps(H200_SMS));
}

TEST(HopperPlan, Tf32HoldsTheKMajorCopies) {
  // Contrastive B = 65536, c = 512 in TF32: A^T alone is 128 MiB, the accumulator another 128:
  // under 256 MiB the two passes (B^T in the row pass, A^T and G^T in the column pass), in K blocks
  // of the rows and columns, whose panels are wider than the whole two passes' 256 columns.
  const FusedBackwardPlan p = FusedBackwardPlan::make(65536, 65536, 512, 256 * MiB, H200_SMS, 4);
  ASSERT_TRUE(p.fits);
  EXPECT_TRUE(p.two_passes());
  EXPECT_TRUE(p.tf32());
  EXPECT_TRUE(p.row_blocks());
  EXPECT_GE(p.panel, FusedBackwardPlan::MIN_TF32_PANEL);
  EXPECT_EQ(p.k_step(), 32);
  EXPECT_LE(p.bytes, 256 * MiB);
  // Carved from a stand-in base (only the offsets are looked at): G^T and A^T of a block of rows,
  // no G, no B^T.
  tlse::impl::WorkspaceCarver carver(reinterpret_cast<char*>(std::uintptr_t(1) << 30));
  const FusedBackwardPlan::Buffers b = p.carve(carver);
  EXPECT_EQ(reinterpret_cast<char*>(b.mask), b.G);
  EXPECT_EQ(reinterpret_cast<char*>(b.panel_acc), reinterpret_cast<char*>(b.Bt));
  EXPECT_EQ(p.ldgt(), p.row_block);
  EXPECT_GE(reinterpret_cast<char*>(b.GT) - b.panel_rows, std::ptrdiff_t(p.panel * 512 * 4));
  EXPECT_GE(reinterpret_cast<char*>(b.At) - reinterpret_cast<char*>(b.GT), std::ptrdiff_t(p.panel * p.ldgt() * 4));
  EXPECT_GE(reinterpret_cast<char*>(b.Bt) - reinterpret_cast<char*>(b.At), std::ptrdiff_t(512 * p.ldgt() * 4));
  EXPECT_GE(p.row_panel_bytes(), std::size_t(512) * p.ldg_rows * 4);  // B^T of a block of columns
  // With room for the accumulator, A^T and B_panel^T: one pass.
  const FusedBackwardPlan fused = FusedBackwardPlan::make(65536, 65536, 512, 1024 * MiB, H200_SMS, 4);
  ASSERT_TRUE(fused.fits);
  EXPECT_FALSE(fused.two_passes());
  EXPECT_LE(fused.bytes, 1024 * MiB);
  // bf16 takes less: the same budget gives it a wider panel.
  EXPECT_GT(FusedBackwardPlan::make(65536, 65536, 512, 1024 * MiB, H200_SMS).panel, fused.panel);
  // Cross-entropy N = 8192, V = 128256 in TF32: the accumulator is 128 MiB and A^T another 128,
  // so under 256 MiB one pass fits only with K blocks of the rows.
  const FusedBackwardPlan ce = FusedBackwardPlan::make(8192, 128256, 4096, 256 * MiB, H200_SMS, 4);
  ASSERT_TRUE(ce.fits);
  EXPECT_TRUE(ce.row_blocks());
  EXPECT_FALSE(FusedBackwardPlan::make_blocked(8192, 128256, 4096, 256 * MiB, H200_SMS, 4, 8192, 128256).fits);
}

TEST(HopperPlan, Tf32PrefersTwoPassesToNarrowPanels) {
  // 512 MiB holds one pass with 256 columns a panel, but TF32's two passes with wide panels are
  // faster (MIN_TF32_PANEL); bf16 keeps the one pass.
  const FusedBackwardPlan tf32 = FusedBackwardPlan::make(65536, 65536, 512, 512 * MiB, H200_SMS, 4);
  ASSERT_TRUE(tf32.fits);
  EXPECT_TRUE(tf32.two_passes());
  EXPECT_GE(tf32.panel, FusedBackwardPlan::MIN_TF32_PANEL);
  EXPECT_FALSE(FusedBackwardPlan::make(65536, 65536, 512, 512 * MiB, H200_SMS).two_passes());
  // Where the two passes do not fit (B^T whole: 2.2 GiB), the narrow one-pass panel still runs.
  const FusedBackwardPlan narrow = FusedBackwardPlan::make(8192, 256000, 2304, 256 * MiB, H200_SMS, 4);
  ASSERT_TRUE(narrow.fits);
  EXPECT_FALSE(narrow.two_passes());
  EXPECT_LT(narrow.panel, FusedBackwardPlan::MIN_TF32_PANEL);
  // A problem narrower than MIN_TF32_PANEL takes every column in one pass.
  EXPECT_EQ(FusedBackwardPlan::make(900, 900, 520, 256 * MiB, H200_SMS, 4).panel, 900);
}

TEST(HopperPlan, Bf16PrefersTwoPassesToNarrowPanels) {
  // Contrastive B = 65536, c = 512: 192 MiB holds one pass with 256 columns a panel, slower than
  // the two passes (MIN_BF16_PANEL); 224 MiB holds 512 columns, faster; a problem narrower than
  // that takes every column in one pass.
  const FusedBackwardPlan two = FusedBackwardPlan::make(65536, 65536, 512, 192 * MiB, H200_SMS);
  ASSERT_TRUE(two.fits);
  EXPECT_TRUE(two.two_passes());
  EXPECT_LE(two.bytes, 192 * MiB);
  const FusedBackwardPlan one = FusedBackwardPlan::make(65536, 65536, 512, 224 * MiB, H200_SMS);
  ASSERT_TRUE(one.fits);
  EXPECT_FALSE(one.two_passes());
  EXPECT_GE(one.panel, FusedBackwardPlan::MIN_BF16_PANEL);
  EXPECT_EQ(FusedBackwardPlan::make(300, 300, 64, 256 * MiB, H200_SMS).panel, 300);
}

}  // namespace

// The training step's plan (hopper/step_plan.hpp): one chunk of every row when it fits, else the
// largest chunk of at least MIN_CHUNK rows that does, never past the budget.
namespace {

using tlse::impl::cuda::StepPlan;
constexpr std::size_t GiB = std::size_t(1) << 30;

TEST(HopperStepPlan, OneChunkWhenEveryRowFits) {
  // 4096 x 128256 exponentials are 0.98 GiB in fp16: every row in one chunk, no accumulator.
  const StepPlan p = StepPlan::make(4096, 128256, 4096, 3 * GiB, H200_SMS);
  ASSERT_TRUE(p.fits);
  EXPECT_EQ(p.chunk, 4096);
  EXPECT_EQ(p.chunks(), 1);
  EXPECT_LE(p.bytes, 3 * GiB);
  EXPECT_EQ(p.ld_exponentials % 8, 0);    // 16-byte rows of bf16
  EXPECT_EQ(p.ldg(), p.ld_exponentials);  // G (bf16) over the exponentials (bf16), in place
}

TEST(HopperStepPlan, ChunksOfRowsWithinTheBudget) {
  struct Case {
    std::int64_t rows, cols, depth;
    std::size_t budget;
  };
  for (const Case c : {Case{16384, 128256, 4096, 3 * GiB + GiB / 2}, Case{8192, 256000, 2304, 3 * GiB + GiB / 2},
                       Case{4500, 999, 72, 12 * MiB}, Case{100000, 32000, 1024, 2 * GiB}}) {
    SCOPED_TRACE(std::to_string(c.rows) + " x " + std::to_string(c.cols) + " x " + std::to_string(c.depth) + ", " +
                 std::to_string(c.budget / MiB) + " MiB");
    const StepPlan p = StepPlan::make(c.rows, c.cols, c.depth, c.budget, H200_SMS);
    ASSERT_TRUE(p.fits);
    EXPECT_LE(p.bytes, c.budget);
    EXPECT_GT(p.chunks(), 1);
    EXPECT_EQ(p.chunk % StepPlan::TILE_M, 0);
    EXPECT_GE(p.chunk, StepPlan::MIN_CHUNK);
    // The largest chunk that fits, with dA's product split or not.
    EXPECT_GT(StepPlan::with_chunk(c.rows, c.cols, c.depth, p.chunk + StepPlan::TILE_M, H200_SMS, false).bytes,
              c.budget);
    tlse::impl::WorkspaceCarver sizing;
    p.carve(sizing);
    EXPECT_EQ(sizing.bytes(), p.bytes);
    const StepPlan again = StepPlan::make(c.rows, c.cols, c.depth, p.bytes, H200_SMS);
    EXPECT_EQ(again.chunk, p.chunk);
  }
}

TEST(HopperStepPlan, SplitsTheRowsProductInTwoWhereTheLastWaveIsShort) {
  // dA = G B over every column: 8192 x 2304 has 576 output tiles, 4.36 waves on 132 SMs; in two
  // splits 8.73. 4096 x 4096 (3.88 waves) and 8192 x 4096 (7.76) gain nothing from a split.
  const StepPlan wide = StepPlan::make(8192, 256000, 2304, 9 * GiB, H200_SMS);
  ASSERT_TRUE(wide.fits);
  EXPECT_EQ(wide.chunk, 8192);
  EXPECT_EQ(wide.k_splits_rows, 2);
  EXPECT_EQ(wide.k_partial_floats(), std::int64_t(2) * 8192 * 2304);
  EXPECT_EQ(StepPlan::make(4096, 128256, 4096, 3 * GiB, H200_SMS).k_splits_rows, 1);
  EXPECT_EQ(StepPlan::make(8192, 128256, 4096, 4 * GiB, H200_SMS).k_splits_rows, 1);
  // A budget that holds the chunk but not the split's partials: the chunk, in one piece.
  const StepPlan whole = StepPlan::with_chunk(8192, 256000, 2304, 8192, H200_SMS, false);
  ASSERT_LT(whole.bytes, wide.bytes);
  const StepPlan tight = StepPlan::make(8192, 256000, 2304, whole.bytes, H200_SMS);
  ASSERT_TRUE(tight.fits);
  EXPECT_EQ(tight.chunk, 8192);
  EXPECT_EQ(tight.k_splits_rows, 1);
  EXPECT_EQ(tight.bytes, whole.bytes);
}

TEST(HopperStepPlan, NoPlanBelowTheSmallestChunk) {
  // The default 256 MiB holds 2048 x 128256 fp16 values (0.5 GiB) no more than the fp32 dC (2 GiB).
  EXPECT_FALSE(StepPlan::make(8192, 128256, 4096, 256 * MiB, H200_SMS).fits);
  EXPECT_FALSE(StepPlan::make(0, 10, 8, GiB, H200_SMS).fits);
}

// Below the chunks, the step keeps the exponentials of a prefix of the columns in dC's storage
// (hopper/step_plan.hpp, KeptColumnsPlan), in panels placed past dC's rows of each: as many as
// fit there, then as many as the budget leaves in the workspace (the tail), the fused backward's
// panels for the rest, within the budget.
using tlse::impl::cuda::KeptColumnsPlan;

TEST(HopperKeptColumnsPlan, TheIssueShapesAtTheDefaultBudget) {
  struct Case {
    std::int64_t rows, cols, depth, panel, in_gradient, kept;
  };
  // The width whose dC panel products fill whole waves of 132 SMs best (8448: 1056 tiles, 8
  // waves), about half the classes at N = 2 D in dC, 92% at N = D and one more panel (of the
  // 1.4 left) in the workspace; the unit test's shape in 5 panels and one in the workspace.
  for (const Case c : {Case{8192, 128256, 4096, 8448, 7, 59136}, Case{4096, 128256, 4096, 8448, 14, 126720},
                       Case{8192, 256000, 2304, 11264, 6, 67584}, Case{150, 12001, 136, 1792, 5, 10752}}) {
    const std::size_t budget = c.rows == 150 ? 3 * MiB : 256 * MiB;
    SCOPED_TRACE(std::to_string(c.rows) + " x " + std::to_string(c.cols) + " x " + std::to_string(c.depth));
    EXPECT_FALSE(StepPlan::make(c.rows, c.cols, c.depth, budget, H200_SMS).fits);
    const KeptColumnsPlan p = KeptColumnsPlan::make(c.rows, c.cols, c.depth, budget, H200_SMS);
    ASSERT_TRUE(p.fits);
    EXPECT_EQ(p.panel, c.panel);
    EXPECT_EQ(p.panels_in_gradient, c.in_gradient);
    EXPECT_EQ(p.kept, c.kept);
    EXPECT_EQ(p.panel % KeptColumnsPlan::TILE_N, 0);
    EXPECT_EQ(p.kept % p.panel, 0);
    // Panel k's exponentials lie past dC's rows of panels 0..k and within dC's cols x depth.
    for (std::int64_t k = 0; k < p.panels_in_gradient; ++k)
      EXPECT_GE(p.exponentials_offset() + k * p.panel_stride(), (k + 1) * p.panel * p.depth);
    EXPECT_GE(p.panel_stride(), p.rows * p.ld_exponentials());
    EXPECT_LE(p.exponentials_offset() + p.panels_in_gradient * p.panel_stride(), p.cols * p.depth);
    EXPECT_LE(p.bytes, budget);
    EXPECT_FALSE(p.panels.two_passes());
    EXPECT_EQ(p.panels.cols, c.cols - c.kept);
    tlse::impl::WorkspaceCarver sizing;
    p.carve(sizing);
    EXPECT_EQ(sizing.bytes(), p.bytes);
  }
}

TEST(HopperKeptColumnsPlan, SharesTheSpacePastTheAccumulator) {
  // The kept columns' arrays lie past the panels' accumulator, over the panels' other arrays.
  const KeptColumnsPlan p = KeptColumnsPlan::make(8192, 128256, 4096, 256 * MiB, H200_SMS);
  ASSERT_TRUE(p.fits);
  char* base = reinterpret_cast<char*>(std::uintptr_t(1) << 20);
  tlse::impl::WorkspaceCarver carver(base);
  const KeptColumnsPlan::Buffers b = p.carve(carver);
  const char* acc_end = reinterpret_cast<const char*>(b.panels.acc + p.rows * p.depth);
  EXPECT_LT(reinterpret_cast<const char*>(b.g), reinterpret_cast<const char*>(b.panels.acc));
  EXPECT_GE(reinterpret_cast<const char*>(b.shifts), acc_end);
  EXPECT_GE(reinterpret_cast<const char*>(b.row_scale),
            reinterpret_cast<const char*>(b.shifts + p.rows * p.ld_shifts()));
  EXPECT_LE(reinterpret_cast<const char*>(b.partials) + 2 * KeptColumnsPlan::MAX_SWEEP_SPLITS * p.rows * sizeof(float),
            reinterpret_cast<const char*>(b.row_target_logit));
  EXPECT_LE(reinterpret_cast<const char*>(b.row_target_logit + p.rows), base + p.bytes);
}

TEST(HopperKeptColumnsPlan, KeepsMorePanelsInTheWorkspaceAsTheBudgetGrows) {
  // N=8192 D=4096 V=128256: dC holds 7 panels of 8448; each 132 MiB more budget holds one more
  // panel in the workspace, up to every whole panel but the last columns (15 x 8448 = 126720: the
  // fused backward takes the other 1536) from 1.25 GiB; StepPlan's one chunk from 2.1 GiB.
  std::int64_t kept_before = 0;
  for (const std::size_t budget : {256 * MiB, 384 * MiB, 512 * MiB, 768 * MiB, GiB, 1280 * MiB, 2 * GiB}) {
    SCOPED_TRACE(std::to_string(budget / MiB) + " MiB");
    const KeptColumnsPlan p = KeptColumnsPlan::make(8192, 128256, 4096, budget, H200_SMS);
    ASSERT_TRUE(p.fits);
    EXPECT_EQ(p.panel, 8448);
    EXPECT_EQ(p.panels_in_gradient, 7);
    EXPECT_GE(p.kept, kept_before);
    EXPECT_LT(p.kept, p.cols);
    EXPECT_EQ(p.panels.cols, p.cols - p.kept);
    EXPECT_LE(p.bytes, budget);
    if (p.kept + p.panel < p.cols) {  // one more panel in the tail would not fit, split or not
      for (const bool split : {true, false})
        EXPECT_FALSE(KeptColumnsPlan::with_kept(8192, 128256, 4096, p.panel, p.panels_in_gradient, p.tail_panels() + 1,
                                                budget, H200_SMS, split)
                         .fits);
    }
    // The tail lies past the kept side's other arrays, after the accumulator, within the workspace.
    char* base = reinterpret_cast<char*>(std::uintptr_t(1) << 20);
    tlse::impl::WorkspaceCarver carver(base);
    const KeptColumnsPlan::Buffers b = p.carve(carver);
    EXPECT_GE(static_cast<const char*>(b.tail), reinterpret_cast<const char*>(b.row_target_logit + p.rows));
    EXPECT_GE(static_cast<const char*>(b.tail), reinterpret_cast<const char*>(b.panels.acc + p.rows * p.depth));
    EXPECT_LE(static_cast<const char*>(b.tail) + p.tail_panels() * p.tail_stride() * 2, base + p.bytes);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(b.tail) % 16, 0u);
    kept_before = p.kept;
  }
  EXPECT_EQ(kept_before, 126720);
  EXPECT_FALSE(StepPlan::make(8192, 128256, 4096, 2 * GiB, H200_SMS).fits);
}

TEST(HopperKeptColumnsPlan, PrefersMoreKeptColumnsToSplitProducts) {
  // 300 x 12001 x 136 under 6 MiB: the products' K splits (14 x 300 x 136 floats of partials)
  // would leave no room for the tail; unsplit, two panels of 3584 fit there besides dC's one.
  const KeptColumnsPlan p = KeptColumnsPlan::make(300, 12001, 136, 6 * MiB, H200_SMS);
  ASSERT_TRUE(p.fits);
  EXPECT_EQ(p.panels_in_gradient, 1);
  EXPECT_EQ(p.kept, 3 * p.panel);
  EXPECT_EQ(p.k_splits_rows, 1);
  EXPECT_LE(p.bytes, 6 * MiB);
}

TEST(HopperKeptColumnsPlan, NoneWhereLittleWouldBeKeptOrNothingFits) {
  // More rows than dC's storage holds a useful part of (under cols / 8 kept), a budget below
  // the fused backward's accumulator, or no shape.
  EXPECT_FALSE(KeptColumnsPlan::make(65536, 128256, 4096, 2048 * MiB, H200_SMS).fits);
  EXPECT_FALSE(KeptColumnsPlan::make(8192, 128256, 4096, 64 * MiB, H200_SMS).fits);
  EXPECT_FALSE(KeptColumnsPlan::make(0, 10, 8, 256 * MiB, H200_SMS).fits);
}

// Chunks of rows or kept columns, where a budget holds both (kept_columns_first): one chunk of
// every row always; several only where their fp32 accumulator of dC costs less than what the
// kept columns recompute.
using tlse::impl::cuda::kept_columns_first;

TEST(HopperStepPlanChoice, SeveralChunksOnlyWhereTheirAccumulatorCostsLess) {
  // N=8192 D=2304 V=256000 in 4 GiB: 3 chunks would read and write 2.2 GiB of accumulator each;
  // the kept columns recompute 3% of the columns.
  const StepPlan three = StepPlan::make(8192, 256000, 2304, 4 * GiB, H200_SMS);
  const KeptColumnsPlan most = KeptColumnsPlan::make(8192, 256000, 2304, 4 * GiB, H200_SMS);
  ASSERT_TRUE(three.fits && most.fits);
  EXPECT_EQ(three.chunks(), 3);
  EXPECT_GT(most.kept * 30, most.cols * 29);  // all but 3.2%
  EXPECT_TRUE(kept_columns_first(three, most));
  // In 6 GiB one chunk holds every row: no accumulator.
  const StepPlan one = StepPlan::make(8192, 256000, 2304, 6 * GiB, H200_SMS);
  ASSERT_EQ(one.chunks(), 1);
  EXPECT_FALSE(kept_columns_first(one, KeptColumnsPlan::make(8192, 256000, 2304, 6 * GiB, H200_SMS)));
  // N=16384 D=4096 V=32000 in 1 GiB: a small accumulator over 3 chunks against a quarter of the
  // columns recomputed.
  const StepPlan small_acc = StepPlan::make(16384, 32000, 4096, GiB, H200_SMS);
  const KeptColumnsPlan quarter = KeptColumnsPlan::make(16384, 32000, 4096, GiB, H200_SMS);
  ASSERT_TRUE(small_acc.fits && quarter.fits);
  EXPECT_EQ(small_acc.chunks(), 3);
  EXPECT_FALSE(kept_columns_first(small_acc, quarter));
  // Where one of them does not fit, the other.
  EXPECT_TRUE(kept_columns_first(StepPlan{}, most));
  EXPECT_FALSE(kept_columns_first(three, KeptColumnsPlan{}));
  EXPECT_FALSE(kept_columns_first(StepPlan{}, KeptColumnsPlan{}));
}

}  // namespace
