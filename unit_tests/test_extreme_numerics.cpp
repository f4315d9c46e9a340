// Extreme values with defined results (docs/errors.md, Extreme values), on every backend and
// dtype: rows whose every logit is masked, masked targets, logits of +-2^100 (about 1.3e30) with
// and without a softcap, a logit scale of 1e4, targets on the last class of a partial tile, and
// one class or one sample. Where the result is exact in every dtype, it is checked exactly.
#include "test_support.hpp"

namespace {
using namespace tlse::test;

/// One cross-entropy forward and backward (Reduction::none, dloss = 1, exact gradients) on
/// given data; the results as float64.
struct CrossEntropyRun {
  std::vector<double> loss, lse, dE, dC, dbias;
};

template <class C>
CrossEntropyRun run_cross_entropy(const Matrix& E, const Matrix& W, const std::vector<double>& bias,
                                  const std::vector<std::int64_t>& targets, tlse::CrossEntropyOptions o) {
  o.reduction = tlse::Reduction::none;
  o.filter_eps = 0;
  const std::int64_t N = E.rows, V = W.rows, D = E.cols;
  auto Ed = to_device<C>(E, "E"), Cd = to_device<C>(W, "C");
  auto bd = vector_to_device<typename C::VectorView>(bias, "bias");
  auto td = index_to_device<typename C::IndexView>(targets);
  typename C::AccView loss("loss", N), lse("lse", N);
  typename C::Exec exec;
  tlse::cross_entropy(exec, Ed, Cd, bd, td, loss, lse, typename C::IntView(), o);
  typename C::MatrixView dE("dE", N, D), dC("dC", V, D);
  typename C::VectorView dbias("dbias", bias.empty() ? 0 : V);
  tlse::cross_entropy_backward(exec, Ed, Cd, bd, td, lse, typename C::IntView(),
                               vector_to_device<typename C::AccView>(std::vector<double>(N, 1.0)), dE, dC, dbias, o);
  return {to_host(loss), to_host(lse), to_host(dE), to_host(dC), to_host(dbias)};
}

/// Expects `got` to equal `want` up to `rel` of each value (0: exactly); NaN must meet NaN.
void expect_values(const char* what, const std::vector<double>& got, const std::vector<double>& want, double rel = 0) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t i = 0; i < want.size(); ++i) {
    if (std::isnan(want[i])) {
      EXPECT_TRUE(std::isnan(got[i])) << what << "[" << i << "] = " << got[i] << ", expected NaN";
    } else if (std::isinf(want[i])) {
      EXPECT_EQ(got[i], want[i]) << what << "[" << i << "]";
    } else {
      EXPECT_LE(std::fabs(got[i] - want[i]), rel * std::fabs(want[i]))
          << what << "[" << i << "] = " << got[i] << ", expected " << want[i];
    }
  }
}

Matrix matrix(std::int64_t rows, std::int64_t cols, std::initializer_list<double> values) {
  Matrix m(rows, cols);
  std::copy(values.begin(), values.end(), m.v.begin());
  return m;
}

template <class C>
struct ExtremeNumerics : ::testing::Test {
  using T = typename C::Scalar;
  /// Roundoff of results written in T or accumulated: exact where both are exact.
  static double rel() { return 4 * std::max(output_roundoff<T>(), acc_roundoff<T>()); }
};
TYPED_TEST_SUITE(ExtremeNumerics, TLSE_TEST_CONFIGS, ConfigName);

TYPED_TEST(ExtremeNumerics, EveryLogitMaskedGivesNaNLossAndZeroGradients) {
  // A -inf bias on every class: no class is possible. lse = -inf, the row's loss is NaN (0/0, as
  // in PyTorch), no logit gets a gradient. An ignored row stays 0. A softcap keeps the mask.
  const double inf = INFINITY;  // NAN below as the macro: nvcc 11.8 took a `nan` variable for unused
  const Matrix E = matrix(3, 2, {0.5, -1, 2, 0.25, 1, 1}), W = matrix(4, 2, {1, 0, 0, 1, -1, 0.5, 0.75, -2});
  for (double softcap : {0.0, 5.0}) {
    SCOPED_TRACE("softcap " + std::to_string(softcap));
    tlse::CrossEntropyOptions o;
    o.softcap = softcap;
    const auto r = run_cross_entropy<TypeParam>(E, W, {-inf, -inf, -inf, -inf}, {0, 3, -100}, o);
    expect_values("lse", r.lse, {-inf, -inf, 0});
    expect_values("loss", r.loss, {NAN, NAN, 0});
    expect_values("dE", r.dE, std::vector<double>(6, 0.0));
    expect_values("dC", r.dC, std::vector<double>(8, 0.0));
    expect_values("dbias", r.dbias, std::vector<double>(4, 0.0));
  }
}

