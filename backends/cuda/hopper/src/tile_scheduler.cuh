#pragma once
// Persistent tile scheduler: a launch has one CTA per SM (or fewer), and CTA b takes the work
// units b, b + gridDim.x, ... in order. A unit is a rectangle of output tiles (m tiles x n tiles)
// and a range of K steps, swept m-outer, n-inner; epilogues keep state across a unit's tiles
// (the forward's running row LSE, the column slots a row group owns).
//
// Unit order keeps the operands in L2: units are numbered with the K split fastest, then within
// groups of `m_group` m-units, m fastest, then n. With m_group = 1 the n split is fastest: the
// CTAs running at the same time share few m units (the forward's row panels, re-read for every
// column tile, stay resident) and walk the same column tiles in step (each read once from HBM).
// Products use larger groups (a CUTLASS-style swizzle).
//
// With clusters of cluster_m CTAs (TileConfig's ClusterM), a unit's row tiles are
// cluster_m x m_per_unit: CTA `rank` of the cluster takes m_per_unit of them, the rank-th run. All
// CTAs of a cluster walk the same number of tiles (they load B tiles for one another), so one
// whose tiles lie past m_tiles still walks them: TMA reads zeros there and the epilogues write
// nothing past the last row.
#include <cstdint>

namespace tlse::hopper {

struct WorkUnit {
  int m_begin, m_end, n_begin, n_end, k_begin, k_end;
  int m_unit, n_unit, k_unit;  // the unit's coordinates: row group, column split, K split
};

struct TileSchedule {
  int m_tiles = 0, n_tiles = 0, k_tiles = 0;
  int m_per_unit = 1, n_per_unit = 1, k_per_unit = 1;
  int m_units = 0, n_units = 0, k_units = 0;
  int m_group = 1;

  static int ceil_div(int64_t a, int64_t b) { return int((a + b - 1) / b); }

  static TileSchedule make(int m_tiles, int n_tiles, int k_tiles, int m_per_unit, int n_per_unit, int k_per_unit,
                           int m_group, int cluster_m = 1) {
    TileSchedule s;
    s.m_tiles = m_tiles, s.n_tiles = n_tiles, s.k_tiles = k_tiles;
    s.m_per_unit = m_per_unit, s.n_per_unit = n_per_unit, s.k_per_unit = k_per_unit;
    s.m_units = ceil_div(m_tiles, int64_t(m_per_unit) * cluster_m);
    s.n_units = ceil_div(n_tiles, n_per_unit);
    s.k_units = ceil_div(k_tiles, k_per_unit);
    s.m_group = m_group < 1 ? 1 : m_group;
    return s;
  }
  __host__ __device__ int units() const { return m_units * n_units * k_units; }

  /// Unit u as CTA `rank` of its cluster of ClusterM (make()'s cluster_m, a constant here so
  /// that the kernels without clusters compute no more than before) sees it.
  template <int ClusterM = 1>
  __host__ __device__ WorkUnit unit(int u, int rank = 0) const {
    WorkUnit w;
    w.k_unit = u % k_units;
    const int mn = u / k_units;
    const int per_group = m_group * n_units;
    const int group = mn / per_group, in_group = mn % per_group;
    const int first_m = group * m_group;
    const int group_m = m_units - first_m < m_group ? m_units - first_m : m_group;
    w.m_unit = first_m + in_group % group_m;
    w.n_unit = in_group / group_m;
    w.m_begin = (w.m_unit * ClusterM + rank) * m_per_unit;
    w.m_end = w.m_begin + m_per_unit < m_tiles || ClusterM > 1 ? w.m_begin + m_per_unit : m_tiles;
    w.n_begin = w.n_unit * n_per_unit;
    w.n_end = w.n_begin + n_per_unit < n_tiles ? w.n_begin + n_per_unit : n_tiles;
    w.k_begin = w.k_unit * k_per_unit;
    w.k_end = w.k_begin + k_per_unit < k_tiles ? w.k_begin + k_per_unit : k_tiles;
    return w;
  }
};

}  // namespace tlse::hopper
