#pragma once
// What a successful call must have computed: float64 references of the two losses that
// materialize the logits (tlse.h's formulas, written out again, independent of the library), and
// the error each result may carry. The error model is the unit tests' (unit_tests/test_support.hpp):
// with unit roundoff u of the accumulator and `delta` the error of one logit,
//   LSE: delta + 4 u (|lse| + sqrt(cols)),  gradient: (4 delta + 8 u sqrt(terms) + u_out) mag + u_out |ref|
// where mag sums the magnitudes of a gradient's terms and u_out is the 16-bit output rounding;
// here every factor is doubled, for margin, and every result may round by u (with `accumulate`
// the previous value is part of it).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace fuzz {

/// A row-major float64 matrix.
struct Mat {
  std::int64_t rows = 0, cols = 0;
  std::vector<double> v;
  Mat(std::int64_t r = 0, std::int64_t c = 0) : rows(r), cols(c), v(std::size_t(r * c), 0.0) {}
  double& operator()(std::int64_t i, std::int64_t j) { return v[std::size_t(i * cols + j)]; }
  double operator()(std::int64_t i, std::int64_t j) const { return v[std::size_t(i * cols + j)]; }
};

inline double dot(const Mat& a, std::int64_t i, const Mat& b, std::int64_t j) {
  double s = 0;
  for (std::int64_t k = 0; k < a.cols; ++k) s += a(i, k) * b(j, k);
  return s;
}
inline double logsumexp(const std::vector<double>& x) {
  double m = -INFINITY;
  for (double v : x) m = std::max(m, v);
  if (m == -INFINITY) return m;
  double s = 0;
  for (double v : x) s += std::exp(v - m);
  return m + std::log(s);
}

/// Adds a gradient's previous values (accumulate), if any.
inline void add_previous(std::vector<double>& grad, const std::vector<double>& previous) {
  for (std::size_t k = 0; k < previous.size(); ++k) grad[k] += previous[k];
}
inline void add_previous(Mat& grad, const std::vector<double>& previous) { add_previous(grad.v, previous); }

/// A result and how far from it the library's value may be.
struct Expected {
  std::vector<double> value, tolerance;
  explicit Expected(std::size_t n = 0) : value(n, 0.0), tolerance(n, 0.0) {}
};

/// Rounding of the library's arithmetic: accumulator roundoff u, 16-bit output roundoff u_out,
/// and the underflow floor of the output type.
struct Rounding {
  double u, u_out, floor;
};

struct CrossEntropyExpected {
  Expected loss, lse, dE, dC, dbias;
};

