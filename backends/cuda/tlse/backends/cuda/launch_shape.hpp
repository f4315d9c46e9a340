#pragma once
// How many pieces to cut a kernel's long dimension into. The tensor-core kernels run two blocks
// per SM and every block of a launch does the same amount of work, so a launch takes
// ceil(blocks / resident) waves of one block's time: 576 blocks on 264 slots cost 3 waves where
// 2.18 would do. Picking the split count by that cost (instead of "about four blocks per SM")
// keeps the last wave full; measured in docs/performance.md.
#include <cstdint>

namespace tlse::impl::cuda {

/// Blocks of the tensor-core kernels resident on one SM (__launch_bounds__(THREADS, 2)).
constexpr int BLOCKS_PER_SM = 2;

/// Number of splits s in [1, max_splits] of `units` work units (tiles) for a launch of
/// `blocks_per_split` x s blocks on `sms` SMs with `blocks_per_sm` resident each, minimizing
/// waves(s) x (ceil(units / s) + overhead_units): the time of the launch when a block costs its
/// units plus a fixed overhead (pipeline fill, partial writes). Ties go to fewer splits (less
/// partial state to merge).
inline int balanced_splits(std::int64_t blocks_per_split, std::int64_t units, std::int64_t max_splits, int sms,
                           std::int64_t overhead_units = 1, int blocks_per_sm = BLOCKS_PER_SM) {
  const std::int64_t slots = std::int64_t(sms) * blocks_per_sm;
  std::int64_t limit = max_splits < units ? max_splits : units;
  if (limit < 1) limit = 1;
  int best = 1;
  std::int64_t best_cost = INT64_MAX;
  for (std::int64_t s = 1; s <= limit; ++s) {
    const std::int64_t waves = (blocks_per_split * s + slots - 1) / slots;
    const std::int64_t cost = waves * ((units + s - 1) / s + overhead_units);
    if (cost < best_cost) best_cost = cost, best = int(s);
  }
  return best;
}

}  // namespace tlse::impl::cuda
