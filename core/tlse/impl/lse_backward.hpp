#pragma once
// Generic backward (Inf-CL Algorithm 4, CCE Algorithm 3): tiles are recomputed, turned into
// dL/dx from the saved LSEs, and multiplied into the gradient of the side a team owns.
// One pass owns row tiles (dA, dscale), another owns column tiles (dB, dbias); each team
// accumulates its rows over the whole other side in level-1 scratch and writes them once, so
// no atomics are needed and results are bitwise reproducible. A tile whose softmax entries
// are all below filter_eps (and that holds no target) skips its gradient product (CCE's
// gradient filtering).
#include <tlse/impl/backend_dispatch.hpp>
#include <tlse/impl/dot_tile.hpp>

namespace tlse::impl {

template <class T, class Acc, class Tile>
struct BackwardTiles {
  static constexpr int TM = Tile::TM, TN = Tile::TN, TK = Tile::TK, SLD = DotTileScratch<Acc, Tile>::SLD;
  static_assert(TM == TN, "the owned and the other side swap roles, so tiles are square");
  using Scratch = DotTileScratch<Acc, Tile>;

  TileProblem<T, Acc> prob;
  bool owner_is_row;                 // true: teams own row tiles; false: column tiles
  SoftmaxTerms<Acc> row_terms, col_terms;
  Acc filter_eps;                    // 0: no filtering
  T* grad;                           // gradient rows of the owned side, by id (nullptr: not wanted)
  bool accumulate;                   // grad += result instead of grad = result
  Acc* dscale_part;                  // per owned position: sum_x dL/dz * dot (nullptr: not wanted)
  T* dbias;                          // per owned column id (column owners only; nullptr: not wanted)
  char* scratch;                     // for a backend specialization: backward_scratch_bytes of the call
  std::size_t scratch_bytes;

  /// The pass owning a request's rows: grad_rows and dscale.
  static BackwardTiles row_pass(const BackwardRequest<T, Acc>& r) {
    BackwardTiles f = common(r);
    f.owner_is_row = true;
    f.grad = r.grad_rows;
    f.accumulate = r.accumulate;
    f.dscale_part = r.dscale_part;
    return f;
  }
  /// The pass owning its columns: grad_cols (or, for the self-similarity form, the columns' share
  /// added into grad_rows) and dbias.
  static BackwardTiles column_pass(const BackwardRequest<T, Acc>& r) {
    BackwardTiles f = common(r);
    f.owner_is_row = false;
    f.grad = r.cols_into_rows ? r.grad_rows : r.grad_cols;
    f.accumulate = r.cols_into_rows || r.accumulate;
    f.dbias = r.dbias;
    return f;
  }

  static std::size_t scratch0_bytes() { return Scratch::bytes() + 2 * sizeof(Acc) * TM; }
  static std::size_t scratch1_bytes(index_t depth) { return sizeof(Acc) * TM * std::size_t(depth); }

  KOKKOS_INLINE_FUNCTION const Side<T>& owned() const { return owner_is_row ? prob.rows : prob.cols; }
  KOKKOS_INLINE_FUNCTION const Side<T>& other() const { return owner_is_row ? prob.cols : prob.rows; }

  /// dL/dz at (row id, col id) given the dot product; sets `significant` when the entry
  /// matters for filtering.
  KOKKOS_INLINE_FUNCTION Acc dlogit(Acc dot, index_t r, index_t c, bool& significant) const {
    const Acc x = prob.logit(dot, r, c);
    if (x == -infinity<Acc>()) return Acc(0);
    Acc g = 0;
    if (row_terms.active()) {
      const Acc p = impl::exp(x - row_terms.lse[r]);
      g += row_terms.g[r] * p;
      significant |= !(p < filter_eps);
      if (row_terms.target && row_terms.target[r] == c) {
        g -= row_terms.w[r];
        significant = true;
      }
      if (row_terms.spread) {
        g -= row_terms.spread[r] * (row_terms.spread_weight ? row_terms.spread_weight[c] : Acc(1));
        significant = true;
      }
    }
    if (col_terms.active()) {
      const Acc q = impl::exp(x - col_terms.lse[c]);
      g += col_terms.g[c] * q;
      significant |= !(q < filter_eps);
      if (col_terms.target && col_terms.target[c] == r) {
        g -= col_terms.w[c];
        significant = true;
      }
    }
    return g * prob.logit.dx_dz(x);
  }

