#pragma once
// The plan of the mma.sync backward (mma/backward.hpp): how the passes, and the fused float
// backward, cut their chunks of owned rows and split their launches. Host arithmetic, checked on
// every build (unit_tests/test_mma_backward_plan.cpp).
#include <tlse/backends/cuda/launch_shape.hpp>
#include <tlse/backends/cuda/mma/tile_shape.hpp>
#include <tlse/impl/tile_problem.hpp>
#include <tlse/impl/workspace_carver.hpp>

#include <algorithm>
#include <cstddef>

namespace tlse::impl::cuda {

/// How one backward pass is cut: chunks of owned rows whose G buffer fits chunk_budget_bytes,
/// then sweep splits over the other side and K splits of the product, each chosen so that the
/// launch's last wave is full (balanced_splits). The fused backward (fused()) also holds G^T, and
/// takes the largest chunk whose buffers fit the call's memory budget.
struct BackwardPlan {
  static constexpr std::size_t chunk_budget_bytes = std::size_t(64) << 20;
  static constexpr index_t max_sweep_splits = 256, max_k_splits = 32;
  index_t ldp = 0, chunk = 0, elem_bytes = 2, col_tiles = 0, other = 0;
  index_t ldt = 0;  // G^T's row stride: the chunk (fused), or 0
  int sweep_splits = 1, k_splits = 1, col_tiles_per_split = 1, k_tiles_per_split = 1;

  /// The pass's plan.
  static BackwardPlan make(index_t owned, index_t other, index_t depth, int sms, index_t elem_bytes) {
    const index_t ldp = (other + 7) / 8 * 8;
    const index_t chunk = index_t(chunk_budget_bytes / (std::size_t(ldp) * elem_bytes)) / BM * BM;
    return with_chunk(owned, other, depth, sms, elem_bytes, chunk, false);
  }

  /// The fused backward's plan within `budget` bytes; chunk == 0 where not even one row tile fits.
  static BackwardPlan fused(index_t owned, index_t other, index_t depth, int sms, index_t elem_bytes,
                            std::size_t budget) {
    const index_t ldp = (other + 7) / 8 * 8;
    // G and G^T take 2 ldp elements a row; the partial sums of the K splits shrink the chunk further.
    index_t chunk = index_t(budget / (2 * std::size_t(ldp) * elem_bytes)) / BM * BM;
    chunk = std::min(chunk, (owned + BM - 1) / BM * BM);
    for (; chunk >= BM; chunk -= BM) {
      const BackwardPlan p = with_chunk(owned, other, depth, sms, elem_bytes, chunk, true);
      if (p.bytes(depth) <= budget) return p;
    }
    return BackwardPlan{};
  }

  struct Buffers {
    char *G, *Gt;
    float *part, *row_sums;
    unsigned char* tile_mask;
    float *row_scale, *other_bound;
  };
  Buffers carve(WorkspaceCarver& c, index_t depth) const {
    Buffers b;
    b.G = c.take<char>(ldp * chunk * elem_bytes);
    b.Gt = c.take<char>(ldt * other * elem_bytes);
    b.part = c.take<float>(k_splits > 1 ? k_splits * chunk * depth : 0);
    b.row_sums = c.take<float>(index_t(sweep_splits) * chunk);
    b.tile_mask = c.take<unsigned char>(chunk / BM * col_tiles);
    b.row_scale = c.take<float>(chunk);
    b.other_bound = c.take<float>(1);
    return b;
  }
  std::size_t bytes(index_t depth) const {
    WorkspaceCarver c;
    carve(c, depth);
    return c.bytes();
  }

 private:
  static BackwardPlan with_chunk(index_t owned, index_t other, index_t depth, int sms, index_t elem_bytes,
                                 index_t chunk, bool transposed) {
    BackwardPlan p;
    p.elem_bytes = elem_bytes;
    p.other = other;
    p.ldp = (other + 7) / 8 * 8;
    const index_t owned_rounded = (owned + BM - 1) / BM * BM;
    p.chunk = chunk < BM ? BM : chunk > owned_rounded ? owned_rounded : chunk;
    p.ldt = transposed ? p.chunk : 0;
    const index_t row_tiles = p.chunk / BM;
    p.col_tiles = (other + BN - 1) / BN;
    p.sweep_splits = balanced_splits(row_tiles, p.col_tiles, max_sweep_splits, sms);
    p.col_tiles_per_split = int((p.col_tiles + p.sweep_splits - 1) / p.sweep_splits);
    p.sweep_splits = int((p.col_tiles + p.col_tiles_per_split - 1) / p.col_tiles_per_split);
    const index_t out_tiles = row_tiles * ((depth + BN - 1) / BN);
    const index_t k_step = BK * 2 / elem_bytes, k_tiles = (other + k_step - 1) / k_step;
    // A K split adds an fp32 partial of the chunk's gradient rows to write and reduce: count it
    // as two K steps of the block.
    p.k_splits = balanced_splits(out_tiles, k_tiles, max_k_splits, sms, 2);
    p.k_tiles_per_split = int((k_tiles + p.k_splits - 1) / p.k_splits);
    p.k_splits = int((k_tiles + p.k_tiles_per_split - 1) / p.k_tiles_per_split);
    return p;
  }
};

}  // namespace tlse::impl::cuda
