#pragma once
// Generic kernels of the distillation loss: tile pairs. For one (row block, column block) a team
// computes the student's tile (depth D_s) and the teacher's (depth D_t) in two scratch tiles, then
// works on both entry by entry: the forward sums each row's divergence terms from the LSEs a first
// sweep saved (lse_forward on each head), the backward turns the pair into dL/dx of each head and
// multiplies it with that head's other operand. As ForwardTiles and BackwardTiles: per-(row,
// column block) partials merged in a fixed order, teams that own the rows (or the columns) they
// write, no atomics, so the results are bitwise reproducible.
//
// Per row, with ls = log p_s and lt = log p_t of an entry (z / T - lse at scale 1 / T):
//   forward KL  F   = sum_j p_t (lt - ls);          dF/dz_s = p_s - p_t,  dF/dz_t = p_t ((lt - ls) - F)
//   reverse KL  R   = sum_j p_s (ls - lt);          dR/dz_s = p_s ((ls - lt) - R),  dR/dz_t = p_t - p_s
//   JSD         K_t = sum_j p_t (lt - lm), K_s = sum_j p_s (ls - lm), lm = log(beta p_t + (1 - beta) p_s),
//               J = beta K_t + (1 - beta) K_s;      dJ/dz_s = (1 - beta) p_s ((ls - lm) - K_s),
//                                                   dJ/dz_t = beta p_t ((lt - lm) - K_t)
// An entry with p = 0 adds 0 to a sum weighted by p (0 log 0 = 0), so masked (-inf) classes are
// no NaN; p_t > 0 where p_s = 0 gives the forward KL +inf, as the math does.
#include <tlse/distillation_options.hpp>
#include <tlse/impl/backend_dispatch.hpp>
#include <tlse/impl/dot_tile.hpp>
#include <tlse/impl/lse_forward.hpp>

namespace tlse::impl {

/// The fields of a row of distillation_row_stats, by row id.
enum DistillationStat { stat_lse_s, stat_lse_t, stat_lse_ce, stat_term_s, stat_term_t };

/// The per-entry math of the divergences (header comment). `divergence` is resolved: jsd only
/// with 0 < beta < 1.
template <class Acc>
struct DivergenceModel {
  Divergence divergence = Divergence::forward_kl;
  Acc beta = 0, log_beta = 0, log_rest = 0;  // log beta, log(1 - beta)

  static DivergenceModel make(Divergence d, double beta) {
    DivergenceModel m;
    m.divergence = d == Divergence::jsd && beta == 0   ? Divergence::forward_kl
                   : d == Divergence::jsd && beta == 1 ? Divergence::reverse_kl
                                                       : d;
    m.beta = Acc(beta);
    if (m.divergence == Divergence::jsd) m.log_beta = Acc(std::log(beta)), m.log_rest = Acc(std::log1p(-beta));
    return m;
  }

  /// p * d, 0 where p = 0 (so that 0 * inf is no NaN); a NaN p stays NaN.
  KOKKOS_INLINE_FUNCTION static Acc weighted(Acc p, Acc d) { return p == Acc(0) ? Acc(0) : p * d; }

  /// log m = log(beta p_t + (1 - beta) p_s), from the log-probabilities.
  KOKKOS_INLINE_FUNCTION Acc log_mix(Acc ls, Acc lt) const {
    const Acc a = log_beta + lt, b = log_rest + ls;
    const Acc hi = a > b ? a : b, lo = a > b ? b : a;
    if (hi == -infinity<Acc>()) return hi;
    return hi + impl::log(Acc(1) + impl::exp(lo - hi));
  }

  /// Adds an entry's shares to the row's student and teacher sums.
  KOKKOS_INLINE_FUNCTION void add_terms(Acc ls, Acc lt, Acc& term_s, Acc& term_t) const {
    const Acc ps = impl::exp(ls), pt = impl::exp(lt);
    if (divergence == Divergence::forward_kl) {
      term_t += weighted(pt, lt - ls);
    } else if (divergence == Divergence::reverse_kl) {
      term_s += weighted(ps, ls - lt);
    } else {
      const Acc lm = log_mix(ls, lt);
      term_t += weighted(pt, lt - lm);
      term_s += weighted(ps, ls - lm);
    }
  }

