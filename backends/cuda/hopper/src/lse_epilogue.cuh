#pragma once
// Epilogue of the forward: each finished tile becomes logits (the logit model) and is folded into
// online LSE states. Rows: each thread keeps the state of its 2 rows over its 64 columns of every
// tile of the unit, and the quad merges them once, when the row tile is done (row_max/row_sum
// [column split][row]). Columns (ForwardVariant::Columns): per tile, the column max over the tile's 128
// rows (lanes by a reduce-scatter, then the 8 warps through shared memory), the sum of
// exponentials under it and the logit sum are merged into the column slot of the unit's row group,
// which no other unit touches (col_*[row group][col]); the group's first row tile writes it, and
// the slot a tile merges into is read before the tile's products run. No atomics. On request
// (KeepExponentials) the tiles' exponentials are stored too, for a training step that turns them
// into the gradient without recomputing the tiles: each as exp(x - s) in the input type (bf16 or
// fp16, through StagedStore, half the bytes of the logits as floats), s for bf16 the row's shift
// where the thread's part of the row lies within TLSE_HOP_ROW_SHIFT_SPAN above it, else the part's
// own max, for fp16 a multiple of ln 2 just below the part's max (keep_row); the tiles past
// exponentials_cols only fold into the row states.
#include "fragment_reductions.cuh"
#include "staged_store.cuh"

namespace tlse::hopper {

template <class T>
struct LseForwardParams {
  DeviceSide rows, cols;
  DeviceLogitModel<T> logit;
  float *row_max, *row_sum;
  float *col_max, *col_sum, *col_logit_sum;
  CUtensorMap exponentials_map;         // the kept exponentials (bf16, panels x rows x columns), KeepExponentials only
  float* exponentials_shift;            // the shift of each row's tile and quad lane, with KeepExponentials only
  int64_t exponentials_shift_ld;        // 4 x column tiles
  const float* exponentials_row_shift;  // by row, or nullptr (every part under its own max)
  int64_t exponentials_cols;            // the tiles below it are kept (a multiple of TILE_N, or every column)
  int32_t exponentials_panel_tiles;     // column tiles per layer of exponentials_map (a panel)
  CUtensorMap exponentials_tail_map;    // the panels from exponentials_tail_panel on, where they lie apart
  int32_t exponentials_tail_panel;      // INT32_MAX: none
  float* row_best;                      // ArgMax only: [column split][rows positions], the largest logit
  int32_t* row_best_col;                // and its column
};

/// The forward's kernel variants, a set of flags (template arguments of run_forward and
/// LseForwardEpilogue, joined by |). Without Simple some tile may need the general logit model
/// (bias, softcap, masks, column ids; the tile's ModelColumns in shared memory). With it every
/// column takes x = scale * dot (the host checked that the model is that simple for all of them),
/// or for the row LSE alone x = capped(scale * dot), and the kernel has no general path. ArgMax
/// (rows alone): each row's largest logit and its column per split too. A thread searches its part
/// of a row for the column only when the part's max reaches the row's best so far, which after the
/// first tiles is rare: the search costs little against the exponentials every entry takes.
enum class ForwardVariant : unsigned {
  RowsOnly = 0,                // no flag: the row LSE states alone, under the general model, in single CTAs
  Columns = 1u << 0,           // the columns' LSE states and logit sums too
  KeepExponentials = 1u << 1,  // the tiles' exponentials kept (16-bit inputs, rows alone)
  Simple = 1u << 2,            // no general logit model
  Paired = 1u << 3,            // in clusters of two CTAs (TileConfig); the epilogue does not look at it
  ArgMax = 1u << 4,            // each row's largest logit and its column (rows alone)
};
constexpr ForwardVariant operator|(ForwardVariant a, ForwardVariant b) {
  return ForwardVariant(unsigned(a) | unsigned(b));
}
constexpr bool has(ForwardVariant set, ForwardVariant flag) { return (unsigned(set) & unsigned(flag)) != 0; }

template <class T, ForwardVariant Variant>
struct LseForwardEpilogue {
  static constexpr bool Columns = has(Variant, ForwardVariant::Columns);
  static constexpr bool KeepExponentials = has(Variant, ForwardVariant::KeepExponentials);
  static constexpr bool General = !has(Variant, ForwardVariant::Simple);
  static constexpr bool ArgMax = has(Variant, ForwardVariant::ArgMax);
  static_assert(!ArgMax || (!Columns && !KeepExponentials), "the argmax comes with the rows alone");
  using Params = LseForwardParams<T>;
  struct NoStaging {};
  struct SharedStorage {
    float max[Columns ? 8 : 1][TILE_N], sum[Columns ? 8 : 1][TILE_N], total[Columns ? 8 : 1][TILE_N];
    float tile_max[Columns ? TILE_N : 1];
    float range[CONSUMER_THREADS / 32][2];  // one_exponential's max and min of the tile, warp by warp
    float row_shift[KeepExponentials ? TILE_M : 1];  // the row tile's shifts (-inf: none)
    // the kept exponentials' boxes on their way out
    std::conditional_t<KeepExponentials, StagedStore::Storage, NoStaging> staged;
    ModelColumn model_columns[General ? TILE_N : 1];  // the tile's, where it takes the general model
  };
  static constexpr int ROWS = Fragment::ROWS;

