#pragma once
// The float64 reference of the distillation loss, materializing both logit matrices (shared by
// test_distillation and test_distributed). The math: core/tlse/impl/distillation_tiles.hpp.
#include <tlse/distillation_options.hpp>
#include <tlse/testing/reference.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace tlse::test {

using testing::Matrix;

/// The float64 reference (header comment of distillation_tiles.hpp for the math).
struct DistillReference {
  std::vector<double> row_loss, row_mag;  // per row (0 for rows not scored); row_mag: its terms' magnitudes
  double loss = 0, loss_mag = 0;
  std::int64_t active = 0;
  Matrix dHs, dWs, dHt, dWt, dHs_mag, dWs_mag, dHt_mag, dWt_mag;
  double lse_max = 0;  // largest |LSE| of either head (and of the cross-entropy's)
};

inline DistillReference distillation_reference(const Matrix& Hs, const Matrix& Ws, const Matrix& Ht, const Matrix& Wt,
                                               const std::vector<std::int64_t>& targets,
                                               const tlse::DistillationOptions& o, const std::vector<double>& dloss) {
  namespace d = tlse::testing::detail;
  const double inf = std::numeric_limits<double>::infinity();
  const std::int64_t N = Hs.rows, V = Ws.rows;
  DistillReference r;
  r.row_loss.assign(N, 0.0);
  r.row_mag.assign(N, 0.0);
  tlse::Divergence div = o.divergence;
  if (div == tlse::Divergence::jsd && o.beta == 0) div = tlse::Divergence::forward_kl;
  if (div == tlse::Divergence::jsd && o.beta == 1) div = tlse::Divergence::reverse_kl;
  const double b = o.beta, T = o.temperature, a = o.alpha;
  std::vector<std::int64_t> target(N, -2);  // -2: not scored; -1: scored without a target
  for (std::int64_t i = 0; i < N; ++i) {
    if (targets.empty())
      target[i] = -1;
    else if (i + o.shift < N && targets[i + o.shift] != o.ignore_index)
      target[i] = targets[i + o.shift];
    r.active += target[i] >= -1;
  }
  const double scale = o.reduction == tlse::Reduction::mean ? (r.active ? 1.0 / double(r.active) : 0.0) : 1.0;
  Matrix Gs(N, V), Gt(N, V), Gs_abs(N, V), Gt_abs(N, V);
  std::vector<double> zs(V), zt(V), z1(V), ls(V), lt(V), lm(V);
  for (std::int64_t i = 0; i < N; ++i) {
    if (target[i] < -1) continue;
    for (std::int64_t j = 0; j < V; ++j) {
      z1[j] = d::dot(Hs, i, Ws, j);
      zs[j] = z1[j] / T;
      zt[j] = d::dot(Ht, i, Wt, j) / T;
    }
    const double lse_s = d::lse(zs.data(), V), lse_t = d::lse(zt.data(), V), lse_1 = d::lse(z1.data(), V);
    r.lse_max = std::max({r.lse_max, std::fabs(lse_s), std::fabs(lse_t), a > 0 ? std::fabs(lse_1) : 0.0});
    double term_s = 0, term_t = 0, mag = 0;
    const auto weighted = [](double p, double x) { return p == 0 ? 0.0 : p * x; };
    for (std::int64_t j = 0; j < V; ++j) {
      ls[j] = zs[j] - lse_s, lt[j] = zt[j] - lse_t;
      const double ps = std::exp(ls[j]), pt = std::exp(lt[j]);
      // log m from the log-probabilities: m itself underflows where both p do (a denormal p_t
      // beside p_s = 0 would give log m = -inf and an infinite term).
      if (div == tlse::Divergence::jsd) {
        const double x = std::log(b) + lt[j], y = std::log1p(-b) + ls[j], hi = std::max(x, y);
        lm[j] = hi == -inf ? -inf : hi + std::log1p(std::exp(std::min(x, y) - hi));
      }
      if (div == tlse::Divergence::forward_kl) {
        term_t += weighted(pt, lt[j] - ls[j]);
        mag += weighted(pt, 1 + std::fabs(lt[j] - ls[j]));
      } else if (div == tlse::Divergence::reverse_kl) {
        term_s += weighted(ps, ls[j] - lt[j]);
        mag += weighted(ps, 1 + std::fabs(ls[j] - lt[j]));
      } else {
        term_t += weighted(pt, lt[j] - lm[j]);
        term_s += weighted(ps, ls[j] - lm[j]);
        mag += weighted(pt, 1 + std::fabs(lt[j] - lm[j])) + weighted(ps, 1 + std::fabs(ls[j] - lm[j]));
      }
    }
    const double dv = div == tlse::Divergence::forward_kl   ? term_t
                      : div == tlse::Divergence::reverse_kl ? term_s
                                                            : b * term_t + (1 - b) * term_s;
    double row = 0, row_mag = 0;
    if (a < 1) row += (1 - a) * dv, row_mag += (1 - a) * mag;
    if (a > 0) row += a * (lse_1 - z1[target[i]]), row_mag += a * (std::fabs(lse_1) + std::fabs(z1[target[i]]) + 1);
    r.row_loss[i] = scale * row;
    r.row_mag[i] = scale * row_mag;
    r.loss += scale * row;
    r.loss_mag += scale * row_mag;
    const double c = o.reduction == tlse::Reduction::none ? dloss[i] : dloss[0];
    const double cd = c * scale * (1 - a) / T, cc = c * scale * a;
    for (std::int64_t j = 0; j < V; ++j) {
      const double ps = std::exp(ls[j]), pt = std::exp(lt[j]);
      double ds, dt, ds_abs, dt_abs;  // d div / dz and the magnitudes of their terms
      if (div == tlse::Divergence::forward_kl) {
        ds = ps - pt, ds_abs = ps + pt;
        dt = weighted(pt, (lt[j] - ls[j]) - term_t),
        dt_abs = weighted(pt, 1 + std::fabs(lt[j] - ls[j]) + std::fabs(term_t));
      } else if (div == tlse::Divergence::reverse_kl) {
        ds = weighted(ps, (ls[j] - lt[j]) - term_s),
        ds_abs = weighted(ps, 1 + std::fabs(ls[j] - lt[j]) + std::fabs(term_s));
        dt = pt - ps, dt_abs = pt + ps;
      } else {
        ds = (1 - b) * weighted(ps, (ls[j] - lm[j]) - term_s);
        ds_abs = (1 - b) * weighted(ps, 2 + std::fabs(ls[j] - lm[j]) + std::fabs(term_s));
        dt = b * weighted(pt, (lt[j] - lm[j]) - term_t);
        dt_abs = b * weighted(pt, 2 + std::fabs(lt[j] - lm[j]) + std::fabs(term_t));
      }
      const double p1 = a > 0 ? std::exp(z1[j] - lse_1) : 0.0, hit = j == target[i] ? 1.0 : 0.0;
      Gs(i, j) = (a < 1 ? cd * ds : 0.0) + (a > 0 ? cc * (p1 - hit) : 0.0);
      Gs_abs(i, j) = (a < 1 ? std::fabs(cd) * ds_abs : 0.0) + (a > 0 ? std::fabs(cc) * (p1 + hit) : 0.0);
      Gt(i, j) = a < 1 ? cd * dt : 0.0;
      Gt_abs(i, j) = a < 1 ? std::fabs(cd) * dt_abs : 0.0;
    }
  }
  r.dHs = Matrix(N, Hs.cols), r.dWs = Matrix(V, Ws.cols), r.dHt = Matrix(N, Ht.cols), r.dWt = Matrix(V, Wt.cols);
  d::backprop(Gs, Hs, Ws, 1.0, r.dHs, r.dWs);
  d::backprop(Gt, Ht, Wt, 1.0, r.dHt, r.dWt);
  r.dHs_mag = Matrix(N, Hs.cols), r.dWs_mag = Matrix(V, Ws.cols), r.dHt_mag = Matrix(N, Ht.cols),
  r.dWt_mag = Matrix(V, Wt.cols);
  d::backprop(Gs_abs, d::abs(Hs), d::abs(Ws), 1.0, r.dHs_mag, r.dWs_mag);
  d::backprop(Gt_abs, d::abs(Ht), d::abs(Wt), 1.0, r.dHt_mag, r.dWt_mag);
  return r;
}

}  // namespace tlse::test
