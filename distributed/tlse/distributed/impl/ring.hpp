#pragma once
// What the distributed losses share: how rows are spread over the ranks, timed waits on ring
// requests, padded ring buffers and the online log-sum-exp merge of partial results.
#include <tlse/distributed/reduce_op.hpp>
#include <tlse/impl/tile_problem.hpp>

#include <algorithm>
#include <chrono>
#include <vector>

namespace tlse::distributed::impl {

using tlse::impl::index_t;

/// Rank r owns the global rows [offset[r], offset[r] + rows[r]).
struct RowLayout {
  std::vector<index_t> rows, offset;
  index_t total = 0, max_rows = 0;
  int rank = 0, size = 1;

  template <class Field>
  RowLayout(int rank_, int size_, const Field& rows_of) : rows(size_), offset(size_), rank(rank_), size(size_) {
    for (int r = 0; r < size; ++r) {
      rows[r] = rows_of(r);
      offset[r] = total;
      total += rows[r];
      max_rows = std::max(max_rows, rows[r]);
    }
  }
  /// The rank whose block this rank holds at ring step k (blocks move to rank+1 each step).
  int block_at(int step) const { return (rank - step % size + size) % size; }
};

/// Waits on a ring request; the time spent is communication that compute did not hide. The
/// execution space is fenced first (its next kernels need the data anyway), so that the time
/// counted is time it sits idle, not time the host waits while kernels still run.
template <class Exec, class Request>
void timed_wait(const Exec& exec, Request& request, RingStatistics* stats) {
  exec.fence();
  const auto t0 = std::chrono::steady_clock::now();
  request.wait();
  if (stats) stats->wait_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

/// Posts a ring step and counts its bytes.
template <class Comm, class V>
typename Comm::Request ring_step(const Comm& comm, const V& send, const V& recv, RingStatistics* stats) {
  if (stats) stats->bytes_sent += std::int64_t(send.span() * sizeof(typename V::value_type));
  return comm.ring_step(send, recv);
}

/// log(exp(a) + exp(b)), with -inf as the empty sum and NaN propagating.
template <class Acc>
KOKKOS_INLINE_FUNCTION Acc log_add(Acc a, Acc b) {
  tlse::impl::LseState<Acc> s;
  s.merge(a, Acc(1));
  s.merge(b, Acc(1));
  return s.value();
}

}  // namespace tlse::distributed::impl
