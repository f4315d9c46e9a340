#pragma once
// The label-smoothing term of the cross-entropy without a softcap. With class weights u (all 1
// without them), its loss needs each row's weighted logit sum S_i = sum_j u_j x_ij =
// E_i . (C^T u) + bias . u, and its share of dL/dx is the rank-one matrix -s_i u_j, whose
// products are dE_i -= s_i C^T u, dC_j -= u_j E^T s and dbias_j -= u_j sum_i s_i: vectors of the
// depth, O((N + V) D) memory traffic and no pass over the logit tiles. (Under a softcap dx/dz
// varies per entry, and the tile kernels take the term: SoftmaxTerms::spread.)
#include <tlse/impl/sixteen_bytes.hpp>
#include <tlse/impl/tile_problem.hpp>

#include <algorithm>

namespace tlse::impl {

/// How weighted_column_sums splits the rows: `chunks` chunks of `rows_per_chunk` rows, one team
/// each, whose partial sums (chunks x depth) are then added in a fixed order: deterministic.
struct ColumnSumPlan {
  index_t chunks = 1, rows_per_chunk = 1;

  template <class Exec>
  static ColumnSumPlan make(const Exec& exec, index_t rows) {
    // Enough teams to keep every core streaming; on a GPU a team is 128 threads.
    const index_t teams = is_host_space<Exec>() ? index_t(exec.concurrency()) : index_t(exec.concurrency()) / 128;
    ColumnSumPlan p;
    p.chunks = std::max<index_t>(1, std::min<index_t>((rows + 31) / 32, std::max<index_t>(teams, 1)));
    p.rows_per_chunk = std::max<index_t>(1, (rows + p.chunks - 1) / p.chunks);
    p.chunks = std::max<index_t>(1, (rows + p.rows_per_chunk - 1) / p.rows_per_chunk);
    return p;
  }
  /// Acc values of the partial sums for `depth` columns.
  index_t partials(index_t depth) const { return chunks * depth; }
};

/// out[k] = sum_r weight[r] M(r, k) over the rows of the row-major M (rows x depth); weight
/// nullptr stands for all 1. `partials` holds ColumnSumPlan::make(exec, rows).partials(depth)
/// values (at most as many as for more rows).
template <class Exec, class T, class Acc>
void weighted_column_sums(const Exec& exec, const T* M, index_t rows, index_t depth, const Acc* weight, Acc* partials,
                          Acc* out) {
  const ColumnSumPlan plan = ColumnSumPlan::make(exec, rows);
  using Pack = SixteenBytes<T>;
  constexpr int W = Pack::COUNT;
  const bool packed = Pack::fits(M, depth);
  const index_t lanes = packed ? depth / W : depth;  // columns (or packs of W columns) per row
  const index_t per_chunk = plan.rows_per_chunk;
  using Member = typename Kokkos::TeamPolicy<Exec>::member_type;
  const int team = is_host_space<Exec>() ? 1 : 128;
  if (rows > 0 && depth > 0)
    Kokkos::parallel_for(
        "tlse::weighted_column_sums", Kokkos::TeamPolicy<Exec>(exec, int(plan.chunks), team),
        KOKKOS_LAMBDA(const Member& m) {
          const index_t chunk = m.league_rank(), r0 = chunk * per_chunk;
          const index_t r1 = impl::min<index_t>(rows, r0 + per_chunk);
          Kokkos::parallel_for(Kokkos::TeamThreadRange(m, lanes), [&](index_t lane) {
            Acc s[W];
            for (int q = 0; q < W; ++q) s[q] = 0;
            for (index_t r = r0; r < r1; ++r) {
              const Acc w = weight ? weight[r] : Acc(1);
              if (packed) {
                const Pack p = reinterpret_cast<const Pack*>(M + r * depth)[lane];
                for (int q = 0; q < W; ++q) s[q] += w * to_acc<Acc>(p.v[q]);
              } else {
                s[0] += w * to_acc<Acc>(M[r * depth + lane]);
              }
            }
            Acc* dst = partials + chunk * depth;
            if (packed)
              for (int q = 0; q < W; ++q) dst[lane * W + q] = s[q];
            else
              dst[lane] = s[0];
          });
        });
  // The chunks' sums in two levels, so that more than `depth` threads share the reads: groups of
  // about sqrt(chunks) chunks into their first chunk's row (in place), then the groups.
  const index_t chunks = rows > 0 ? plan.chunks : 0;
  index_t per_group = 1;
  while ((per_group + 1) * (per_group + 1) <= chunks) ++per_group;
  const index_t groups = chunks > 0 ? (chunks + per_group - 1) / per_group : 0;
  if (per_group > 1)
    Kokkos::parallel_for(
        "tlse::weighted_column_sums_groups", Kokkos::RangePolicy<Exec>(exec, 0, groups * depth),
        KOKKOS_LAMBDA(index_t idx) {
          const index_t first = (idx / depth) * per_group, k = idx % depth;
          const index_t end = impl::min<index_t>(chunks, first + per_group);
          Acc s = 0;
          for (index_t c = first; c < end; ++c) s += partials[c * depth + k];
          partials[first * depth + k] = s;
        });
  Kokkos::parallel_for(
      "tlse::weighted_column_sums_merge", Kokkos::RangePolicy<Exec>(exec, 0, depth), KOKKOS_LAMBDA(index_t k) {
        Acc s = 0;
        for (index_t g = 0; g < groups; ++g) s += partials[g * per_group * depth + k];
        out[k] = s;
      });
}

/// *out = sum_j x[j] weight[j] (weight nullptr: 1), j in [0, n), summed in a fixed order on the device.
template <class Exec, class T, class Acc>
void weighted_dot(const Exec& exec, const T* x, const Acc* weight, index_t n, Acc* out) {
  using Scalar = Kokkos::View<Acc, typename Exec::memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  Kokkos::parallel_reduce(
      "tlse::weighted_dot", Kokkos::RangePolicy<Exec, Kokkos::Schedule<Kokkos::Static>>(exec, 0, n),
      KOKKOS_LAMBDA(index_t j, Acc & s) { s += to_acc<Acc>(x[j]) * (weight ? weight[j] : Acc(1)); }, Scalar(out));
}

/// out[id] = M(id, :) . v + *add (add nullptr: 0) for the rows id = row_of(k), k in [0, n):
/// one team per row, as pair_logits.
template <class Exec, class T, class Acc, class RowOf>
void row_dots(const Exec& exec, const T* M, index_t depth, index_t n, const RowOf& row_of, const Acc* v,
              const Acc* add, Acc* out) {
  if (n == 0) return;
  using Pack = SixteenBytes<T>;
  constexpr int W = Pack::COUNT;
  const bool packed = Pack::fits(M, depth);
  const index_t steps = packed ? depth / W : depth;
  using Member = typename Kokkos::TeamPolicy<Exec>::member_type;
  Kokkos::parallel_for(
      "tlse::row_dots", Kokkos::TeamPolicy<Exec>(exec, int(n), is_host_space<Exec>() ? 1 : 32),
      KOKKOS_LAMBDA(const Member& m) {
        const index_t id = row_of(index_t(m.league_rank()));
        const T* a = M + id * depth;
        Acc dot = 0;
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(m, steps),
            [&](index_t d, Acc& s) {
              if (packed) {
                const Pack p = reinterpret_cast<const Pack*>(a)[d];
                for (int q = 0; q < W; ++q) s += to_acc<Acc>(p.v[q]) * v[d * W + q];
              } else {
                s += to_acc<Acc>(a[d]) * v[d];
              }
            },
            dot);
        Kokkos::single(Kokkos::PerTeam(m), [&]() { out[id] = dot + (add ? *add : Acc(0)); });
      });
}