TYPED_TEST(ExtremeNumerics, AMaskedTargetGivesAnInfiniteLoss) {
  // Row 0's target (class 1) is masked: its loss is +inf and the masked logit gets no gradient,
  // so dE_0 = sum_j p_0j C_j without PyTorch's -C_1. Row 1 is an ordinary row. With a softcap too.
  const double inf = INFINITY;
  const Matrix E = matrix(2, 2, {0.5, -1, 2, 0.25}), W = matrix(3, 2, {1, 0, 0, 1, -1, 0.5});
  const std::vector<double> bias = {0, -inf, 0.5};
  for (double softcap : {0.0, 3.0}) {
    SCOPED_TRACE("softcap " + std::to_string(softcap));
    tlse::CrossEntropyOptions o;
    o.softcap = softcap;
    const auto r = run_cross_entropy<TypeParam>(E, W, bias, {1, 2}, o);
    // The expectation in float64: softmax over the unmasked classes 0 and 2.
    std::vector<double> loss(2), lse(2), dE(4, 0.0), dC(6, 0.0), dbias(3, 0.0);
    for (int i = 0; i < 2; ++i) {
      double x[3], cap[3];
      for (int j = 0; j < 3; ++j) {
        const double z = E(i, 0) * W(j, 0) + E(i, 1) * W(j, 1) + bias[j];
        x[j] = softcap > 0 && std::isfinite(z) ? softcap * std::tanh(z / softcap) : z;
        cap[j] = softcap > 0 ? 1 - (x[j] / softcap) * (x[j] / softcap) : 1;
      }
      lse[i] = std::max(x[0], x[2]) +
               std::log(std::exp(x[0] - std::max(x[0], x[2])) + std::exp(x[2] - std::max(x[0], x[2])));
      const int t = i == 0 ? 1 : 2;
      loss[i] = lse[i] - x[t];
      for (int j : {0, 2}) {
        const double g = (std::exp(x[j] - lse[i]) - (j == t ? 1 : 0)) * cap[j];
        for (int k = 0; k < 2; ++k) dE[i * 2 + k] += g * W(j, k), dC[j * 2 + k] += g * E(i, k);
        dbias[j] += g;
      }
    }
    EXPECT_EQ(r.loss[0], inf);
    // Values and gradients below 4 in magnitude: a few roundings of the output and accumulator types.
    const double tol = 32 * (output_roundoff<typename TestFixture::T>() + acc_roundoff<typename TestFixture::T>());
    for (std::size_t k = 0; k < 4; ++k) EXPECT_NEAR(r.dE[k], dE[k], tol) << "dE " << k;
    for (std::size_t k = 0; k < 6; ++k) EXPECT_NEAR(r.dC[k], dC[k], tol) << "dC " << k;
    for (std::size_t k = 0; k < 3; ++k) EXPECT_NEAR(r.dbias[k], dbias[k], tol) << "dbias " << k;
    EXPECT_NEAR(r.lse[0], lse[0], tol);
    EXPECT_NEAR(r.loss[1], loss[1], tol);
  }
}

TYPED_TEST(ExtremeNumerics, LogitsOf1e30AreExact) {
  // E, C = +-2^50 give logits +-2^100 (~1.3e30; fp16 holds no 2^50). Without a softcap the softmax
  // is one-hot: lse = the max logit, loss = max - target logit, gradients are differences of rows.
  using T = typename TestFixture::T;
  if (std::is_same<T, tlse::float16>::value) GTEST_SKIP() << "fp16 holds at most 65504";
  const double h = std::ldexp(1.0, 50), x = std::ldexp(1.0, 100);
  const Matrix E = matrix(2, 1, {h, -h}), W = matrix(3, 1, {h, -h, 0});
  const auto r = run_cross_entropy<TypeParam>(E, W, {}, {1, 1}, {});
  expect_values("lse", r.lse, {x, x}, TestFixture::rel());
  expect_values("loss", r.loss, {2 * x, 0}, TestFixture::rel());
  expect_values("dE", r.dE, {2 * h, 0}, TestFixture::rel());
  expect_values("dC", r.dC, {h, -h, 0}, TestFixture::rel());
}

