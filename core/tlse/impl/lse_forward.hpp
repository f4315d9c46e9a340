#pragma once
// Generic forward: every logit tile is computed once and feeds the row LSE, and on request the
// column LSE and the column logit sums (for vocabulary sorting). Teams form a grid of
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

  static std::size_t scratch_bytes() { return Scratch::bytes() + 2 * sizeof(Acc) * TM; }

  template <class Member>
  KOKKOS_INLINE_FUNCTION void operator()(const Member& member) const {
    const index_t rb = member.league_rank() / grid.grid_cols, cb = member.league_rank() % grid.grid_cols;
    const Scratch sc(member);
    Acc* run_max = static_cast<Acc*>(member.team_scratch(0).get_shmem(sizeof(Acc) * TM));
    Acc* run_sum = static_cast<Acc*>(member.team_scratch(0).get_shmem(sizeof(Acc) * TM));
    const index_t nr = prob.rows.count, nc = prob.cols.count;
    const index_t c_begin = cb * grid.col_tiles * TN, c_end = impl::min<index_t>(nc, c_begin + grid.col_tiles * TN);
    for (index_t rt = 0; rt < grid.row_tiles; ++rt) {
      const index_t r0 = (rb * grid.row_tiles + rt) * TM;
      if (r0 >= nr) break;
      const int mr = int(impl::min<index_t>(TM, nr - r0));
      Kokkos::parallel_for(Kokkos::TeamThreadRange(member, TM), [&](int i) {
        run_max[i] = -infinity<Acc>();
        run_sum[i] = 0;
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

/// An upper bound of forward_partials_size over every row count in [0, max_rows], for sizing a
/// workspace before the number of active rows is known.
template <class Exec>
index_t forward_partials_bound(const Exec& exec, index_t max_rows, index_t cols, bool col_lse, bool col_sums) {
  const ForwardGrid g = ForwardGrid::plan(exec, max_rows, cols);
  const index_t want = ForwardGrid::teams_wanted(exec);
  // grid_cols * rows <= min(want * TM + rows, max_blocks * rows) (see plan); grid_rows never
  // exceeds its value at max_rows.
  const index_t per_col = (col_lse ? 2 : 0) + (col_sums ? 1 : 0);
  return 2 * std::min(want * GenericTile::TM + max_rows, ForwardGrid::max_blocks * max_rows) +
         per_col * g.grid_rows * cols;
}

/// Number of Acc values lse_forward needs as `partials`.
inline index_t forward_partials_size(const ForwardGrid& g, index_t rows, index_t cols, bool col_lse,
                                     bool col_sums) {
  return 2 * g.grid_cols * rows + (col_lse ? 2 * g.grid_rows * cols : 0) + (col_sums ? g.grid_rows * cols : 0);
}

/// Runs the tile sweep. Outputs are indexed by id: row_lse[rows.id(p)], col_lse[cols.id(p)],
/// col_logit_sum[cols.id(p)]; pass nullptr for what is not wanted.
template <class Exec, class T, class Acc>
void lse_forward(const Exec& exec, const TileProblem<T, Acc>& prob, const ForwardGrid& grid, Acc* partials,
                 Acc* row_lse, Acc* col_lse, Acc* col_logit_sum) {
  using Tile = GenericTile;
  const index_t nr = prob.rows.count, nc = prob.cols.count;
  if (nr > 0 && nc > 0 && specializations_enabled()) {
    // The specialization writes where the generic kernel would (forward_partials_size holds it).
    Acc* col_parts = partials + 2 * grid.grid_cols * nr;
    ForwardPartials<Acc> parts{partials, col_lse ? col_parts : nullptr,
                               col_logit_sum ? col_parts + (col_lse ? 2 * grid.grid_rows * nc : 0) : nullptr,
                               grid.grid_cols, grid.grid_rows};
    if (LseForwardSpecialization<Exec>::run(exec, prob, parts)) {
      merge_lse_partials(exec, prob.rows, partials, partials + parts.col_splits * nr, parts.col_splits, row_lse);
      if (col_lse)
        merge_lse_partials(exec, prob.cols, col_parts, col_parts + parts.row_splits * nc, parts.row_splits, col_lse);
      if (col_logit_sum) merge_logit_sums(exec, prob.cols, parts.col_sums, parts.row_splits, col_logit_sum);
      return;
    }
  }
  ForwardTiles<T, Acc, Tile> f{prob, grid, nullptr, nullptr, nullptr, nullptr, nullptr};
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
  }
  merge_lse_partials(exec, prob.rows, f.row_max, f.row_sum, grid.grid_cols, row_lse);
  if (col_lse) merge_lse_partials(exec, prob.cols, f.col_max, f.col_sum, grid.grid_rows, col_lse);
  if (col_logit_sum) merge_logit_sums(exec, prob.cols, f.col_logit_sum, grid.grid_rows, col_logit_sum);
}

}  // namespace tlse::impl
