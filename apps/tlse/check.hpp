#pragma once
// --check: the errors of each outcome against the float64 reference, and the per-dtype
// tolerances (justified in the --help text, cli.hpp).
#include "outcome.hpp"

#include <tlse/scalar_types.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <type_traits>
#include <vector>

namespace tlse::app {

struct Tolerance {
  double loss;  ///< |loss - ref| <= loss * (1 + |ref|)
  double grad;  ///< max |g - ref| <= grad * max |ref|
};

template <class T>
Tolerance tolerance(bool tf32) {
  if (std::is_same<T, double>::value) return {1e-9, 1e-9};
  if (std::is_same<T, float>::value && tf32) return {0x1p-9, 0x1p-7};
  if (std::is_same<T, float>::value) return {1e-5, 1e-4};
  return {1e-5, storage_epsilon<T>()};  // bf16: 2^-7, f16: 2^-10
}

/// max |got - ref| / max |ref| (the absolute error when ref is all zero).
inline double relative_max_error(const testing::Matrix& got, const testing::Matrix& ref) {
  double err = 0, scale = 0;
  for (std::size_t k = 0; k < ref.v.size(); ++k) {
    const double e = std::fabs(got.v[k] - ref.v[k]);
    err = (e > err || e != e) ? e : err;  // a NaN wins, and then fails every comparison
    scale = std::max(scale, std::fabs(ref.v[k]));
  }
  return scale > 0 ? err / scale : err;
}

/// Prints one line of errors per outcome; returns whether all are within tolerance.
/// `grad_names` and `ref_grads` follow the order of Outcome::grads.
inline bool check_outcomes(const std::vector<Outcome>& outcomes, double ref_loss,
                           const std::vector<const testing::Matrix*>& ref_grads,
                           const std::vector<std::string>& grad_names, const Tolerance& tol) {
  const double loss_tol = tol.loss * (1 + std::fabs(ref_loss));
  bool all_ok = true;
  std::printf("\ncheck against the float64 reference (loss %.9g):\n", ref_loss);
  for (const Outcome& o : outcomes) {
    const double loss_err = std::fabs(o.loss - ref_loss);
    bool ok = loss_err <= loss_tol;
    std::printf("  %-13s loss err %.2e (tol %.2e)", o.name.c_str(), loss_err, loss_tol);
    for (std::size_t k = 0; k < ref_grads.size(); ++k) {
      const double e = relative_max_error(o.grads[k], *ref_grads[k]);
      ok = ok && e <= tol.grad;
      std::printf("  %s err %.2e", grad_names[k].c_str(), e);
    }
    std::printf(" (tol %.2e, relative to max|ref|)  %s\n", tol.grad, ok ? "ok" : "MISMATCH");
    all_ok = all_ok && ok;
  }
  std::printf("check %s\n", all_ok ? "passed" : "FAILED");
  return all_ok;
}

}  // namespace tlse::app
