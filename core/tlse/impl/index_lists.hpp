#pragma once
// Lists of row positions: those that pass a test, in order (compact_indices: the rows that are
// scored), and the inverse of such a list, each row's place in it (invert_index).
#include <tlse/impl/tile_problem.hpp>

namespace tlse::impl {

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
  Kokkos::parallel_for(
      "tlse::invert_index_clear", Kokkos::RangePolicy<Exec>(exec, 0, stored),
      KOKKOS_LAMBDA(index_t r) { position[r] = -1; });
  Kokkos::parallel_for(
      "tlse::invert_index", Kokkos::RangePolicy<Exec>(exec, 0, count),
      KOKKOS_LAMBDA(index_t p) { position[list[p]] = int(p); });
}

}  // namespace tlse::impl