  /// The row's divergence from its sums.
  KOKKOS_INLINE_FUNCTION Acc row(Acc term_s, Acc term_t) const {
    if (divergence == Divergence::forward_kl) return term_t;
    if (divergence == Divergence::reverse_kl) return term_s;
    return beta * term_t + (Acc(1) - beta) * term_s;
  }

  /// d divergence / d z_s (ds) and d z_t (dt) at an entry, given the row's sums.
  KOKKOS_INLINE_FUNCTION void dlogits(Acc ls, Acc lt, Acc term_s, Acc term_t, Acc& ds, Acc& dt) const {
    const Acc ps = impl::exp(ls), pt = impl::exp(lt);
    if (divergence == Divergence::forward_kl) {
      ds = ps - pt;
      dt = weighted(pt, (lt - ls) - term_t);
    } else if (divergence == Divergence::reverse_kl) {
      ds = weighted(ps, (ls - lt) - term_s);
      dt = pt - ps;
    } else {
      const Acc lm = log_mix(ls, lt);
      ds = (Acc(1) - beta) * weighted(ps, (ls - lm) - term_s);
      dt = beta * weighted(pt, (lt - lm) - term_t);
    }
  }
};

/// Both heads as the tile kernels see them: the same row positions (the scored rows) and the same
/// columns (the vocabulary, or a shard of it), each with its logit model (scale 1 / T), and the
/// saved per-row statistics (stats[row id * distillation_row_stats + DistillationStat]).
template <class T, class Acc>
struct PairProblem {
  TileProblem<T, Acc> student, teacher;
  DivergenceModel<Acc> model;
  const Acc* stats = nullptr;

  /// The log-probabilities of the entry (row id r, column id c) from its two dot products.
  KOKKOS_INLINE_FUNCTION void log_probs(Acc dot_s, Acc dot_t, index_t r, index_t c, Acc& ls, Acc& lt) const {
    const Acc* st = stats + r * distillation_row_stats;
    ls = student.logit(dot_s, r, c) - st[stat_lse_s];
    lt = teacher.logit(dot_t, r, c) - st[stat_lse_t];
  }
};

/// The scratch of a tile pair: DotTileScratch's staging and the student's tile, plus the
/// teacher's tile. The two products share the staging buffers, which keeps a double team under
/// Kokkos 3.4's 40 KiB CUDA scratch cap.
template <class Acc, class Tile>
struct PairScratch {
  using Scratch = DotTileScratch<Acc, Tile>;
  Scratch s, t;  // t.p == s.p, t.q == s.q; t.s the teacher's tile
  static constexpr std::size_t bytes() { return Scratch::bytes() + sizeof(Acc) * Tile::TM * Scratch::SLD; }
  template <class Member>
  KOKKOS_INLINE_FUNCTION explicit PairScratch(const Member& member) : s(member), t(s) {
    t.s = static_cast<Acc*>(member.team_scratch(0).get_shmem(sizeof(Acc) * Tile::TM * Scratch::SLD));
  }
};

/// Forward, second sweep: each team sums its (row block, column block)'s terms per row into the
/// partials term_s_part, term_t_part ([grid_cols][rows.count] each).
template <class T, class Acc, class Tile = GenericTile>
struct PairForwardTiles {
  static constexpr int TM = Tile::TM, TN = Tile::TN, SLD = DotTileScratch<Acc, Tile>::SLD;
  PairProblem<T, Acc> pp;
  ForwardGrid grid;
  Acc* term_s_part;
  Acc* term_t_part;

  static std::size_t scratch_bytes() { return PairScratch<Acc, Tile>::bytes() + 2 * sizeof(Acc) * TM; }