/// Cut cross-entropy (tlse.h): active rows i have i + shift < n and targets[i + shift] !=
/// ignore_index; x_ij = softcap(E_i . C_j + bias_j); loss_i = lse_i - x_{i,t_i} + z lse_i^2.
/// `dloss` has n entries for reduction none (0), else one; `init_*` are the gradients' values
/// before the call (added to with accumulate, else empty).
inline CrossEntropyExpected cross_entropy_expected(const Mat& E, const Mat& C, const std::vector<double>& bias,
                                                   const std::vector<std::int64_t>& targets, std::int64_t ignore_index,
                                                   int reduction, std::int64_t shift, double softcap, double z_loss,
                                                   const std::vector<double>& dloss, const Mat& init_dE,
                                                   const Mat& init_dC, const std::vector<double>& init_dbias,
                                                   Rounding r) {
  const std::int64_t n = E.rows, v = C.rows, d = E.cols;
  CrossEntropyExpected x{Expected(reduction == 0 ? std::size_t(n) : 1), Expected(std::size_t(n)),
                         Expected(std::size_t(n * d)), Expected(std::size_t(v * d)), Expected(std::size_t(v))};
  std::vector<std::int64_t> target(std::size_t(n), -1);
  std::int64_t active = 0;
  for (std::int64_t i = 0; shift < n && i < n - shift; ++i)
    if (targets[std::size_t(i + shift)] != ignore_index)
      target[std::size_t(i)] = targets[std::size_t(i + shift)], ++active;
  // One logit's error: the float dot products of exactly representable data are exact; the bias
  // sum, the softcap's tanh and the division inside it round.
  double max_abs_logit = 0;
  Mat X(n, v), Z(n, v);
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t j = 0; j < v; ++j) {
      Z(i, j) = dot(E, i, C, j) + (bias.empty() ? 0.0 : bias[std::size_t(j)]);
      X(i, j) = softcap > 0 ? softcap * std::tanh(Z(i, j) / softcap) : Z(i, j);
      max_abs_logit = std::max(max_abs_logit, std::fabs(Z(i, j)));
    }
  const double delta = 8 * r.u * (max_abs_logit + softcap);
  const double weight = reduction == 2 ? (active ? 1.0 / double(active) : 0.0) : 1.0;
  Mat G(n, v), Gabs(n, v);
  double total = 0, total_tol = 0, sum = 0;  // sum: the rows' unweighted partial sum
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t t = target[std::size_t(i)];
    if (t < 0) continue;
    const std::vector<double> row(X.v.begin() + i * v, X.v.begin() + (i + 1) * v);
    const double l = logsumexp(row);
    const double lse_tol = 2 * delta + 8 * r.u * (std::fabs(l) + std::sqrt(double(v) + 1));
    const double loss = l - X(i, t) + z_loss * l * l;
    const double loss_tol = lse_tol * (1 + 2 * z_loss * std::fabs(l)) + delta + 8 * r.u * std::fabs(loss);
    x.lse.value[std::size_t(i)] = l, x.lse.tolerance[std::size_t(i)] = lse_tol;
    if (reduction == 0) x.loss.value[std::size_t(i)] = loss, x.loss.tolerance[std::size_t(i)] = loss_tol;
    // Each addition of the library's sum may round by u times the partial sum (in any order).
    sum += loss, total += loss * weight, total_tol += (loss_tol + 8 * r.u * std::fabs(sum)) * weight;
    const double coef = (reduction == 0 ? dloss[std::size_t(i)] : dloss[0]) * weight;
    for (std::int64_t j = 0; j < v; ++j) {
      const double p = coef * (1 + 2 * z_loss * l) * std::exp(X(i, j) - l), hit = j == t ? coef : 0.0;
      const double cap = softcap > 0 ? 1 - (X(i, j) / softcap) * (X(i, j) / softcap) : 1.0;
      G(i, j) = (p - hit) * cap;
      // The library computes the softcap's derivative from the rounded logit: an absolute error
      // of 2 delta / softcap + 5u, large next to the derivative where the tanh saturates. Here it
      // is scaled into the magnitude, whose factor below is at least 8 delta + 16u.
      const double cap_err = softcap > 0 ? (2 * delta / softcap + 5 * r.u) / (8 * delta + 16 * r.u) : 0.0;
      Gabs(i, j) = (std::fabs(p) + std::fabs(hit)) * (std::fabs(cap) + cap_err);
    }
  }
  if (reduction != 0) x.loss.value[0] = total, x.loss.tolerance[0] = total_tol;
  // Gradients, their magnitudes, and the tolerance of each entry.
  const double terms = double(std::max(n, v)) + 1;
  const auto tol = [&](double ref, double mag) {
    return (8 * delta + 16 * r.u * std::sqrt(terms) + 2 * r.u_out) * mag + 2 * (r.u_out + r.u) * std::fabs(ref) +
           r.floor;
  };
  Mat dE(n, d), dC(v, d), magE(n, d), magC(v, d);
  std::vector<double> dbias(std::size_t(v), 0.0), magb(std::size_t(v), 0.0);
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t j = 0; j < v; ++j) {
      if (Gabs(i, j) == 0) continue;
      dbias[std::size_t(j)] += G(i, j), magb[std::size_t(j)] += Gabs(i, j);
      for (std::int64_t k = 0; k < d; ++k) {
        dE(i, k) += G(i, j) * C(j, k), magE(i, k) += Gabs(i, j) * std::fabs(C(j, k));
        dC(j, k) += G(i, j) * E(i, k), magC(j, k) += Gabs(i, j) * std::fabs(E(i, k));
      }
    }
  // With accumulate, the previous values are added last, as the library does (adding them first
  // would round every term at their magnitude).
  add_previous(dE, init_dE.v), add_previous(dC, init_dC.v), add_previous(dbias, init_dbias);
  for (std::size_t k = 0; k < dE.v.size(); ++k) x.dE.value[k] = dE.v[k], x.dE.tolerance[k] = tol(dE.v[k], magE.v[k]);
  for (std::size_t k = 0; k < dC.v.size(); ++k) x.dC.value[k] = dC.v[k], x.dC.tolerance[k] = tol(dC.v[k], magC.v[k]);
  for (std::size_t k = 0; k < dbias.size(); ++k)
    x.dbias.value[k] = dbias[k], x.dbias.tolerance[k] = tol(dbias[k], magb[k]);
  return x;
}

