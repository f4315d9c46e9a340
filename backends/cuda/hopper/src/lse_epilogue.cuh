#pragma once
// Epilogue of the forward: each finished tile becomes logits (the logit model) and is folded into
// online LSE states. Rows: each thread keeps the state of its 2 rows over its 64 columns of every
// tile of the unit, and the quad merges them once, when the row tile is done (row_max/row_sum
// [column split][row]). Columns (Columns = true): per tile, the column max over the tile's 128
// rows (lanes by a reduce-scatter, then the 8 warps through shared memory), the sum of
// exponentials under it and the logit sum are merged into the column slot of the unit's row group,
// which no other unit touches (col_*[row group][col]); the group's first row tile writes it, and
// the slot a tile merges into is read before the tile's products run. No atomics. On request the
// logits themselves are stored too (float, by row, through StagedStore), for a training step that
// turns them into the gradient without recomputing the tiles.
#include "fragment_reductions.cuh"
#include "staged_store.cuh"

namespace tlse::hopper {

template <class T>
struct LseForwardParams {
  DeviceSide rows, cols;
  DeviceLogitModel<T> logit;
  float *row_max, *row_sum;
  float *col_max, *col_sum, *col_logit_sum;
  CUtensorMap logits_map;  // the kept logits (float, rows x cols), with Logits only
};

/// General: some tile may need the general logit model (bias, softcap, masks, column ids). Without
/// it every column takes x = scale * dot (the host checked that the model is that simple for all
/// of them), and the kernel has no general path: that path's register demand made ptxas spill
/// about 1 KB per thread into the code every tile runs.
template <class T, bool Columns, bool Logits = false, bool General = true>
struct LseForwardEpilogue {
  using Params = LseForwardParams<T>;
  struct NoStaging {};
  struct SharedStorage {
    float max[Columns ? 8 : 1][TILE_N], sum[Columns ? 8 : 1][TILE_N], total[Columns ? 8 : 1][TILE_N];
    float tile_max[Columns ? TILE_N : 1];
    std::conditional_t<Logits, StagedStore::Storage, NoStaging> staged;  // the logits' boxes on their way out
  };
  static constexpr int ROWS = Fragment::ROWS;

  const Params& p;
  SharedStorage& s;
  int ct;
  float run_max[ROWS], run_sum[ROWS];
  float slot_max = NEG_INF, slot_sum = 0.f, slot_total = 0.f;  // column ct's slot before this tile

  __device__ LseForwardEpilogue(const Params& params, SharedStorage& storage, int consumer_thread)
      : p(params), s(storage), ct(consumer_thread) {}

  __device__ static bool keep(const Params&, int, int) { return true; }

  /// Before tile (m, n)'s products: column ct's slot as the unit's earlier row tiles left it (the
  /// load's latency hides behind the products).
  __device__ void prefetch(const WorkUnit& w, int m, int n) {
    if constexpr (Columns) {
      const int64_t col = int64_t(n) * TILE_N + ct;
      slot_max = NEG_INF, slot_sum = 0.f, slot_total = 0.f;
      if (m == w.m_begin || col >= p.cols.count) return;
      const int64_t slot = int64_t(w.m_unit) * p.cols.count + col;
      if (p.col_max) slot_max = p.col_max[slot], slot_sum = p.col_sum[slot];
      if (p.col_logit_sum) slot_total = p.col_logit_sum[slot];
    }
  }

  __device__ void begin_row(const Fragment&, const WorkUnit&, int) {
#pragma unroll
    for (int r = 0; r < ROWS; ++r) run_max[r] = NEG_INF, run_sum[r] = 0.f;
  }

  template <class Acc>
  __device__ void tile(Acc& acc, const Fragment& c, const WorkUnit& w, int m, int n) {
    const int64_t row0 = int64_t(m) * TILE_M, col0 = int64_t(n) * TILE_N;
    if constexpr (General) {
      if (p.logit.simple_columns(col0, TILE_N))
        rows<true>(acc, c, row0, col0);
      else
        rows<false>(acc, c, row0, col0);
    } else {
      if (col0 + TILE_N <= p.cols.count)
        rows<true>(acc, c, row0, col0);
      else
        rows<true, true>(acc, c, row0, col0);  // the last column tile: past the columns is -inf
    }
    if constexpr (Logits)
      StagedStore::put_rows<float>(s.staged, ct >> 5, ct & 31, p.logits_map, m, n, c,
                                   [&](int r, int j) { return Fragment::at(acc, r, j); });
    if constexpr (Columns) columns(acc, c, w, m, col0);
  }