  template <class Member>
  KOKKOS_INLINE_FUNCTION void operator()(const Member& member) const {
    const index_t rb = member.league_rank() / grid.grid_cols, cb = member.league_rank() % grid.grid_cols;
    const PairScratch<Acc, Tile> sc(member);
    Acc* run_s = static_cast<Acc*>(member.team_scratch(0).get_shmem(sizeof(Acc) * TM));
    Acc* run_t = static_cast<Acc*>(member.team_scratch(0).get_shmem(sizeof(Acc) * TM));
    const Side<T>&rows_s = pp.student.rows, &cols_s = pp.student.cols;
    const index_t nr = rows_s.count, nc = cols_s.count;
    const index_t c_begin = cb * grid.col_tiles * TN, c_end = impl::min<index_t>(nc, c_begin + grid.col_tiles * TN);
    for (index_t rt = 0; rt < grid.row_tiles; ++rt) {
      const index_t r0 = (rb * grid.row_tiles + rt) * TM;
      if (r0 >= nr) break;
      const int mr = int(impl::min<index_t>(TM, nr - r0));
      Kokkos::parallel_for(Kokkos::TeamThreadRange(member, TM), [&](int i) { run_s[i] = run_t[i] = 0; });
      for (index_t c0 = c_begin; c0 < c_end; c0 += TN) {
        const int mc = int(impl::min<index_t>(TN, c_end - c0));
        dot_tile<Tile>(member, rows_s, r0, cols_s, c0, pp.student.depth, sc.s);
        dot_tile<Tile>(member, pp.teacher.rows, r0, pp.teacher.cols, c0, pp.teacher.depth, sc.t);
        Kokkos::parallel_for(Kokkos::TeamThreadRange(member, mr), [&](int i) {
          const index_t r = rows_s.id(r0 + i);
          Acc ts = 0, tt = 0;
          for (int j = 0; j < mc; ++j) {
            Acc ls, lt;
            pp.log_probs(sc.s.s[i * SLD + j], sc.t.s[i * SLD + j], r, cols_s.id(c0 + j), ls, lt);
            pp.model.add_terms(ls, lt, ts, tt);
          }
          run_s[i] += ts;
          run_t[i] += tt;
        });
        member.team_barrier();
      }
      Kokkos::parallel_for(Kokkos::TeamThreadRange(member, mr), [&](int i) {
        term_s_part[cb * nr + r0 + i] = run_s[i];
        term_t_part[cb * nr + r0 + i] = run_t[i];
      });
      member.team_barrier();
    }
  }
};

/// The forward whole, as a backend specialization may take it in one sweep where the divergence
/// allows (the KLs: their sums need no LSE beforehand): each scored row's statistics into stats
/// (by row id), pp.stats unread. ce_lse: the cross-entropy's LSE is wanted (alpha > 0), at scale 1
/// where ce_own (T != 1), else the student's; without it, 0 (as the LSE sweeps leave it).
template <class T, class Acc>
struct PairStatisticsRequest {
  PairProblem<T, Acc> pp;
  Acc* stats;
  bool ce_lse, ce_own;
  char* scratch;
  std::size_t scratch_bytes;

