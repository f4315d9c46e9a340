#pragma once
// Argument validation shared by every public call. All of it runs before a call writes
// anything, so a rejected call leaves the caller's outputs untouched. Messages name the call,
// the argument and the values involved.
#include <tlse/impl/kokkos_compat.hpp>
#include <tlse/options.hpp>
#include <tlse/scalar_types.hpp>

#include <cstdint>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace tlse::impl {

template <class V>
using scalar_of = std::remove_const_t<typename V::value_type>;

/// Compile-time checks on a view argument: accessible from `Exec`, of the expected rank.
template <class Exec, class V, int Rank>
constexpr void static_check_view() {
  static_assert(Kokkos::is_view<V>::value, "tlse: arguments must be Kokkos::View");
  static_assert(int(V::rank) == Rank, "tlse: a view argument has the wrong rank (see the API documentation)");
  static_assert(Kokkos::SpaceAccessibility<Exec, typename V::memory_space>::accessible,
                "tlse: a view argument lives in a memory space the execution space cannot access "
                "(e.g. a HostSpace view passed with a Cuda execution space)");
}

class ArgumentChecker {
 public:
  /// The largest extent of a matrix: the kernels index rows, classes and features with 32-bit ints.
  static constexpr std::size_t max_extent = 2147483647;

  explicit ArgumentChecker(const char* function) : function_(function) {}

  [[noreturn]] void fail(const std::string& argument, const std::string& message) const {
    throw std::invalid_argument(std::string(function_) + ": argument '" + argument + "' " + message);
  }

  /// A lent workspace (none: nothing to check) holds `need()` bytes, what the call's sizing
  /// function `sizer` says. A call that runs two calls, the first writing outputs before the
  /// second checks its own workspace, checks it against both here first.
  template <class Need>
  void lent_workspace(const Workspace& ws, const char* sizer, const Need& need) const {
    if (!ws.data) return;
    const std::size_t bytes = need();
    if (ws.bytes < bytes)
      fail("workspace", "holds " + std::to_string(ws.bytes) + " bytes but this call needs " + std::to_string(bytes) +
                            " (" + sizer + ")");
  }

  /// A row-major contiguous matrix (LayoutRight, or a LayoutStride view with those strides).
  template <class V>
  void matrix(const char* name, const V& v) const {
    const std::size_t rows = v.extent(0), cols = v.extent(1);
    if (rows > max_extent || cols > max_extent)
      fail(name, "has shape " + shape(v) + "; TiledLSE indexes rows and columns with 32-bit integers (at most " +
                     std::to_string(max_extent) + ")");
    if (rows > 1 && cols > 0 && (v.stride(1) != 1 || v.stride(0) != cols))
      fail(name, "must be row-major contiguous (LayoutRight) of shape " + shape(v) + ", but its strides are (" +
                     std::to_string(v.stride(0)) + ", " + std::to_string(v.stride(1)) +
                     "); TiledLSE does not copy strided inputs");
    if (rows == 1 && cols > 1 && v.stride(1) != 1)
      fail(name, "must be row-major contiguous; its column stride is " + std::to_string(v.stride(1)));
  }

  /// A contiguous vector (or any rank-1 view of stride 1).
  template <class V>
  void vector(const char* name, const V& v) const {
    if (v.extent(0) > 1 && v.stride(0) != 1)
      fail(name, "must be contiguous, but its stride is " + std::to_string(v.stride(0)));
  }

  void extent(const char* name, std::size_t got, std::size_t expected, const std::string& why) const {
    if (got != expected)
      fail(name, "has extent " + std::to_string(got) + " but " + why + " needs " + std::to_string(expected));
  }

  /// A view shaped like a loss (loss, dloss): a vector of one value per row of `rows_of` (`rows`
  /// of them) under Reduction::none, else of one.
  template <class V>
  void loss_shaped(const char* name, const V& v, Reduction reduction, std::size_t rows, const char* rows_of) const {
    const bool none = reduction == Reduction::none;
    vector(name, v);
    extent(name, v.extent(0), none ? rows : 1,
           none ? std::string("Reduction::none (one loss per row of ") + rows_of + ")" : std::string("a reduced loss"));
  }

  /// An optional vector: empty (not requested), or exactly `expected` long.
  template <class V>
  bool optional(const char* name, const V& v, std::size_t expected, const std::string& why) const {
    if (v.size() == 0) return false;
    vector(name, v);
    extent(name, v.extent(0), expected, why);
    return true;
  }

