#pragma once
// The sum of an array of per-row values into one scalar on the device (a loss, its mean, the
// accuracy), summed in a fixed order: deterministic, and nothing read back to the host.
#include <tlse/impl/tile_problem.hpp>

namespace tlse::impl {

/// *out = weight * sum(values[0..n)) (+ *out when accumulating), summed in a fixed order.
/// `total` is one Acc of workspace. Nothing is read back to the host.
template <class Exec, class Acc>
void weighted_sum(const Exec& exec, const Acc* values, index_t n, Acc weight, Acc* out, bool accumulate, Acc* total) {
  using Scalar = Kokkos::View<Acc, typename Exec::memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  // A static schedule combines per-thread partials in thread order: same inputs, same bits.
  Kokkos::parallel_reduce(
      "tlse::weighted_sum", Kokkos::RangePolicy<Exec, Kokkos::Schedule<Kokkos::Static>>(exec, 0, n),
      KOKKOS_LAMBDA(index_t i, Acc & s) { s += values[i]; }, Scalar(total));
  Kokkos::parallel_for(
      "tlse::weighted_sum_store", Kokkos::RangePolicy<Exec>(exec, 0, 1),
      KOKKOS_LAMBDA(int) { *out = (accumulate ? *out : Acc(0)) + weight * *total; });
}

/// A loss from its per-row values: out[i] = row_loss[i] (n of them) when `per_row`, else
/// *out = their sum (the rows were scaled by the reduction already). `total`: one Acc of workspace.
template <class Exec, class Acc>
void write_row_losses(const Exec& exec, bool per_row, const Acc* row_loss, index_t n, Acc* out, Acc* total) {
  if (per_row)
    Kokkos::parallel_for(
        "tlse::write_row_losses", Kokkos::RangePolicy<Exec>(exec, 0, n),
        KOKKOS_LAMBDA(index_t i) { out[i] = row_loss[i]; });
  else
    weighted_sum(exec, row_loss, n, Acc(1), out, false, total);
}

}  // namespace tlse::impl