  const Params& p;
  SharedStorage& s;
  int ct;
  float run_max[ROWS], run_sum[ROWS];
  float kept_shift[ROWS];  // with KeepExponentials: the shifts the tile's kept exponentials are under
  float best[ArgMax ? ROWS : 1];        // with ArgMax: the largest logit of the thread's part of each row
  int32_t best_col[ArgMax ? ROWS : 1];  // and its column (INT32_MAX: none yet)
  bool keeping = KeepExponentials;  // the tile's exponentials are kept (it lies below exponentials_cols)
  float slot_max = NEG_INF, slot_sum = 0.f, slot_total = 0.f;  // column ct's slot before this tile
  ModelColumn next_column;                                     // column ct's, General only

  __device__ LseForwardEpilogue(const Params& params, SharedStorage& storage, int consumer_thread)
      : p(params), s(storage), ct(consumer_thread) {}

  __device__ static bool keep(const Params&, int, int) { return true; }

  /// Before tile (m, n)'s products: column ct's slot as the unit's earlier row tiles left it, and
  /// its general model where the tile needs it (the loads' latency hides behind the products).
  __device__ void prefetch(const WorkUnit& w, int m, int n) {
    if constexpr (General) {
      const int64_t col0 = int64_t(n) * TILE_N;
      if (!p.logit.simple_tile(int64_t(m) * TILE_M, TILE_M, col0, TILE_N))
        next_column = p.logit.column(p.cols, col0 + ct, p.cols.count);
    }
    if constexpr (Columns) {
      const int64_t col = int64_t(n) * TILE_N + ct;
      slot_max = NEG_INF, slot_sum = 0.f, slot_total = 0.f;
      if (m == w.m_begin || col >= p.cols.count) return;
      const int64_t slot = int64_t(w.m_unit) * p.cols.count + col;
      if (p.col_max) slot_max = p.col_max[slot], slot_sum = p.col_sum[slot];
      if (p.col_logit_sum) slot_total = p.col_logit_sum[slot];
    }
  }

  /// With KeepExponentials, the row tile's shifts go to shared memory (kept in registers through
  /// the products, they made ptxas spill 12 bytes per thread; this way 8, where nothing spilled
  /// before the shifts): each of the quad lanes that hold a row writes its shift, and reads it there.
  __device__ void begin_row(const Fragment& c, const WorkUnit&, int m) {
    if constexpr (KeepExponentials) __syncwarp();  // the quad is done with the previous row tile's
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      run_max[r] = NEG_INF, run_sum[r] = 0.f;
      if constexpr (ArgMax) best[r] = NEG_INF, best_col[r] = INT32_MAX;
      if constexpr (KeepExponentials) {
        const int64_t row = int64_t(m) * TILE_M + c.row(r);
        const float shift = p.exponentials_row_shift && row < p.rows.count ? p.exponentials_row_shift[row] : NEG_INF;
        s.row_shift[c.row(r)] = shift < -NEG_INF ? shift : NEG_INF;  // +inf would make every exponential 0
      }
    }
    if constexpr (KeepExponentials) __syncwarp();
  }

