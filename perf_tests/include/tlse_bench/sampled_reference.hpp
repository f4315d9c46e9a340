#pragma once
/// \file sampled_reference.hpp
/// Float64 gradients of the mean cross-entropy (no bias, dloss = 1) on a sample, for problems whose
/// full float64 reference (testing::cross_entropy_reference: serial, N x V memory) would take
/// hours: dE on sampled rows and dC on sampled classes, from exact float64 LSEs of every row. What
/// `tlse cross-entropy --check-sampled` compares the kernels' gradients with, e.g. to measure the
/// error that gradient filtering adds.
///
/// Everything runs through KokkosBlas::gemm in double on the default execution space (the GPU in
/// a CUDA build), a block of classes at a time: N V D multiply-adds for the LSEs, plus
/// 2 (rows V + N classes) D for the sampled gradients.
#include <tlse/impl/kokkos_compat.hpp>
#include <tlse_bench/random_inputs.hpp>

#include <KokkosBlas3_gemm.hpp>
#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace tlse::perf {

/// dE at `rows` and dC at `classes` (rows.size() x D and classes.size() x D).
struct SampledGradients {
  std::vector<std::int64_t> rows, classes;
  Matrix dE, dC;
};

namespace detail {

using RefExec = Kokkos::DefaultExecutionSpace;
using RefDevice = Kokkos::Device<RefExec, RefExec::memory_space>;
using RefMatrix = Kokkos::View<double**, Kokkos::LayoutRight, RefDevice>;
using RefVector = Kokkos::View<double*, RefDevice>;

/// The rows `which` of m (all of them when `which` is empty) on the device.
inline RefMatrix device_rows(const std::string& label, const Matrix& m, const std::vector<std::int64_t>& which) {
  const std::int64_t n = which.empty() ? m.rows : std::int64_t(which.size());
  RefMatrix d(label, n, m.cols);
  auto h = Kokkos::create_mirror_view(d);
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t k = 0; k < m.cols; ++k) h(i, k) = m(which.empty() ? i : which[std::size_t(i)], k);
  Kokkos::deep_copy(d, h);
  return d;
}

/// Rows [j0, j0 + block) of m into `d` (block x cols), zero past m's last row.
inline void load_block(const RefMatrix& d, const Matrix& m, std::int64_t j0) {
  auto h = Kokkos::create_mirror_view(d);
  for (std::int64_t j = 0; j < std::int64_t(d.extent(0)); ++j)
    for (std::int64_t k = 0; k < m.cols; ++k) h(j, k) = j0 + j < m.rows ? m(j0 + j, k) : 0.0;
  Kokkos::deep_copy(d, h);
}

inline Matrix to_host(const RefMatrix& d) {
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), d);
  Matrix m(std::int64_t(d.extent(0)), std::int64_t(d.extent(1)));
  for (std::int64_t i = 0; i < m.rows; ++i)
    for (std::int64_t k = 0; k < m.cols; ++k) m(i, k) = h(i, k);
  return m;
}

/// G = softmax entries minus the one-hot target, divided by `count` (the mean), in place over the
/// logits x (rows x n valid columns of classes class_of(c)); columns past n are zeroed.
template <class ClassOf>
void logits_to_gradient(const RefMatrix& x, std::int64_t n, const RefVector& row_lse,
                        const Kokkos::View<std::int64_t*, RefDevice>& row_target, double count, ClassOf class_of) {
  const std::int64_t cols = std::int64_t(x.extent(1));
  Kokkos::parallel_for(
      "tlse::perf::logits_to_gradient", Kokkos::RangePolicy<RefExec>(0, std::int64_t(x.extent(0)) * cols),
      KOKKOS_LAMBDA(std::int64_t idx) {
        const std::int64_t i = idx / cols, c = idx % cols;
        double& g = x(i, c);
        g = c < n ? (impl::exp(g - row_lse(i)) - (row_target(i) == class_of(c) ? 1.0 : 0.0)) / count : 0.0;
      });
}

}  // namespace detail

