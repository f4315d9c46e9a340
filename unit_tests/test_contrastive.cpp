// Contrastive loss (paired and self-similarity forms) against the float64 reference.
#include "test_support.hpp"

namespace {
using namespace tlse::test;

template <class C>
struct Contrastive : ::testing::Test {
  using T = typename C::Scalar;
  using Acc = typename C::Acc;

  /// Paired form: forward + backward vs the reference. Features have row norm `norm`.
  static void check(std::mt19937_64& rng, std::int64_t b, std::int64_t c, tlse::ContrastiveOptions o,
                    bool custom_labels = false, double norm = 1.0) {
    Matrix I = random_matrix<T>(rng, b, c, 1.0, true), Tm = random_matrix<T>(rng, b, c, 1.0, true);
    for (auto* m : {&I, &Tm})
      for (double& v : m->v) v = representable<T>(v * norm);
    std::vector<std::int64_t> labels;
    if (custom_labels)
      for (std::int64_t i = 0; i < b; ++i) labels.push_back(std::int64_t(rng() % b));  // not a permutation
    const double dloss = representable<Acc>(0.75);
    const auto ref = tlse::testing::contrastive_reference(I, Tm, labels, o, dloss);

    auto Id = to_device<C>(I, "I"), Td = to_device<C>(Tm, "T");
    auto lab = index_to_device<typename C::IntView>(labels);
    typename C::AccView loss("loss", 1), row_lse("row_lse", b), col_lse("col_lse", b), dscale("dscale", 1);
    typename C::Exec exec;
    tlse::contrastive_loss(exec, Id, Td, lab, loss, row_lse, col_lse, o);
    typename C::MatrixView dI("dI", b, c), dT("dT", b, c);
    auto dl = vector_to_device<typename C::AccView>({dloss});
    tlse::contrastive_loss_backward(exec, Id, Td, lab, row_lse, col_lse, dl, dI, dT, dscale, o);

    Tolerance<T> tol(I, Tm, o.scale, 0, tf32_roundoff(o.precision));
    const double lse_tol = tol.lse(std::max(max_abs(ref.row_lse), max_abs(ref.col_lse)), b);
    if (o.direction != tlse::Direction::text_to_image)
      expect_close("row_lse", to_host(row_lse), ref.row_lse, [&](std::size_t) { return lse_tol; });
    if (o.direction != tlse::Direction::image_to_text)
      expect_close("col_lse", to_host(col_lse), ref.col_lse, [&](std::size_t) { return lse_tol; });
    expect_close("loss", to_host(loss), {ref.loss},
                 [&](std::size_t) { return 2 * lse_tol + 4 * tol.u * std::fabs(ref.loss); });
    auto g = [&](double r, double m) { return tol.grad(r, m, b); };
    expect_grad_close("dI", to_host(dI), ref.dI, ref.dA_mag, g);
    expect_grad_close("dT", to_host(dT), ref.dT, ref.dB_mag, g);
    expect_close("dscale", to_host(dscale), {ref.dscale}, [&](std::size_t) {
      return (4 * tol.delta + 8 * tol.u * b) * ref.dscale_mag + tol.delta / std::max(o.scale, 1e-30) * ref.G_abs_sum;
    });
  }

