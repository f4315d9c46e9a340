// Fused linear distillation (forward KL, reverse KL, JSD, the alpha mix with the student's
// cross-entropy) against a float64 reference that materializes both logit matrices.
//
// Tolerances: the model of test_support.hpp. Each head's logits carry delta (depth, scale 1 / T,
// norms of its operands; the larger of the two heads, and of scale 1 for the cross-entropy), each
// LSE tol.lse; a row's divergence sums V terms p (lp - lq) whose relative errors come from both:
// (4 delta + 8 (u + u_ref) sqrt(V) + lse error) * the row's sum of term magnitudes. Gradients:
// Tolerance::grad with the magnitudes of dL/dx's terms (Gabs) through |the other operand|. The
// same bound for every dtype, with u = 2^-24 for float, bf16 and fp16 (they accumulate in float)
// and 2^-53 for double, and the 16-bit types' output rounding u_out (2^-8 bf16, 2^-11 fp16).
#include "distillation_reference.hpp"
#include "test_support.hpp"

#include <tlse/distillation_loss.hpp>

#include <algorithm>
#include <cstring>
#include <limits>

namespace {
using namespace tlse::test;

/// How the teacher's masked classes are made (every third class j % 3 == 1): the teacher's first
/// feature is 1 in every row and -big in the class's row of Wt, the others 0 there.
enum class Mask { none, very_negative, negative_infinity };

struct DistillCase {
  std::int64_t N, V, Ds, Dt;
  tlse::DistillationOptions o;
  double ignore_fraction = 0.0;  // share of targets set to ignore_index
  bool targets = true;           // false: an empty targets view (every row scored)
  bool teacher_grads = true;     // dHt and dWt wanted
  double logit_std = 3.0;        // std of each head's logits at T = 1
  Mask mask = Mask::none;
  bool int32_targets = false;
  bool step = false;  // distillation_loss_with_gradients rather than the two calls
};

template <class C>
struct Distillation : ::testing::Test {
  using T = typename C::Scalar;
  using Acc = typename C::Acc;
  using StatsView = Kokkos::View<Acc**, Kokkos::LayoutRight, typename C::Mem>;

  struct Inputs {
    Matrix Hs, Ws, Ht, Wt;
    Matrix Wt_unmasked;  // Wt without its masked classes (for the tolerance's norms)
    std::vector<std::int64_t> targets;
  };

  static Inputs make_inputs(std::mt19937_64& rng, const DistillCase& k) {
    Inputs in;
    in.Hs = random_matrix<T>(rng, k.N, k.Ds);
    in.Ws = random_matrix<T>(rng, k.V, k.Ds, k.logit_std / std::sqrt(double(k.Ds)));
    in.Ht = random_matrix<T>(rng, k.N, k.Dt);
    in.Wt = random_matrix<T>(rng, k.V, k.Dt, k.logit_std / std::sqrt(double(k.Dt)));
    in.Wt_unmasked = in.Wt;
    if (k.mask != Mask::none) {
      // fp16 tops out at 65504: -6e4 is as good a mask there (exp(-6e4) = 0 in float).
      const double big = k.mask == Mask::negative_infinity       ? INFINITY
                         : std::is_same<T, tlse::float16>::value ? 6e4
                                                                 : 1e30;
      for (std::int64_t i = 0; i < k.N; ++i) in.Ht(i, 0) = 1;
      for (std::int64_t j = 1; j < k.V; j += 3) {
        for (std::int64_t f = 0; f < k.Dt; ++f) in.Wt(j, f) = 0, in.Wt_unmasked(j, f) = 0;
        in.Wt(j, 0) = representable<T>(-big);
      }
    }
    std::uniform_int_distribution<std::int64_t> cls(0, std::max<std::int64_t>(k.V - 1, 0));
    std::uniform_real_distribution<double> unit(0, 1);
    if (k.targets)
      for (std::int64_t i = 0; i < k.N; ++i)
        in.targets.push_back(unit(rng) < k.ignore_fraction ? k.o.ignore_index : cls(rng));
    return in;
  }

