#pragma once
/// \file random_inputs.hpp
/// The seeded random problems the `tlse` tool and the benchmarks run on, generated as float64
/// host matrices (what the reference reads) and uploaded to device views of the run's dtype.
#include <tlse/testing/reference.hpp>

#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

namespace tlse::perf {

using Mem = Kokkos::DefaultExecutionSpace::memory_space;
template <class T>
using DeviceMatrix = Kokkos::View<T**, Kokkos::LayoutRight, Mem>;
using testing::Matrix;

/// Reproducible samples: mt19937_64 is fully specified by the standard, and Box-Muller is
/// written out because std::normal_distribution differs between standard libraries.
class Random {
 public:
  explicit Random(std::uint64_t seed) : bits_(seed) {}
  double uniform() { return double(bits_() >> 11) * 0x1p-53; }  // [0, 1)
  double normal() {
    const double r = std::sqrt(-2 * std::log(1 - uniform()));  // 1 - u is in (0, 1]
    return r * std::cos(6.283185307179586 * uniform());  // 2 pi
  }
  std::int64_t below(std::int64_t n) { return std::int64_t(bits_() % std::uint64_t(n)); }

 private:
  std::mt19937_64 bits_;
};

/// rows x cols samples of N(0, sigma^2).
inline Matrix normal_matrix(Random& rng, std::int64_t rows, std::int64_t cols, double sigma) {
  Matrix m(rows, cols);
  for (double& v : m.v) v = sigma * rng.normal();
  return m;
}

/// Rows scaled to unit L2 norm.
inline Matrix normalized_rows(Matrix m) {
  for (std::int64_t i = 0; i < m.rows; ++i) {
    double s = 0;
    for (std::int64_t k = 0; k < m.cols; ++k) s += m(i, k) * m(i, k);
    const double inv = s > 0 ? 1 / std::sqrt(s) : 0;
    for (std::int64_t k = 0; k < m.cols; ++k) m(i, k) *= inv;
  }
  return m;
}

/// CLIP: b image and b text features of c dimensions, L2-normalized as CLIP normalizes its
/// embeddings (pair i is the positive of row and column i).
struct ContrastiveProblem {
  Matrix I, T;
};
inline ContrastiveProblem contrastive_problem(std::uint64_t seed, std::int64_t b, std::int64_t c) {
  Random rng(seed);
  ContrastiveProblem p;
  p.I = normalized_rows(normal_matrix(rng, b, c, 1));
  p.T = normalized_rows(normal_matrix(rng, b, c, 1));
  return p;
}

/// Language-model head: E ~ N(0, 1) (N x D), C ~ N(0, 1) * 4 / sqrt(D) (V x D), so logits have
/// standard deviation ~4 and the softmax is about as peaked as a trained model's; targets uniform.
struct CrossEntropyProblem {
  Matrix E, C;
  std::vector<std::int64_t> targets;
  std::vector<double> bias;  ///< (V) added to every logit of class j, or empty: none (add_random_bias)
};
inline CrossEntropyProblem cross_entropy_problem(std::uint64_t seed, std::int64_t N, std::int64_t D,
                                                 std::int64_t V) {
  Random rng(seed);
  CrossEntropyProblem p;
  p.E = normal_matrix(rng, N, D, 1);
  p.C = normal_matrix(rng, V, D, 4 / std::sqrt(double(D)));
  p.targets.resize(std::size_t(N));
  for (auto& t : p.targets) t = rng.below(V);
  return p;
}

/// Gives `p` a per-class bias b_j ~ N(0, 1), from a stream of its own so that E, C and the targets
/// stay those of the same seed without a bias.
inline void add_random_bias(CrossEntropyProblem& p, std::uint64_t seed) {
  Random rng(seed ^ 0x9e3779b97f4a7c15ull);
  p.bias.resize(std::size_t(p.C.rows));
  for (double& b : p.bias) b = rng.normal();
}

/// Sets the targets of a share `fraction` (in [0, 1]) of the rows to `ignore_index`, spread evenly
/// (row i when floor((i + 1) fraction) > floor(i fraction)): the rows a padded or prompt-masked
/// batch does not score. E, C and the other targets stay those of the seed.
inline void ignore_rows(CrossEntropyProblem& p, double fraction, std::int64_t ignore_index) {
  for (std::size_t i = 0; i < p.targets.size(); ++i)
    if (std::floor(double(i + 1) * fraction) > std::floor(double(i) * fraction)) p.targets[i] = ignore_index;
}

/// Rounds a float64 value to the run's dtype T, and back.
template <class T>
T to_dtype(double v) {
  if constexpr (std::is_same<T, double>::value)
    return v;
  else
    return T(static_cast<float>(v));
}
template <class T>
double to_double(const T& v) {
  if constexpr (std::is_same<T, double>::value)
    return v;
  else
    return static_cast<float>(v);
}

/// Stores `value` rounded to T in `slot`, and puts back in `value` what `slot` holds: uploads round
/// the host values in place, so that the reference sees exactly the inputs the kernels see.
template <class T>
void store_rounded(T& slot, double& value) {
  slot = to_dtype<T>(value);
  value = to_double(slot);
}

/// Copies `values` to a new device view of T, and rounds `values` in place (store_rounded).
template <class T>
DeviceMatrix<T> upload(const std::string& label, Matrix& values) {
  DeviceMatrix<T> d(label, values.rows, values.cols);
  auto h = Kokkos::create_mirror_view(d);
  for (std::int64_t i = 0; i < values.rows; ++i)
    for (std::int64_t k = 0; k < values.cols; ++k) store_rounded(h(i, k), values(i, k));
  Kokkos::deep_copy(d, h);
  return d;
}

/// upload() for a vector.
template <class T>
Kokkos::View<T*, Mem> upload_vector(const std::string& label, std::vector<double>& values) {
  Kokkos::View<T*, Mem> d(label, values.size());
  auto h = Kokkos::create_mirror_view(d);
  for (std::size_t j = 0; j < values.size(); ++j) store_rounded(h(j), values[j]);
  Kokkos::deep_copy(d, h);
  return d;
}

inline Kokkos::View<int*, Mem> upload_targets(const std::vector<std::int64_t>& targets) {
  Kokkos::View<int*, Mem> d("targets", targets.size());
  auto h = Kokkos::create_mirror_view(d);
  for (std::size_t i = 0; i < targets.size(); ++i) h(i) = int(targets[i]);
  Kokkos::deep_copy(d, h);
  return d;
}

template <class T>
Matrix download(const DeviceMatrix<T>& d) {
  const auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), d);
  Matrix m(std::int64_t(d.extent(0)), std::int64_t(d.extent(1)));
  for (std::int64_t i = 0; i < m.rows; ++i)
    for (std::int64_t k = 0; k < m.cols; ++k) m(i, k) = to_double(h(i, k));
  return m;
}

}  // namespace tlse::perf
