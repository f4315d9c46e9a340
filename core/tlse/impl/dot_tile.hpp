#pragma once
// The team-level building block of every generic kernel: S = P_tile . Q_tile^T for a TM x TN
// tile, the depth streamed through level-0 scratch TK at a time, each thread owning 4 x 4
// register blocks (vectorizes on CPUs, register-blocks on GPUs).
#include <tlse/impl/tile_problem.hpp>

namespace tlse::impl {

template <class Acc, class Tile = GenericTile>
struct DotTileScratch {
  static constexpr int TM = Tile::TM, TN = Tile::TN, TK = Tile::TK;
  static constexpr int SLD = TN + 1;  // S row stride, padded against shared-memory bank conflicts
  Acc* p;  // TK x TM, depth-major
  Acc* q;  // TK x TN, depth-major (reused as TN x TK by the backward)
  Acc* s;  // TM x SLD
  static constexpr std::size_t bytes() { return sizeof(Acc) * (TK * TM + TK * TN + TM * SLD); }
  template <class Member>
  KOKKOS_INLINE_FUNCTION explicit DotTileScratch(const Member& member) {
    p = static_cast<Acc*>(member.team_scratch(0).get_shmem(sizeof(Acc) * TK * TM));
    q = static_cast<Acc*>(member.team_scratch(0).get_shmem(sizeof(Acc) * TK * TN));
    s = static_cast<Acc*>(member.team_scratch(0).get_shmem(sizeof(Acc) * TM * SLD));
  }
};

/// Copies rows [p0, p0+rows) x depth [k0, k0+TK) of a side into depth-major scratch,
/// converting to Acc and zero-filling past the edges.
template <int ROWS, int TK, class Member, class T, class Acc>
KOKKOS_INLINE_FUNCTION void load_depth_major(const Member& member, const Side<T>& side, index_t depth,
                                             index_t p0, index_t k0, Acc* dst) {
  Kokkos::parallel_for(Kokkos::TeamThreadRange(member, ROWS * TK), [&](int idx) {
    const int r = idx / TK, k = idx % TK;
    const index_t p = p0 + r, kk = k0 + k;
    dst[k * ROWS + r] = (p < side.count && kk < depth) ? to_acc<Acc>(side.data[side.id(p) * depth + kk]) : Acc(0);
  });
}

/// S[i][j] = sum_k P[p0+i][k] * Q[q0+j][k] over the whole depth. Ends with a team barrier.
template <class Tile, class Member, class T, class Acc>
KOKKOS_INLINE_FUNCTION void dot_tile(const Member& member, const Side<T>& P, index_t p0, const Side<T>& Q,
                                     index_t q0, index_t depth, const DotTileScratch<Acc, Tile>& sc) {
  constexpr int TM = Tile::TM, TN = Tile::TN, TK = Tile::TK, SLD = DotTileScratch<Acc, Tile>::SLD;
  constexpr int BM = TM / 4, BN = TN / 4;
  Kokkos::parallel_for(Kokkos::TeamThreadRange(member, TM * SLD), [&](int idx) { sc.s[idx] = Acc(0); });
  for (index_t k0 = 0; k0 < depth; k0 += TK) {
    load_depth_major<TM, TK>(member, P, depth, p0, k0, sc.p);
    load_depth_major<TN, TK>(member, Q, depth, q0, k0, sc.q);
    member.team_barrier();
    const int kc = depth - k0 < TK ? int(depth - k0) : TK;
    Kokkos::parallel_for(Kokkos::TeamThreadRange(member, BM * BN), [&](int blk) {
      const int i0 = (blk / BN) * 4, j0 = (blk % BN) * 4;
      Acc acc[4][4];
      for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 4; ++j) acc[i][j] = sc.s[(i0 + i) * SLD + j0 + j];
      for (int k = 0; k < kc; ++k) {
        const Acc* a = sc.p + k * TM + i0;
        const Acc* b = sc.q + k * TN + j0;
        for (int i = 0; i < 4; ++i)
          for (int j = 0; j < 4; ++j) acc[i][j] += a[i] * b[j];
      }
      for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 4; ++j) sc.s[(i0 + i) * SLD + j0 + j] = acc[i][j];
    });
    member.team_barrier();
  }
}

/// acc[o * depth + k] += sum_x G[o * SLD + x] * Q[q0 + x][k] for o < TM and k < depth: a TM x TN
/// tile G (zero outside the matrix) times the TN rows of side Q from q0 (mq of them real), the
/// rows staged TK features at a time through sc.q. The backward's product of dL/dx with the other
/// side's operand. Ends with a team barrier.
template <class Tile, class Member, class T, class Acc>
KOKKOS_INLINE_FUNCTION void add_tile_product(const Member& member, const Acc* G, const Side<T>& Q, index_t q0, int mq,
                                             index_t depth, const DotTileScratch<Acc, Tile>& sc, Acc* acc) {
  constexpr int TM = Tile::TM, TN = Tile::TN, TK = Tile::TK, SLD = DotTileScratch<Acc, Tile>::SLD;
  for (index_t k0 = 0; k0 < depth; k0 += TK) {
    const int kc = depth - k0 < TK ? int(depth - k0) : TK;
    // The other side's tile, row-major this time: q[x * TK + k].
    Kokkos::parallel_for(Kokkos::TeamThreadRange(member, TN * TK), [&](int idx) {
      const int x = idx / TK, k = idx % TK;
      sc.q[idx] = (x < mq && k < kc) ? to_acc<Acc>(Q.data[Q.id(q0 + x) * depth + k0 + k]) : Acc(0);
    });
    member.team_barrier();
    Kokkos::parallel_for(Kokkos::TeamThreadRange(member, TM * (TK / 4)), [&](int idx) {
      const int o = idx / (TK / 4), kb = (idx % (TK / 4)) * 4;
      Acc a[4] = {0, 0, 0, 0};
      const Acc* g = G + o * SLD;
      for (int x = 0; x < TN; ++x)
        for (int u = 0; u < 4; ++u) a[u] += g[x] * sc.q[x * TK + kb + u];
      for (int u = 0; u < 4; ++u)
        if (kb + u < kc) acc[o * depth + k0 + kb + u] += a[u];
    });
    member.team_barrier();
  }
}

/// grad[own.id(o0 + o)][k] = acc[o * depth + k] (added to grad's value when accumulating) for the
/// mo owned rows from o0: where a backward team writes its rows, once. G: the gradient's type
/// (the inputs', or Acc for a partial gradient that is summed further).
template <class Member, class T, class Acc, class G>
KOKKOS_INLINE_FUNCTION void write_tile_rows(const Member& member, const Side<T>& own, index_t o0, int mo, index_t depth,
                                            const Acc* acc, G* grad, bool accumulate) {
  Kokkos::parallel_for(Kokkos::TeamThreadRange(member, index_t(mo) * depth), [&](index_t idx) {
    const index_t o = idx / depth, k = idx % depth;
    G& out = grad[own.id(o0 + o) * depth + k];
    out = from_acc<G>((accumulate ? to_acc<Acc>(out) : Acc(0)) + acc[idx]);
  });
}

}  // namespace tlse::impl