  static void check_self(std::mt19937_64& rng, std::int64_t n, std::int64_t c, tlse::ContrastiveOptions o) {
    Matrix Z = random_matrix<T>(rng, n, c, 1.0, true);
    const double dloss = 1.25;
    const auto ref = tlse::testing::self_contrastive_reference(Z, o, dloss);
    auto Zd = to_device<C>(Z, "Z");
    typename C::AccView loss("loss", 1), lse("lse", n), dscale("dscale", 1);
    typename C::Exec exec;
    tlse::self_contrastive_loss(exec, Zd, loss, lse, o);
    typename C::MatrixView dZ("dZ", n, c);
    tlse::self_contrastive_loss_backward(exec, Zd, lse, vector_to_device<typename C::AccView>({dloss}), dZ, dscale, o);
    Tolerance<T> tol(Z, Z, o.scale, 0, tf32_roundoff(o.precision));
    const double lse_tol = tol.lse(max_abs(ref.row_lse), n);
    expect_close("lse", to_host(lse), ref.row_lse, [&](std::size_t) { return lse_tol; });
    expect_close("loss", to_host(loss), {ref.loss},
                 [&](std::size_t) { return 2 * lse_tol + 4 * tol.u * std::fabs(ref.loss); });
    // dZ sums two products (G Z + G^T Z), each rounded to the output type in bf16/fp16.
    expect_grad_close("dZ", to_host(dZ), ref.dI, ref.dA_mag,
                      [&](double r, double m) { return 2 * tol.grad(r, m, n) + tol.u_out * m; });
    expect_close("dscale", to_host(dscale), {ref.dscale}, [&](std::size_t) {
      return (4 * tol.delta + 8 * tol.u * n) * ref.dscale_mag + tol.delta / std::max(o.scale, 1e-30) * ref.G_abs_sum;
    });
  }
};
TYPED_TEST_SUITE(Contrastive, TLSE_TEST_CONFIGS, ConfigName);

tlse::ContrastiveOptions with_scale(double s, tlse::Direction d = tlse::Direction::symmetric) {
  tlse::ContrastiveOptions o;
  o.scale = s;
  o.direction = d;
  return o;
}

TYPED_TEST(Contrastive, SymmetricPrimeBatch) {
  TLSE_SEEDED(rng);
  this->check(rng, 67, 29, with_scale(1 / 0.07));
}

TYPED_TEST(Contrastive, EachDirection) {
  TLSE_SEEDED(rng);
  for (auto d : {tlse::Direction::image_to_text, tlse::Direction::text_to_image}) {
    SCOPED_TRACE("direction " + std::to_string(int(d)));
    this->check(rng, 41, 16, with_scale(10, d));
  }
}

TYPED_TEST(Contrastive, CustomPositives) {
  TLSE_SEEDED(rng);
  this->check(rng, 53, 20, with_scale(14.3), true);
}

TYPED_TEST(Contrastive, BatchOfOneAndDepthSweep) {
  TLSE_SEEDED(rng);
  this->check(rng, 1, 5, with_scale(3));
  for (std::int64_t c : {1, 3, 64, 2048}) {
    SCOPED_TRACE("c=" + std::to_string(c));
    this->check(rng, 35, c, with_scale(14.3));
  }
}

TYPED_TEST(Contrastive, LargerThanSeveralTiles) {
  TLSE_SEEDED(rng);
  this->check(rng, 211, 48, with_scale(20));
}

TYPED_TEST(Contrastive, Tf32Precision) {
  // Float inputs on CUDA take the TF32 tensor cores (checked at TF32 roundoff); elsewhere exact.
  if (!std::is_same<typename TestFixture::T, float>::value) GTEST_SKIP() << "Precision::tf32 concerns float";
  TLSE_SEEDED(rng);
  auto o = with_scale(14.3);
  o.precision = tlse::Precision::tf32;
  this->check(rng, 211, 48, o);
  this->check(rng, 300, 132, o, true);
  // On Hopper GPUs the backward's products run on wgmma with K-major copies (G^T, the inputs
  // transposed): in one pass at the default budget, in two under 4 MiB (B^T whole for the row
  // panels, A^T and G^T for the column panels), and the self-similarity form in both.
  this->check(rng, 900, 520, o, true);
  this->check_self(rng, 2 * 450, 520, o);
  o.memory_budget = std::size_t(4) << 20;
  this->check(rng, 900, 520, o, true);
  this->check_self(rng, 2 * 450, 520, o);
  // Under 2 MiB the two passes fit only with K blocks (H200: 256 rows of G^T and A^T at a time in
  // the column panels, 256 columns of G and B^T in the row panels), each block transposed in turn.
  o.memory_budget = std::size_t(2) << 20;
  this->check(rng, 900, 520, o, true);
  this->check_self(rng, 2 * 450, 520, o);
}

TYPED_TEST(Contrastive, ExactFloatTileKernelShapes) {
  // Exact float on CUDA runs the tile kernels with 3xTF32 (or, TLSE_CUDA_EXACT_F32=ffma, FFMA)
  // products (docs/gpu.md): shapes that are not multiples of the 128 x 128 tiles, depth 4 (the smallest
  // they take), custom positives, and the self-similarity form (both passes into one gradient).
  if (!std::is_same<typename TestFixture::T, float>::value) GTEST_SKIP() << "exact float32";
  TLSE_SEEDED(rng);
  this->check(rng, 300, 132, with_scale(1 / 0.07), true);
  this->check(rng, 129, 4, with_scale(20));
  this->check_self(rng, 2 * 150, 36, with_scale(1 / 0.07));
}

TYPED_TEST(Contrastive, ExactFloatBackwardInChunksOfRows) {
  // Exact float on CUDA runs the whole backward as one pass owning the rows when its buffers fit
  // the budget (mma/backward.hpp, run_fused): under 3 MiB, chunks of 128 of these 1000 images,
  // each adding its G^T I_chunk into dT (the last chunk partial), with dscale from the rows' sums.
  // The self-similarity form adds both sides into one gradient: the two passes.
  if (!std::is_same<typename TestFixture::T, float>::value) GTEST_SKIP() << "exact float32";
  TLSE_SEEDED(rng);
  auto o = with_scale(14.3);
  o.memory_budget = std::size_t(3) << 20;
  this->check(rng, 1000, 72, o, true);
  this->check_self(rng, 2 * 500, 72, o);
}

TYPED_TEST(Contrastive, BackwardInTwoPassesUnderASmallBudget) {
  TLSE_SEEDED(rng);
  // On Hopper GPUs (bf16, fp16) 1 MiB does not hold the fused backward's 900 x 520 fp32 accumulator:
  // two passes, panels of columns then of rows (the last ones partial); the self-similarity
  // form adds its columns' gradient onto the row panels' dZ.
  auto o = with_scale(14.3);
  o.memory_budget = std::size_t(1) << 20;
  this->check(rng, 900, 520, o, true);
  this->check_self(rng, 2 * 450, 520, o);
}

TYPED_TEST(Contrastive, BackwardInKBlocksUnderATinyBudget) {
  if (tlse::impl::is_host_space<typename TypeParam::Exec>())
    GTEST_SKIP() << "the host's backward plans no budget: the other cases cover its kernels";
  TLSE_SEEDED(rng);
  // On Hopper GPUs (bf16, fp16) 320 KiB holds the two passes of 1501 rows only with K blocks (H200:
  // column panels over blocks of 256 rows, row panels over blocks of 256 columns, the last ones
  // partial): dB_panel and dA_panel summed over the blocks in fp32, dscale's row sums a block at a
  // time; the self-similarity form adds its summed column products onto the row panels' dZ.
  // Other GPUs run the same calls on their kernels; the host's backward plans no budget.
  auto o = with_scale(14.3);
  o.memory_budget = std::size_t(320) << 10;
  this->check(rng, 1501, 64, o, true);
  this->check_self(rng, 2 * 750, 64, o);
}

TYPED_TEST(Contrastive, ExtremeLogitsNear1e4) {
  TLSE_SEEDED(rng);
  // Unit features with scale 1e4: logits in [-1e4, 1e4], softmax saturated.
  this->check(rng, 37, 6, with_scale(1e4));
}

TYPED_TEST(Contrastive, ZeroScaleIsUniform) {
  TLSE_SEEDED(rng);
  this->check(rng, 13, 4, with_scale(0));
}

TYPED_TEST(Contrastive, SelfSimilarityNtXent) {
  TLSE_SEEDED(rng);
  this->check_self(rng, 2, 3, with_scale(5));
  this->check_self(rng, 2 * 45, 19, with_scale(1 / 0.1));
  this->check_self(rng, 2 * 17, 2048, with_scale(1 / 0.07));
}

TYPED_TEST(Contrastive, EmptyBatchGivesZero) {
  using C = TypeParam;
  typename C::MatrixView I("I", 0, 8), T("T", 0, 8), dI("dI", 0, 8), dT("dT", 0, 8);
  typename C::AccView loss("loss", 1), lse("lse", 0), dscale("dscale", 1), dloss("dloss", 1);
  Kokkos::deep_copy(loss, 7);
  Kokkos::deep_copy(dscale, 7);
  typename C::IntView none;
  typename C::Exec exec;
  tlse::contrastive_loss(exec, I, T, none, loss, lse, lse, tlse::ContrastiveOptions{});
  tlse::contrastive_loss_backward(exec, I, T, none, lse, lse, dloss, dI, dT, dscale, tlse::ContrastiveOptions{});
  EXPECT_EQ(to_host(loss)[0], 0.0);
  EXPECT_EQ(to_host(dscale)[0], 0.0);
  tlse::self_contrastive_loss(exec, I, loss, lse, tlse::ContrastiveOptions{});
  EXPECT_EQ(to_host(loss)[0], 0.0);
}

TYPED_TEST(Contrastive, BitwiseDeterministic) {
  using C = TypeParam;
  TLSE_SEEDED(rng);
  const std::int64_t b = 150, c = 40;
  auto I = to_device<C>(random_matrix<typename C::Scalar>(rng, b, c, 1.0, true));
  auto T = to_device<C>(random_matrix<typename C::Scalar>(rng, b, c, 1.0, true));
  typename C::IntView none;
  typename C::Exec exec;
  auto run = [&] {
    typename C::AccView loss("loss", 1), rl("rl", b), cl("cl", b), dscale("ds", 1), dloss("dl", 1);
    Kokkos::deep_copy(dloss, 1);
    typename C::MatrixView dI("dI", b, c), dT("dT", b, c);
    tlse::ContrastiveOptions o;
    o.scale = 14.3;
    tlse::contrastive_loss(exec, I, T, none, loss, rl, cl, o);
    tlse::contrastive_loss_backward(exec, I, T, none, rl, cl, dloss, dI, dT, dscale, o);
    return std::vector<std::vector<double>>{to_host(loss), to_host(rl), to_host(cl),
                                            to_host(dI),   to_host(dT), to_host(dscale)};
  };
  const auto first = run(), second = run();
  for (std::size_t k = 0; k < first.size(); ++k)
    EXPECT_EQ(0, std::memcmp(first[k].data(), second[k].data(), first[k].size() * sizeof(double))) << k;
}

TYPED_TEST(Contrastive, GradientsReachingTheReturnedLses) {
  // A loss built from the returned LSEs, L + sum_i a_i row_lse_i + b_i col_lse_i, trains through
  // them: the backward with those gradients (ContrastiveExtras) equals the plain backward plus the
  // LSEs' own gradients, which linear_lse_backward gives (rows: I against T; columns: T against I).
  using C = TypeParam;
  using Acc = typename C::Acc;
  if (!std::is_same<Acc, double>::value) GTEST_SKIP() << "compared in double";
  TLSE_SEEDED(rng);
  const std::int64_t b = 37, c = 12;
  const Matrix I = random_matrix<typename C::Scalar>(rng, b, c, 1.0, true),
               Tm = random_matrix<typename C::Scalar>(rng, b, c, 1.0, true);
  std::vector<double> a(b), bb(b);
  for (auto* v : {&a, &bb})
    for (double& x : *v) x = double(rng() % 100) / 50 - 1;
  auto Id = to_device<C>(I, "I"), Td = to_device<C>(Tm, "T");
  typename C::IntView nolabels;
  typename C::AccView loss("loss", 1), row_lse("row_lse", b), col_lse("col_lse", b);
  typename C::Exec exec;
  tlse::ContrastiveOptions o;
  o.scale = 5;
  tlse::contrastive_loss(exec, Id, Td, nolabels, loss, row_lse, col_lse, o);
  const auto dl = vector_to_device<typename C::AccView>({0.75});
  typename C::MatrixView dI("dI", b, c), dT("dT", b, c), dI0("dI0", b, c), dT0("dT0", b, c);
  typename C::AccView dscale("dscale", 1), dscale0("dscale0", 1);
  tlse::ContrastiveExtras<Acc, typename C::Mem> x;
  x.d_row_lse = vector_to_device<typename C::AccView>(a, "d_row_lse");
  x.d_col_lse = vector_to_device<typename C::AccView>(bb, "d_col_lse");
  tlse::contrastive_loss_backward(exec, Id, Td, nolabels, row_lse, col_lse, dl, dI, dT, dscale, x, o);
  tlse::contrastive_loss_backward(exec, Id, Td, nolabels, row_lse, col_lse, dl, dI0, dT0, dscale0, o);
  tlse::LinearLseOptions lo;
  lo.scale = o.scale;
  lo.accumulate = true;  // onto the plain backward's gradients
  typename C::VectorView nobias;
  tlse::linear_lse_backward(exec, Id, Td, nobias, row_lse, x.d_row_lse, dI0, dT0, lo);
  tlse::linear_lse_backward(exec, Td, Id, nobias, col_lse, x.d_col_lse, dT0, dI0, lo);
  const auto got_I = to_host(dI), want_I = to_host(dI0), got_T = to_host(dT), want_T = to_host(dT0);
  for (std::size_t k = 0; k < got_I.size(); ++k) EXPECT_NEAR(got_I[k], want_I[k], 1e-12) << "dI " << k;
  for (std::size_t k = 0; k < got_T.size(); ++k) EXPECT_NEAR(got_T[k], want_T[k], 1e-12) << "dT " << k;
}

TYPED_TEST(Contrastive, FiniteDifferenceOnFeaturesAndScale) {
  using C = TypeParam;
  using T = typename C::Scalar;
  if (!std::is_same<T, double>::value) GTEST_SKIP() << "finite differences need float64";
  TLSE_SEEDED(rng);
  const std::int64_t b = 9, c = 5;
  const Matrix I = random_matrix<T>(rng, b, c, 1.0, true), Tm = random_matrix<T>(rng, b, c, 1.0, true);
  typename C::IntView none;
  typename C::Exec exec;
  auto loss_at = [&](const Matrix& i, const Matrix& t, double scale) {
    typename C::AccView loss("loss", 1);
    tlse::contrastive_loss(exec, to_device<C>(i), to_device<C>(t), loss, with_scale(scale));
    return to_host(loss)[0];
  };
  const double s = 7.0;
  typename C::AccView loss("loss", 1), rl("rl", b), cl("cl", b), dscale("ds", 1), dloss("dl", 1);
  Kokkos::deep_copy(dloss, 1);
  typename C::MatrixView dI("dI", b, c), dT("dT", b, c);
  auto Id = to_device<C>(I), Td = to_device<C>(Tm);
  tlse::contrastive_loss(exec, Id, Td, none, loss, rl, cl, with_scale(s));
  tlse::contrastive_loss_backward(exec, Id, Td, none, rl, cl, dloss, dI, dT, dscale, with_scale(s));
  const double h = 1e-6;
  EXPECT_NEAR(to_host(dscale)[0], (loss_at(I, Tm, s + h) - loss_at(I, Tm, s - h)) / (2 * h), 1e-6);
  const auto gI = to_host(dI), gT = to_host(dT);
  for (int trial = 0; trial < 4; ++trial) {
    const std::int64_t i = rng() % b, d = rng() % c;
    Matrix p = I, m = I;
    p(i, d) += h, m(i, d) -= h;
    EXPECT_NEAR(gI[i * c + d], (loss_at(p, Tm, s) - loss_at(m, Tm, s)) / (2 * h), 1e-6);
    p = Tm, m = Tm;
    p(i, d) += h, m(i, d) -= h;
    EXPECT_NEAR(gT[i * c + d], (loss_at(I, p, s) - loss_at(I, m, s)) / (2 * h), 1e-6);
  }
}

}  // namespace
