#pragma once
/// \file vocabulary_sort.hpp
/// The forward's vocabulary order: the classes sorted by decreasing column logit sum, ties by id.
/// On a device the sort runs there (a bitonic network, one kernel per pass); it used to copy the
/// sums to the host and std::sort them, which at V = 128256 took longer than the forward itself
/// (docs/performance.md, "The vocabulary order on the device").
#include <tlse/impl/kokkos_compat.hpp>
#include <tlse/impl/tile_problem.hpp>  // index_t

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <numeric>
#include <vector>

namespace tlse::impl {

/// Whether class a (logit sum sa) comes before class b (sum sb): the larger sum first, equal sums by
/// id. A NaN sum ranks as -inf, so the order is total and the same on every backend.
template <class Acc>
KOKKOS_INLINE_FUNCTION bool vocab_before(Acc sa, int a, Acc sb, int b) {
  if (sa != sa) sa = -infinity<Acc>();
  if (sb != sb) sb = -infinity<Acc>();
  return sa > sb || (sa == sb && a < b);
}

/// Fills `order` (V) with the vocabulary sorted by vocab_before of `logit_sum` (V, in the execution
/// space's memory), so that the backward meets the likely classes together and skips whole tiles
/// of unlikely ones. Permutes logit_sum in place on a device (it is the forward's scratch).
template <class Exec, class Acc, class OrderV>
void sort_vocabulary(const Exec& exec, Acc* logit_sum, index_t V, const OrderV& order) {
  if (V <= 0) return;
  if constexpr (is_host_space<Exec>()) {
    exec.fence();
    std::vector<int> idx(static_cast<std::size_t>(V));
    std::iota(idx.begin(), idx.end(), 0);
    std::sort(idx.begin(), idx.end(), [&](int a, int b) { return vocab_before(logit_sum[a], a, logit_sum[b], b); });
    Kokkos::deep_copy(
        exec, order,
        Kokkos::View<const int*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>(idx.data(), V));
    exec.fence();
  } else {
    Kokkos::parallel_for(
        "tlse::vocabulary_ids", Kokkos::RangePolicy<Exec>(exec, 0, V), KOKKOS_LAMBDA(index_t j) { order(j) = int(j); });
    // Bitonic sort with every comparator pointing one way (the earlier class to the lower index):
    // per merge width k, a flip stage (i against its mirror in the k-block) and half-cleaners.
    // Indices from V up act as classes after every other, so their comparators do nothing and are
    // skipped: V need not be a power of 2.
    index_t n = 1;
    while (n < V) n *= 2;
    const auto pass = [&](index_t k, index_t stride, bool flip) {
      Kokkos::parallel_for(
          "tlse::vocabulary_sort_pass", Kokkos::RangePolicy<Exec>(exec, 0, n / 2), KOKKOS_LAMBDA(index_t t) {
            const index_t lo = (t / stride) * 2 * stride + t % stride;
            const index_t hi = flip ? lo + k - 1 - 2 * (t % stride) : lo + stride;
            if (hi >= V) return;
            const int a = order(lo), b = order(hi);
            const Acc sa = logit_sum[lo], sb = logit_sum[hi];
            if (vocab_before(sb, b, sa, a)) {
              order(lo) = b, order(hi) = a;
              logit_sum[lo] = sb, logit_sum[hi] = sa;
            }
          });
    };
    for (index_t k = 2; k <= n; k *= 2) {
      pass(k, k / 2, true);
      for (index_t stride = k / 4; stride >= 1; stride /= 2) pass(k, stride, false);
    }
  }
}

}  // namespace tlse::impl