  template <class Acc>
  __device__ void tile(Acc& acc, const Fragment& c, const WorkUnit& w, int m, int n) {
    const int64_t row0 = int64_t(m) * TILE_M, col0 = int64_t(n) * TILE_N;
    if constexpr (KeepExponentials) keeping = col0 < p.exponentials_cols;
    if constexpr (Columns && !General)
      // The contrastive loss (row and column LSE), but for the last, partial column tile.
      if (p.col_max && !p.col_logit_sum && col0 + TILE_N <= p.cols.count && one_exponential(acc, c, w, m, row0, col0))
        return;
    if constexpr (General) {
      if (p.logit.simple_tile(row0, TILE_M, col0, TILE_N)) {
        rows(acc, c, row0, col0);
      } else {
        consumer_sync();  // every thread is done with the previous general tile's columns
        s.model_columns[ct] = next_column;
        consumer_sync();
        general_rows(acc, c, row0, col0, s.model_columns);
      }
    } else {
      bool capped = false;  // every column takes x = capped(scale * dot): the row LSE alone
      if constexpr (!Columns) capped = p.logit.softcap > 0.f;
      const bool inside = col0 + TILE_N <= p.cols.count;  // else the last tile: past the columns is -inf
      if (capped)
        inside ? rows<false, true>(acc, c, row0, col0) : rows<true, true>(acc, c, row0, col0);
      else
        inside ? rows(acc, c, row0, col0) : rows<true>(acc, c, row0, col0);
    }
    if constexpr (KeepExponentials)
      if (keeping) keep_tile(acc, c, row0, m, n);
    if constexpr (Columns) columns(acc, c, w, m, col0);
  }

