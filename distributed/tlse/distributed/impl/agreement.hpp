#pragma once
// Before any data moves, the ranks of a distributed call agree: every rank runs its local
// argument checks, then all of them exchange one small record (the status of those checks, the
// first error message, and the metadata the ranks must agree on) in a single all-gather. A rank
// whose checks failed still takes part in that all-gather, so the others never wait on it in a
// ring: every rank throws the same std::invalid_argument, built from the same gathered table.
#include <tlse/scalar_types.hpp>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace tlse::distributed::impl {

class Agreement {
 public:
  /// Runs `local_checks()` (which throws std::exception on bad input), then gathers every rank's
  /// status, message and `meta`. Throws on every rank when any rank's checks failed.
  template <class Comm, class Checks>
  Agreement(const Comm& comm, const char* function, std::vector<std::int64_t> meta, const Checks& local_checks)
      : function_(function), fields_(meta.size()), ranks_(comm.size()) {
    std::string error;
    try {
      local_checks();
    } catch (const std::exception& e) {
      error = e.what();
    }
    // Record: [failed, meta...] as int64, then a fixed-size message buffer.
    std::vector<std::int64_t> head(1 + fields_);
    head[0] = error.empty() ? 0 : 1;
    std::copy(meta.begin(), meta.end(), head.begin() + 1);
    std::vector<char> record(record_bytes());
    std::memcpy(record.data(), head.data(), head.size() * sizeof(std::int64_t));
    std::strncpy(record.data() + head.size() * sizeof(std::int64_t), error.c_str(), message_bytes - 1);
    table_ = comm.allgather_host(record.data(), record.size());
    for (int r = 0; r < ranks_; ++r)
      if (value(r, -1) != 0) {
        const char* msg = table_.data() + std::size_t(r) * record_bytes() + (1 + fields_) * sizeof(std::int64_t);
        throw std::invalid_argument(std::string(msg, strnlen(msg, message_bytes)) + " (on rank " + std::to_string(r) +
                                    "; no rank exchanged data)");
      }
  }

  /// Field `field` of rank `rank`'s metadata.
  std::int64_t value(int rank, int field) const {
    std::int64_t v;
    std::memcpy(&v, table_.data() + std::size_t(rank) * record_bytes() + (1 + field) * sizeof(std::int64_t), sizeof v);
    return v;
  }

  /// A value that agrees with any other: what a rank without rows passes for "labels given?".
  static constexpr std::int64_t any_value = INT64_MIN;

  /// Throws on every rank unless every rank passed the same value of `field` (any_value
  /// excepted). `what` says what the field is, e.g. "columns (features)"; `name` prints a value.
  void require_same(int field, const char* argument, const std::string& what,
                    std::string (*name)(std::int64_t) = nullptr) const {
    const auto text = [&](std::int64_t v) { return name ? name(v) : std::to_string(v); };
    int first = -1;
    for (int r = 0; r < ranks_; ++r) {
      if (value(r, field) == any_value) continue;
      if (first < 0) first = r;
      if (value(r, field) != value(first, field))
        throw std::invalid_argument(std::string(function_) + ": argument '" + argument + "' has " + what + " " +
                                    text(value(r, field)) + " on rank " + std::to_string(r) + " but " +
                                    text(value(first, field)) + " on rank " + std::to_string(first) +
                                    "; every rank must pass the same");
    }
  }

 private:
  static constexpr std::size_t message_bytes = 480;
  std::size_t record_bytes() const { return (1 + fields_) * sizeof(std::int64_t) + message_bytes; }

  const char* function_;
  std::size_t fields_;
  int ranks_;
  std::vector<char> table_;
};

/// A double as an exact integer field (options such as scale must match bit for bit).
inline std::int64_t double_bits(double v) {
  std::int64_t b;
  std::memcpy(&b, &v, sizeof b);
  return b;
}

/// Numbers for the supported scalar types, so that ranks can compare them, and back to names.
template <class T>
std::int64_t scalar_code() {
  return std::is_same<T, float>::value      ? 1
         : std::is_same<T, double>::value   ? 2
         : std::is_same<T, bfloat16>::value ? 3
                                            : 4;
}
inline std::string scalar_code_name(std::int64_t code) {
  static const char* names[] = {"float", "double", "bfloat16", "float16"};
  return code >= 1 && code <= 4 ? names[code - 1] : "unknown";
}

}  // namespace tlse::distributed::impl