  template <class Member>
  KOKKOS_INLINE_FUNCTION void operator()(const Member& member) const {
    const Scratch sc(member);
    Acc* own_dscale = static_cast<Acc*>(member.team_scratch(0).get_shmem(sizeof(Acc) * TM));
    Acc* own_dbias = static_cast<Acc*>(member.team_scratch(0).get_shmem(sizeof(Acc) * TM));
    const index_t depth = prob.depth;
    const index_t acc_len = grad ? TM * depth : 0;
    Acc* acc = static_cast<Acc*>(member.team_scratch(1).get_shmem(sizeof(Acc) * acc_len));
    const Side<T>& own = owned();
    const Side<T>& oth = other();
    const index_t o0 = index_t(member.league_rank()) * TM;
    const int mo = int(impl::min<index_t>(TM, own.count - o0));

    Kokkos::parallel_for(Kokkos::TeamThreadRange(member, acc_len), [&](index_t i) { acc[i] = 0; });
    Kokkos::parallel_for(Kokkos::TeamThreadRange(member, TM), [&](int i) {
      own_dscale[i] = 0;
      own_dbias[i] = 0;
    });
    for (index_t x0 = 0; x0 < oth.count; x0 += TN) {
      const int mx = int(impl::min<index_t>(TN, oth.count - x0));
      dot_tile<Tile>(member, own, o0, oth, x0, depth, sc);
      // S[o][x] <- scale * dL/dz, zero outside the matrix; count significant entries.
      int significant = 0;
      Kokkos::parallel_reduce(
          Kokkos::TeamThreadRange(member, TM),
          [&](int o, int& count) {
            Acc* s = sc.s + o * SLD;
            bool any = filter_eps == Acc(0);
            Acc ds = 0, db = 0;
            for (int x = 0; x < TN; ++x) {
              if (o >= mo || x >= mx) {
                s[x] = 0;
                continue;
              }
              const index_t oid = own.id(o0 + o), xid = oth.id(x0 + x);
              const Acc dot = s[x];
              const Acc dz = owner_is_row ? dlogit(dot, oid, xid, any) : dlogit(dot, xid, oid, any);
              ds += dz * dot;
              db += dz;
              s[x] = dz * prob.logit.scale;
            }
            own_dscale[o] += ds;
            own_dbias[o] += db;
            count += any ? 1 : 0;
          },
          significant);
      member.team_barrier();
      if (significant == 0 || grad == nullptr) continue;  // every thread saw the same count
      add_tile_product<Tile>(member, sc.s, oth, x0, mx, depth, sc, acc);
    }
    member.team_barrier();
    if (grad) write_tile_rows(member, own, o0, mo, depth, acc, grad, accumulate);
    Kokkos::parallel_for(Kokkos::TeamThreadRange(member, mo), [&](int o) {
      if (dscale_part) dscale_part[o0 + o] = own_dscale[o];
      if (dbias) {
        T& out = dbias[own.id(o0 + o)];
        out = from_acc<T>((accumulate ? to_acc<Acc>(out) : Acc(0)) + own_dbias[o]);
      }
    });
  }

 private:
  /// What both passes take from the request; the rest is value-initialized (nothing wanted).
  static BackwardTiles common(const BackwardRequest<T, Acc>& r) {
    BackwardTiles f{};
    f.prob = r.prob;
    f.row_terms = r.row_terms;
    f.col_terms = r.col_terms;
    f.filter_eps = r.filter_eps;
    f.scratch = r.scratch;
    f.scratch_bytes = r.scratch_bytes;
    return f;
  }
};

/// Launches one backward pass. The owned side's positions are split into TM-row teams.
template <class Exec, class T, class Acc>
void lse_backward_pass(const Exec& exec, const BackwardTiles<T, Acc>& f) {
  using F = BackwardTiles<T, Acc>;
  const index_t owned = f.owned().count;
  if (owned == 0) return;
  if (f.other().count > 0 && specializations_enabled() && LseBackwardSpecialization<Exec>::run(exec, f)) return;
  const int teams = int((owned + F::TM - 1) / F::TM);
  const int team = is_host_space<Exec>() ? 1 : 64;
  Kokkos::TeamPolicy<Exec> policy(exec, teams, team);
  policy.set_scratch_size(0, Kokkos::PerTeam(F::scratch0_bytes()))
      .set_scratch_size(1, Kokkos::PerTeam(f.grad ? F::scratch1_bytes(f.prob.depth) : 0));
  Kokkos::parallel_for(f.owner_is_row ? "tlse::lse_backward_rows" : "tlse::lse_backward_cols", policy, f);
}

/// Runs a backward step: a backend's fused step where one takes it, otherwise two passes, one
/// owning the rows (grad_rows, dscale) and one owning the columns (grad_cols, dbias).
template <class Exec, class T, class Acc>
void lse_backward(const Exec& exec, const BackwardRequest<T, Acc>& r) {
  if (r.prob.rows.count > 0 && r.prob.cols.count > 0 && specializations_enabled() &&
      LseBackwardFusedSpecialization<Exec>::run(exec, r))
    return;
  using F = BackwardTiles<T, Acc>;
  if (r.grad_rows || r.dscale_part) lse_backward_pass(exec, F::row_pass(r));
  if ((r.cols_into_rows ? r.grad_rows : r.grad_cols) || r.dbias) lse_backward_pass(exec, F::column_pass(r));
}

}  // namespace tlse::impl