  /// An optional output matrix (a gradient): empty (not requested), or row-major of exactly
  /// rows x cols. Returns whether it was requested.
  template <class V>
  bool optional_matrix(const char* name, const V& v, std::size_t rows, std::size_t cols,
                       const std::string& like) const {
    if (v.size() == 0) return false;
    matrix(name, v);
    extent(name, v.extent(0), rows, like + "'s row count");
    extent(name, v.extent(1), cols, like + "'s column count");
    return true;
  }

  /// An option finite and >= 0 that keeps its meaning in the accumulator type Acc: it does not
  /// overflow Acc and, where 0 means "off" (`zero_is_off`), a positive value does not round to 0.
  template <class Acc>
  void finite_nonnegative(const char* name, double value, bool zero_is_off = false) const {
    if (!(value >= 0) || value == infinity<double>())
      fail(name, "must be finite and >= 0, got " + number(value));
    const char* acc = std::is_same<Acc, double>::value ? "double" : "float";
    if (value > double(std::numeric_limits<Acc>::max()))
      fail(name, "is " + number(value) + ", more than the largest " + acc + " (" +
                     number(double(std::numeric_limits<Acc>::max())) + "), the accumulator type of these inputs");
    if (zero_is_off && value > 0 && Acc(value) == Acc(0))
      fail(name, "is " + number(value) + ", which rounds to 0 (off) in " + acc +
                     ", the accumulator type of these inputs");
  }

  template <class V>
  static std::string shape(const V& v) {
    std::ostringstream s;
    s << "(" << v.extent(0);
    for (unsigned r = 1; r < V::rank; ++r) s << ", " << v.extent(r);
    s << ")";
    return s.str();
  }
  static std::string number(double v) {
    std::ostringstream s;
    s << v;
    return s.str();
  }

  const char* function() const { return function_; }

 private:
  const char* function_;
};

/// With NonFinite::detect: throws naming `name` and the first non-finite element of `v`.
template <class Exec, class V>
void check_finite(const Exec& exec, const ArgumentChecker& check, const char* name, const V& v, NonFinite policy) {
  if (policy != NonFinite::detect || v.size() == 0) return;
  using T = scalar_of<V>;
  using Acc = accumulator_t<T>;
  const T* data = v.data();
  std::int64_t first = INT64_MAX;
  Kokkos::parallel_reduce(
      "tlse::check_finite", Kokkos::RangePolicy<Exec>(exec, 0, std::int64_t(v.size())),
      KOKKOS_LAMBDA(std::int64_t i, std::int64_t & m) {
        if (!impl::isfinite(to_acc<Acc>(data[i])) && i < m) m = i;
      },
      Kokkos::Min<std::int64_t>(first));
  if (first == INT64_MAX) return;
  std::string where = "element " + std::to_string(first);
  if (V::rank == 2 && v.extent(1) > 0)
    where = "row " + std::to_string(first / std::int64_t(v.extent(1))) + ", column " +
            std::to_string(first % std::int64_t(v.extent(1)));
  check.fail(name, "contains NaN or Inf (first at " + where + ") and non_finite is NonFinite::detect");
}

/// Throws naming `name` unless every index[i] (i in [0, n)) is in [0, bound) or equals `ignore`.
/// Returns the number of entries equal to `ignore`.
template <class Exec, class V>
std::int64_t check_indices(const Exec& exec, const ArgumentChecker& check, const char* name, const V& index,
                           std::int64_t offset, std::int64_t n, std::int64_t bound, std::int64_t ignore,
                           bool has_ignore) {
  if (n <= 0) return 0;
  std::int64_t first_bad = INT64_MAX, ignored = 0;
  const auto* data = index.data();
  Kokkos::parallel_reduce(
      "tlse::check_indices", Kokkos::RangePolicy<Exec>(exec, 0, n),
      KOKKOS_LAMBDA(std::int64_t i, std::int64_t & bad, std::int64_t & skipped) {
        const std::int64_t t = std::int64_t(data[i + offset]);
        if (has_ignore && t == ignore)
          ++skipped;
        else if ((t < 0 || t >= bound) && i < bad)
          bad = i;
      },
      Kokkos::Min<std::int64_t>(first_bad), ignored);
  if (first_bad != INT64_MAX) {
    typename V::non_const_value_type value{};
    Kokkos::deep_copy(exec, Kokkos::View<typename V::non_const_value_type, Kokkos::HostSpace>(&value),
                      Kokkos::subview(index, first_bad + offset));
    exec.fence();
    check.fail(name, "has " + std::string(name) + "[" + std::to_string(first_bad + offset) + "] = " +
                         std::to_string(std::int64_t(value)) + ", outside [0, " + std::to_string(bound) + ")" +
                         (has_ignore ? " and not ignore_index (" + std::to_string(ignore) + ")" : ""));
  }
  return ignored;
}

}  // namespace tlse::impl
