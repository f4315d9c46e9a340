#pragma once
/// \file vocabulary_sort.hpp
/// The forward's vocabulary order: the classes sorted by decreasing column logit sum, ties by id;
/// the sums from one matrix-vector product where the logits are linear in the rows.
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

/// Rows per partial sum of linear_logit_sums' first pass: enough threads (D per chunk) to fill a
/// device, few partials to add up after.
constexpr index_t LOGIT_SUM_ROW_CHUNK = 64;

/// Scratch of linear_logit_sums, in Acc elements.
inline index_t linear_logit_sums_scratch(index_t rows, index_t depth) {
  return ((rows + LOGIT_SUM_ROW_CHUNK - 1) / LOGIT_SUM_ROW_CHUNK + 1) * depth;
}

/// Whether the column logit sums are linear in the rows: no softcap. Then
/// sum_i x_ij = scale C_j . (sum_i E_i) + n b_j, which linear_logit_sums computes from one pass over
/// the rows and one over the columns instead of a sum per tile in the forward's epilogue.
inline bool logit_sums_are_linear(double softcap) { return !(softcap > 0); }

/// logit_sum[j] = the sum of class j's logits over the rows of `prob` (logit_sums_are_linear):
/// scale C_j . S + count b_j with S = sum_p E_id(p), the order's key; -inf for a class past
/// valid_cols (as a -inf bias gives). Fixed-order sums: the same key every call. `scratch`:
/// linear_logit_sums_scratch(rows, depth) elements.
template <class Exec, class T, class Acc>
void linear_logit_sums(const Exec& exec, const TileProblem<T, Acc>& prob, Acc* scratch, Acc* logit_sum) {
  const Side<T> rows = prob.rows;
  const T* C = prob.cols.data;
  const index_t D = prob.depth, V = prob.cols.count, n = rows.count;
  const index_t chunks = (n + LOGIT_SUM_ROW_CHUNK - 1) / LOGIT_SUM_ROW_CHUNK;
  Acc* part = scratch;                    // [chunks][D]
  Acc* row_total = scratch + chunks * D;  // S
  // Thread (chunk, d) adds column d of the chunk's rows: neighbouring threads read neighbouring
  // elements of a row.
  Kokkos::parallel_for(
      "tlse::logit_sum_rows", Kokkos::RangePolicy<Exec>(exec, 0, chunks * D), KOKKOS_LAMBDA(index_t t) {
        const index_t c = t / D, d = t % D, end = c * LOGIT_SUM_ROW_CHUNK + LOGIT_SUM_ROW_CHUNK;
        Acc s = 0;
        for (index_t p = c * LOGIT_SUM_ROW_CHUNK; p < end && p < n; ++p)
          s += to_acc<Acc>(rows.data[rows.id(p) * D + d]);
        part[t] = s;
      });
  Kokkos::parallel_for(
      "tlse::logit_sum_row_total", Kokkos::RangePolicy<Exec>(exec, 0, D), KOKKOS_LAMBDA(index_t d) {
        Acc s = 0;
        for (index_t c = 0; c < chunks; ++c) s += part[c * D + d];
        row_total[d] = s;
      });
  const LogitModel<T, Acc> m = prob.logit;
  using Team = typename Kokkos::TeamPolicy<Exec>::member_type;
  Kokkos::parallel_for(
      "tlse::logit_sum_columns", Kokkos::TeamPolicy<Exec>(exec, V, Kokkos::AUTO), KOKKOS_LAMBDA(const Team& team) {
        const index_t j = team.league_rank();
        Acc dot = 0;
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(team, D), [&](index_t d, Acc& s) { s += to_acc<Acc>(C[j * D + d]) * row_total[d]; },
            dot);
        Kokkos::single(Kokkos::PerTeam(team), [&]() {
          const Acc bias = m.col_bias ? to_acc<Acc>(m.col_bias[j]) : Acc(0);
          logit_sum[j] = j >= m.valid_cols ? -infinity<Acc>() : m.scale * dot + Acc(n) * bias;
        });
      });
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