TYPED_TEST(ExtremeNumerics, LogitsOf1e30WithASoftcapSaturate) {
  // With softcap 30 the logits +-2^100 become +-30 exactly; tanh is flat there, so those logits
  // pass no gradient, and the one finite logit (class 2, 0) passes p_i2 C_2 = 0: every gradient is 0.
  using T = typename TestFixture::T;
  if (std::is_same<T, tlse::float16>::value) GTEST_SKIP() << "fp16 holds at most 65504";
  const double h = std::ldexp(1.0, 50);
  const Matrix E = matrix(2, 1, {h, -h}), W = matrix(3, 1, {h, -h, 0});
  tlse::CrossEntropyOptions o;
  o.softcap = 30;
  const auto r = run_cross_entropy<TypeParam>(E, W, {}, {1, 1}, o);
  const double lse = 30 + std::log1p(std::exp(-60.0) + std::exp(-30.0));
  const double u = acc_roundoff<T>();
  expect_values("lse", r.lse, {lse, lse}, 4 * u);
  EXPECT_NEAR(r.loss[0], lse + 30, 4 * u * 60);
  EXPECT_NEAR(r.loss[1], lse - 30, 4 * u * 30);
  expect_values("dE", r.dE, {0, 0});
  expect_values("dC", r.dC, {0, 0, 0});
}

TYPED_TEST(ExtremeNumerics, ScaleOf1e4) {
  // Unit features e_i with scale 1e4: x_ii = 1e4, x_ij = 0 elsewhere; e^-1e4 is 0 in float64 too.
  // Diagonal positives: loss 0 and zero gradients exactly. Positives i -> i+1 (mod 3): loss 1e4,
  // dI_i = scale (g e_i - g/2 e_pos(i) - g/2 e_pos^-1(i)) with g = 2 * 0.5 / b, dscale = 1.
  using C = TypeParam;
  const Matrix Id = matrix(3, 3, {1, 0, 0, 0, 1, 0, 0, 0, 1});
  tlse::ContrastiveOptions o;
  o.scale = 1e4;
  for (bool cyclic : {false, true}) {
    SCOPED_TRACE(cyclic ? "positives i -> i+1" : "diagonal positives");
    auto I = to_device<C>(Id, "I"), Tx = to_device<C>(Id, "T");
    auto labels = index_to_device<typename C::IndexView>(cyclic ? std::vector<std::int64_t>{1, 2, 0}
                                                                : std::vector<std::int64_t>{});
    typename C::AccView loss("loss", 1), rl("rl", 3), cl("cl", 3), dscale("dscale", 1);
    typename C::MatrixView dI("dI", 3, 3), dT("dT", 3, 3);
    typename C::Exec exec;
    tlse::contrastive_loss(exec, I, Tx, labels, loss, rl, cl, o);
    tlse::contrastive_loss_backward(exec, I, Tx, labels, rl, cl, vector_to_device<typename C::AccView>({1.0}), dI, dT,
                                    dscale, o);
    const double rel = TestFixture::rel();
    expect_values("row_lse", to_host(rl), {1e4, 1e4, 1e4}, rel);
    expect_values("loss", to_host(loss), {cyclic ? 1e4 : 0.0}, rel);
    std::vector<double> want(9, 0.0);
    if (cyclic)  // row i: +scale/3 at i, -scale/6 at i+1 (its positive) and i-1 (the text whose positive it is)
      for (int i = 0; i < 3; ++i)
        want[i * 3 + i] = 1e4 / 3, want[i * 3 + (i + 1) % 3] = -1e4 / 6, want[i * 3 + (i + 2) % 3] = -1e4 / 6;
    expect_values("dI", to_host(dI), want, rel);
    expect_values("dT", to_host(dT), want, rel);
    expect_values("dscale", to_host(dscale), {cyclic ? 1.0 : 0.0}, rel);
  }
}

