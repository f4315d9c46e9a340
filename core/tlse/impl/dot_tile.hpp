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

}  // namespace tlse::impl
