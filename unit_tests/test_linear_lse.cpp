// The primitive: linear LSE forward and backward against the float64 reference.
#include "test_support.hpp"

namespace {
using namespace tlse::test;

template <class C>
struct LinearLse : ::testing::Test {
  using T = typename C::Scalar;
  using Acc = typename C::Acc;

  static void check(std::mt19937_64& rng, std::int64_t rows, std::int64_t cols, std::int64_t depth,
                    tlse::LinearLseOptions o, bool bias = false, double stddev = 1.0) {
    const Matrix A = random_matrix<T>(rng, rows, depth, stddev), B = random_matrix<T>(rng, cols, depth);
    std::vector<double> b, dlse(rows);
    std::normal_distribution<double> d(0, 1);
    if (bias)
      for (std::int64_t j = 0; j < cols; ++j) b.push_back(representable<T>(d(rng)));
    for (auto& v : dlse) v = representable<Acc>(d(rng));
    const auto ref = tlse::testing::linear_lse_reference(A, B, b, o, dlse);

    auto Ad = to_device<C>(A, "A"), Bd = to_device<C>(B, "B");
    auto bias_d = vector_to_device<typename C::VectorView>(b, "bias");
    typename C::AccView lse("lse", rows);
    typename C::Exec exec;
    tlse::linear_lse(exec, Ad, Bd, bias_d, lse, o);
    // With accumulate, the gradients start from the reference's (rounded to T), so that what the
    // call adds is checked at the gradients' own magnitude.
    Matrix start_A = ref.dA, start_B = ref.dB;
    for (double& v : start_A.v) v = o.accumulate ? representable<T>(v) : 0.0;
    for (double& v : start_B.v) v = o.accumulate ? representable<T>(v) : 0.0;
    auto dA = to_device<C>(start_A, "dA"), dB = to_device<C>(start_B, "dB");
    tlse::linear_lse_backward(exec, Ad, Bd, bias_d, lse, vector_to_device<typename C::AccView>(dlse), dA, dB, o);

    Tolerance<T> tol(A, B, o.scale, bias ? 4.0 : 0.0);
    const auto got = to_host(lse);
    for (std::int64_t i = 0; i < rows; ++i) {
      if (std::isinf(ref.lse[i])) {
        EXPECT_EQ(got[i], ref.lse[i]) << "fully masked row " << i;
      } else {
        EXPECT_NEAR(got[i], ref.lse[i], tol.lse(ref.lse[i], cols)) << "row " << i;
      }
    }
    auto g = [&](std::int64_t n) { return [&tol, n](double r, double m) { return tol.grad(r, m, n); }; };
    const auto added = [](std::vector<double> got, const Matrix& start) {
      for (std::size_t i = 0; i < got.size(); ++i) got[i] -= start.v[i];
      return got;
    };
    expect_grad_close("dA", added(to_host(dA), start_A), ref.dA, ref.dA_mag, g(cols));
    expect_grad_close("dB", added(to_host(dB), start_B), ref.dB, ref.dB_mag, g(rows));
  }
};
TYPED_TEST_SUITE(LinearLse, TLSE_TEST_CONFIGS, ConfigName);

TYPED_TEST(LinearLse, PrimeShapes) {
  TLSE_SEEDED(rng);
  tlse::LinearLseOptions o;
  o.scale = 0.37;
  this->check(rng, 73, 89, 41, o);
  this->check(rng, 1, 1, 1, o);
  this->check(rng, 2, 97, 2048, o);
}

TYPED_TEST(LinearLse, SeveralTensorCoreTiles) {
  TLSE_SEEDED(rng);
  tlse::LinearLseOptions o;
  o.scale = 0.6;
  this->check(rng, 300, 700, 64, o);
  o.exclude_diagonal = true;
  o.valid_cols = 650;
  this->check(rng, 257, 700, 16, o, true);
}

TYPED_TEST(LinearLse, ExactFloatTileKernelShapes) {
  // Exact float on CUDA runs the tile kernels with 3xTF32 (or, TLSE_CUDA_EXACT_F32=ffma, FFMA)
  // products (docs/gpu.md): several tiles with bias, an excluded diagonal and masked columns at depth 4,
  // and logits up to ~1e4.
  if (!std::is_same<typename TestFixture::T, float>::value) GTEST_SKIP() << "exact float32";
  TLSE_SEEDED(rng);
  tlse::LinearLseOptions o;
  o.scale = 0.6;
  this->check(rng, 300, 700, 64, o, true);
  o.exclude_diagonal = true;
  o.diagonal_offset = 3;
  o.valid_cols = 650;
  this->check(rng, 257, 700, 4, o, true);
  tlse::LinearLseOptions extreme;
  extreme.scale = 2e3;
  this->check(rng, 130, 131, 4, extreme);
}

TYPED_TEST(LinearLse, ExactFloatBackwardInChunksOfRows) {
  // Exact float on CUDA runs the whole backward as one pass owning the rows when its buffers fit
  // the budget (mma/backward.hpp, run_fused): under 3 MiB, chunks of 128 of these 1000 rows, each
  // adding its G^T A_chunk into dB (the last chunk partial), into gradients that already hold
  // values (accumulate) and with masked columns; with a bias, whose dbias only the two passes
  // sum. At the default budget, one chunk.
  if (!std::is_same<typename TestFixture::T, float>::value) GTEST_SKIP() << "exact float32";
  TLSE_SEEDED(rng);
  tlse::LinearLseOptions o;
  o.scale = 0.6;
  o.accumulate = true;
  this->check(rng, 1000, 1000, 72, o);
  o.memory_budget = std::size_t(3) << 20;
  this->check(rng, 1000, 1000, 72, o);
  o.accumulate = false;
  o.valid_cols = 990;
  this->check(rng, 1000, 1000, 72, o);
  this->check(rng, 1000, 1000, 72, o, true);
}

TYPED_TEST(LinearLse, BiasDiagonalAndValidColumns) {
  TLSE_SEEDED(rng);
  tlse::LinearLseOptions o;
  o.exclude_diagonal = true;
  o.diagonal_offset = 3;
  o.valid_cols = 50;
  this->check(rng, 45, 64, 12, o, true);
}

TYPED_TEST(LinearLse, NoValidColumnGivesMinusInfinity) {
  TLSE_SEEDED(rng);
  tlse::LinearLseOptions o;
  o.valid_cols = 0;
  this->check(rng, 5, 9, 3, o);
}

TYPED_TEST(LinearLse, ExtremeLogits) {
  TLSE_SEEDED(rng);
  tlse::LinearLseOptions o;
  o.scale = 2e3;  // |x| up to ~1e4 at depth 4
  this->check(rng, 30, 31, 4, o);
}

TYPED_TEST(LinearLse, AccumulateAddsToExistingGradients) {
  using C = TypeParam;
  using T = typename C::Scalar;
  if (!std::is_same<T, double>::value) GTEST_SKIP() << "checked exactly in double";
  TLSE_SEEDED(rng);
  const Matrix A = random_matrix<T>(rng, 20, 6), B = random_matrix<T>(rng, 33, 6);
  std::vector<double> dlse(20, 1.0);
  tlse::LinearLseOptions o;
  const auto ref = tlse::testing::linear_lse_reference(A, B, {}, o, dlse);
  auto Ad = to_device<C>(A), Bd = to_device<C>(B);
  typename C::AccView lse("lse", 20);
  typename C::Exec exec;
  tlse::linear_lse(exec, Ad, Bd, lse, o);
  auto dA = to_device<C>(A), dB = to_device<C>(B);
  o.accumulate = true;
  typename C::VectorView nobias;
  tlse::linear_lse_backward(exec, Ad, Bd, nobias, lse, vector_to_device<typename C::AccView>(dlse), dA, dB, o);
  const auto ga = to_host(dA), gb = to_host(dB);
  for (std::size_t i = 0; i < ga.size(); ++i) EXPECT_NEAR(ga[i], A.v[i] + ref.dA.v[i], 1e-12);
  for (std::size_t i = 0; i < gb.size(); ++i) EXPECT_NEAR(gb[i], B.v[i] + ref.dB.v[i], 1e-12);
}

TYPED_TEST(LinearLse, NanInputsPropagate) {
  using C = TypeParam;
  TLSE_SEEDED(rng);
  Matrix A = random_matrix<typename C::Scalar>(rng, 4, 3), B = random_matrix<typename C::Scalar>(rng, 40, 3);
  B(37, 1) = NAN;
  typename C::AccView lse("lse", 4);
  tlse::linear_lse(typename C::Exec(), to_device<C>(A), to_device<C>(B), lse);
  for (double v : to_host(lse)) EXPECT_TRUE(std::isnan(v));
}

}  // namespace