  /// Row r's statistics.
  KOKKOS_INLINE_FUNCTION static void store(Acc* stats, index_t r, Acc lse_s, Acc lse_t, Acc lse_ce, Acc term_s,
                                           Acc term_t) {
    Acc* st = stats + r * distillation_row_stats;
    st[stat_lse_s] = lse_s;
    st[stat_lse_t] = lse_t;
    st[stat_lse_ce] = lse_ce;
    st[stat_term_s] = term_s;
    st[stat_term_t] = term_t;
  }
};

/// Runs the forward's statistics on a backend's specialization (scratch: its
/// distillation_scratch_bytes, or none); false: the LSE sweeps and distillation_terms are to run.
template <class Exec, class T, class Acc>
bool distillation_statistics(const Exec& exec, const PairProblem<T, Acc>& pp, Acc* stats, bool ce_lse, bool ce_own,
                             char* scratch, std::size_t scratch_bytes) {
  return pp.student.rows.count > 0 && pp.student.cols.count > 0 && scratch_bytes > 0 && specializations_enabled() &&
         DistillationSpecialization<Exec>::statistics(
             exec, PairStatisticsRequest<T, Acc>{pp, stats, ce_lse, ce_own, scratch, scratch_bytes});
}

/// The forward's second sweep as a backend specialization takes it: term_s[id], term_t[id] (by
/// row id) for the row positions of pp, with `scratch_bytes` of scratch (the call's
/// distillation_scratch_bytes, or fewer).
template <class T, class Acc>
struct PairTermsRequest {
  PairProblem<T, Acc> pp;
  Acc* term_s;
  Acc* term_t;
  char* scratch;
  std::size_t scratch_bytes;
};

/// Number of Acc values distillation_terms needs as `partials` for `rows` row positions.
inline index_t distillation_partials_size(const ForwardGrid& g, index_t rows) { return 2 * g.grid_cols * rows; }

/// Runs the forward's second sweep: term_s[rows.id(p)], term_t[rows.id(p)] (by row id) for the
/// row positions of pp, summed over pp's columns.
/// A backend's specialization (scratch: its distillation_scratch_bytes, or none) takes the sweep
/// first.
template <class Exec, class T, class Acc>
void distillation_terms(const Exec& exec, const PairProblem<T, Acc>& pp, const ForwardGrid& grid, Acc* partials,
                        Acc* term_s, Acc* term_t, char* scratch = nullptr, std::size_t scratch_bytes = 0) {
  using F = PairForwardTiles<T, Acc>;
  const index_t nr = pp.student.rows.count, nc = pp.student.cols.count;
  if (nr > 0 && nc > 0 && scratch_bytes > 0 && specializations_enabled() &&
      DistillationSpecialization<Exec>::terms(exec,
                                              PairTermsRequest<T, Acc>{pp, term_s, term_t, scratch, scratch_bytes}))
    return;
  F f{pp, grid, partials, partials + grid.grid_cols * nr};
  if (nr > 0 && nc > 0) {
    const int team = is_host_space<Exec>() ? 1 : 64;
    Kokkos::TeamPolicy<Exec> policy(exec, int(grid.grid_rows * grid.grid_cols), team);
    Kokkos::parallel_for("tlse::distillation_terms", policy.set_scratch_size(0, Kokkos::PerTeam(F::scratch_bytes())),
                         f);
  } else {
    fill(exec, partials, distillation_partials_size(grid, nr), Acc(0));
  }
  merge_logit_sums(exec, pp.student.rows, f.term_s_part, grid.grid_cols, term_s);
  merge_logit_sums(exec, pp.student.rows, f.term_t_part, grid.grid_cols, term_t);
}

/// The backward's coefficients by row id: the divergence's weight (1 - alpha) times the row's
/// upstream gradient (with the reduction's factor), and the cross-entropy's alpha times it with
/// the row's target (a column id of pp, or -1: none on these columns) and its LSE at scale 1
/// (stats' stat_lse_ce). ce == nullptr: no cross-entropy term.
template <class Acc>
struct DistillationGradientTerms {
  const Acc* div = nullptr;
  const Acc* ce = nullptr;
  const int* target = nullptr;
};

/// dL/d(dot) of both heads at an entry (row id r, column id c) from its two dot products: the
/// divergence's through the row coefficients, plus the student's cross-entropy.
template <class T, class Acc>
struct PairGradient {
  PairProblem<T, Acc> pp;
  DistillationGradientTerms<Acc> g;

