#pragma once
/// \file reduce_op.hpp
/// The reductions the distributed calls ask of a communicator, and the statistics a ring reports.
#include <cstdint>

namespace tlse::distributed {

/// Element-wise reduction of an all-reduce.
enum class ReduceOp { sum, max };

/// What one distributed call spent on its ring, for benchmarks: `wait_seconds` is the host time
/// spent waiting for ring transfers to finish, i.e. the communication that compute did not hide.
struct RingStatistics {
  double wait_seconds = 0;      ///< host seconds spent waiting for ring transfers
  std::int64_t bytes_sent = 0;  ///< bytes this rank sent around the ring
  int steps = 0;                ///< ring steps taken
};

}  // namespace tlse::distributed
