#pragma once
// The O(rows + cols) kernels around the tile sweeps: logits of single (row, column) pairs
// (the "indexed matmul" of CCE for targets and positives), index lists, and deterministic sums.
#include <cstdint>
#include <tlse/impl/tile_problem.hpp>

namespace tlse::impl {

/// 16 bytes of T (one vector load on a GPU).
template <class T>
struct alignas(16) SixteenBytes {
  static constexpr int COUNT = int(16 / sizeof(T));
  T v[COUNT];
};

/// out[k] = x(row_of(k), col_of(k)) for k in [0, n): one team per pair, dot product over the depth.
template <class Exec, class T, class Acc, class RowOf, class ColOf>
void pair_logits(const Exec& exec, const TileProblem<T, Acc>& prob, index_t n, const RowOf& row_of,
                 const ColOf& col_of, Acc* out) {
  if (n == 0) return;
  const int team = is_host_space<Exec>() ? 1 : 32;
  using Pack = SixteenBytes<T>;
  static_assert(sizeof(Pack) == 16, "T divides 16 bytes");
  // Each lane reads 16 bytes at a time where the rows allow it: one element per lane kept the
  // loads latency-bound on a GPU (docs/notes/2026-11-26.md, "The step on H100s, its clocks and
  // kernels"). On the host (one thread per team) the sum's order is the same either way.
  const auto aligned = [](const T* p) { return reinterpret_cast<std::uintptr_t>(p) % sizeof(Pack) == 0; };
  const bool packed = prob.depth % Pack::COUNT == 0 && aligned(prob.rows.data) && aligned(prob.cols.data);
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

/// Writes the positions whose `keep(i)` holds, in order, to `list`; returns how many.
template <class Exec, class Keep>
index_t compact_indices(const Exec& exec, index_t n, const Keep& keep, int* list) {
  index_t count = 0;
  Kokkos::parallel_scan(
      "tlse::compact_indices", Kokkos::RangePolicy<Exec>(exec, 0, n),
      KOKKOS_LAMBDA(index_t i, index_t & offset, bool final) {
        if (!keep(i)) return;
        if (final) list[offset] = int(i);
        ++offset;
      },
      count);
  return count;
}

/// position[r] = p where list[p] == r (p < count), -1 for the rows r < stored no position lists.
template <class Exec>
void invert_index(const Exec& exec, const int* list, index_t count, index_t stored, int* position) {
  Kokkos::parallel_for("tlse::invert_index_clear", Kokkos::RangePolicy<Exec>(exec, 0, stored),
                       KOKKOS_LAMBDA(index_t r) { position[r] = -1; });
  Kokkos::parallel_for("tlse::invert_index", Kokkos::RangePolicy<Exec>(exec, 0, count),
                       KOKKOS_LAMBDA(index_t p) { position[list[p]] = int(p); });
}

/// *out = weight * sum(values[0..n)) (+ *out when accumulating), summed in a fixed order.
/// `total` is one Acc of workspace. Nothing is read back to the host.
template <class Exec, class Acc>
void weighted_sum(const Exec& exec, const Acc* values, index_t n, Acc weight, Acc* out, bool accumulate,
                  Acc* total) {
  using Scalar = Kokkos::View<Acc, typename Exec::memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  // A static schedule combines per-thread partials in thread order: same inputs, same bits.
  Kokkos::parallel_reduce(
      "tlse::weighted_sum", Kokkos::RangePolicy<Exec, Kokkos::Schedule<Kokkos::Static>>(exec, 0, n),
      KOKKOS_LAMBDA(index_t i, Acc & s) { s += values[i]; }, Scalar(total));
  Kokkos::parallel_for(
      "tlse::weighted_sum_store", Kokkos::RangePolicy<Exec>(exec, 0, 1),
      KOKKOS_LAMBDA(int) { *out = (accumulate ? *out : Acc(0)) + weight * *total; });
}

}  // namespace tlse::impl
