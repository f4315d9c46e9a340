#pragma once
/// \file reference.hpp
/// Float64 reference implementations that materialize the whole logit matrix. They are the
/// oracle of the test suite and of `tlse --check`: slow (O(rows x cols) memory), simple, exact
/// up to float64 rounding. Host only; inputs are read as double.
#include <tlse/contrastive_loss.hpp>
#include <tlse/cross_entropy.hpp>
#include <tlse/linear_lse.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

/// Float64 references (test oracles); `detail` holds their helpers.
namespace tlse::testing {

/// A row-major float64 matrix.
struct Matrix {
  /// Row count (cols: column count).
  std::int64_t rows = 0, cols = 0;
  /// rows * cols entries, row-major.
  std::vector<double> v;
  /// Empty (0 x 0).
  Matrix() = default;
  /// rows r x cols c, zero-filled.
  Matrix(std::int64_t r, std::int64_t c) : rows(r), cols(c), v(std::size_t(r * c), 0.0) {}
  /// Entry (i, j).
  double& operator()(std::int64_t i, std::int64_t j) { return v[std::size_t(i * cols + j)]; }
  /// Entry (i, j).
  double operator()(std::int64_t i, std::int64_t j) const { return v[std::size_t(i * cols + j)]; }
};

namespace detail {
inline double dot(const Matrix& a, std::int64_t i, const Matrix& b, std::int64_t j) {
  double s = 0;
  for (std::int64_t k = 0; k < a.cols; ++k) s += a(i, k) * b(j, k);
  return s;
}
inline double lse(const double* x, std::int64_t n, std::int64_t stride = 1) {
  double m = -std::numeric_limits<double>::infinity();
  for (std::int64_t j = 0; j < n; ++j) m = std::max(m, x[j * stride]);
  if (m == -std::numeric_limits<double>::infinity()) return m;
  double s = 0;
  for (std::int64_t j = 0; j < n; ++j) s += std::exp(x[j * stride] - m);
  return m + std::log(s);
}
/// dA += scale * G B, dB += scale * G^T A.
inline void backprop(const Matrix& G, const Matrix& A, const Matrix& B, double scale, Matrix& dA, Matrix& dB) {
  for (std::int64_t i = 0; i < G.rows; ++i)
    for (std::int64_t j = 0; j < G.cols; ++j) {
      const double g = G(i, j) * scale;
      if (g == 0) continue;
      for (std::int64_t k = 0; k < A.cols; ++k) {
        dA(i, k) += g * B(j, k);
        dB(j, k) += g * A(i, k);
      }
    }
}
inline Matrix abs(const Matrix& M) {
  Matrix r = M;
  for (double& v : r.v) v = std::fabs(v);
  return r;
}
/// Fills the magnitudes the tests scale their tolerances by: with Gabs_ij the sum of the
/// absolute values of the terms of dL/dx_ij, dA_mag = scale Gabs |B| and dB_mag = scale Gabs^T |A|.
template <class R>
void magnitudes(R& r, const Matrix& Gabs, const Matrix& A, const Matrix& B, double scale) {
  r.dA_mag = Matrix(A.rows, A.cols);
  r.dB_mag = Matrix(B.rows, B.cols);
  backprop(Gabs, abs(A), abs(B), std::fabs(scale), r.dA_mag, r.dB_mag);
  r.G_abs_sum = 0;
  for (double v : Gabs.v) r.G_abs_sum += v;
}
}  // namespace detail

/// Every reference also returns error magnitudes for tolerances: dA_mag, dB_mag (see
/// detail::magnitudes) and G_abs_sum = sum_ij Gabs_ij.
struct LinearLseReference {
  /// Per row of A.
  std::vector<double> lse;
  /// Gradients of A and B for the given dlse, and their error magnitudes.
  Matrix dA, dB, dA_mag, dB_mag;
  /// sum_ij Gabs_ij.
  double G_abs_sum = 0;
};

/// lse_i = log sum_j exp(scale A_i.B_j + bias_j) (masks as LinearLseOptions); gradients for dlse.
inline LinearLseReference linear_lse_reference(const Matrix& A, const Matrix& B, const std::vector<double>& bias,
                                               const LinearLseOptions& o, const std::vector<double>& dlse) {
  const double inf = std::numeric_limits<double>::infinity();
  Matrix X(A.rows, B.rows);
  for (std::int64_t i = 0; i < A.rows; ++i)
    for (std::int64_t j = 0; j < B.rows; ++j) {
      const bool masked =
          (o.valid_cols >= 0 && j >= o.valid_cols) || (o.exclude_diagonal && i + o.diagonal_offset == j);
      X(i, j) = masked ? -inf : o.scale * detail::dot(A, i, B, j) + (bias.empty() ? 0.0 : bias[j]);
    }
  LinearLseReference r{std::vector<double>(A.rows), Matrix(A.rows, A.cols), Matrix(B.rows, B.cols), {}, {}, 0};
  Matrix G(A.rows, B.rows);
  for (std::int64_t i = 0; i < A.rows; ++i) {
    r.lse[i] = detail::lse(&X.v[i * B.rows], B.rows);
    for (std::int64_t j = 0; j < B.rows; ++j)
      G(i, j) = X(i, j) == -inf ? 0.0 : dlse.empty() ? 0.0 : dlse[i] * std::exp(X(i, j) - r.lse[i]);
  }
  detail::backprop(G, A, B, o.scale, r.dA, r.dB);
  detail::magnitudes(r, detail::abs(G), A, B, o.scale);
  return r;
}

/// Result of cross_entropy_reference().
struct CrossEntropyReference {
  std::vector<double> row_loss;  ///< per row (0 for ignored rows)
  double loss = 0;               ///< reduced as the options say (row_loss when Reduction::none is unused)
  std::vector<double> lse;       ///< per row (0 for ignored rows)
  /// Gradients of E and C for the given dloss.
  Matrix dE, dC;
  /// Bias gradient (V).
  std::vector<double> dbias;
  /// Rows not ignored.
  std::int64_t active = 0;
  Matrix dA_mag, dB_mag;  ///< magnitudes of dE and dC
  /// sum_ij Gabs_ij.
  double G_abs_sum = 0;
  /// Magnitudes of dbias.
  std::vector<double> dbias_mag;
  /// Per row: the argmax class (ties: the lowest id), -1 for ignored rows.
  std::vector<std::int64_t> predicted;
  /// Per row: the class it is scored against, -1 for ignored rows.
  std::vector<std::int64_t> row_target;
  /// The fraction of scored rows whose argmax is the target (0 with none).
  double accuracy = 0;
  /// Per row: the gap between its largest and second largest logit (infinite with one class);
  /// an argmax computed in lower precision may differ where this is below its error.
  std::vector<double> top_gap;
};

/// Optional inputs of cross_entropy_reference, as CrossEntropyExtras: class weights (V) and the
/// gradient reaching the returned LSE (N); empty when not used.
struct CrossEntropyReferenceExtras {
  /// Class weights (V), or empty.
  std::vector<double> class_weight;
  /// dL/dlse (N), or empty.
  std::vector<double> dlse;
};

/// Cross-entropy with every CrossEntropyOptions feature but filtering (the reference is exact),
/// written as F.cross_entropy defines weight and label_smoothing, from the materialized logits:
/// loss_i = u_t (1 - e) (lse_i - x_it) + (e / V) sum_j u_j (lse_i - x_ij) + z lse_i^2, mean over
/// sum_i u_t (the z-loss over the scored rows). dloss has N entries for Reduction::none, one otherwise.
inline CrossEntropyReference cross_entropy_reference(const Matrix& E, const Matrix& C, const std::vector<double>& bias,
                                                     const std::vector<std::int64_t>& targets,
                                                     const CrossEntropyOptions& o, const std::vector<double>& dloss,
                                                     const CrossEntropyReferenceExtras& extras = {}) {
  const double inf = std::numeric_limits<double>::infinity();
  const std::int64_t N = E.rows, V = C.rows;
  CrossEntropyReference r{std::vector<double>(N, 0.0), 0.0, std::vector<double>(N, 0.0), Matrix(N, E.cols),
                          Matrix(V, C.cols), std::vector<double>(V, 0.0), 0, {}, {}, 0, std::vector<double>(V, 0.0),
                          std::vector<std::int64_t>(N, -1), {}, 0.0, std::vector<double>(N, inf)};
  const auto u = [&](std::int64_t j) { return extras.class_weight.empty() ? 1.0 : extras.class_weight[j]; };
  std::vector<std::int64_t> target(N, -1);
  double weight_total = 0, class_total = 0;
  for (std::int64_t j = 0; j < V; ++j) class_total += u(j);
  for (std::int64_t i = 0; i + o.shift < N; ++i)
    if (targets[i + o.shift] != o.ignore_index)
      target[i] = targets[i + o.shift], ++r.active, weight_total += u(target[i]);
  const bool mean = o.reduction == Reduction::mean;
  const double ce_scale = mean ? (weight_total > 0 ? 1 / weight_total : 0.0) : 1.0;
  const double z_scale = mean ? (r.active ? 1.0 / double(r.active) : 0.0) : 1.0;
  const double e = o.label_smoothing;
  Matrix G(N, V), Gabs(N, V);  // dL/dz (z: logit before the softcap)
  std::vector<double> x(V), z(V);
  std::int64_t hits = 0;
  for (std::int64_t i = 0; i < N; ++i) {
    if (target[i] < 0) continue;
    for (std::int64_t j = 0; j < V; ++j) {
      z[j] = detail::dot(E, i, C, j) + (bias.empty() ? 0.0 : bias[j]);
      x[j] = o.softcap > 0 && z[j] != -inf ? o.softcap * std::tanh(z[j] / o.softcap) : z[j];  // -inf stays masked
    }
    const double l = detail::lse(x.data(), V);
    const double ut = u(target[i]);
    double smooth = 0;
    std::int64_t best = 0;
    double second = -inf;
    for (std::int64_t j = 0; j < V; ++j) {
      smooth += u(j) * (l - x[j]);
      if (x[j] > x[best]) second = x[best], best = j;
      else if (j != best) second = std::max(second, x[j]);
    }
    r.predicted[i] = best;
    r.top_gap[i] = x[best] - second;
    hits += best == target[i];
    r.lse[i] = l;
    const double ce_part = (1 - e) * ut * (l - x[target[i]]) + (e > 0 ? e / double(V) * smooth : 0.0);
    r.row_loss[i] = ce_part + o.z_loss * l * l;
    r.loss += ce_scale * ce_part + z_scale * o.z_loss * l * l;
    const double up = o.reduction == Reduction::none ? dloss[i] : dloss[0];
    const double c = up * ce_scale, cz = up * z_scale;
    const double dl = extras.dlse.empty() ? 0.0 : extras.dlse[i];
    const double g = c * ((1 - e) * ut + e * class_total / double(V)) + 2 * o.z_loss * cz * l + dl;
    for (std::int64_t j = 0; j < V; ++j) {
      if (x[j] == -inf) continue;  // a masked logit passes no gradient
      const double p = g * std::exp(x[j] - l), t = j == target[i] ? c * (1 - e) * ut : 0.0;
      const double spread = c * e / double(V) * u(j);
      const double cap = o.softcap > 0 ? 1 - (x[j] / o.softcap) * (x[j] / o.softcap) : 1.0;
      G(i, j) = (p - t - spread) * cap;
      Gabs(i, j) = (std::fabs(p) + std::fabs(t) + std::fabs(spread)) * cap;
      r.dbias[j] += G(i, j);
      r.dbias_mag[j] += Gabs(i, j);
    }
  }
  if (o.reduction == Reduction::sum) {
    r.loss = 0;
    for (double v : r.row_loss) r.loss += v;
  }
  r.accuracy = r.active ? double(hits) / double(r.active) : 0.0;
  r.row_target = target;
  detail::backprop(G, E, C, 1.0, r.dE, r.dC);
  detail::magnitudes(r, Gabs, E, C, 1.0);
  return r;
}

/// Result of contrastive_reference() and self_contrastive_reference().
struct ContrastiveReference {
  /// The reduced loss.
  double loss = 0;
  /// Image-to-text LSEs (per row of Z for the self form); col_lse: text-to-image (empty for the self form).
  std::vector<double> row_lse, col_lse;
  Matrix dI, dT;  ///< for the self-similarity form, dI is dZ and dT is empty
  /// Gradient with respect to the logit scale.
  double dscale = 0;
  Matrix dA_mag, dB_mag;  ///< magnitudes of dI and dT (of dZ in dA_mag for the self form)
  /// sum_ij Gabs_ij.
  double G_abs_sum = 0;
  double dscale_mag = 0;  ///< sum_ij Gabs_ij |I_i . T_j|
};

/// Paired contrastive loss; labels empty means the diagonal.
inline ContrastiveReference contrastive_reference(const Matrix& I, const Matrix& T,
                                                  const std::vector<std::int64_t>& labels, const ContrastiveOptions& o,
                                                  double dloss) {
  const std::int64_t b = I.rows;
  const double wr = o.direction == Direction::text_to_image ? 0 : o.direction == Direction::symmetric ? 0.5 : 1;
  const double wc = o.direction == Direction::image_to_text ? 0 : o.direction == Direction::symmetric ? 0.5 : 1;
  auto pos = [&](std::int64_t i) { return labels.empty() ? i : labels[i]; };
  Matrix D(b, b), G(b, b), Gabs(b, b);
  for (std::int64_t i = 0; i < b; ++i)
    for (std::int64_t j = 0; j < b; ++j) D(i, j) = detail::dot(I, i, T, j);
  ContrastiveReference r{0, std::vector<double>(b), std::vector<double>(b), Matrix(b, I.cols), Matrix(b, T.cols), 0,
                         {}, {}, 0, 0};
  std::vector<double> x(b);
  for (std::int64_t i = 0; i < b; ++i) {
    for (std::int64_t j = 0; j < b; ++j) x[j] = o.scale * D(i, j);
    r.row_lse[i] = detail::lse(x.data(), b);
    for (std::int64_t j = 0; j < b; ++j) x[j] = o.scale * D(j, i);
    r.col_lse[i] = detail::lse(x.data(), b);
  }
  if (b == 0) return r;
  for (std::int64_t i = 0; i < b; ++i)
    r.loss += (wr * (r.row_lse[i] - o.scale * D(i, pos(i))) + wc * (r.col_lse[i] - o.scale * D(pos(i), i))) / double(b);
  const double gr = wr * dloss / double(b), gc = wc * dloss / double(b);
  for (std::int64_t i = 0; i < b; ++i)
    for (std::int64_t j = 0; j < b; ++j) {
      const double xij = o.scale * D(i, j);
      const double p = gr * std::exp(xij - r.row_lse[i]), q = gc * std::exp(xij - r.col_lse[j]);
      const double t = (j == pos(i) ? gr : 0.0) + (i == pos(j) ? gc : 0.0);
      G(i, j) = p + q - t;
      Gabs(i, j) = std::fabs(p) + std::fabs(q) + std::fabs(t);
      r.dscale += G(i, j) * D(i, j);
      r.dscale_mag += Gabs(i, j) * std::fabs(D(i, j));
    }
  detail::backprop(G, I, T, o.scale, r.dI, r.dT);
  detail::magnitudes(r, Gabs, I, T, o.scale);
  return r;
}

/// Self-similarity (NT-Xent) form: Z has 2B rows, diagonal excluded, positive i <-> i+B.
inline ContrastiveReference self_contrastive_reference(const Matrix& Z, const ContrastiveOptions& o, double dloss) {
  const std::int64_t n = Z.rows;
  const double inf = std::numeric_limits<double>::infinity();
  ContrastiveReference r{0, std::vector<double>(n), {}, Matrix(n, Z.cols), Matrix(n, Z.cols), 0, {}, {}, 0, 0};
  if (n == 0) return r;
  Matrix D(n, n), X(n, n), G(n, n), Gabs(n, n);
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      D(i, j) = detail::dot(Z, i, Z, j);
      X(i, j) = i == j ? -inf : o.scale * D(i, j);
    }
  for (std::int64_t i = 0; i < n; ++i) {
    r.row_lse[i] = detail::lse(&X.v[i * n], n);
    const std::int64_t p = (i + n / 2) % n;
    r.loss += (r.row_lse[i] - X(i, p)) / double(n);
    for (std::int64_t j = 0; j < n; ++j) {
      const double q = i == j ? 0.0 : dloss / double(n) * std::exp(X(i, j) - r.row_lse[i]);
      const double t = j == p ? dloss / double(n) : 0.0;
      G(i, j) = q - t;
      Gabs(i, j) = std::fabs(q) + std::fabs(t);
      r.dscale += G(i, j) * D(i, j);
      r.dscale_mag += Gabs(i, j) * std::fabs(D(i, j));
    }
  }
  Matrix dB(n, Z.cols);
  detail::backprop(G, Z, Z, o.scale, r.dI, dB);
  for (std::size_t k = 0; k < dB.v.size(); ++k) r.dI.v[k] += dB.v[k];
  detail::magnitudes(r, Gabs, Z, Z, o.scale);
  for (std::size_t k = 0; k < r.dA_mag.v.size(); ++k) r.dA_mag.v[k] += r.dB_mag.v[k];
  r.dT = Matrix();
  return r;
}

/// \var Matrix::cols
/// Column count.
/// \var LinearLseReference::dB
/// Gradient of B for the given dlse.
/// \var LinearLseReference::dA_mag
/// Error magnitude of each entry of dA (detail::magnitudes).
/// \var LinearLseReference::dB_mag
/// Error magnitude of each entry of dB.
/// \var CrossEntropyReference::dC
/// Gradient of C for the given dloss.
/// \var CrossEntropyReference::dA_mag
/// Error magnitudes of dE.
/// \var ContrastiveReference::col_lse
/// Text-to-image LSEs (empty for the self-similarity form).
/// \var ContrastiveReference::dI
/// Gradient of I (of Z for the self-similarity form).
/// \var ContrastiveReference::dA_mag
/// Error magnitudes of dI (of dZ for the self-similarity form).

}  // namespace tlse::testing