/// The float64 gradients of the mean cross-entropy of (E, C, targets) at `rows` of dE and
/// `classes` of dC (every row's target in [0, V)).
inline SampledGradients sampled_cross_entropy_gradients(const Matrix& E, const Matrix& C,
                                                        const std::vector<std::int64_t>& targets,
                                                        const std::vector<std::int64_t>& rows,
                                                        const std::vector<std::int64_t>& classes) {
  using namespace detail;
  const std::int64_t N = E.rows, V = C.rows, D = E.cols, S = std::int64_t(rows.size()),
                     J = std::int64_t(classes.size());
  SampledGradients out{rows, classes, Matrix(), Matrix()};
  const RefMatrix Ed = device_rows("E", E, {});
  Kokkos::View<std::int64_t*, RefDevice> target("targets", N), sampled_target("sampled targets", S);
  {
    auto h = Kokkos::create_mirror_view(target);
    for (std::int64_t i = 0; i < N; ++i) h(i) = targets[std::size_t(i)];
    Kokkos::deep_copy(target, h);
    auto hs = Kokkos::create_mirror_view(sampled_target);
    for (std::int64_t i = 0; i < S; ++i) hs(i) = targets[std::size_t(rows[std::size_t(i)])];
    Kokkos::deep_copy(sampled_target, hs);
  }

  // Every row's LSE: running (max, sum of exp) over blocks of classes, merged per row.
  const std::int64_t by_logits = (std::int64_t(256) << 20) / 8 / std::max<std::int64_t>(N, 1);
  const std::int64_t by_classes = (std::int64_t(128) << 20) / 8 / std::max<std::int64_t>(D, 1);
  const std::int64_t block = std::max<std::int64_t>(1, std::min({V, by_logits, by_classes}));
  RefMatrix Cb("C block", block, D), X("logit block", N, block);
  RefVector row_max("row max", N), row_sum("row sum", N), lse("lse", N);
  Kokkos::deep_copy(row_max, -impl::infinity<double>());
  for (std::int64_t j0 = 0; j0 < V; j0 += block) {
    const std::int64_t n = std::min(block, V - j0);
    load_block(Cb, C, j0);
    KokkosBlas::gemm("N", "T", 1.0, Ed, Cb, 0.0, X);
    Kokkos::parallel_for(
        "tlse::perf::row_lse", Kokkos::RangePolicy<RefExec>(0, N), KOKKOS_LAMBDA(std::int64_t i) {
          double m = row_max(i), s = row_sum(i);
          for (std::int64_t c = 0; c < n; ++c) {
            const double x = X(i, c);
            if (x > m)
              s = s * impl::exp(m - x) + 1, m = x;
            else
              s += impl::exp(x - m);
          }
          row_max(i) = m, row_sum(i) = s;
        });
  }
  Kokkos::parallel_for(
      "tlse::perf::lse", Kokkos::RangePolicy<RefExec>(0, N),
      KOKKOS_LAMBDA(std::int64_t i) { lse(i) = row_max(i) + impl::log(row_sum(i)); });

  // dE at the sampled rows: (P - onehot) C / N, a block of classes at a time.
  RefVector sampled_lse("sampled lse", S);
  {
    auto all = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), lse);
    auto h = Kokkos::create_mirror_view(sampled_lse);
    for (std::int64_t i = 0; i < S; ++i) h(i) = all(rows[std::size_t(i)]);
    Kokkos::deep_copy(sampled_lse, h);
  }
  const RefMatrix Es = device_rows("sampled E", E, rows);
  RefMatrix Gs("sampled G", S, block), dEs("sampled dE", S, D);
  for (std::int64_t j0 = 0; j0 < V; j0 += block) {
    load_block(Cb, C, j0);
    KokkosBlas::gemm("N", "T", 1.0, Es, Cb, 0.0, Gs);
    detail::logits_to_gradient(
        Gs, std::min(block, V - j0), sampled_lse, sampled_target, double(N),
        KOKKOS_LAMBDA(std::int64_t c) { return j0 + c; });
    KokkosBlas::gemm("N", "N", 1.0, Gs, Cb, 1.0, dEs);
  }
  out.dE = to_host(dEs);

  // dC at the sampled classes: (P - onehot)^T E / N over every row.
  const RefMatrix Cj = device_rows("sampled C", C, classes);
  Kokkos::View<std::int64_t*, RefDevice> class_id("sampled classes", J);
  {
    auto h = Kokkos::create_mirror_view(class_id);
    for (std::int64_t j = 0; j < J; ++j) h(j) = classes[std::size_t(j)];
    Kokkos::deep_copy(class_id, h);
  }
  RefMatrix Gj("G at sampled classes", N, J), dCj("sampled dC", J, D);
  KokkosBlas::gemm("N", "T", 1.0, Ed, Cj, 0.0, Gj);
  detail::logits_to_gradient(
      Gj, J, lse, target, double(N), KOKKOS_LAMBDA(std::int64_t c) { return class_id(c); });
  KokkosBlas::gemm("T", "N", 1.0, Gj, Ed, 0.0, dCj);
  out.dC = to_host(dCj);
  return out;
}

