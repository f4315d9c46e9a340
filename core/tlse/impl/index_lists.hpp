#pragma once
// Lists of row positions: those that pass a test, in order (compact_indices: the rows that are
// scored), the inverse of such a list, each row's place in it (invert_index), and the rows that
// are in no list (zero_unlisted_rows).
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

/// Zeroes row r of the row-major (rows x depth) `out` wherever marker[r] < 0: a row no pass visits
/// (invert_index's -1, or a target that marks a row not scored), whose gradient is then 0.
template <class Exec, class T>
void zero_unlisted_rows(const Exec& exec, const int* marker, T* out, index_t rows, index_t depth) {
  Kokkos::parallel_for(
      "tlse::zero_unlisted_rows", Kokkos::RangePolicy<Exec>(exec, 0, rows * depth), KOKKOS_LAMBDA(index_t idx) {
        if (marker[idx / depth] < 0) out[idx] = T(0.0f);
      });
}

}  // namespace tlse::impl
