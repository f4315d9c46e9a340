// The mma.sync backward's plan (mma/backward_plan.hpp) is host arithmetic: checked here on every
// build, GPU or not. The passes keep a chunk's G within 64 MiB; the fused float backward takes
// the largest chunk of whole row tiles whose buffers fit the call's budget, and none where one
// row tile does not fit.
#include <gtest/gtest.h>

#include <tlse/backends/cuda/mma/backward_plan.hpp>

#include <string>

namespace {

using tlse::impl::cuda::BackwardPlan;
using tlse::impl::cuda::BM;
constexpr int H100_SMS = 132;
constexpr std::size_t MiB = std::size_t(1) << 20;
constexpr std::int64_t FLOAT_BYTES = 4;

std::int64_t whole_row_tiles(std::int64_t rows) { return (rows + BM - 1) / BM * BM; }

TEST(MmaBackwardPlan, FusedTakesTheLargestChunkWithinTheBudget) {
  struct Case {
    std::int64_t rows, cols, depth;
    std::size_t budget;
    std::int64_t chunk;  // expected on 132 SMs
  };
  // The two exact-float benchmark cases (docs/notes/2026-12-07-float32-fused.md), the GPU tests'
  // chunked cases (8 and 3 MiB), a vocabulary of 70001, and rows fewer than a row tile's multiple.
  for (const Case c : {Case{4096, 65536, 2048, 256 * MiB, 384}, Case{65536, 65536, 512, 256 * MiB, 384},
                       Case{700, 1500, 520, 8 * MiB, 128}, Case{1000, 1000, 72, 3 * MiB, 128},
                       Case{300, 70001, 8, 256 * MiB, 384}, Case{129, 513, 4, 64 * MiB, 256}}) {
    SCOPED_TRACE(std::to_string(c.rows) + " x " + std::to_string(c.cols) + " x " + std::to_string(c.depth) + ", " +
                 std::to_string(c.budget / MiB) + " MiB");
    const BackwardPlan p = BackwardPlan::fused(c.rows, c.cols, c.depth, H100_SMS, FLOAT_BYTES, c.budget);
    EXPECT_EQ(p.chunk, c.chunk);
    EXPECT_EQ(p.chunk % BM, 0);
    EXPECT_LE(p.chunk, whole_row_tiles(c.rows));
    EXPECT_EQ(p.ldt, p.chunk);  // G^T holds every row of a chunk
    EXPECT_LE(p.bytes(c.depth), c.budget);
    // Largest: a byte less gives a smaller chunk (or none), a larger budget never a smaller one.
    EXPECT_LT(BackwardPlan::fused(c.rows, c.cols, c.depth, H100_SMS, FLOAT_BYTES, p.bytes(c.depth) - 1).chunk, p.chunk);
    EXPECT_GE(BackwardPlan::fused(c.rows, c.cols, c.depth, H100_SMS, FLOAT_BYTES, 2 * c.budget).chunk, p.chunk);
  }
}

TEST(MmaBackwardPlan, FusedNeedsOneRowTile) {
  // 1 MiB holds no 128 rows of G and G^T with the product's partial sums: the two passes run
  // (the GPU tests' BackwardInTwoPassesUnderASmallBudget).
  EXPECT_EQ(BackwardPlan::fused(900, 900, 520, H100_SMS, FLOAT_BYTES, 1 * MiB).chunk, 0);
  EXPECT_EQ(BackwardPlan::fused(700, 1500, 520, H100_SMS, FLOAT_BYTES, 1 * MiB).chunk, 0);
}

TEST(MmaBackwardPlan, PassesKeepAChunkOfGWithin64MiB) {
  for (const std::int64_t elem_bytes : {std::int64_t(2), FLOAT_BYTES}) {
    const BackwardPlan p = BackwardPlan::make(4096, 65536, 2048, H100_SMS, elem_bytes);
    EXPECT_EQ(p.chunk % BM, 0);
    EXPECT_EQ(p.ldt, 0);  // no G^T
    EXPECT_LE(std::size_t(p.ldp * p.chunk * elem_bytes), BackwardPlan::chunk_budget_bytes);
    EXPECT_GT(std::size_t(p.ldp * (p.chunk + BM) * elem_bytes), BackwardPlan::chunk_budget_bytes);
  }
  // A row of G beyond the 64 MiB still gets one row tile.
  EXPECT_EQ(BackwardPlan::make(1000, std::int64_t(1) << 25, 8, H100_SMS, FLOAT_BYTES).chunk, BM);
}

}  // namespace