  KOKKOS_INLINE_FUNCTION void operator()(Acc dot_s, Acc dot_t, index_t r, index_t c, Acc& gs, Acc& gt) const {
    Acc ls, lt, ds, dt;
    pp.log_probs(dot_s, dot_t, r, c, ls, lt);
    const Acc* st = pp.stats + r * distillation_row_stats;
    pp.model.dlogits(ls, lt, st[stat_term_s], st[stat_term_t], ds, dt);
    gs = g.div[r] * ds * pp.student.logit.scale;
    gt = g.div[r] * dt * pp.teacher.logit.scale;
    if (g.ce) gs += g.ce[r] * (impl::exp(dot_s - st[stat_lse_ce]) - (g.target[r] == c ? Acc(1) : Acc(0)));
  }
};

/// The backward as a backend specialization takes it: the gradients (each nullptr: not wanted;
/// dHs and dHt by row id of type G, dWs and dWt by column id), with `scratch_bytes` of scratch.
template <class T, class Acc, class G>
struct PairBackwardRequest {
  PairGradient<T, Acc> grad;
  G* dHs;
  T* dWs;
  G* dHt;
  T* dWt;
  bool accumulate;
  char* scratch;
  std::size_t scratch_bytes;
};

/// The training step as a backend specialization may take it: the forward's statistics in one
/// sweep (into forward.stats, which backward.grad.pp.stats is), then the backward, in the
/// forward's scratch, so that what the first sweep computes may serve the second.
template <class T, class Acc, class G>
struct PairStepRequest {
  PairStatisticsRequest<T, Acc> forward;
  PairBackwardRequest<T, Acc, G> backward;
};

/// Runs a training step on a backend's specialization; false: nothing ran (the two calls are to).
template <class Exec, class T, class Acc, class G>
bool distillation_step(const Exec& exec, const PairStatisticsRequest<T, Acc>& forward,
                       const PairBackwardRequest<T, Acc, G>& backward) {
  return forward.pp.student.rows.count > 0 && forward.pp.student.cols.count > 0 && forward.scratch_bytes > 0 &&
         specializations_enabled() &&
         DistillationSpecialization<Exec>::step(exec, PairStepRequest<T, Acc, G>{forward, backward});
}

/// A backward pass over tile pairs: teams own row tiles (grad_s = dHs, grad_t = dHt) or column
/// tiles (dWs, dWt), recompute both heads' tiles against the whole other side, form dL/dx of
/// each head and add its product with that head's other operand into level-1 scratch (TM x
/// (D_s + D_t) accumulators), written once. G: the gradients' type (T, or Acc for the partial
/// gradients of a vocabulary shard).
template <class T, class Acc, class G = T, class Tile = GenericTile>
struct PairBackwardTiles {
  static constexpr int TM = Tile::TM, TN = Tile::TN, SLD = DotTileScratch<Acc, Tile>::SLD;
  static_assert(TM == TN, "the owned and the other side swap roles, so tiles are square");
  PairGradient<T, Acc> grad;
  bool owner_is_row;
  G* grad_s;  // by owned id, nullptr: not wanted
  G* grad_t;
  bool accumulate;

  static std::size_t scratch0_bytes() { return PairScratch<Acc, Tile>::bytes(); }
  std::size_t scratch1_bytes() const {
    return sizeof(Acc) * TM * std::size_t((grad_s ? grad.pp.student.depth : 0) + (grad_t ? grad.pp.teacher.depth : 0));
  }
  KOKKOS_INLINE_FUNCTION const Side<T>& owned(const TileProblem<T, Acc>& p) const {
    return owner_is_row ? p.rows : p.cols;
  }
  KOKKOS_INLINE_FUNCTION const Side<T>& other(const TileProblem<T, Acc>& p) const {
    return owner_is_row ? p.cols : p.rows;
  }

