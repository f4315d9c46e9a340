#pragma once
// Generic forward: every logit tile is computed once and feeds the row LSE, and on request the
// column LSE and the column logit sums (for vocabulary sorting), and each row's argmax and
// weighted logit sum (the cross-entropy's predicted class and label smoothing). Teams form a grid of
// row blocks x column blocks; each owns its partial (max, sum) entries exclusively, and a
// second pass merges the partials in a fixed order, so results are bitwise reproducible.
#include <tlse/impl/backend_dispatch.hpp>
#include <tlse/impl/dot_tile.hpp>
#include <tlse/impl/kokkos_compat.hpp>

#include <algorithm>

namespace tlse::impl {

/// How the forward splits the matrix: grid_rows x grid_cols teams, each sweeping
/// row_tiles x col_tiles tiles. The partials cost (grid_cols * rows + grid_rows * cols) states.
struct ForwardGrid {
  index_t grid_rows = 1, grid_cols = 1, row_tiles = 0, col_tiles = 0;

  /// At most this many row blocks and column blocks: the partial states then cost at most
  /// 2 * max_blocks * (rows + cols) accumulators, O(rows + cols) whatever the device.
  static constexpr index_t max_blocks = 32;

  /// Enough teams to fill the machine a few times over.
  template <class Exec>
  static index_t teams_wanted(const Exec& exec) {
    const index_t threads_per_team = is_host_space<Exec>() ? 1 : 64;
    return std::max<index_t>(1, 4 * index_t(exec.concurrency()) / threads_per_team);
  }

  /// Rows are split first: a row block costs column partials, a column block row partials.
  template <class Exec, class Tile = GenericTile>
  static ForwardGrid plan(const Exec& exec, index_t rows, index_t cols) {
    const index_t total_row_tiles = std::max<index_t>(1, (rows + Tile::TM - 1) / Tile::TM);
    const index_t total_col_tiles = std::max<index_t>(1, (cols + Tile::TN - 1) / Tile::TN);
    const index_t want = teams_wanted(exec);
    ForwardGrid g;
    g.grid_rows = std::min({total_row_tiles, want, max_blocks});
    g.grid_cols = std::min({total_col_tiles, (want + g.grid_rows - 1) / g.grid_rows, max_blocks});
    g.row_tiles = (total_row_tiles + g.grid_rows - 1) / g.grid_rows;
    g.col_tiles = (total_col_tiles + g.grid_cols - 1) / g.grid_cols;
    return g;
  }
};

/// Best (largest) entry of a row between two candidates: the larger value, equal values by the
/// lower column id. A NaN never wins (its row's LSE is NaN already).
template <class Acc>
KOKKOS_INLINE_FUNCTION bool better_entry(Acc x, index_t id, Acc best, index_t best_id) {
  return x > best || (x == best && id < best_id);
}

/// What the forward gives per row beyond the LSE, by row id (nullptr: not wanted): the column id
/// of the largest logit (ties: the lowest id; a row whose logits are all -inf gets column 0),
/// and sum_j u_j x_ij with u = col_weight by column id (nullptr: 1).
template <class Acc>
struct RowStatistics {
  std::int64_t* argmax = nullptr;
  Acc* max = nullptr;  // with argmax: the row's largest logit by row id (nullptr: not wanted)
  Acc* weighted_sum = nullptr;
  const Acc* col_weight = nullptr;
  /// The partial results per column split ([splits][rows.count] each), from the workspace:
  /// row_partials_bound values each for best, best_id and sum_parts where wanted.
  Acc* best = nullptr;
  int* best_id = nullptr;
  Acc* sum_parts = nullptr;
  bool any() const { return argmax || weighted_sum; }
};

template <class T, class Acc, class Tile = GenericTile>
struct ForwardTiles {
  static constexpr int TM = Tile::TM, TN = Tile::TN, SLD = DotTileScratch<Acc, Tile>::SLD;
  using Scratch = DotTileScratch<Acc, Tile>;

  TileProblem<T, Acc> prob;
  ForwardGrid grid;
  Acc* row_max;        // [grid_cols][rows.count]
  Acc* row_sum;
  Acc* col_max;        // [grid_rows][cols.count], or nullptr: no column LSE
  Acc* col_sum;
  Acc* col_logit_sum;  // [grid_rows][cols.count], or nullptr: no logit sums
  Acc* row_best;       // [grid_cols][rows.count], or nullptr: no argmax
  int* row_best_id;
  Acc* row_weighted_sum;  // [grid_cols][rows.count], or nullptr: no weighted logit sums
  const Acc* col_weight;  // u of the weighted sums by column id, nullptr: 1

  static std::size_t scratch_bytes() { return Scratch::bytes() + 4 * sizeof(Acc) * TM + sizeof(int) * TM; }

