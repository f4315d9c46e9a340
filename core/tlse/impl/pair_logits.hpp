#pragma once
// Logits of single (row, column) pairs without the tile sweep: the "indexed matmul" of CCE for
// the targets' logits and of the contrastive loss for the positives', one dot product per pair.
#include <tlse/impl/sixteen_bytes.hpp>
#include <tlse/impl/tile_problem.hpp>

namespace tlse::impl {

/// out[k] = x(row_of(k), col_of(k)) for k in [0, n): one team per pair, dot product over the depth.
template <class Exec, class T, class Acc, class RowOf, class ColOf>
void pair_logits(const Exec& exec, const TileProblem<T, Acc>& prob, index_t n, const RowOf& row_of, const ColOf& col_of,
                 Acc* out) {
  if (n == 0) return;
  const int team = is_host_space<Exec>() ? 1 : 32;
  using Pack = SixteenBytes<T>;
  static_assert(sizeof(Pack) == 16, "T divides 16 bytes");
  // Each lane reads 16 bytes at a time where the rows allow it: one element per lane kept the
  // loads latency-bound on a GPU (docs/notes/2026-11-26.md, "The step on H100s, its clocks and
  // kernels"). On the host (one thread per team) the sum's order is the same either way.
  const bool packed = Pack::fits(prob.rows.data, prob.depth) && Pack::fits(prob.cols.data, prob.depth);
  const index_t steps = packed ? prob.depth / Pack::COUNT : prob.depth;
  using Member = typename Kokkos::TeamPolicy<Exec>::member_type;
  Kokkos::parallel_for(
      "tlse::pair_logits", Kokkos::TeamPolicy<Exec>(exec, int(n), team), KOKKOS_LAMBDA(const Member& m) {
        const index_t k = m.league_rank();
        const index_t r = row_of(k), c = col_of(k);
        const T* a = prob.rows.data + r * prob.depth;
        const T* b = prob.cols.data + c * prob.depth;
        Acc dot = 0;
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(m, steps),
            [&](index_t d, Acc& s) {
              if (packed) {
                const Pack pa = reinterpret_cast<const Pack*>(a)[d], pb = reinterpret_cast<const Pack*>(b)[d];
                for (int q = 0; q < Pack::COUNT; ++q) s += to_acc<Acc>(pa.v[q]) * to_acc<Acc>(pb.v[q]);
              } else {
                s += to_acc<Acc>(a[d]) * to_acc<Acc>(b[d]);
              }
            },
            dot);
        Kokkos::single(Kokkos::PerTeam(m), [&]() { out[k] = prob.logit(dot, r, c); });
      });
}

}  // namespace tlse::impl
