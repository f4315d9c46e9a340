#pragma once
// Shared by every test: fresh random inputs (seed printed on failure), host <-> device copies,
// and the tolerance model.
//
// Tolerances. The kernels accumulate in Acc (float, or double for double inputs) with unit
// roundoff u. For depth K and M = scale * max_i |A_i|_2 * max_j |B_j|_2 (+ max |bias|), every
// logit carries an error below  delta = 4 sqrt(K) u M + 4 u (max|bias| + softcap)  (dot
// products of K terms, Cauchy-Schwarz). Softmax entries then have relative error <= 2 delta, so
//   LSE   : |err| <= delta + 4 (u + u_ref) (|lse| + sqrt(cols))
//   grads : |err_ik| <= (4 delta + 8 (u + u_ref) sqrt(n) + u_out) * mag_ik + u_out * |ref_ik|
// (u_ref = 2^-53: the float64 reference's sums err as much as the kernels' for double inputs;
// without it a double LSE over 160000 classes missed its bound by 0.15%, seed 3361499972)
// where mag is the reference's sum of term magnitudes (scale |G| |B|, see testing/reference.hpp)
// and u_out the unit roundoff of the 16-bit input/output storage (2^-8 bf16, 2^-11 fp16, 0 for
// f32/f64 whose output rounding is within the first term). u_out * |ref| is the rounding of the
// result; u_out * mag that of G = dL/dx to the input type before the gradient product, which the
// CUDA tensor-core backward does (mma.sync multiplies 16-bit operands, as in CCE): a rigorous
// bound, |sum_i e_i G_i B_i| <= u_out sum_i |G_i B_i|; 2 u_out * mag where each term rounds two
// operands (the Hopper training step's dC takes the kept exponentials and the rows times G's
// row factors, both in bf16). With Precision::tf32, u is 2^-10. Results below the smallest normal number of the
// accumulator or output type may underflow to 0: an absolute floor of that size (fp16: 2^-24,
// float/bf16: 2^-126, double: 2^-1022) is added to every gradient tolerance. The factors 4 and 8 cover the random-walk
// growth of rounding errors with margin; they are not tuned to make tests pass.
#include <tlse/testing/reference.hpp>
#include <tlse/tlse.hpp>

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace tlse::test {

using testing::Matrix;

template <class E, class T>
struct Config {
  using Exec = E;
  using Scalar = T;
  using Acc = accumulator_t<T>;
  using Mem = typename Exec::memory_space;
  using MatrixView = Kokkos::View<T**, Kokkos::LayoutRight, Mem>;
  using VectorView = Kokkos::View<T*, Mem>;
  using AccView = Kokkos::View<Acc*, Mem>;
  using IndexView = Kokkos::View<std::int64_t*, Mem>;
  using IntView = Kokkos::View<int*, Mem>;
};

/// A fresh seed per test (TLSE_TEST_SEED replays one), reported on failure by SCOPED_TRACE.
inline unsigned test_seed() {
  if (const char* s = std::getenv("TLSE_TEST_SEED")) return unsigned(std::strtoul(s, nullptr, 10));
  return std::random_device{}();
}
#define TLSE_SEEDED(rng)                                                                    \
  const unsigned tlse_seed_ = ::tlse::test::test_seed();                                  \
  SCOPED_TRACE("seed " + std::to_string(tlse_seed_) + " (replay: TLSE_TEST_SEED=" +        \
               std::to_string(tlse_seed_) + ")");                                          \
  std::mt19937_64 rng(tlse_seed_)

/// Rounds through the storage type, so the reference sees exactly what the kernel reads.
template <class T>
double representable(double v) {
  return double(impl::to_acc<double>(impl::from_acc<T, double>(v)));
}
template <>
inline double representable<double>(double v) {
  return v;
}
template <>
inline double representable<float>(double v) {
  return double(float(v));
}

template <class T>
Matrix random_matrix(std::mt19937_64& rng, std::int64_t rows, std::int64_t cols, double stddev = 1.0,
                     bool normalize_rows = false) {
  std::normal_distribution<double> d(0.0, stddev);
  Matrix m(rows, cols);
  for (std::int64_t i = 0; i < rows; ++i) {
    double norm = 0;
    for (std::int64_t k = 0; k < cols; ++k) norm += (m(i, k) = d(rng)) * m(i, k);
    for (std::int64_t k = 0; k < cols; ++k)
      m(i, k) = representable<T>(normalize_rows && norm > 0 ? m(i, k) / std::sqrt(norm) : m(i, k));
  }
  return m;
}

template <class C>
typename C::MatrixView to_device(const Matrix& m, const char* label = "m") {
  typename C::MatrixView v(std::string(label), m.rows, m.cols);
  auto h = Kokkos::create_mirror_view(v);
  for (std::int64_t i = 0; i < m.rows; ++i)
    for (std::int64_t k = 0; k < m.cols; ++k) h(i, k) = impl::from_acc<typename C::Scalar, double>(m(i, k));
  Kokkos::deep_copy(v, h);
  return v;
}
template <class V>
auto vector_to_device(const std::vector<double>& x, const char* label = "v") {
  V v(std::string(label), x.size());
  auto h = Kokkos::create_mirror_view(v);
  for (std::size_t i = 0; i < x.size(); ++i) h(i) = impl::from_acc<typename V::value_type, double>(x[i]);
  Kokkos::deep_copy(v, h);
  return v;
}
template <class V, class I>
V index_to_device(const std::vector<I>& x, const char* label = "idx") {
  V v(std::string(label), x.size());
  auto h = Kokkos::create_mirror_view(v);
  for (std::size_t i = 0; i < x.size(); ++i) h(i) = typename V::value_type(x[i]);
  Kokkos::deep_copy(v, h);
  return v;
}
template <class V>
std::vector<double> to_host(const V& v) {
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
  std::vector<double> out(h.size());
  for (std::size_t i = 0; i < h.size(); ++i) out[i] = impl::to_acc<double>(h.data()[i]);
  return out;
}

template <class T>
constexpr double output_roundoff() {
  return std::is_same<T, bfloat16>::value ? 0x1p-8 : std::is_same<T, float16>::value ? 0x1p-11 : 0.0;
}
template <class T>
constexpr double underflow_floor() {
  return std::is_same<T, float16>::value ? 0x1p-24 : std::is_same<T, double>::value ? 0x1p-1022 : 0x1p-126;
}
template <class T>
constexpr double acc_roundoff() {
  return std::is_same<T, double>::value ? 0x1p-53 : 0x1p-24;
}

inline double max_row_norm(const Matrix& m) {
  double best = 0;
  for (std::int64_t i = 0; i < m.rows; ++i) {
    double s = 0;
    for (std::int64_t k = 0; k < m.cols; ++k) s += m(i, k) * m(i, k);
    best = std::max(best, std::sqrt(s));
  }
  return best;
}
inline double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::fabs(x));
  return m;
}