  /// Turns a tile of a simple model into logits (x = scale * dot, or with Capped x = capped(scale *
  /// dot); Edge: some columns lie past the side's end) and folds each of the thread's rows into its
  /// running state; a row that takes no part becomes -inf.
  template <bool Edge = false, bool Capped = false, class Acc>
  __device__ __forceinline__ void rows(Acc& acc, const Fragment& c, int64_t row0, int64_t col0) {
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      const float mx = row_logits<Edge, Capped>(acc, c, r, row0, col0);
      track(acc, c, r, mx, col0);
      fold(acc, c, r, mx);
    }
  }

  /// With ArgMax: where the thread's part of row r (logits, their max mx) reaches the row's best,
  /// its lowest column holding mx becomes the best (a part all -inf never does).
  template <class Acc>
  __device__ __forceinline__ void track(const Acc& acc, const Fragment& c, int r, float mx, int64_t col0) {
    if constexpr (ArgMax) {
      if (!(mx >= best[r]) || mx == NEG_INF) return;
      int first = Fragment::COLS;
#pragma unroll
      for (int j = Fragment::COLS - 1; j >= 0; --j)
        if (Fragment::at(acc, r, j) == mx) first = j;
      const int32_t col = int32_t(col0) + c.col(first);
      if (mx > best[r] || col < best_col[r]) best[r] = mx, best_col[r] = col;
    }
  }

  /// rows() under the general model, the tile's columns in cols: column by column, both
  /// rows of the thread from one shared load; a row that takes no part becomes -inf.
  template <class Acc>
  __device__ __forceinline__ void general_rows(Acc& acc, const Fragment& c, int64_t row0, int64_t col0,
                                               const ModelColumn* cols) {
    bool row_ok[ROWS];
    int32_t excluded[ROWS];
    float mx[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      const int64_t row = row0 + c.row(r);
      row_ok[r] = p.rows.output(row) >= 0;
      excluded[r] = row_ok[r] ? p.logit.excluded_id(p.rows.id(row)) : -2;
      mx[r] = NEG_INF;
    }
#pragma unroll
    for (int j = 0; j < Fragment::COLS; ++j) {
      const ModelColumn col = cols[c.col(j)];
#pragma unroll
      for (int r = 0; r < ROWS; ++r) {
        float& x = Fragment::at(acc, r, j);
        x = row_ok[r] ? p.logit.at(x, col, excluded[r]) : NEG_INF;
        mx[r] = nan_max(mx[r], x);
      }
    }
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      track(acc, c, r, mx[r], col0);
      fold(acc, c, r, mx[r]);
    }
  }

  /// Folds the thread's part of row r (logits, their max mx) into its running state, keeping the
  /// exponentials where the kernel does.
  template <class Acc>
  __device__ __forceinline__ void fold(Acc& acc, const Fragment& c, int r, float mx) {
    if (KeepExponentials && keeping)
      keep_row(acc, c, r, mx);
    else
      fold_row(acc, r, mx);
  }

  /// fold_row for a tile whose exponentials are kept: under the shift s (bf16: the row's, where
  /// the thread's part of row r, max mx, lies within the span above it, else mx; fp16: n ln 2 with
  /// n = ceil(mx log2 e) - TLSE_HOP_FP16_HEADROOM), each entry becomes e = exp(x - s) in acc (bf16
  /// at most e^SPAN; fp16 at most 2^HEADROOM, the part's largest above half that) (a part all
  /// -inf is left as it is, kept_shift -inf, and stored as 0), and the state takes (s, sum e).
  /// bf16: below s it may lose what is below e^-87 of s, nothing against the row's LSE, which is
  /// at least the row's shift (a logit of the row). fp16: its narrow range holds the part's
  /// values down to 2^-(24 + HEADROOM) of its largest, and on the grid of ln 2 the training step
  /// rescales a part by a power of two, exactly.
  template <class Acc>
  __device__ __forceinline__ void keep_row(Acc& acc, const Fragment& c, int r, float mx) {
    float shift, shift2;  // s, and s log2 e
    if constexpr (std::is_same<T, cutlass::half_t>::value) {
      shift2 = ceilf(mx * LOG2E) - float(TLSE_HOP_FP16_HEADROOM);  // an integer: ex2 takes it exactly
      shift = shift2 * LN2;
    } else {
      const float row_shift = s.row_shift[c.row(r)];
      shift = mx <= row_shift + float(TLSE_HOP_ROW_SHIFT_SPAN) ? row_shift : mx;
      shift2 = shift * LOG2E;
    }
    kept_shift[r] = mx == NEG_INF ? NEG_INF : shift;
    if (mx == NEG_INF) return;
    float sum = 0.f;
#pragma unroll
    for (int j = 0; j < Fragment::COLS; ++j) {
      float& x = Fragment::at(acc, r, j);
      x = exp_of_dot(x, LOG2E, shift2);
      sum += x;
    }
    lse_merge(run_max[r], run_sum[r], shift, sum);
  }

  /// The tile's kept exponentials (in T: bf16 or fp16, through TMA), then the shifts they are under: one per
  /// row, tile and quad lane, written after the stores so that their addresses take no registers
  /// while the tile is live (ptxas spilled 200-300 bytes per thread otherwise).
  template <class Acc>
  __device__ __forceinline__ void keep_tile(const Acc& acc, const Fragment& c, int64_t row0, int m, int n) {
    const int panel = n / p.exponentials_panel_tiles;
    const bool tail = panel >= p.exponentials_tail_panel;
    StagedStore::put_rows<T, true>(
        s.staged, ct >> 5, ct & 31, tail ? p.exponentials_tail_map : p.exponentials_map, m,
        n - panel * p.exponentials_panel_tiles, c,
        [&](int r, int j) { return kept_shift[r] == NEG_INF ? 0.f : Fragment::at(acc, r, j); },
        tail ? panel - p.exponentials_tail_panel : panel);
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      const int64_t row = row0 + c.row(r);
      if (row < p.rows.count) p.exponentials_shift[row * p.exponentials_shift_ld + 4 * n + (ct & 3)] = kept_shift[r];
    }
  }

  /// The thread's part of row r as logits of the simple model; returns their max (a NaN is dropped
  /// here but poisons the sums).
  template <bool Edge, bool Capped, class Acc>
  __device__ __forceinline__ float row_logits(Acc& acc, const Fragment& c, int r, int64_t row0, int64_t col0) {
    const int64_t row = row0 + c.row(r);
    const bool row_ok = p.rows.output(row) >= 0;
    float mx = NEG_INF;
#pragma unroll
    for (int j = 0; j < Fragment::COLS; ++j) {
      float& x = Fragment::at(acc, r, j);
      const float z = x * p.logit.scale;
      x = row_ok && (!Edge || col0 + c.col(j) < p.cols.count) ? (Capped ? p.logit.capped(z) : z) : NEG_INF;
      mx = fmaxf(mx, x);
    }
    return mx;
  }

  /// Folds the thread's part of row r (logits, their max mx) into the row's running state.
  template <class Acc>
  __device__ __forceinline__ void fold_row(const Acc& acc, int r, float mx) {
    if (mx == NEG_INF) return;
    float sum = 0.f;
#pragma unroll
    for (int j = 0; j < Fragment::COLS; ++j) sum += exp_shifted(Fragment::at(acc, r, j), mx);
    lse_merge(run_max[r], run_sum[r], mx, sum);
  }

  /// Row and column LSE of a tile of the simple model from one exponential per entry, where
  /// rows() and columns() take two (each side under its own max): the special function unit
  /// computes 16 of them per clock and SM, which makes them as long as the tile's products at a
  /// depth of 512. When every logit of the tile lies within SPREAD of the tile's max M (CLIP's
  /// logits lie within 2 / temperature of each other), each entry becomes e = exp(x - M) >=
  /// e^-SPREAD, far from float's subnormals, and its row and its column sum the same e: the state
  /// (M, sum) stands for M + log(sum) as exactly as one under the side's own max. Otherwise (and
  /// for infinite logits, or no row taking part) it returns false with acc untouched, and the
  /// tile takes rows() and columns(). (Testing each column of a partial tile, in both loops, cost
  /// registers that ptxas spilled: such a tile takes rows() and columns() too.)
  template <class Acc>
  __device__ __forceinline__ bool one_exponential(Acc& acc, const Fragment& c, const WorkUnit& w, int m, int64_t row0,
                                                  int64_t col0) {
    constexpr float SPREAD = 64.f;
    const int warp = ct >> 5, lane = ct & 31;
    bool row_ok[ROWS];
    float hi = NEG_INF, lo = -NEG_INF;  // of the dot products that take part
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      row_ok[r] = p.rows.output(row0 + c.row(r)) >= 0;
#pragma unroll
      for (int j = 0; j < Fragment::COLS; ++j)
        if (row_ok[r]) hi = fmaxf(hi, Fragment::at(acc, r, j)), lo = fminf(lo, Fragment::at(acc, r, j));
    }
