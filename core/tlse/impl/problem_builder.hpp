#pragma once
// Turns the views of a public call into the kernels' TileProblem, with the compile-time type
// checks every call shares.
#include <tlse/impl/argument_checks.hpp>
#include <tlse/impl/tile_problem.hpp>

namespace tlse::impl {

/// Compile-time checks for a call on matrices AV (rows) and BV (columns) run on Exec.
template <class Exec, class AV, class BV>
constexpr void static_check_operands() {
  static_check_view<Exec, AV, 2>();
  static_check_view<Exec, BV, 2>();
  static_assert(std::is_same<scalar_of<AV>, scalar_of<BV>>::value,
                "tlse: both matrix operands must have the same scalar type");
  static_assert(is_supported_scalar<scalar_of<AV>>::value,
                "tlse: supported scalar types are float, double, tlse::bfloat16 and tlse::float16");
}

/// An output (or saved) vector of the accumulator type of T.
template <class Exec, class T, class V>
constexpr void static_check_acc_vector() {
  static_check_view<Exec, V, 1>();
  static_assert(std::is_same<scalar_of<V>, accumulator_t<T>>::value,
                "tlse: losses, LSEs, dscale and their gradients are views of accumulator_t<T> "
                "(double for double inputs, float otherwise)");
}

template <class Exec, class V>
constexpr void static_check_index_vector() {
  static_check_view<Exec, V, 1>();
  static_assert(std::is_integral<scalar_of<V>>::value, "tlse: targets and labels are views of an integer type");
}

template <class T, class Acc, class AV, class BV>
TileProblem<T, Acc> make_problem(const AV& A, const BV& B, double scale, Precision precision) {
  TileProblem<T, Acc> p;
  p.tf32 = precision == Precision::tf32;
  p.rows.data = A.data();
  p.rows.count = p.rows.stored = index_t(A.extent(0));
  p.cols.data = B.data();
  p.cols.count = p.cols.stored = index_t(B.extent(0));
  p.depth = index_t(A.extent(1));
  p.logit.scale = Acc(scale);
  return p;
}

/// Checks the two operands of an implicit product: both row-major, equal depth.
template <class AV, class BV>
void check_operands(const ArgumentChecker& check, const char* a, const AV& A, const char* b, const BV& B) {
  check.matrix(a, A);
  check.matrix(b, B);
  if (A.extent(1) != B.extent(1))
    check.fail(b, "has " + std::to_string(B.extent(1)) + " columns (features) but '" + a + "' has " +
                      std::to_string(A.extent(1)) + "; they must match");
}

}  // namespace tlse::impl