/// The error model of the header comment, for one call.
template <class T>
struct Tolerance {
  double u = acc_roundoff<T>(), u_out = output_roundoff<T>(), floor = underflow_floor<T>(), delta = 0;
  /// The float64 reference's own roundoff: its sums carry the same random walk as the kernels',
  /// which matters for double inputs only (u_ref = u there).
  static constexpr double U_REF = 0x1p-53;
  /// u_products: unit roundoff of the tile products when coarser than the accumulator's
  /// (TF32 rounds each operand to 2^-11, a product to about 2^-10).
  Tolerance(const Matrix& A, const Matrix& B, double scale, double extra_logit = 0, double u_products = 0) {
    u = std::max(u, u_products);
    delta = 4 * std::sqrt(double(std::max<std::int64_t>(A.cols, 1))) * u * std::fabs(scale) * max_row_norm(A) *
                max_row_norm(B) +
            4 * u * extra_logit;
  }
  double lse(double ref, std::int64_t cols) const {
    return delta + 4 * (u + U_REF) * (std::fabs(ref) + std::sqrt(double(cols) + 1));
  }
  /// The last u_out * mag: with 16-bit inputs a backend may round G = dL/dx to the input type
  /// before the gradient product (the CUDA tensor-core backward does, as CCE does), which adds
  /// |sum_i e_i G_i X_i| <= u_out sum_i |G_i X_i| = u_out * mag (0 for float and double).
  /// lse_error: a bound on the error of the LSEs the probabilities are normalized by (tol.lse of
  /// the largest). p = exp(x - lse) carries it as a relative error into every one of the n terms,
  /// so into the sum as lse_error * mag. The sqrt(n) term covers it only when the LSE sums about n
  /// terms too; cross-entropy's dC sums N rows of softmaxes over V >> N classes. roundings: of
  /// the 16-bit operands in each term of the product (2: G's two factors rounded apart).
  double grad(double ref, double mag, std::int64_t n, double lse_error = 0, int roundings = 1) const {
    return (4 * delta + 8 * (u + U_REF) * std::sqrt(double(n) + 1) + roundings * u_out + lse_error) * mag +
           u_out * std::fabs(ref) + floor;
  }
};