  /// Turns the tile into logits (Simple: columns of a simple model, x = scale * dot; Edge: some
  /// lie past the columns) and folds each of the thread's rows into its running state; a row that
  /// takes no part becomes -inf.
  template <bool Simple, bool Edge = false, class Acc>
  __device__ __forceinline__ void rows(Acc& acc, const Fragment& c, int64_t row0, int64_t col0) {
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      const int64_t row = row0 + c.row(r);
      const bool row_ok = p.rows.output(row) >= 0;
      const int64_t rid = row_ok ? p.rows.id(row) : 0;
      float mx = NEG_INF;
#pragma unroll
      for (int j = 0; j < Fragment::COLS; ++j) {
        float& x = Fragment::at(acc, r, j);
        if constexpr (Simple) {
          x = row_ok && (!Edge || col0 + c.col(j) < p.cols.count) ? x * p.logit.scale : NEG_INF;
          mx = fmaxf(mx, x);  // a NaN is dropped here but poisons the sum below
        } else {
          const int64_t col = col0 + c.col(j);
          x = row_ok && col < p.cols.count ? p.logit(x, rid, p.cols.id(col)) : NEG_INF;
          mx = nan_max(mx, x);
        }
      }
      if (mx == NEG_INF) continue;
      float sum = 0.f;
#pragma unroll
      for (int j = 0; j < Fragment::COLS; ++j) sum += exp_shifted(Fragment::at(acc, r, j), mx);
      lse_merge(run_max[r], run_sum[r], mx, sum);
    }
  }

  /// acc holds logits now. Shared memory: s.max is read before the second barrier, s.tile_max,
  /// s.sum and s.total after it, by thread ct for column ct only after the third; the next tile
  /// writes s.max only after its products, s.sum and s.total after its second barrier.
  template <class Acc>
  __device__ void columns(const Acc& acc, const Fragment& c, const WorkUnit& w, int m, int64_t col0) {
    const int warp = ct >> 5, lane = ct & 31, first = scatter_first_column(lane);
    const bool want_lse = p.col_max != nullptr, want_total = p.col_logit_sum != nullptr;
    float part[8];
    if (want_lse) {
      column_lanes_scatter([&](int j) { return nan_max(Fragment::at(acc, 0, j), Fragment::at(acc, 1, j)); },
                           nan_max, lane, part);
#pragma unroll
      for (int k = 0; k < 8; ++k) s.max[warp][c.col(first + k)] = part[k];
      consumer_sync();
      float mx = s.max[0][ct];
#pragma unroll
      for (int q = 1; q < CONSUMER_THREADS / 32; ++q) mx = nan_max(mx, s.max[q][ct]);
      s.tile_max[ct] = mx;
      consumer_sync();
      column_lanes_scatter(
          [&](int j) {
            const float mx = s.tile_max[c.col(j)];
            return mx == NEG_INF ? 0.f
                                 : exp_shifted(Fragment::at(acc, 0, j), mx) + exp_shifted(Fragment::at(acc, 1, j), mx);
          },
          add, lane, part);
#pragma unroll
      for (int k = 0; k < 8; ++k) s.sum[warp][c.col(first + k)] = part[k];
    } else {
      consumer_sync();  // no barrier above: every thread is done reading the previous tile's totals
    }
    if (want_total) {
      const auto finite = [](float x) { return x != NEG_INF ? x : 0.f; };
      column_lanes_scatter(
          [&](int j) { return finite(Fragment::at(acc, 0, j)) + finite(Fragment::at(acc, 1, j)); }, add, lane, part);
#pragma unroll
      for (int k = 0; k < 8; ++k) s.total[warp][c.col(first + k)] = part[k];
    }
    consumer_sync();
    const int64_t col = col0 + ct;
    if (col >= p.cols.count) return;
    const int64_t slot = int64_t(w.m_unit) * p.cols.count + col;
    if (want_lse) {
      float sum = 0.f;
#pragma unroll
      for (int q = 0; q < CONSUMER_THREADS / 32; ++q) sum += s.sum[q][ct];
      lse_merge(slot_max, slot_sum, s.tile_max[ct], sum);
      p.col_max[slot] = slot_max, p.col_sum[slot] = slot_sum;
    }
    if (want_total) {
#pragma unroll
      for (int q = 0; q < CONSUMER_THREADS / 32; ++q) slot_total += s.total[q][ct];
      p.col_logit_sum[slot] = slot_total;
    }
  }

  __device__ void end_row(const Fragment& c, const WorkUnit& w, int m) {
    if constexpr (Logits) StagedStore::drain(ct & 31);  // before the CTA's shared memory goes away
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      quad_lse_merge(run_max[r], run_sum[r]);
      const int64_t pos = p.rows.output(int64_t(m) * TILE_M + c.row(r));
      if ((ct & 3) == 0 && pos >= 0) {
        p.row_max[int64_t(w.n_unit) * p.rows.positions + pos] = run_max[r];
        p.row_sum[int64_t(w.n_unit) * p.rows.positions + pos] = run_sum[r];
      }
    }
  }
};

}  // namespace tlse::hopper