  template <class Member>
  KOKKOS_INLINE_FUNCTION void operator()(const Member& member) const {
    const PairProblem<T, Acc>& pp = grad.pp;
    const PairScratch<Acc, Tile> sc(member);
    const index_t ds = pp.student.depth, dt = pp.teacher.depth;
    const index_t len_s = grad_s ? TM * ds : 0, len_t = grad_t ? TM * dt : 0;
    Acc* acc_s = static_cast<Acc*>(member.team_scratch(1).get_shmem(sizeof(Acc) * (len_s + len_t)));
    Acc* acc_t = acc_s + len_s;
    const Side<T>&own_s = owned(pp.student), &oth_s = other(pp.student);
    const Side<T>&own_t = owned(pp.teacher), &oth_t = other(pp.teacher);
    const index_t o0 = index_t(member.league_rank()) * TM;
    const int mo = int(impl::min<index_t>(TM, own_s.count - o0));
    Kokkos::parallel_for(Kokkos::TeamThreadRange(member, len_s + len_t), [&](index_t i) { acc_s[i] = 0; });
    for (index_t x0 = 0; x0 < oth_s.count; x0 += TN) {
      const int mx = int(impl::min<index_t>(TN, oth_s.count - x0));
      dot_tile<Tile>(member, own_s, o0, oth_s, x0, ds, sc.s);
      dot_tile<Tile>(member, own_t, o0, oth_t, x0, dt, sc.t);
      // Both tiles <- dL/d(dot), zero outside the matrix.
      Kokkos::parallel_for(Kokkos::TeamThreadRange(member, TM), [&](int o) {
        Acc* s = sc.s.s + o * SLD;
        Acc* t = sc.t.s + o * SLD;
        for (int x = 0; x < TN; ++x) {
          if (o >= mo || x >= mx) {
            s[x] = t[x] = 0;
            continue;
          }
          const index_t oid = own_s.id(o0 + o), xid = oth_s.id(x0 + x);
          if (owner_is_row)
            grad(s[x], t[x], oid, xid, s[x], t[x]);
          else
            grad(s[x], t[x], xid, oid, s[x], t[x]);
        }
      });
      member.team_barrier();
      if (grad_s) add_tile_product<Tile>(member, sc.s.s, oth_s, x0, mx, ds, sc.s, acc_s);
      if (grad_t) add_tile_product<Tile>(member, sc.t.s, oth_t, x0, mx, dt, sc.s, acc_t);
    }
    member.team_barrier();
    if (grad_s) write_tile_rows(member, own_s, o0, mo, ds, acc_s, grad_s, accumulate);
    if (grad_t) write_tile_rows(member, own_t, o0, mo, dt, acc_t, grad_t, accumulate);
  }
};

/// Runs one backward pass (PairBackwardTiles) when it has a gradient to write.
template <class Exec, class T, class Acc, class G>
void distillation_backward_pass(const Exec& exec, const PairBackwardTiles<T, Acc, G>& f) {
  using F = PairBackwardTiles<T, Acc, G>;
  const index_t owned = f.owned(f.grad.pp.student).count;
  if (owned == 0 || (!f.grad_s && !f.grad_t)) return;
  const int team = is_host_space<Exec>() ? 1 : 64;
  Kokkos::TeamPolicy<Exec> policy(exec, int((owned + F::TM - 1) / F::TM), team);
  policy.set_scratch_size(0, Kokkos::PerTeam(F::scratch0_bytes()))
      .set_scratch_size(1, Kokkos::PerTeam(f.scratch1_bytes()));
  Kokkos::parallel_for(f.owner_is_row ? "tlse::distillation_backward_rows" : "tlse::distillation_backward_cols", policy,
                       f);
}

/// The backward's two passes: rows (dHs, dHt, by row id of the scored rows only; of type G) then
/// columns (dWs, dWt, by column id). Each gradient may be nullptr (not wanted). `accumulate`
/// adds into all four. A backend's specialization (scratch: its distillation_scratch_bytes, or
/// none) takes the backward first.
template <class Exec, class T, class Acc, class G>
void distillation_backward(const Exec& exec, const PairProblem<T, Acc>& pp, const DistillationGradientTerms<Acc>& g,
                           G* dHs, T* dWs, G* dHt, T* dWt, bool accumulate, char* scratch = nullptr,
                           std::size_t scratch_bytes = 0) {
  const PairGradient<T, Acc> grad{pp, g};
  if ((dHs || dWs || dHt || dWt) && pp.student.rows.count > 0 && pp.student.cols.count > 0 && scratch_bytes > 0 &&
      specializations_enabled() &&
      DistillationSpecialization<Exec>::backward(
          exec, PairBackwardRequest<T, Acc, G>{grad, dHs, dWs, dHt, dWt, accumulate, scratch, scratch_bytes}))
    return;
  PairBackwardTiles<T, Acc, G> rows{grad, true, dHs, dHt, accumulate};
  distillation_backward_pass(exec, rows);
  PairBackwardTiles<T, Acc, T> cols{grad, false, dWs, dWt, accumulate};
  distillation_backward_pass(exec, cols);
}

}  // namespace tlse::impl