#pragma unroll
    for (int lanes = 16; lanes > 0; lanes >>= 1) {
      hi = fmaxf(hi, __shfl_xor_sync(0xffffffffu, hi, lanes));
      lo = fminf(lo, __shfl_xor_sync(0xffffffffu, lo, lanes));
    }
    if (lane == 0) s.range[warp][0] = hi, s.range[warp][1] = lo;
    // The previous tile read s.range before its last barrier; s.sum, which columns() reads after
    // its last barrier, is written here only after this one.
    consumer_sync();
#pragma unroll
    for (int q = 0; q < CONSUMER_THREADS / 32; ++q) hi = fmaxf(hi, s.range[q][0]), lo = fminf(lo, s.range[q][1]);
    const float scale = p.logit.scale, top = fmaxf(scale * hi, scale * lo), bottom = fminf(scale * hi, scale * lo);
    if (!(hi > NEG_INF && bottom >= top - SPREAD)) return false;
    const float scale2 = scale * LOG2E, top2 = top * LOG2E;
    float row_sum[ROWS] = {}, part[8];
    column_lanes_scatter(
        [&](int j) {
          float column;
#pragma unroll
          for (int r = 0; r < ROWS; ++r) {
            const float e = row_ok[r] ? exp_of_dot(Fragment::at(acc, r, j), scale2, top2) : 0.f;
            row_sum[r] += e;
            column = r == 0 ? e : column + e;
          }
          return column;
        },
        add, lane, part);
    const int first = scatter_first_column(lane);
#pragma unroll
    for (int k = 0; k < 8; ++k) s.sum[warp][c.col(first + k)] = part[k];
#pragma unroll
    for (int r = 0; r < ROWS; ++r)
      if (row_ok[r]) lse_merge(run_max[r], run_sum[r], top, row_sum[r]);
    consumer_sync();
    const int64_t col = col0 + ct;
    if (col >= p.cols.count) return true;
    float sum = 0.f;
#pragma unroll
    for (int q = 0; q < CONSUMER_THREADS / 32; ++q) sum += s.sum[q][ct];
    lse_merge(slot_max, slot_sum, top, sum);
    const int64_t slot = int64_t(w.m_unit) * p.cols.count + col;
    p.col_max[slot] = slot_max, p.col_sum[slot] = slot_sum;
    return true;
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
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      quad_lse_merge(run_max[r], run_sum[r]);
      if constexpr (ArgMax) quad_best_merge(best[r], best_col[r]);
      const int64_t pos = p.rows.output(int64_t(m) * TILE_M + c.row(r));
      if ((ct & 3) == 0 && pos >= 0) {
        const int64_t slot = int64_t(w.n_unit) * p.rows.positions + pos;
        p.row_max[slot] = run_max[r];
        p.row_sum[slot] = run_sum[r];
        if constexpr (ArgMax) p.row_best[slot] = best[r], p.row_best_col[slot] = best_col[r];
      }
    }
  }

  /// The best (value, column) of a quad: the larger value, equal ones by the lower column.
  __device__ __forceinline__ static void quad_best_merge(float& value, int32_t& col) {
#pragma unroll
    for (int o = 1; o <= 2; o <<= 1) {
      const float v = __shfl_xor_sync(0xffffffffu, value, o);
      const int32_t k = __shfl_xor_sync(0xffffffffu, col, o);
      if (v > value || (v == value && k < col)) value = v, col = k;
    }
  }
};

}  // namespace tlse::hopper