/// The product roundoff a Tolerance needs for a call's precision option.
inline double tf32_roundoff(tlse::Precision p) { return p == tlse::Precision::tf32 ? 0x1p-10 : 0; }

/// Element-wise comparison that reports the worst offender.
template <class TolFn>
void expect_close(const char* what, const std::vector<double>& got, const std::vector<double>& ref, TolFn tol) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  std::size_t worst = 0;
  double worst_ratio = -1;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double err = std::fabs(got[i] - ref[i]), t = tol(i);
    const double ratio = std::isnan(got[i]) != std::isnan(ref[i]) ? INFINITY : (err == 0 ? 0 : err / t);
    if (ratio > worst_ratio || std::isnan(ratio)) worst_ratio = ratio, worst = i;
  }
  if (ref.empty()) return;
  EXPECT_LE(worst_ratio, 1.0) << what << ": worst element " << worst << " got " << got[worst] << " expected "
                              << ref[worst] << " tolerance " << tol(worst);
}

inline void expect_grad_close(const char* what, const std::vector<double>& got, const Matrix& ref, const Matrix& mag,
                              const std::function<double(double, double)>& tol) {
  expect_close(what, got, ref.v, [&](std::size_t i) { return tol(ref.v[i], mag.v[i]); });
}

}  // namespace tlse::test

/// The four scalar types on one execution space, as typed-test parameters.
#define TLSE_TEST_SCALARS(Exec)                                                                                \
  tlse::test::Config<Exec, float>, tlse::test::Config<Exec, double>, tlse::test::Config<Exec, tlse::bfloat16>, \
      tlse::test::Config<Exec, tlse::float16>

// A device build tests its device, where its kernels run; a host build every host backend its
// Kokkos has. Which spaces exist depends on how Kokkos was configured, so each is named only where
// enabled.
#if defined(KOKKOS_ENABLE_CUDA)
#define TLSE_TEST_CONFIGS ::testing::Types<TLSE_TEST_SCALARS(Kokkos::Cuda)>
#elif defined(KOKKOS_ENABLE_HIP)
// The HIP space is Kokkos::Experimental::HIP in Kokkos 3 and Kokkos::HIP in Kokkos 4; in a HIP
// build it is the default execution space either way.
#define TLSE_TEST_CONFIGS ::testing::Types<TLSE_TEST_SCALARS(Kokkos::DefaultExecutionSpace)>
#elif defined(KOKKOS_ENABLE_OPENMP) && defined(TLSE_TEST_OPENMP_ONLY)
// The sanitizer build (scripts/sanitize.sh) and the distributed test: Serial runs the same generic
// kernels as OpenMP, and leaving it out halves their compile time.
#define TLSE_TEST_CONFIGS ::testing::Types<TLSE_TEST_SCALARS(Kokkos::OpenMP)>
#elif defined(KOKKOS_ENABLE_OPENMP) && defined(KOKKOS_ENABLE_SERIAL)
#define TLSE_TEST_CONFIGS ::testing::Types<TLSE_TEST_SCALARS(Kokkos::Serial), TLSE_TEST_SCALARS(Kokkos::OpenMP)>
#else
#define TLSE_TEST_CONFIGS ::testing::Types<TLSE_TEST_SCALARS(Kokkos::DefaultHostExecutionSpace)>
#endif

/// Names typed-test instances "Serial_f32", "OpenMP_bf16", ...
struct ConfigName {
  template <class C>
  static std::string GetName(int) {
    return std::string(C::Exec::name()) + "_" + tlse::scalar_name<typename C::Scalar>();
  }
};