/// out(id, k) -= coef(id) v[k] in place, rounded once to T, for the rows id = row_of(p), p in
/// [0, n); coef nullptr stands for 1 (a rank-one update of a gradient). 16 bytes a thread where
/// the rows allow: the pass is as long as the gradient (V x D for dC), and element-wise 2-byte
/// accesses left it several times slower than the memory.
template <class Exec, class T, class Acc, class RowOf>
void subtract_outer(const Exec& exec, T* out, index_t depth, index_t n, const RowOf& row_of, const Acc* coef,
                    const Acc* v) {
  if (n == 0 || depth == 0) return;
  using Pack = SixteenBytes<T>;
  constexpr int W = Pack::COUNT;
  const bool packed = Pack::fits(out, depth);
  const index_t lanes = packed ? depth / W : depth;  // per row: packs of W values, or values
  Kokkos::parallel_for(
      "tlse::subtract_outer", Kokkos::RangePolicy<Exec>(exec, 0, n * lanes), KOKKOS_LAMBDA(index_t idx) {
        const index_t id = row_of(idx / lanes), lane = idx % lanes;
        const Acc a = coef ? coef[id] : Acc(1);
        if (packed) {
          Pack& at = reinterpret_cast<Pack*>(out + id * depth)[lane];
          Pack p = at;
          for (int q = 0; q < W; ++q) p.v[q] = from_acc<T>(to_acc<Acc>(p.v[q]) - a * v[lane * W + q]);
          at = p;
        } else {
          T& o = out[id * depth + lane];
          o = from_acc<T>(to_acc<Acc>(o) - a * v[lane]);
        }
      });
}

}  // namespace tlse::impl