/// max |got - ref| / max |ref| over the sampled rows of `got` (a full gradient) listed in `which`.
inline double sampled_relative_error(const Matrix& got, const Matrix& ref, const std::vector<std::int64_t>& which) {
  double err = 0, scale = 0;
  for (std::size_t s = 0; s < which.size(); ++s)
    for (std::int64_t k = 0; k < ref.cols; ++k) {
      const double e = std::fabs(got(which[s], k) - ref(std::int64_t(s), k));
      err = (e > err || e != e) ? e : err;
      scale = std::max(scale, std::fabs(ref(std::int64_t(s), k)));
    }
  return scale > 0 ? err / scale : err;
}

/// What a gradient entry sums over: dE_ik over the classes j of row i (one softmax row, whose
/// entries add up to at most 1) or dC_jk over the rows i of class j (entries of different rows).
enum class GradientSum { over_classes, over_rows };

/// The largest error gradient filtering at a threshold eps can add to the mean cross-entropy's
/// gradient of one operand, relative to the sample's largest |ref| (as sampled_relative_error).
/// The filter drops entries p < eps of skipped tiles (never a target), each adding
/// p other_rk / n_rows to a sum over `other`'s rows r: per column k at most
/// eps sum_r |other_rk| / n_rows, and over the classes, where the dropped entries of a row add up
/// to at most 1, at most max_r |other_rk| / n_rows too. Built once per operand (one pass over
/// `other`), asked per threshold.
class FilterBound {
 public:
  FilterBound(const Matrix& other, std::int64_t n_rows, const Matrix& ref, GradientSum sum_of)
      : sum_(std::size_t(other.cols), 0.0), top_(std::size_t(other.cols), 0.0), n_rows_(n_rows), sum_of_(sum_of) {
    for (std::int64_t r = 0; r < other.rows; ++r)
      for (std::int64_t k = 0; k < other.cols; ++k) {
        const double a = std::fabs(other(r, k));
        sum_[std::size_t(k)] += a, top_[std::size_t(k)] = std::max(top_[std::size_t(k)], a);
      }
    for (double x : ref.v) scale_ = std::max(scale_, std::fabs(x));
  }
  /// The bound at threshold eps; 0 without filtering.
  double relative(double eps) const {
    if (!(eps > 0) || n_rows_ < 1) return 0;
    double bound = 0;
    for (std::size_t k = 0; k < sum_.size(); ++k) {
      const double dropped = sum_of_ == GradientSum::over_classes ? std::min(eps * sum_[k], top_[k]) : eps * sum_[k];
      bound = std::max(bound, dropped / double(n_rows_));
    }
    return scale_ > 0 ? bound / scale_ : bound;
  }

 private:
  std::vector<double> sum_, top_;  // per column of `other`: sum and max of |other_rk|
  double scale_ = 0;               // the sample's largest |ref|
  std::int64_t n_rows_;
  GradientSum sum_of_;
};

}  // namespace tlse::perf