TYPED_TEST(ExtremeNumerics, TargetsOnTheLastClassOfAPartialTile) {
  // Every target is class V-1, for V at and around the tile edges (32 on the host, 128 on CUDA).
  using T = typename TestFixture::T;
  TLSE_SEEDED(rng);
  for (std::int64_t V : {1, 31, 33, 127, 129}) {
    SCOPED_TRACE("V=" + std::to_string(V));
    const std::int64_t N = 37, D = 8;
    const Matrix E = random_matrix<T>(rng, N, D), W = random_matrix<T>(rng, V, D, 2.0 / std::sqrt(double(D)));
    const std::vector<std::int64_t> targets(N, V - 1);
    tlse::CrossEntropyOptions o;
    o.reduction = tlse::Reduction::none;
    const auto r = run_cross_entropy<TypeParam>(E, W, {}, targets, o);
    const auto ref = tlse::testing::cross_entropy_reference(E, W, {}, targets, o, std::vector<double>(N, 1.0));
    Tolerance<T> tol(E, W, 1.0);
    expect_close("lse", r.lse, ref.lse, [&](std::size_t i) { return tol.lse(ref.lse[i], V); });
    expect_close("loss", r.loss, ref.row_loss, [&](std::size_t i) { return 2 * tol.lse(ref.lse[i], V); });
    const double lse_error = tol.lse(max_abs(ref.lse), V);
    expect_grad_close("dE", r.dE, ref.dE, ref.dA_mag, [&](double x, double m) { return tol.grad(x, m, V, lse_error); });
    expect_grad_close("dC", r.dC, ref.dC, ref.dB_mag, [&](double x, double m) { return tol.grad(x, m, N, lse_error); });
  }
}

TYPED_TEST(ExtremeNumerics, OneClassOrOneSampleGivesZeroExactly) {
  // V = 1: lse is the only logit, the loss 0 and every gradient 0, exactly (also with a bias and a
  // softcap). b = 1 in the contrastive loss: the same (the losses within a rounding on a GPU).
  using C = TypeParam;
  using T = typename TestFixture::T;
  TLSE_SEEDED(rng);
  const Matrix E = random_matrix<T>(rng, 5, 3), W = random_matrix<T>(rng, 1, 3);
  tlse::CrossEntropyOptions o;
  o.softcap = 4;
  const auto r = run_cross_entropy<C>(E, W, {0.5}, {0, 0, -100, 0, 0}, o);
  // On a GPU the target's logit comes from its own small kernel, which sums over the depth in
  // another order than the tiles (a team reduction): the two logits may differ in the last bits of
  // the accumulator, and the loss shows it (the gradients come from the tiles alone and stay
  // exactly 0). Each order rounds at most 4 times (2 additions, the scale, the bias), by at most
  // eps / 2 of the bound each, and the softcap's tanh once more by at most eps / 2 of the softcap
  // in each: the loss is within 4 eps (bound + softcap). The host backends sum in one order:
  // exactly 0.
  using Acc = typename C::Acc;
  const bool host = tlse::impl::is_host_space<typename C::Exec>();
  for (std::int64_t i = 0; i < 5; ++i) {
    double bound = 0.5 + o.softcap;
    for (int d = 0; d < 3; ++d) bound += std::fabs(E(i, d) * W(0, d));
    const double slack = host ? 0.0 : 4 * std::numeric_limits<Acc>::epsilon() * bound;
    EXPECT_LE(std::fabs(r.loss[std::size_t(i)]), slack) << "cross-entropy loss of row " << i << " (one class)";
  }
  expect_values("dE", r.dE, std::vector<double>(15, 0.0));
  expect_values("dC", r.dC, std::vector<double>(3, 0.0));
  expect_values("dbias", r.dbias, {0.0});

  const Matrix Ih = random_matrix<T>(rng, 1, 4), Th = random_matrix<T>(rng, 1, 4);
  auto I = to_device<C>(Ih, "I"), Tx = to_device<C>(Th, "T");
  typename C::AccView loss("loss", 1), rl("rl", 1), cl("cl", 1), dscale("dscale", 1);
  typename C::MatrixView dI("dI", 1, 4), dT("dT", 1, 4);
  typename C::Exec exec;
  tlse::ContrastiveOptions co;
  co.scale = 14.3;
  tlse::contrastive_loss(exec, I, Tx, typename C::IntView(), loss, rl, cl, co);
  tlse::contrastive_loss_backward(exec, I, Tx, typename C::IntView(), rl, cl,
                                  vector_to_device<typename C::AccView>({1.0}), dI, dT, dscale, co);
  // The positive pair's logit likewise (3 additions, the scale): within 4 eps * bound on a GPU.
  double logit_bound = 0;
  for (int d = 0; d < 4; ++d) logit_bound += co.scale * std::fabs(Ih.v[d] * Th.v[d]);
  const double slack = host ? 0.0 : 4 * std::numeric_limits<Acc>::epsilon() * logit_bound;
  EXPECT_LE(std::fabs(to_host(loss)[0]), slack) << "contrastive loss of one sample";
  expect_values("dI", to_host(dI), std::vector<double>(4, 0.0));
  expect_values("dT", to_host(dT), std::vector<double>(4, 0.0));
  expect_values("dscale", to_host(dscale), {0.0});
}

}  // namespace