struct ContrastiveExpected {
  Expected loss, row_lse, col_lse, dI, dT, dscale;
};

/// Neumaier's compensated sum: the reference's own rounding stays near one ulp of the result, so
/// that a bound on the library's error is not spent on the reference's (a sum of b^2 near-equal
/// terms rounds the same way at every step: its error grows with the count, not its root).
struct CompensatedSum {
  double sum = 0, carry = 0;
  void add(double x) {
    const double t = sum + x;
    carry += std::fabs(sum) >= std::fabs(x) ? (sum - t) + x : (x - t) + sum;
    sum = t;
  }
  double value() const { return sum + carry; }
};

/// CLIP loss (tlse.h): x_ij = scale I_i . T_j, positives pos(i) = labels[i] (or i), direction
/// 0 symmetric, 1 image-to-text, 2 text-to-image; `init_*` as for the cross-entropy.
/// `exclude_diagonal`: x_ii left out (the self-similarity form, I = T = Z, whose dZ is dI + dT).
inline ContrastiveExpected contrastive_expected(const Mat& I, const Mat& T, const std::vector<std::int64_t>& labels,
                                                double scale, int direction, double dloss, const Mat& init_dI,
                                                const Mat& init_dT, double init_dscale, Rounding r,
                                                bool exclude_diagonal = false) {
  const std::int64_t b = I.rows, c = I.cols;
  ContrastiveExpected x{Expected(1),
                        Expected(std::size_t(b)),
                        Expected(std::size_t(b)),
                        Expected(std::size_t(b * c)),
                        Expected(std::size_t(b * c)),
                        Expected(1)};
  const double wr = direction == 2 ? 0 : direction == 0 ? 0.5 : 1, wc = direction == 1 ? 0 : direction == 0 ? 0.5 : 1;
  const auto pos = [&](std::int64_t i) { return labels.empty() ? i : labels[std::size_t(i)]; };
  Mat D(b, b), X(b, b);
  double max_abs_logit = 0;
  for (std::int64_t i = 0; i < b; ++i)
    for (std::int64_t j = 0; j < b; ++j) {
      D(i, j) = dot(I, i, T, j), X(i, j) = scale * D(i, j);
      if (exclude_diagonal && i == j)
        X(i, j) = -INFINITY;  // weighs nothing: p = q = 0 there
      else
        max_abs_logit = std::max(max_abs_logit, std::fabs(X(i, j)));
    }
  const double delta = 8 * r.u * max_abs_logit;
  std::vector<double> row(static_cast<std::size_t>(b)), col(static_cast<std::size_t>(b));
  for (std::int64_t i = 0; i < b; ++i) {
    for (std::int64_t j = 0; j < b; ++j) row[std::size_t(j)] = X(i, j), col[std::size_t(j)] = X(j, i);
    x.row_lse.value[std::size_t(i)] = logsumexp(row), x.col_lse.value[std::size_t(i)] = logsumexp(col);
    x.row_lse.tolerance[std::size_t(i)] =
        2 * delta + 8 * r.u * (std::fabs(x.row_lse.value[std::size_t(i)]) + std::sqrt(double(b) + 1));
    x.col_lse.tolerance[std::size_t(i)] =
        2 * delta + 8 * r.u * (std::fabs(x.col_lse.value[std::size_t(i)]) + std::sqrt(double(b) + 1));
  }
  double loss = 0, loss_tol = 0, sum = 0;  // sum: the terms' unweighted partial sum
  for (std::int64_t i = 0; i < b; ++i) {
    const double term =
        wr * (x.row_lse.value[std::size_t(i)] - X(i, pos(i))) + wc * (x.col_lse.value[std::size_t(i)] - X(pos(i), i));
    sum += term, loss += term / double(b);
    loss_tol += (x.row_lse.tolerance[std::size_t(i)] + x.col_lse.tolerance[std::size_t(i)] + 2 * delta +
                 8 * r.u * (std::fabs(term) + std::fabs(sum))) /
                double(b);
  }
  x.loss.value[0] = loss, x.loss.tolerance[0] = loss_tol;
  const double gr = b ? wr * dloss / double(b) : 0, gc = b ? wc * dloss / double(b) : 0;
  Mat dI(b, c), dT(b, c), magI(b, c), magT(b, c);
  // dscale sums g * dot: besides the terms' own error, each dot carries up to (c + 2) u times
  // sum_k |I_ik T_jk| (not |dot|, which cancellation can make far smaller).
  CompensatedSum dscale_sum;
  double dscale_mag = 0, dscale_dots = 0;
  for (std::int64_t i = 0; i < b; ++i)
    for (std::int64_t j = 0; j < b; ++j) {
      double dot_mag = 0;
      for (std::int64_t k = 0; k < c; ++k) dot_mag += std::fabs(I(i, k) * T(j, k));
      const double p = gr * std::exp(X(i, j) - x.row_lse.value[std::size_t(i)]);
      const double q = gc * std::exp(X(i, j) - x.col_lse.value[std::size_t(j)]);
      const double hit = (j == pos(i) ? gr : 0.0) + (i == pos(j) ? gc : 0.0);
      const double g = p + q - hit, gabs = std::fabs(p) + std::fabs(q) + std::fabs(hit);
      dscale_sum.add(g * D(i, j)), dscale_mag += gabs * std::fabs(D(i, j)), dscale_dots += gabs * dot_mag;
      for (std::int64_t k = 0; k < c; ++k) {
        dI(i, k) += scale * g * T(j, k), magI(i, k) += std::fabs(scale) * gabs * std::fabs(T(j, k));
        dT(j, k) += scale * g * I(i, k), magT(j, k) += std::fabs(scale) * gabs * std::fabs(I(i, k));
      }
    }
  add_previous(dI, init_dI.v), add_previous(dT, init_dT.v);  // last, as the library does
  const double dscale = dscale_sum.value() + init_dscale;
  const double terms = double(b) + 1;
  const auto tol = [&](double ref, double mag, double u_out) {
    return (8 * delta + 16 * r.u * std::sqrt(terms) + 2 * u_out) * mag + 2 * (u_out + r.u) * std::fabs(ref) + r.floor;
  };
  for (std::size_t k = 0; k < dI.v.size(); ++k)
    x.dI.value[k] = dI.v[k], x.dI.tolerance[k] = tol(dI.v[k], magI.v[k], r.u_out);
  for (std::size_t k = 0; k < dT.v.size(); ++k)
    x.dT.value[k] = dT.v[k], x.dT.tolerance[k] = tol(dT.v[k], magT.v[k], r.u_out);
  x.dscale.value[0] = dscale,
  x.dscale.tolerance[0] = tol(dscale, dscale_mag, 0) * std::sqrt(terms) + 2 * double(c + 2) * r.u * dscale_dots;
  return x;
}

}  // namespace fuzz