  static void check(const DistillCase& k, std::mt19937_64& rng) {
    const Inputs in = make_inputs(rng, k);
    const auto& o = k.o;
    auto Hs = to_device<C>(in.Hs, "Hs");
    auto Ws = to_device<C>(in.Ws, "Ws");
    auto Ht = to_device<C>(in.Ht, "Ht");
    auto Wt = to_device<C>(in.Wt, "Wt");
    const bool none = o.reduction == tlse::Reduction::none;
    typename C::AccView loss("loss", none ? k.N : 1);
    StatsView stats("row_stats", k.N, tlse::distillation_row_stats);
    typename C::Exec exec;
    std::vector<double> dloss(none ? k.N : 1);
    std::uniform_real_distribution<double> up(0.5, 1.5);
    for (auto& v : dloss) v = representable<Acc>(up(rng));
    auto dl = vector_to_device<typename C::AccView>(dloss, "dloss");
    typename C::MatrixView dHs("dHs", k.N, k.Ds), dWs("dWs", k.V, k.Ds);
    typename C::MatrixView dHt("dHt", k.teacher_grads ? k.N : 0, k.Dt), dWt("dWt", k.teacher_grads ? k.V : 0, k.Dt);
    // With accumulate, the gradients start from a known value.
    Matrix start_s(k.N, k.Ds), start_ws(k.V, k.Ds), start_t(k.N, k.Dt), start_wt(k.V, k.Dt);
    if (o.accumulate) {
      start_s = random_matrix<T>(rng, k.N, k.Ds), start_ws = random_matrix<T>(rng, k.V, k.Ds);
      start_t = random_matrix<T>(rng, k.N, k.Dt), start_wt = random_matrix<T>(rng, k.V, k.Dt);
      Kokkos::deep_copy(dHs, to_device<C>(start_s));
      Kokkos::deep_copy(dWs, to_device<C>(start_ws));
      if (k.teacher_grads)
        Kokkos::deep_copy(dHt, to_device<C>(start_t)), Kokkos::deep_copy(dWt, to_device<C>(start_wt));
    }
    const auto run = [&](const auto& targets) {
      if (k.step) {
        tlse::distillation_loss_with_gradients(exec, Hs, Ws, Ht, Wt, targets, dl, loss, dHs, dWs, dHt, dWt, o);
        return;
      }
      tlse::distillation_loss(exec, Hs, Ws, Ht, Wt, targets, loss, stats, o);
      tlse::distillation_loss_backward(exec, Hs, Ws, Ht, Wt, targets, stats, dl, dHs, dWs, dHt, dWt, o);
    };
    if (k.int32_targets)
      run(index_to_device<typename C::IntView>(in.targets));
    else
      run(index_to_device<typename C::IndexView>(in.targets));
    const auto ref = distillation_reference(in.Hs, in.Ws, in.Ht, in.Wt, in.targets, o, dloss);

    // The larger of the heads' logit errors (scale 1 / T; the cross-entropy's at scale 1).
    const double s = std::max(1.0 / o.temperature, o.alpha > 0 ? 1.0 : 0.0);
    Tolerance<T> tol_s(in.Hs, in.Ws, s), tol_t(in.Ht, in.Wt_unmasked, 1.0 / o.temperature);
    Tolerance<T> tol = tol_s.delta > tol_t.delta ? tol_s : tol_t;
    const double lse_error = tol.lse(ref.lse_max, k.V);
    const double per_term = 4 * tol.delta + 8 * (tol.u + tol.U_REF) * std::sqrt(double(k.V) + 1) + 2 * lse_error;
    if (none)
      expect_close("loss", to_host(loss), ref.row_loss,
                   [&](std::size_t i) { return per_term * ref.row_mag[i] + 1e-30; });
    else
      expect_close("loss", to_host(loss), {ref.loss}, [&](std::size_t) {
        return per_term * ref.loss_mag + 4 * tol.u * std::fabs(ref.loss) * std::sqrt(double(k.N) + 1) + 1e-30;
      });
    const auto check_grad = [&](const char* what, const typename C::MatrixView& got, const Matrix& want,
                                const Matrix& mag, const Matrix& start, std::int64_t n) {
      Matrix expected = want;
      if (o.accumulate)
        for (std::size_t i = 0; i < expected.v.size(); ++i) expected.v[i] += start.v[i];
      expect_close(what, to_host(got), expected.v, [&](std::size_t i) {
        return tol.grad(expected.v[i], mag.v[i], n, 2 * lse_error) +
               // the sum with the start value, rounded to T (float's rounding too: the model's
               // first term covers it only relative to the gradient, not to the start value)
               (o.accumulate ? 2 * (tol.u_out + tol.u) * (std::fabs(start.v[i]) + std::fabs(expected.v[i])) : 0.0);
      });
    };
    check_grad("dHs", dHs, ref.dHs, ref.dHs_mag, start_s, k.V);
    check_grad("dWs", dWs, ref.dWs, ref.dWs_mag, start_ws, k.N);
    if (k.teacher_grads) {
      if (k.mask != Mask::negative_infinity) check_grad("dHt", dHt, ref.dHt, ref.dHt_mag, start_t, k.V);
      check_grad("dWt", dWt, ref.dWt, ref.dWt_mag, start_wt, k.N);
    }
  }
};
TYPED_TEST_SUITE(Distillation, TLSE_TEST_CONFIGS, ConfigName);

tlse::DistillationOptions with(tlse::Divergence d, double beta = 0.5, double temperature = 1.0, double alpha = 0.0) {
  tlse::DistillationOptions o;
  o.divergence = d;
  o.beta = beta;
  o.temperature = temperature;
  o.alpha = alpha;
  return o;
}

TYPED_TEST(Distillation, EachDivergenceOnShapesThatAreNoTileMultiple) {
  TLSE_SEEDED(rng);
  for (auto d : {tlse::Divergence::forward_kl, tlse::Divergence::reverse_kl})
    this->check({45, 77, 19, 33, with(d)}, rng);
  for (double beta : {0.3, 0.5}) this->check({45, 77, 19, 33, with(tlse::Divergence::jsd, beta)}, rng);
}

TYPED_TEST(Distillation, BetaZeroAndOneAreTheKls) {
  TLSE_SEEDED(rng);
  for (double beta : {0.0, 1.0}) this->check({45, 77, 19, 33, with(tlse::Divergence::jsd, beta)}, rng);
}

TYPED_TEST(Distillation, Temperatures) {
  TLSE_SEEDED(rng);
  for (double t : {0.5, 4.0})
    for (auto d : {tlse::Divergence::forward_kl, tlse::Divergence::reverse_kl, tlse::Divergence::jsd})
      this->check({37, 70, 24, 16, with(d, 0.3, t)}, rng);
}

TYPED_TEST(Distillation, AlphaMixesTheHardLabelCrossEntropy) {
  TLSE_SEEDED(rng);
  for (double alpha : {0.5, 1.0}) {
    this->check({45, 77, 19, 33, with(tlse::Divergence::forward_kl, 0.5, 2.0, alpha)}, rng);
    this->check({45, 77, 19, 33, with(tlse::Divergence::jsd, 0.3, 1.0, alpha)}, rng);
  }
}

TYPED_TEST(Distillation, ReductionsIgnoredRowsAndShift) {
  TLSE_SEEDED(rng);
  for (auto red : {tlse::Reduction::none, tlse::Reduction::sum, tlse::Reduction::mean}) {
    auto o = with(tlse::Divergence::jsd, 0.5, 2.0, 0.5);
    o.reduction = red;
    o.shift = 3;
    this->check({50, 40, 12, 20, o, 0.3}, rng);
    o.ignore_index = -1;
    o.alpha = 0;
    this->check({50, 40, 12, 20, o, 0.3, true, true, 3.0, Mask::none, true}, rng);
  }
}

TYPED_TEST(Distillation, WithoutTargetsEveryRowIsScored) {
  TLSE_SEEDED(rng);
  auto o = with(tlse::Divergence::reverse_kl, 0.5, 1.5);
  o.reduction = tlse::Reduction::none;
  this->check({33, 65, 8, 40, o, 0.0, false}, rng);
}

TYPED_TEST(Distillation, EveryRowIgnored) {
  TLSE_SEEDED(rng);
  this->check({20, 30, 8, 8, with(tlse::Divergence::forward_kl, 0.5, 1.0, 0.5), 1.0}, rng);  // mean over none: 0
}

TYPED_TEST(Distillation, FrozenTeacherAndAccumulate) {
  TLSE_SEEDED(rng);
  auto o = with(tlse::Divergence::jsd, 0.3, 0.5, 0.5);
  this->check({45, 77, 19, 33, o, 0.1, true, false}, rng);
  o.accumulate = true;
  this->check({45, 77, 19, 33, o, 0.1, true, true}, rng);
  this->check({45, 77, 19, 33, o, 0.1, true, false}, rng);
}

TYPED_TEST(Distillation, SeveralTilesPerTeam) {
  TLSE_SEEDED(rng);
  this->check({130, 300, 40, 72, with(tlse::Divergence::jsd, 0.5, 1.0, 0.25)}, rng);
}

TYPED_TEST(Distillation, VocabularyInPanels) {
  TLSE_SEEDED(rng);
  // A budget that holds panels of 256 columns on the GPU's tile-pair kernels
  // (hopper/distillation.hpp; depths multiples of 8 as they take them): three panels, the last
  // of an odd width, with and without the teacher's row accumulator beside them.
  const std::size_t budget = 8 * 70 * 256 + 4 * 70 * (24 + 40) + 1536;
  for (auto d : {tlse::Divergence::forward_kl, tlse::Divergence::reverse_kl, tlse::Divergence::jsd}) {
    auto o = with(d, 0.3, 2.0, 0.5);
    o.shift = 1;
    o.accumulate = true;
    o.memory_budget = budget;
    this->check({70, 701, 24, 40, o, 0.2, true, true, 3.0, Mask::very_negative}, rng);
  }
  auto o = with(tlse::Divergence::forward_kl);
  o.memory_budget = budget;
  this->check({70, 701, 24, 40, o, 0.0, true, false, 3.0, Mask::negative_infinity}, rng);
}

TYPED_TEST(Distillation, TrainingStepInOneCall) {
  TLSE_SEEDED(rng);
  // A budget that holds, on the GPU's tile-pair kernels, the working panels of 256 columns and
  // one more: the step keeps two of the teacher's panels there (the first also its working
  // panel, so that the forward sweeps the panel not kept first), and with accumulate off one
  // more in dWs's storage ((V - 256) D_s >= 256 x 2 N): four panels, three kept (two with
  // accumulate).
  const std::int64_t N = 70, V = 1000, Ds = 64, Dt = 40;
  const std::size_t budget = 8 * N * 256 + 4 * N * (Ds + Dt) + 4 * N * 256 + 2048;
  for (auto d : {tlse::Divergence::forward_kl, tlse::Divergence::reverse_kl, tlse::Divergence::jsd})
    for (bool accumulate : {false, true}) {
      auto o = with(d, 0.3, 2.0, 0.5);
      o.shift = 1;
      o.accumulate = accumulate;
      o.memory_budget = budget;
      DistillCase k{N, V, Ds, Dt, o, 0.2, true, !accumulate, 3.0, Mask::very_negative};
      k.step = true;
      this->check(k, rng);
    }
  // The frozen teacher with -inf masks; per-row losses; the default budget.
  auto o = with(tlse::Divergence::forward_kl);
  o.reduction = tlse::Reduction::none;
  DistillCase k{N, V, Ds, Dt, o, 0.1, true, false, 3.0, Mask::negative_infinity};
  k.step = true;
  this->check(k, rng);
  o.memory_budget = budget;
  k.o = o;
  this->check(k, rng);
}

TYPED_TEST(Distillation, ExtremeLogitsNear1e4) {
  TLSE_SEEDED(rng);
  // The KLs' gradients grow with the logits' differences times the weights (about 1e4 x 1e4 /
  // sqrt(D) here): past fp16's largest value (65504), so fp16 gets logits near 1e2.
  const double logits = std::is_same<typename TestFixture::T, tlse::float16>::value ? 1e2 : 1e4;
  DistillCase k{29, 41, 8, 12, {}, 0.0, true, true, logits};
  for (auto d : {tlse::Divergence::forward_kl, tlse::Divergence::reverse_kl, tlse::Divergence::jsd}) {
    k.o = with(d, 0.5, 1.0, 0.5);
    this->check(k, rng);
  }
}

TYPED_TEST(Distillation, MaskedTeacherClasses) {
  TLSE_SEEDED(rng);
  for (auto d : {tlse::Divergence::forward_kl, tlse::Divergence::jsd}) {
    this->check({31, 64, 12, 10, with(d, 0.5, 2.0), 0.0, true, true, 3.0, Mask::very_negative}, rng);
    // -inf teacher logits: dHt sums 0 * -inf (not checked; a frozen teacher wants none).
    this->check({31, 64, 12, 10, with(d, 0.5, 0.5, 0.5), 0.0, true, true, 3.0, Mask::negative_infinity}, rng);
  }
}

TYPED_TEST(Distillation, MaskedTeacherClassMakesTheReverseKlInfinite) {
  using C = TypeParam;
  TLSE_SEEDED(rng);
  const DistillCase k{9, 20, 4, 5, with(tlse::Divergence::reverse_kl), 0.0, false, true, 3.0, Mask::negative_infinity};
  const auto in = TestFixture::make_inputs(rng, k);
  typename C::AccView loss("loss", 1);
  typename TestFixture::StatsView stats("row_stats", k.N, tlse::distillation_row_stats);
  tlse::distillation_loss(typename C::Exec(), to_device<C>(in.Hs), to_device<C>(in.Ws), to_device<C>(in.Ht),
                          to_device<C>(in.Wt), typename C::IndexView(), loss, stats, k.o);
  EXPECT_EQ(to_host(loss)[0], INFINITY);  // p_s > 0 where p_t = 0
}

TYPED_TEST(Distillation, BitwiseDeterministic) {
  using C = TypeParam;
  using Acc = typename C::Acc;
  TLSE_SEEDED(rng);
  const DistillCase k{70, 150, 20, 36, with(tlse::Divergence::jsd, 0.3, 2.0, 0.5), 0.2};
  const auto in = TestFixture::make_inputs(rng, k);
  auto Hs = to_device<C>(in.Hs), Ws = to_device<C>(in.Ws), Ht = to_device<C>(in.Ht), Wt = to_device<C>(in.Wt);
  auto targets = index_to_device<typename C::IndexView>(in.targets);
  std::vector<std::vector<double>> runs[2];
  for (auto& out : runs) {
    typename C::AccView loss("loss", 1), dloss("dloss", 1);
    Kokkos::deep_copy(dloss, Acc(1));
    typename TestFixture::StatsView stats("row_stats", k.N, tlse::distillation_row_stats);
    typename C::MatrixView dHs("dHs", k.N, k.Ds), dWs("dWs", k.V, k.Ds), dHt("dHt", k.N, k.Dt), dWt("dWt", k.V, k.Dt);
    typename C::Exec exec;
    tlse::distillation_loss(exec, Hs, Ws, Ht, Wt, targets, loss, stats, k.o);
    tlse::distillation_loss_backward(exec, Hs, Ws, Ht, Wt, targets, stats, dloss, dHs, dWs, dHt, dWt, k.o);
    out = {to_host(loss), to_host(dHs), to_host(dWs), to_host(dHt), to_host(dWt)};
    // The training step of the forward KL, its teacher's logits kept (TrainingStepInOneCall's budget).
    auto o = with(tlse::Divergence::forward_kl);
    o.memory_budget = 8 * k.N * 256 + 4 * k.N * (k.Ds + k.Dt) + 4 * k.N * 256 + 2048;
    tlse::distillation_loss_with_gradients(exec, Hs, Ws, Ht, Wt, targets, dloss, loss, dHs, dWs, dHt, dWt, o);
    for (const auto& v : {to_host(loss), to_host(dHs), to_host(dWs), to_host(dHt), to_host(dWt)}) out.push_back(v);
  }
  for (std::size_t i = 0; i < runs[0].size(); ++i)
    EXPECT_EQ(0, std::memcmp(runs[0][i].data(), runs[1][i].data(), runs[0][i].size() * sizeof(double))) << i;
}

// The gradient formulas against central differences of the loss itself, independent of the reference.
TYPED_TEST(Distillation, FiniteDifferenceSpotCheck) {
  using C = TypeParam;
  using T = typename C::Scalar;
  if (!std::is_same<T, double>::value) GTEST_SKIP() << "finite differences need float64";
  TLSE_SEEDED(rng);
  const std::int64_t N = 11, V = 29, Ds = 7, Dt = 5;
  const auto in = TestFixture::make_inputs(rng, {N, V, Ds, Dt, {}, 0.2});
  typename C::Exec exec;
  auto targets = index_to_device<typename C::IndexView>(in.targets);
  for (auto d : {tlse::Divergence::forward_kl, tlse::Divergence::reverse_kl, tlse::Divergence::jsd}) {
    auto o = with(d, 0.3, 2.0, 0.4);
    o.shift = 1;
    SCOPED_TRACE("divergence " + std::to_string(int(d)));
    const auto loss_at = [&](const Matrix& hs, const Matrix& ws, const Matrix& ht, const Matrix& wt) {
      typename C::AccView loss("loss", 1);
      typename TestFixture::StatsView stats("row_stats", N, tlse::distillation_row_stats);
      tlse::distillation_loss(exec, to_device<C>(hs), to_device<C>(ws), to_device<C>(ht), to_device<C>(wt), targets,
                              loss, stats, o);
      return to_host(loss)[0];
    };
    typename C::AccView loss("loss", 1), dloss("dloss", 1);
    Kokkos::deep_copy(dloss, 1.0);
    typename TestFixture::StatsView stats("row_stats", N, tlse::distillation_row_stats);
    auto Hs = to_device<C>(in.Hs), Ws = to_device<C>(in.Ws), Ht = to_device<C>(in.Ht), Wt = to_device<C>(in.Wt);
    typename C::MatrixView dHs("dHs", N, Ds), dWs("dWs", V, Ds), dHt("dHt", N, Dt), dWt("dWt", V, Dt);
    tlse::distillation_loss(exec, Hs, Ws, Ht, Wt, targets, loss, stats, o);
    tlse::distillation_loss_backward(exec, Hs, Ws, Ht, Wt, targets, stats, dloss, dHs, dWs, dHt, dWt, o);
    const std::vector<double> grads[4] = {to_host(dHs), to_host(dWs), to_host(dHt), to_host(dWt)};
    const double h = 1e-6;
    for (int trial = 0; trial < 4; ++trial)
      for (int which = 0; which < 4; ++which) {
        Matrix m[4] = {in.Hs, in.Ws, in.Ht, in.Wt};
        const std::int64_t r = std::int64_t(rng() % std::uint64_t(m[which].rows));
        const std::int64_t f = std::int64_t(rng() % std::uint64_t(m[which].cols));
        Matrix plus[4] = {m[0], m[1], m[2], m[3]}, minus[4] = {m[0], m[1], m[2], m[3]};
        plus[which](r, f) += h, minus[which](r, f) -= h;
        const double fd =
            (loss_at(plus[0], plus[1], plus[2], plus[3]) - loss_at(minus[0], minus[1], minus[2], minus[3])) / (2 * h);
        EXPECT_NEAR(grads[which][std::size_t(r * m[which].cols + f)], fd, 1e-6) << "operand " << which;
      }
  }
}

}  // namespace