  template <class Member>
  KOKKOS_INLINE_FUNCTION void operator()(const Member& member) const {
    const index_t rb = member.league_rank() / grid.grid_cols, cb = member.league_rank() % grid.grid_cols;
    const Scratch sc(member);
    Acc* run_max = static_cast<Acc*>(member.team_scratch(0).get_shmem(sizeof(Acc) * TM));
    Acc* run_sum = static_cast<Acc*>(member.team_scratch(0).get_shmem(sizeof(Acc) * TM));
    Acc* run_best = static_cast<Acc*>(member.team_scratch(0).get_shmem(sizeof(Acc) * TM));
    Acc* run_wsum = static_cast<Acc*>(member.team_scratch(0).get_shmem(sizeof(Acc) * TM));
    int* run_best_id = static_cast<int*>(member.team_scratch(0).get_shmem(sizeof(int) * TM));
    const index_t nr = prob.rows.count, nc = prob.cols.count;
    const index_t c_begin = cb * grid.col_tiles * TN, c_end = impl::min<index_t>(nc, c_begin + grid.col_tiles * TN);
    for (index_t rt = 0; rt < grid.row_tiles; ++rt) {
      const index_t r0 = (rb * grid.row_tiles + rt) * TM;
      if (r0 >= nr) break;
      const int mr = int(impl::min<index_t>(TM, nr - r0));
      Kokkos::parallel_for(Kokkos::TeamThreadRange(member, TM), [&](int i) {
        run_max[i] = -infinity<Acc>();
        run_sum[i] = 0;
        run_best[i] = -infinity<Acc>();
        run_best_id[i] = INT32_MAX;
        run_wsum[i] = 0;
      });
      for (index_t c0 = c_begin; c0 < c_end; c0 += TN) {
        const int mc = int(impl::min<index_t>(TN, c_end - c0));
        dot_tile<Tile>(member, prob.rows, r0, prob.cols, c0, prob.depth, sc);
        Kokkos::parallel_for(Kokkos::TeamThreadRange(member, TM * TN), [&](int idx) {
          const int i = idx / TN, j = idx % TN;
          Acc& s = sc.s[i * SLD + j];
          s = (i < mr && j < mc) ? prob.logit(s, prob.rows.id(r0 + i), prob.cols.id(c0 + j)) : -infinity<Acc>();
        });
        member.team_barrier();
        Kokkos::parallel_for(Kokkos::TeamThreadRange(member, mr), [&](int i) {
          const Acc* x = sc.s + i * SLD;
          if (row_best)
            for (int j = 0; j < mc; ++j) {
              const index_t id = prob.cols.id(c0 + j);
              if (better_entry(x[j], id, run_best[i], index_t(run_best_id[i])))
                run_best[i] = x[j], run_best_id[i] = int(id);
            }
          if (row_weighted_sum)
            for (int j = 0; j < mc; ++j) run_wsum[i] += (col_weight ? col_weight[prob.cols.id(c0 + j)] : Acc(1)) * x[j];
          Acc m = -infinity<Acc>();
          for (int j = 0; j < mc; ++j) m = nan_max(m, x[j]);
          if (m == -infinity<Acc>()) return;
          Acc sum = 0;
          for (int j = 0; j < mc; ++j) sum += impl::exp(x[j] - m);
          LseState<Acc> st{run_max[i], run_sum[i]};
          st.merge(m, sum);
          run_max[i] = st.max;
          run_sum[i] = st.sum;
        });
        if (col_max || col_logit_sum) {
          Kokkos::parallel_for(Kokkos::TeamThreadRange(member, mc), [&](int j) {
            const index_t slot = rb * nc + c0 + j;
            Acc m = -infinity<Acc>(), total = 0;
            for (int i = 0; i < mr; ++i) {
              const Acc x = sc.s[i * SLD + j];
              m = nan_max(m, x);
              if (x != -infinity<Acc>()) total += x;
            }
            if (col_logit_sum) col_logit_sum[slot] += total;
            if (!col_max || m == -infinity<Acc>()) return;
            Acc sum = 0;
            for (int i = 0; i < mr; ++i) sum += impl::exp(sc.s[i * SLD + j] - m);
            LseState<Acc> st{col_max[slot], col_sum[slot]};
            st.merge(m, sum);
            col_max[slot] = st.max;
            col_sum[slot] = st.sum;
          });
        }
        member.team_barrier();
      }
      Kokkos::parallel_for(Kokkos::TeamThreadRange(member, mr), [&](int i) {
        row_max[cb * nr + r0 + i] = run_max[i];
        row_sum[cb * nr + r0 + i] = run_sum[i];
        if (row_best) row_best[cb * nr + r0 + i] = run_best[i], row_best_id[cb * nr + r0 + i] = run_best_id[i];
        if (row_weighted_sum) row_weighted_sum[cb * nr + r0 + i] = run_wsum[i];
      });
      member.team_barrier();
    }
  }
};

template <class Exec, class Acc>
void fill(const Exec& exec, Acc* data, index_t n, Acc value) {
  Kokkos::parallel_for("tlse::fill", Kokkos::RangePolicy<Exec>(exec, 0, n),
                       KOKKOS_LAMBDA(index_t i) { data[i] = value; });
}

/// Merges `parts` partial states per logical position in order and writes
/// out[side.id(p)] = lse, for the positions of `side`.
template <class Exec, class T, class Acc>
void merge_lse_partials(const Exec& exec, const Side<T>& side, const Acc* max, const Acc* sum, index_t parts,
                        Acc* out) {
  const index_t n = side.count;
  Kokkos::parallel_for("tlse::merge_lse", Kokkos::RangePolicy<Exec>(exec, 0, n), KOKKOS_LAMBDA(index_t p) {
    LseState<Acc> st;
    for (index_t part = 0; part < parts; ++part) st.merge(max[part * n + p], sum[part * n + p]);
    out[side.id(p)] = st.value();
  });
}

/// Sums `parts` partial column logit sums per logical position in order into out[side.id(p)].
template <class Exec, class T, class Acc>
void merge_logit_sums(const Exec& exec, const Side<T>& side, const Acc* partial_sums, index_t parts, Acc* out) {
  const index_t n = side.count;
  Kokkos::parallel_for("tlse::merge_logit_sums", Kokkos::RangePolicy<Exec>(exec, 0, n), KOKKOS_LAMBDA(index_t p) {
    Acc total = 0;
    for (index_t part = 0; part < parts; ++part) total += partial_sums[part * n + p];
    out[side.id(p)] = total;
  });
}

/// An upper bound of grid_cols * rows (one partial value per row and column split) over every row
/// count in [0, max_rows]: grid_cols * rows <= min(want * TM + rows, max_blocks * rows) (see plan).
/// Specializations use at most as many splits (ForwardPartials::max_col_splits).
template <class Exec>
index_t row_partials_bound(const Exec& exec, index_t max_rows) {
  const index_t want = ForwardGrid::teams_wanted(exec);
  return std::min(want * GenericTile::TM + max_rows, ForwardGrid::max_blocks * max_rows);
}

/// An upper bound of forward_partials_size over every row count in [0, max_rows], for sizing a
/// workspace before the number of active rows is known.
template <class Exec>
index_t forward_partials_bound(const Exec& exec, index_t max_rows, index_t cols, bool col_lse, bool col_sums) {
  const ForwardGrid g = ForwardGrid::plan(exec, max_rows, cols);
  // grid_rows never exceeds its value at max_rows.
  const index_t per_col = (col_lse ? 2 : 0) + (col_sums ? 1 : 0);
  return 2 * row_partials_bound(exec, max_rows) + per_col * g.grid_rows * cols;
}

/// Merges the `parts` partial row statistics per position in split order: stats.argmax and
/// stats.weighted_sum by id (see RowStatistics).
template <class Exec, class T, class Acc>
void merge_row_statistics(const Exec& exec, const Side<T>& side, const RowStatistics<Acc>& stats, index_t parts) {
  const index_t n = side.count;
  const RowStatistics<Acc> s = stats;
  Kokkos::parallel_for("tlse::merge_row_statistics", Kokkos::RangePolicy<Exec>(exec, 0, n), KOKKOS_LAMBDA(index_t p) {
    if (s.argmax) {
      Acc best = -infinity<Acc>();
      index_t best_id = INT32_MAX;
      for (index_t part = 0; part < parts; ++part) {
        const Acc x = s.best[part * n + p];
        const index_t id = s.best_id[part * n + p];
        if (better_entry(x, id, best, best_id)) best = x, best_id = id;
      }
      s.argmax[side.id(p)] = best_id == INT32_MAX ? 0 : best_id;  // every logit NaN: column 0
      if (s.max) s.max[side.id(p)] = best;
    }
    if (s.weighted_sum) {
      Acc total = 0;
      for (index_t part = 0; part < parts; ++part) total += s.sum_parts[part * n + p];
      s.weighted_sum[side.id(p)] = total;
    }
  });
}

/// Number of Acc values lse_forward needs as `partials`.
inline index_t forward_partials_size(const ForwardGrid& g, index_t rows, index_t cols, bool col_lse,
                                     bool col_sums) {
  return 2 * g.grid_cols * rows + (col_lse ? 2 * g.grid_rows * cols : 0) + (col_sums ? g.grid_rows * cols : 0);
}

/// Runs the tile sweep. Outputs are indexed by id: row_lse[rows.id(p)], col_lse[cols.id(p)],
/// col_logit_sum[cols.id(p)]; pass nullptr for what is not wanted; `stats` the rows' other
/// statistics (RowStatistics), from the same tiles.
template <class Exec, class T, class Acc>
void lse_forward(const Exec& exec, const TileProblem<T, Acc>& prob, const ForwardGrid& grid, Acc* partials,
                 Acc* row_lse, Acc* col_lse, Acc* col_logit_sum, const RowStatistics<Acc>& stats = {}) {
  using Tile = GenericTile;
  const index_t nr = prob.rows.count, nc = prob.cols.count;
  if (nr > 0 && nc > 0 && specializations_enabled()) {
    // The specialization writes where the generic kernel would (forward_partials_size holds it).
    Acc* col_parts = partials + 2 * grid.grid_cols * nr;
    ForwardPartials<Acc> parts{partials, col_lse ? col_parts : nullptr,
                               col_logit_sum ? col_parts + (col_lse ? 2 * grid.grid_rows * nc : 0) : nullptr,
                               grid.grid_cols, grid.grid_rows};
    if (stats.argmax) parts.row_best = stats.best, parts.row_best_id = stats.best_id;
    if (stats.weighted_sum) parts.row_weighted_sums = stats.sum_parts, parts.col_weight = stats.col_weight;
    if (LseForwardSpecialization<Exec>::run(exec, prob, parts)) {
      merge_lse_partials(exec, prob.rows, partials, partials + parts.col_splits * nr, parts.col_splits, row_lse);
      if (col_lse)
        merge_lse_partials(exec, prob.cols, col_parts, col_parts + parts.row_splits * nc, parts.row_splits, col_lse);
      if (col_logit_sum) merge_logit_sums(exec, prob.cols, parts.col_sums, parts.row_splits, col_logit_sum);
      if (stats.any()) merge_row_statistics(exec, prob.rows, stats, parts.col_splits);
      return;
    }
  }
  ForwardTiles<T, Acc, Tile> f{prob,    grid,    nullptr, nullptr, nullptr, nullptr,
                               nullptr, nullptr, nullptr, nullptr, nullptr};
  if (stats.argmax) f.row_best = stats.best, f.row_best_id = stats.best_id;
  if (stats.weighted_sum) f.row_weighted_sum = stats.sum_parts, f.col_weight = stats.col_weight;
  f.row_max = partials;
  f.row_sum = f.row_max + grid.grid_cols * nr;
  Acc* next = f.row_sum + grid.grid_cols * nr;
  if (col_lse) {
    f.col_max = next;
    f.col_sum = f.col_max + grid.grid_rows * nc;
    next = f.col_sum + grid.grid_rows * nc;
    fill(exec, f.col_max, grid.grid_rows * nc, -infinity<Acc>());
    fill(exec, f.col_sum, grid.grid_rows * nc, Acc(0));
  }
  if (col_logit_sum) {
    f.col_logit_sum = next;
    fill(exec, f.col_logit_sum, grid.grid_rows * nc, Acc(0));
  }
  if (nr > 0 && nc > 0) {
    const int team = is_host_space<Exec>() ? 1 : 64;
    Kokkos::TeamPolicy<Exec> policy(exec, int(grid.grid_rows * grid.grid_cols), team);
    Kokkos::parallel_for("tlse::lse_forward_tiles",
                         policy.set_scratch_size(0, Kokkos::PerTeam(ForwardTiles<T, Acc, Tile>::scratch_bytes())), f);
  } else {
    fill(exec, f.row_max, grid.grid_cols * nr, -infinity<Acc>());
    fill(exec, f.row_sum, grid.grid_cols * nr, Acc(0));
    if (f.row_best) fill(exec, f.row_best, grid.grid_cols * nr, -infinity<Acc>());
    if (f.row_best_id) fill(exec, f.row_best_id, grid.grid_cols * nr, int(INT32_MAX));
    if (f.row_weighted_sum) fill(exec, f.row_weighted_sum, grid.grid_cols * nr, Acc(0));
  }
  merge_lse_partials(exec, prob.rows, f.row_max, f.row_sum, grid.grid_cols, row_lse);
  if (stats.any()) merge_row_statistics(exec, prob.rows, stats, grid.grid_cols);
  if (col_lse) merge_lse_partials(exec, prob.cols, f.col_max, f.col_sum, grid.grid_rows, col_lse);
  if (col_logit_sum) merge_logit_sums(exec, prob.cols, f.col_logit_sum, grid.grid_rows, col_logit_sum);
}

}  // namespace tlse::impl
