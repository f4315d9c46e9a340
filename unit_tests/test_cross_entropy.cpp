// Cross-entropy (CCE) against the float64 materialized reference, for every option.
#include "test_support.hpp"

#include <algorithm>
#include <array>
#include <limits>
#include <numeric>

namespace {
using namespace tlse::test;

struct CeCase {
  std::int64_t N, V, D;
  tlse::CrossEntropyOptions o;
  double logit_std = 4.0;         // std of the logits (C is scaled to reach it)
  double ignore_fraction = 0.0;   // share of targets set to ignore_index
  bool bias = false;
  bool neg_inf_bias = false;      // mask some non-target classes with a -inf bias
  bool int32_targets = false;
  int clusters = 0;               // > 0: rows and classes in contiguous clusters (see make_inputs)
  bool class_weights = false;     // F.cross_entropy's weight: random in [0.5, 2], one class at 0
  bool dlse = false;              // a gradient reaching the returned LSE (random in [-1, 1])
  bool argmax = false;            // the predicted classes and the accuracy
};

template <class C>
struct CrossEntropy : ::testing::Test {
  using T = typename C::Scalar;
  using Acc = typename C::Acc;

  struct Inputs {
    Matrix E, W;  // embeddings and classifier
    std::vector<double> bias;
    std::vector<std::int64_t> targets;
    tlse::testing::CrossEntropyReferenceExtras extras;
  };

  static Inputs make_inputs(std::mt19937_64& rng, const CeCase& k) {
    Inputs in;
    in.E = random_matrix<T>(rng, k.N, k.D);
    in.W = random_matrix<T>(rng, k.V, k.D, k.logit_std / std::sqrt(double(k.D)));
    std::uniform_int_distribution<std::int64_t> cls(0, std::max<std::int64_t>(k.V - 1, 0));
    std::uniform_real_distribution<double> unit(0, 1);
    for (std::int64_t i = 0; i < k.N; ++i)
      in.targets.push_back(unit(rng) < k.ignore_fraction ? k.o.ignore_index : cls(rng));
    if (k.clusters > 0) {
      // Row i and class j belong to clusters i K / N and j K / V, contiguous ranges; a shared
      // direction adds 20 to the logits within a cluster, so the softmax of a row outside its
      // cluster is ~e^-20 and whole tiles fall under the gradient filter. Targets stay inside.
      const std::int64_t K = k.clusters;
      for (std::int64_t i = 0; i < k.N; ++i) in.E(i, i * K / k.N) = representable<T>(in.E(i, i * K / k.N) + 4);
      for (std::int64_t j = 0; j < k.V; ++j) in.W(j, j * K / k.V) = representable<T>(in.W(j, j * K / k.V) + 5);
      for (std::int64_t i = 0; i < k.N; ++i) {
        const std::int64_t c = i * K / k.N, first = (c * k.V + K - 1) / K, end = ((c + 1) * k.V + K - 1) / K;
        if (in.targets[i] != k.o.ignore_index) in.targets[i] = first + cls(rng) % (end - first);
      }
    }
    if (k.bias || k.neg_inf_bias) {
      std::normal_distribution<double> d(0, 1);
      for (std::int64_t j = 0; j < k.V; ++j) in.bias.push_back(representable<T>(k.bias ? d(rng) : 0.0));
      if (k.neg_inf_bias)
        for (std::int64_t j = 0; j < k.V; j += 3) {
          bool is_target = false;
          for (auto t : in.targets) is_target |= t == j;
          if (!is_target) in.bias[j] = -INFINITY;
        }
    }
    std::uniform_real_distribution<double> weight(0.5, 2.0), dlse(-1.0, 1.0);
    if (k.class_weights) {
      for (std::int64_t j = 0; j < k.V; ++j) in.extras.class_weight.push_back(representable<Acc>(weight(rng)));
      if (k.V > 1) in.extras.class_weight[std::size_t(cls(rng))] = 0;  // a class that weighs nothing
    }
    if (k.dlse)
      for (std::int64_t i = 0; i < k.N; ++i) in.extras.dlse.push_back(representable<Acc>(dlse(rng)));
    return in;
  }

  using Extras = tlse::CrossEntropyExtras<Acc, typename C::Mem>;
  using PredictedView = Kokkos::View<std::int64_t*, typename C::Mem>;

  /// Runs forward and backward, compares with the reference; returns the outputs for reuse.
  static void check(const CeCase& k, std::mt19937_64& rng) {
    const Inputs in = make_inputs(rng, k);
    const auto& o = k.o;
    auto E = to_device<C>(in.E, "E");
    auto Cm = to_device<C>(in.W, "C");
    auto bias = vector_to_device<typename C::VectorView>(in.bias, "bias");
    const bool none = o.reduction == tlse::Reduction::none;
    typename C::AccView loss("loss", none ? k.N : 1), lse("lse", k.N);
    typename C::IntView order("order", k.V);
    typename C::Exec exec;
    const auto weight = vector_to_device<typename C::AccView>(in.extras.class_weight, "class_weight");
    const auto dlse = vector_to_device<typename C::AccView>(in.extras.dlse, "dlse");
    PredictedView predicted("predicted", k.argmax ? k.N : 0);
    typename C::AccView accuracy("accuracy", k.argmax ? 1 : 0);
    Extras fx;  // the forward's
    fx.class_weight = weight;
    fx.predicted = predicted;
    fx.accuracy = accuracy;
    if (k.int32_targets)
      tlse::cross_entropy(exec, E, Cm, bias, index_to_device<typename C::IntView>(in.targets), loss, lse, order, fx, o);
    else
      tlse::cross_entropy(exec, E, Cm, bias, index_to_device<typename C::IndexView>(in.targets), loss, lse, order, fx,
                          o);

    // Without vocab_order the forward skips the column logit sums (and may take a device
    // specialization): same results.
    typename C::AccView loss2("loss2", none ? k.N : 1), lse2("lse2", k.N);
    Extras weights_only;
    weights_only.class_weight = weight;
    tlse::cross_entropy(exec, E, Cm, bias, index_to_device<typename C::IndexView>(in.targets), loss2, lse2,
                        typename C::IntView(), weights_only, o);

    std::vector<double> dloss(none ? k.N : 1);
    std::uniform_real_distribution<double> up(0.5, 1.5);
    for (auto& v : dloss) v = representable<Acc>(up(rng));
    const auto ref = tlse::testing::cross_entropy_reference(in.E, in.W, in.bias, in.targets, o, dloss, in.extras);

    Tolerance<T> tol(in.E, in.W, 1.0, max_abs_finite(in.bias) + o.softcap, tf32_roundoff(o.precision));
    const double lse_max = max_abs(ref.lse);
    // The largest coefficient of a row's softmax (g_i; CrossEntropyCall's comment), for the filter's bound.
    double u_max = 1, u_total = double(k.V);
    if (k.class_weights) u_max = max_abs(in.extras.class_weight), u_total = 0;
    for (double u : in.extras.class_weight) u_total += u;
    double weight_total = double(ref.active);
    if (k.class_weights) {
      weight_total = 0;
      for (std::int64_t i = 0; i + o.shift < k.N; ++i)
        if (in.targets[i + o.shift] != o.ignore_index) weight_total += in.extras.class_weight[in.targets[i + o.shift]];
    }
    const bool mean = o.reduction == tlse::Reduction::mean;
    const double ce_scale = mean && weight_total > 0 ? 1 / weight_total : 1.0;
    const double z_scale = mean && ref.active ? 1.0 / double(ref.active) : 1.0;
    const double e = o.label_smoothing;
    const double g_max = max_abs(dloss) * (ce_scale * ((1 - e) * u_max + e * u_total / double(k.V)) +
                                           2 * o.z_loss * lse_max * z_scale) +
                         (in.extras.dlse.empty() ? 0.0 : max_abs(in.extras.dlse));
    const auto got_lse = to_host(lse);
    expect_close("lse", got_lse, ref.lse, [&](std::size_t i) { return tol.lse(ref.lse[i], k.V); });
    expect_close("lse without vocab_order", to_host(lse2), ref.lse,
                 [&](std::size_t i) { return tol.lse(ref.lse[i], k.V); });
    // Class weights scale a row's error by its target's weight, and a mean by sum u_t is no
    // weighted average of the smoothing term: with weights in [0.5, 2], a factor 4 covers both.
    const double loss_tol_row = 2 * tol.lse(lse_max, k.V) * (1 + 2 * o.z_loss * lse_max) * (k.class_weights ? 4 : 1);
    const auto check_loss = [&](const char* name, const typename C::AccView& got) {
      if (none)
        expect_close(name, to_host(got), ref.row_loss, [&](std::size_t) { return loss_tol_row; });
      else
        expect_close(name, to_host(got), {ref.loss}, [&](std::size_t) {
          return loss_tol_row *
                     (o.reduction == tlse::Reduction::sum ? double(std::max<std::int64_t>(ref.active, 1)) : 1.0) +
                 4 * tol.u * std::fabs(ref.loss) * std::sqrt(double(k.N) + 1);
        });
    };
    check_loss("loss", loss);
    if (k.argmax) check_argmax(predicted, accuracy, ref, 2 * tol.lse(lse_max, k.V));

    // Backward, from the forward's saved LSE and vocabulary order.
    typename C::MatrixView dE("dE", k.N, k.D), dC("dC", k.V, k.D);
    typename C::VectorView dbias("dbias", in.bias.empty() ? 0 : k.V);
    auto dl = vector_to_device<typename C::AccView>(dloss, "dloss");
    Extras bx;  // the backward's
    bx.class_weight = weight;
    bx.dlse = dlse;
    tlse::cross_entropy_backward(exec, E, Cm, bias, index_to_device<typename C::IndexView>(in.targets), lse, order, dl,
                                 dE, dC, dbias, bx, o);
    const double eps = tlse::impl::resolved_filter_eps<T>(o);
    // Gradient filtering drops terms |g_i| p_ij |C_jk| with p_ij < eps: bounded by eps |g_i| sum_j |C_jk|.
    std::vector<double> colsum_C(k.D, 0.0), colsum_E(k.D, 0.0);
    for (std::int64_t j = 0; j < k.V; ++j)
      for (std::int64_t d = 0; d < k.D; ++d) colsum_C[d] += std::fabs(in.W(j, d));
    for (std::int64_t i = 0; i < k.N; ++i)
      for (std::int64_t d = 0; d < k.D; ++d) colsum_E[d] += std::fabs(in.E(i, d));
    const double lse_error = tol.lse(lse_max, k.V);  // every probability's normalizer
    // dC_roundings: the training step on the Hopper kernels rounds both factors of dC's terms (the
    // kept exponentials, and the rows times G's row factors) to the input type (test_support.hpp).
    // Label smoothing without a softcap subtracts its rank-one term from gradients the kernels
    // already rounded to T: one more rounding, of a value below the term magnitudes (mag).
    const int after = tlse::impl::smoothing_by_vectors(o) ? 1 : 0;
    const auto check_gradients = [&](const std::string& how, const typename C::MatrixView& gE,
                                     const typename C::MatrixView& gC, const typename C::VectorView& gbias,
                                     int dC_roundings) {
      SCOPED_TRACE(how);
      expect_close("dE", to_host(gE), ref.dE.v, [&](std::size_t i) {
        return tol.grad(ref.dE.v[i], ref.dA_mag.v[i], k.V, lse_error, 1 + after) + eps * g_max * colsum_C[i % k.D];
      });
      expect_close("dC", to_host(gC), ref.dC.v, [&](std::size_t i) {
        return tol.grad(ref.dC.v[i], ref.dB_mag.v[i], k.N, lse_error, dC_roundings + after) +
               eps * g_max * colsum_E[i % k.D];
      });
      if (!in.bias.empty())
        expect_close("dbias", to_host(gbias), ref.dbias, [&](std::size_t j) {
          return tol.grad(ref.dbias[j], ref.dbias_mag[j], k.N, lse_error, 1 + after);
        });
    };
    check_gradients("cross_entropy_backward", dE, dC, dbias, 1);

    // The training step in one call: the same loss and gradients (on Hopper GPUs, for bf16 and
    // fp16, the forward's logits become the gradient; without filtering, so within the same bounds).
    typename C::AccView loss3("loss3", none ? k.N : 1);
    typename C::MatrixView dE3("dE3", k.N, k.D), dC3("dC3", k.V, k.D);
    typename C::VectorView dbias3("dbias3", in.bias.empty() ? 0 : k.V);
    Extras sx = bx;  // the step's: every extra
    PredictedView predicted3("predicted3", k.argmax ? k.N : 0);
    typename C::AccView accuracy3("accuracy3", k.argmax ? 1 : 0);
    sx.predicted = predicted3;
    sx.accuracy = accuracy3;
    tlse::cross_entropy_with_gradients(exec, E, Cm, bias, index_to_device<typename C::IndexView>(in.targets), dl, loss3,
                                       dE3, dC3, dbias3, sx, o);
    check_loss("loss of cross_entropy_with_gradients", loss3);
    check_gradients("cross_entropy_with_gradients", dE3, dC3, dbias3, 2);
    if (k.argmax) check_argmax(predicted3, accuracy3, ref, 2 * tol.lse(lse_max, k.V));
  }

  /// The predicted classes are the reference's, but where a row's two largest logits lie within
  /// `logit_error` of each other (either may win in the inputs' precision); -1 for ignored rows.
  /// The accuracy is that of the predicted classes.
  static void check_argmax(const PredictedView& predicted, const typename C::AccView& accuracy,
                           const tlse::testing::CrossEntropyReference& ref, double logit_error) {
    const auto got = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), predicted);
    std::int64_t hits = 0, scored = 0;
    for (std::size_t i = 0; i < ref.predicted.size(); ++i) {
      if (ref.predicted[i] < 0) {
        EXPECT_EQ(got(i), -1) << "predicted class of ignored row " << i;
        continue;
      }
      ++scored;
      if (ref.top_gap[i] > logit_error) {
        EXPECT_EQ(got(i), ref.predicted[i]) << "predicted class of row " << i;
      }
      hits += got(i) == ref.row_target[i] ? 1 : 0;
    }
    const double expected = scored ? double(hits) / double(scored) : 0.0;
    EXPECT_NEAR(to_host(accuracy)[0], expected, 1e-6) << "accuracy";
  }

  static double max_abs_finite(const std::vector<double>& v) {
    double m = 0;
    for (double x : v)
      if (std::isfinite(x)) m = std::max(m, std::fabs(x));
    return m;
  }
};
TYPED_TEST_SUITE(CrossEntropy, TLSE_TEST_CONFIGS, ConfigName);

tlse::CrossEntropyOptions exact() {
  tlse::CrossEntropyOptions o;
  o.filter_eps = 0;
  return o;
}

TYPED_TEST(CrossEntropy, MeanOverPrimeShapes) {
  TLSE_SEEDED(rng);
  this->check({61, 127, 37, exact()}, rng);
}

TYPED_TEST(CrossEntropy, SeveralTensorCoreTiles) {
  TLSE_SEEDED(rng);  // depth % 8 == 0: the CUDA tensor-core forward takes 16-bit inputs
  this->check({300, 1000, 72, exact()}, rng);
  auto o = exact();
  o.softcap = 20;
  this->check({129, 257, 8, o, 4.0, 0.3, true, true}, rng);
  // The softcap alone (no bias, no masks): on Hopper the forward's simple loops cap the logits.
  this->check({300, 1000, 72, o, 4.0, 0.1}, rng);
}

TYPED_TEST(CrossEntropy, Tf32Precision) {
  // Float inputs on CUDA take the TF32 tensor cores (checked at TF32 roundoff); elsewhere exact.
  if (!std::is_same<typename TestFixture::T, float>::value) GTEST_SKIP() << "Precision::tf32 concerns float";
  TLSE_SEEDED(rng);
  auto o = exact();
  o.precision = tlse::Precision::tf32;
  this->check({300, 1000, 72, o}, rng);
  o.softcap = 20;
  this->check({129, 257, 12, o, 4.0, 0.3, true, true}, rng);
  // On Hopper GPUs the backward's products run on wgmma with K-major copies: in one pass at the
  // default budget and in two under 4 MiB, with ignored rows and clustered classes (whole tiles
  // filtered, the columns in vocabulary order).
  CeCase k{700, 1500, 520, tlse::CrossEntropyOptions{}};
  k.o.precision = tlse::Precision::tf32;
  k.o.ignore_index = -1;
  k.ignore_fraction = 0.1;
  k.clusters = 2;
  this->check(k, rng);
  k.o.memory_budget = std::size_t(4) << 20;
  this->check(k, rng);
}

TYPED_TEST(CrossEntropy, ExactFloatChunksSplitsAndMasks) {
  // Exact float on CUDA runs the tile kernels with 3xTF32 products, with FFMA products under
  // TLSE_CUDA_EXACT_F32=ffma, or the generic kernels (docs/gpu.md); checked at float roundoff.
  // V = 70001: the dE pass runs 128-row chunks of G (64 MiB each) and splits the product's K;
  // depth 4 is the smallest the tile kernels take; then bias, -inf masks, ignored rows, softcap,
  // and whole tiles under the gradient filter.
  if (!std::is_same<typename TestFixture::T, float>::value) GTEST_SKIP() << "exact float32";
  TLSE_SEEDED(rng);
  this->check({300, 70001, 8, exact()}, rng);
  auto o = exact();
  o.softcap = 20;
  this->check({130, 513, 4, o, 4.0, 0.2, true, true}, rng);
  CeCase k{300, 1000, 32, tlse::CrossEntropyOptions{}};
  k.clusters = 2;
  this->check(k, rng);
}

TYPED_TEST(CrossEntropy, WideVocabularyManyTilesPerTeam) {
  TLSE_SEEDED(rng);  // more column tiles than a device holds teams: each team sweeps several
  this->check({100, 160000, 16, exact()}, rng);
  this->check({20, 70001, 136, exact()}, rng);
}

TYPED_TEST(CrossEntropy, SingleRowSingleClassUnitDepth) {
  TLSE_SEEDED(rng);
  this->check({1, 1, 1, exact()}, rng);
  this->check({1, 3, 1, exact()}, rng);
}

TYPED_TEST(CrossEntropy, DepthSweepOneTo2048) {
  TLSE_SEEDED(rng);
  for (std::int64_t D : {1, 2, 31, 33, 100, 2048}) {
    SCOPED_TRACE("D=" + std::to_string(D));
    this->check({19, 45, D, exact()}, rng);
  }
}

TYPED_TEST(CrossEntropy, EachReduction) {
  TLSE_SEEDED(rng);
  for (auto r : {tlse::Reduction::none, tlse::Reduction::sum, tlse::Reduction::mean}) {
    auto o = exact();
    o.reduction = r;
    SCOPED_TRACE("reduction " + std::to_string(int(r)));
    this->check({33, 70, 17, o, 4.0, 0.25}, rng);
  }
}

TYPED_TEST(CrossEntropy, BiasSoftcapZLossShift) {
  TLSE_SEEDED(rng);
  auto o = exact();
  o.softcap = 30;
  o.z_loss = 1e-4;
  o.shift = 1;
  this->check({40, 93, 24, o, 4.0, 0.1, true}, rng);
}

/// PyTorch's options: class weights (one class at 0), label smoothing, the argmax and a gradient
/// reaching the returned LSE, under each reduction, with ignored rows, a bias and a shift.
CeCase with_torch_options(std::int64_t N, std::int64_t V, std::int64_t D, tlse::Reduction reduction) {
  CeCase k{N, V, D, exact(), 4.0, 0.2, true};
  k.o.reduction = reduction;
  k.o.label_smoothing = 0.1;
  k.o.ignore_index = -1;
  k.o.shift = 1;
  k.class_weights = k.dlse = k.argmax = true;
  return k;
}

TYPED_TEST(CrossEntropy, ClassWeightsLabelSmoothingArgmaxAndDlse) {
  TLSE_SEEDED(rng);
  for (auto r : {tlse::Reduction::none, tlse::Reduction::sum, tlse::Reduction::mean}) {
    SCOPED_TRACE("reduction " + std::to_string(int(r)));
    this->check(with_torch_options(61, 127, 37, r), rng);
  }
  // Tensor-core shapes (depth % 8 == 0), a z-loss too; the default gradient filter.
  auto k = with_torch_options(300, 1000, 72, tlse::Reduction::mean);
  k.o.z_loss = 1e-4;
  this->check(k, rng);
  k.o.filter_eps = tlse::filter_eps_auto;
  k.clusters = 2;
  this->check(k, rng);
  // Each option alone.
  for (int option = 0; option < 4; ++option) {
    SCOPED_TRACE("option " + std::to_string(option));
    CeCase one{150, 300, 24, exact(), 4.0, 0.1};
    one.o.ignore_index = -1;
    if (option == 0) one.class_weights = true;
    if (option == 1) one.o.label_smoothing = 0.25;
    if (option == 2) one.argmax = true;
    if (option == 3) one.dlse = true;
    this->check(one, rng);
  }
}

TYPED_TEST(CrossEntropy, LabelSmoothingUnderASoftcap) {
  TLSE_SEEDED(rng);  // the smoothing term per entry (dx/dz varies): the tile kernels take it
  auto k = with_torch_options(129, 257, 8, tlse::Reduction::mean);
  k.o.softcap = 20;
  this->check(k, rng);
  k.o.label_smoothing = 1;  // the uniform distribution alone
  k.o.reduction = tlse::Reduction::none;
  this->check(k, rng);
}

TYPED_TEST(CrossEntropy, ArgmaxTiesGoToTheLowestClass) {
  using C = TypeParam;
  TLSE_SEEDED(rng);
  // Every class row equal: every logit of a row ties, the argmax is class 0; then classes 3 and 7
  // made the largest and equal: class 3. Exact in every type (small integers).
  const std::int64_t N = 40, V = 300, D = 8;
  Matrix Eh(N, D), Ch(V, D);
  for (std::int64_t i = 0; i < N; ++i) Eh(i, i % D) = 1;
  for (std::int64_t j = 0; j < V; ++j)
    for (std::int64_t d = 0; d < D; ++d) Ch(j, d) = 1;
  std::vector<std::int64_t> t(N);
  for (auto& x : t) x = std::int64_t(rng() % V);
  for (const bool raised : {false, true}) {
    if (raised)
      for (std::int64_t d = 0; d < D; ++d) Ch(3, d) = Ch(7, d) = 2;
    typename C::AccView loss("loss", 1), lse("lse", N), accuracy("accuracy", 1);
    Kokkos::View<std::int64_t*, typename C::Mem> predicted("predicted", N);
    tlse::CrossEntropyExtras<typename C::Acc, typename C::Mem> x;
    x.predicted = predicted;
    x.accuracy = accuracy;
    typename C::Exec exec;
    tlse::cross_entropy(exec, to_device<C>(Eh), to_device<C>(Ch), typename C::VectorView(),
                        index_to_device<typename C::IndexView>(t), loss, lse, typename C::IntView(), x, exact());
    const auto got = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), predicted);
    double hits = 0;
    for (std::int64_t i = 0; i < N; ++i) {
      EXPECT_EQ(got(i), raised ? 3 : 0) << "row " << i;
      hits += t[i] == (raised ? 3 : 0);
    }
    EXPECT_NEAR(to_host(accuracy)[0], hits / double(N), 1e-6);
  }
}

TYPED_TEST(CrossEntropy, ZLossFromTheReturnedLseEqualsTheOption) {
  // CCE's recipe: loss + z * mean(lse^2) over the scored rows, its gradient reaching the LSE as
  // dlse = 2 z lse / scored (times the upstream gradient), must equal z_loss = z in value and
  // gradient; under each reduction (none: dlse_i = 2 z lse_i dloss_i).
  using C = TypeParam;
  using Acc = typename C::Acc;
  TLSE_SEEDED(rng);
  const std::int64_t N = 150, V = 300, D = 24;
  const double z = 1e-2;
  const Matrix Eh = random_matrix<typename C::Scalar>(rng, N, D),
               Ch = random_matrix<typename C::Scalar>(rng, V, D, 0.8);
  auto E = to_device<C>(Eh), Cm = to_device<C>(Ch);
  std::vector<std::int64_t> t(N);
  std::int64_t scored = 0;
  for (auto& x : t) x = rng() % 5 == 0 ? -100 : std::int64_t(rng() % V), scored += x >= 0;
  const auto targets = index_to_device<typename C::IndexView>(t);
  typename C::VectorView nobias;
  typename C::IntView none;
  typename C::Exec exec;
  for (auto reduction : {tlse::Reduction::none, tlse::Reduction::sum, tlse::Reduction::mean}) {
    SCOPED_TRACE("reduction " + std::to_string(int(reduction)));
    const bool per_row = reduction == tlse::Reduction::none;
    const std::int64_t n_loss = per_row ? N : 1;
    auto o = exact();
    o.reduction = reduction;
    std::vector<double> up(n_loss);
    for (auto& v : up) v = representable<Acc>(0.5 + double(rng() % 100) / 100);
    const auto dloss = vector_to_device<typename C::AccView>(up, "dloss");
    // With the option.
    auto oz = o;
    oz.z_loss = z;
    typename C::AccView loss_z("loss_z", n_loss), lse("lse", N);
    tlse::cross_entropy(exec, E, Cm, nobias, targets, loss_z, lse, none, oz);
    typename C::MatrixView dE_z("dE_z", N, D), dC_z("dC_z", V, D);
    tlse::cross_entropy_backward(exec, E, Cm, nobias, targets, lse, none, dloss, dE_z, dC_z, nobias, oz);
    // From the returned LSE.
    typename C::AccView loss("loss", n_loss), lse2("lse2", N);
    tlse::cross_entropy(exec, E, Cm, nobias, targets, loss, lse2, none, o);
    const auto l = to_host(lse2);
    std::vector<double> dl(N), from_lse(n_loss, 0.0);
    const double per = reduction == tlse::Reduction::mean ? 1.0 / double(scored) : 1.0;
    for (std::int64_t i = 0; i < N; ++i) {
      dl[i] = representable<Acc>(2 * z * l[i] * per * up[per_row ? i : 0]);
      from_lse[per_row ? i : 0] += z * l[i] * l[i] * per;  // l = 0 on ignored rows
    }
    tlse::CrossEntropyExtras<Acc, typename C::Mem> x;
    x.dlse = vector_to_device<typename C::AccView>(dl, "dlse");
    typename C::MatrixView dE("dE", N, D), dC("dC", V, D);
    tlse::cross_entropy_backward(exec, E, Cm, nobias, targets, lse2, none, dloss, dE, dC, nobias, x, o);
    const auto with_option = to_host(loss_z), plain = to_host(loss);
    for (std::int64_t i = 0; i < n_loss; ++i)
      EXPECT_NEAR(with_option[i], plain[i] + from_lse[i], 1e-5 * (std::fabs(with_option[i]) + 1)) << "loss " << i;
    // The same coefficients up to the rounding of dlse to Acc and of the gradients to T.
    const double u_out = sizeof(typename C::Scalar) == 2 ? 1.0 / 128 : 1e-5;
    const auto a = to_host(dE_z), b = to_host(dE), c = to_host(dC_z), d = to_host(dC);
    const double scale_E = max_abs(a) + 1e-30, scale_C = max_abs(c) + 1e-30;
    for (std::size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], u_out * scale_E) << "dE " << i;
    for (std::size_t i = 0; i < c.size(); ++i) EXPECT_NEAR(c[i], d[i], u_out * scale_C) << "dC " << i;
  }
}

TYPED_TEST(CrossEntropy, TrainingStepInChunksOfRows) {
  TLSE_SEEDED(rng);
  // On Hopper GPUs (bf16, fp16) an 11 MiB budget holds the kept exponentials (16-bit) of chunks of 3200
  // rows, not of all 4000 or so scored rows: the step runs in two chunks (the last one partial)
  // through the fp32 dC accumulator, with a vocabulary that is no multiple of 8 (padded rows).
  // Elsewhere: the two calls.
  auto o = exact();
  o.memory_budget = std::size_t(11) << 20;
  o.ignore_index = -1;
  this->check({4500, 999, 72, o, 4.0, 0.1}, rng);
}

TYPED_TEST(CrossEntropy, TrainingStepSplitsTheRowsProductOfManyTiles) {
  // On Hopper GPUs (bf16, fp16) the step's dA = G B over every column has 134 or so output tiles here
  // (about 17100 scored rows of depth 72, gathered through the row index), more than an H100's or
  // H200's 132 SMs: StepPlan takes that product in two K splits, summed through the output's row
  // index (the host test HopperStepPlan checks the choice). Only there: the reference of 19000
  // rows takes seconds, and elsewhere the step is the two calls other tests check.
  if (sizeof(typename TestFixture::T) != 2 || std::string(TypeParam::Exec::name()) != "Cuda")
    GTEST_SKIP() << "concerns the training step on Hopper GPUs (CUDA, bf16 or fp16)";
  TLSE_SEEDED(rng);
  auto o = exact();
  o.ignore_index = -1;
  this->check({19000, 999, 72, o, 4.0, 0.1}, rng);
}

TYPED_TEST(CrossEntropy, TrainingStepKeepsAPartOfTheColumns) {
  TLSE_SEEDED(rng);
  // On Hopper GPUs (bf16, fp16) a 3 MiB budget holds no chunk of the step's exponentials (150 x 12001
  // 16-bit: 3.6 MB) but the fused backward's buffers: the step keeps the exponentials of the first
  // 8960 columns in 5 panels of 1792 in dC's storage and of one more panel in its workspace (the
  // host test HopperKeptColumnsPlan checks that plan), and recomputes the other columns. Without
  // a softcap (G = diag(c) E'), with rows whose largest logit lies far above their target's
  // (logits of std 30: parts under their own max, rescaled), and with a softcap and a z-loss (G
  // formed in place); the last two with a fifth of the rows ignored (every stored row swept, the
  // ignored ones of weight 0). Then, on CUDA, 260 x 9001 x 72, whose dC holds one panel of 1792
  // and the workspace three more. Elsewhere: the two calls.
  auto o = exact();
  o.memory_budget = std::size_t(3) << 20;
  {
    SCOPED_TRACE("logit std 4");
    this->check({150, 12001, 136, o}, rng);
  }
  o.ignore_index = -1;
  {
    SCOPED_TRACE("logit std 30, ignored rows");
    this->check({150, 12001, 136, o, 30.0, 0.2}, rng);
  }
  o.softcap = 20;
  o.z_loss = 1e-4;
  {
    SCOPED_TRACE("softcap 20, z-loss, ignored rows");
    this->check({150, 12001, 136, o, 4.0, 0.2}, rng);
  }
  if (std::string(TypeParam::Exec::name()) != "Cuda") return;  // elsewhere the two calls, as above
  o.softcap = 0;
  SCOPED_TRACE("three panels in the workspace, z-loss, ignored rows");
  this->check({260, 9001, 72, o, 4.0, 0.1}, rng);
}

/// The budget tests' filtered case: the default filter, a tenth of the rows ignored, and the
/// classes in two clusters (whole tiles filtered; make_inputs), under `budget` bytes.
CeCase filtered_under_budget(std::int64_t N, std::int64_t V, std::int64_t D, std::size_t budget) {
  CeCase k{N, V, D, tlse::CrossEntropyOptions{}};
  k.o.memory_budget = budget;
  k.o.ignore_index = -1;
  k.ignore_fraction = 0.1;
  k.clusters = 2;
  return k;
}

/// The budget tests' exact case: no filtering, a bias, under `budget` bytes.
CeCase exact_with_bias_under_budget(std::int64_t N, std::int64_t V, std::int64_t D, std::size_t budget) {
  CeCase k{N, V, D, exact(), 4.0, 0.0, true};
  k.o.memory_budget = budget;
  return k;
}

TYPED_TEST(CrossEntropy, BackwardInTwoPassesUnderASmallBudget) {
  TLSE_SEEDED(rng);
  // On Hopper GPUs (bf16, fp16) 1 MiB does not hold the fused backward's 700 x 520 fp32 accumulator:
  // the backward runs in two passes (row panels against every column in id order, then column
  // panels in the forward's vocabulary order), here with ignored rows, clustered classes (whole
  // tiles filtered in both passes) and, exact, with a bias. Elsewhere: the same calls on the
  // other kernels.
  this->check(filtered_under_budget(700, 1500, 520, std::size_t(1) << 20), rng);
  this->check(exact_with_bias_under_budget(700, 1500, 520, std::size_t(1) << 20), rng);
}

TYPED_TEST(CrossEntropy, ExactFloatBackwardInChunksOfRows) {
  // Exact float on CUDA runs the whole backward as one pass owning the rows when its buffers fit
  // the budget (mma/backward.hpp, run_fused): 8 MiB holds chunks of 128 of these 700 rows, each
  // adding its G^T E_chunk into dC, with ignored rows and whole tiles filtered in both products
  // (clustered classes, in vocabulary order). With a bias, the two passes (dbias).
  if (!std::is_same<typename TestFixture::T, float>::value) GTEST_SKIP() << "exact float32";
  TLSE_SEEDED(rng);
  this->check(filtered_under_budget(700, 1500, 520, std::size_t(8) << 20), rng);
  this->check(exact_with_bias_under_budget(700, 1500, 520, std::size_t(8) << 20), rng);
}

TYPED_TEST(CrossEntropy, BackwardInKBlocksUnderATinyBudget) {
  if (tlse::impl::is_host_space<typename TypeParam::Exec>())
    GTEST_SKIP() << "the host's backward plans no budget: the other cases cover its kernels";
  TLSE_SEEDED(rng);
  // On Hopper GPUs (bf16, fp16) 416 KiB holds the two passes of 700 rows x 1500 classes x 136 only with
  // K blocks (H200: column panels over blocks of 256 rows, row panels over blocks of 512 classes),
  // and 1 MiB those of 700 x 6000 x 64 (blocks of 384 rows and of 3072 classes: each column
  // panel's dC summed over two blocks in fp32 and written through the vocabulary order); 1752
  // KiB holds one pass for 1000 x 8000 x 64 only with K blocks (the accumulator, column panels of
  // 768 over blocks of 256 rows; HopperPlan.OnePassInKBlocksWhereItsModelWins pins that plan);
  // with ignored rows, clustered classes (filtered tiles) and, exact, a bias. Other GPUs run the
  // same calls on their kernels; the host's backward plans no budget.
  this->check(filtered_under_budget(700, 1500, 136, std::size_t(416) << 10), rng);
  this->check(filtered_under_budget(700, 6000, 64, std::size_t(1) << 20), rng);
  this->check(filtered_under_budget(1000, 8000, 64, std::size_t(1752) << 10), rng);
  this->check(exact_with_bias_under_budget(700, 1500, 136, std::size_t(416) << 10), rng);
}

TYPED_TEST(CrossEntropy, ShiftLongerThanBatchIgnoresEverything) {
  TLSE_SEEDED(rng);
  auto o = exact();
  o.shift = 50;
  this->check({7, 20, 8, o}, rng);
}

TYPED_TEST(CrossEntropy, MostlyAndAllIgnored) {
  TLSE_SEEDED(rng);
  this->check({97, 50, 16, exact(), 4.0, 0.95}, rng);
  this->check({45, 50, 16, exact(), 4.0, 1.0}, rng);  // mean over no rows: loss 0, grads 0
  auto o = exact();
  o.ignore_index = -1;
  o.reduction = tlse::Reduction::none;
  this->check({45, 50, 16, o, 4.0, 0.5, false, false, true}, rng);
}

TYPED_TEST(CrossEntropy, ExtremeLogitsNear1e4) {
  TLSE_SEEDED(rng);
  // logit std 1e4 at depth 8: entries near +-1e4, a fully saturated softmax.
  this->check({29, 41, 8, exact(), 1e4}, rng);
}

TYPED_TEST(CrossEntropy, NegativeInfinityMasks) {
  TLSE_SEEDED(rng);
  this->check({31, 64, 12, exact(), 4.0, 0.0, false, true}, rng);
}

TYPED_TEST(CrossEntropy, DefaultGradientFilterStaysWithinBound) {
  TLSE_SEEDED(rng);
  this->check({70, 300, 32, tlse::CrossEntropyOptions{} /* filter_eps_auto */, 6.0, 0.1, true}, rng);
}

TYPED_TEST(CrossEntropy, GradientFilterSkipsWholeTilesWithinBound) {
  TLSE_SEEDED(rng);  // clustered: off-cluster tiles (128 x 128 on tensor cores) are all filtered
  tlse::CrossEntropyOptions o;
  CeCase k{300, 1000, 32, o};
  k.clusters = 2;
  this->check(k, rng);
  k.o.ignore_index = -1;  // ignored rows and the filter together
  k.ignore_fraction = 0.3;
  this->check(k, rng);
}

TYPED_TEST(CrossEntropy, VocabularyOrderDoesNotChangeTheResult) {
  using C = TypeParam;
  TLSE_SEEDED(rng);
  // Depth 20 stays on the generic kernels; depth 24 takes the CUDA tensor cores for 16-bit inputs.
  for (const auto shape : {std::array<std::int64_t, 3>{50, 111, 20}, std::array<std::int64_t, 3>{150, 300, 24}}) {
    const std::int64_t N = shape[0], V = shape[1], D = shape[2];
    const Matrix Eh = random_matrix<typename C::Scalar>(rng, N, D), Ch = random_matrix<typename C::Scalar>(rng, V, D);
    auto E = to_device<C>(Eh, "E");
    auto Cm = to_device<C>(Ch, "C");
    std::vector<int> t(N);
    for (auto& x : t) x = int(rng() % V);
    auto targets = index_to_device<typename C::IntView>(t);
    typename C::AccView loss("loss", 1), lse("lse", N), dloss("dloss", 1);
    typename C::IntView order("order", V), none;
    Kokkos::deep_copy(dloss, 1);
    typename C::VectorView nobias;
    auto o = exact();
    typename C::Exec exec;
    tlse::cross_entropy(exec, E, Cm, nobias, targets, loss, lse, order, o);
    typename C::MatrixView dE1("dE1", N, D), dC1("dC1", V, D), dE2("dE2", N, D), dC2("dC2", V, D);
    tlse::cross_entropy_backward(exec, E, Cm, nobias, targets, lse, order, dloss, dE1, dC1, nobias, o);
    tlse::cross_entropy_backward(exec, E, Cm, nobias, targets, lse, none, dloss, dE2, dC2, nobias, o);
    // dC rows are summed over the same rows in the same order: bitwise equal. dE sums classes
    // in another order: equal up to rounding.
    EXPECT_EQ(to_host(dC1), to_host(dC2)) << "V " << V;
    const auto a = to_host(dE1), b = to_host(dE2);
    for (std::size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-2 * (std::fabs(b[i]) + 1e-3)) << i;
    // The order is a permutation sorted by decreasing logit sum (the likeliest classes first),
    // up to the sums' rounding: fp32 accumulation of N exact products of rounded inputs.
    std::vector<double> sum(V, 0.0), mag(V, 0.0);
    for (std::int64_t i = 0; i < N; ++i)
      for (std::int64_t j = 0; j < V; ++j) {
        double x = 0, m = 0;
        for (std::int64_t d = 0; d < D; ++d) x += Eh(i, d) * Ch(j, d), m += std::fabs(Eh(i, d) * Ch(j, d));
        sum[j] += x, mag[j] += m;
      }
    const auto h = to_host(order);
    std::vector<double> sorted = h;
    std::sort(sorted.begin(), sorted.end());
    for (std::int64_t j = 0; j < V; ++j) ASSERT_EQ(sorted[j], double(j));
    for (std::int64_t j = 0; j + 1 < V; ++j) {
      const int p = int(h[j]), q = int(h[j + 1]);
      EXPECT_GE(sum[p], sum[q] - 1e-5 * (mag[p] + mag[q])) << "classes " << p << ", " << q << " at " << j;
    }
  }
}

// The vocabulary sort on the execution space (on a GPU a bitonic network whose comparators past
// V are skipped) gives exactly std::sort's order under vocab_before: sums with many ties, both
// infinities and NaN, sizes that are no power of 2 (one above 2^16 included).
TYPED_TEST(CrossEntropy, VocabularySortMatchesHostSort) {
  using C = TypeParam;
  using Acc = typename C::Acc;
  TLSE_SEEDED(rng);
  for (const std::int64_t V : {1, 2, 3, 1000, 70001}) {
    std::vector<Acc> sums(static_cast<std::size_t>(V));
    for (Acc& s : sums) {
      const int r = int(rng() % 40);
      s = r == 0   ? -std::numeric_limits<Acc>::infinity()
          : r == 1 ? std::numeric_limits<Acc>::infinity()
          : r == 2 ? std::numeric_limits<Acc>::quiet_NaN()
                   : Acc(r % 8) - Acc(3.5);  // 8 values: ties everywhere
    }
    typename C::AccView keys("keys", V);
    Kokkos::deep_copy(keys, Kokkos::View<const Acc*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>(
                                sums.data(), std::size_t(V)));
    typename C::IntView order("order", V);
    typename C::Exec exec;
    tlse::impl::sort_vocabulary(exec, keys.data(), V, order);
    exec.fence();
    std::vector<int> expected(static_cast<std::size_t>(V));
    std::iota(expected.begin(), expected.end(), 0);
    std::sort(expected.begin(), expected.end(),
              [&](int a, int b) { return tlse::impl::vocab_before(sums[std::size_t(a)], a, sums[std::size_t(b)], b); });
    const auto got = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), order);
    for (std::int64_t j = 0; j < V; ++j) ASSERT_EQ(got(j), expected[std::size_t(j)]) << "V " << V << " at " << j;
  }
}

TYPED_TEST(CrossEntropy, BitwiseDeterministic) {
  using C = TypeParam;
  TLSE_SEEDED(rng);
  const std::int64_t N = 77, V = 130, D = 45;
  auto E = to_device<C>(random_matrix<typename C::Scalar>(rng, N, D), "E");
  auto Cm = to_device<C>(random_matrix<typename C::Scalar>(rng, V, D, 0.7), "C");
  std::vector<std::int64_t> t(N);
  for (auto& x : t) x = std::int64_t(rng() % V);
  auto targets = index_to_device<typename C::IndexView>(t);
  typename C::VectorView nobias;
  typename C::Exec exec;
  auto run = [&] {
    typename C::AccView loss("loss", 1), lse("lse", N), dloss("dloss", 1);
    typename C::IntView order("order", V);
    Kokkos::deep_copy(dloss, 1);
    typename C::MatrixView dE("dE", N, D), dC("dC", V, D);
    tlse::CrossEntropyOptions o;
    tlse::cross_entropy(exec, E, Cm, nobias, targets, loss, lse, order, o);
    tlse::cross_entropy_backward(exec, E, Cm, nobias, targets, lse, order, dloss, dE, dC, nobias, o);
    return std::vector<std::vector<double>>{to_host(loss), to_host(lse), to_host(dE), to_host(dC)};
  };
  const auto first = run(), second = run();
  for (std::size_t k = 0; k < first.size(); ++k)
    EXPECT_EQ(0, std::memcmp(first[k].data(), second[k].data(), first[k].size() * sizeof(double))) << k;
}

TYPED_TEST(CrossEntropy, AccumulateAddsToExistingGradients) {
  using C = TypeParam;
  using T = typename C::Scalar;
  if (!std::is_same<T, double>::value) GTEST_SKIP() << "checked exactly in double";
  TLSE_SEEDED(rng);
  const std::int64_t N = 23, V = 40, D = 9;
  const Matrix Eh = random_matrix<T>(rng, N, D), Ch = random_matrix<T>(rng, V, D);
  auto E = to_device<C>(Eh, "E");
  auto Cm = to_device<C>(Ch, "C");
  std::vector<std::int64_t> t(N);
  for (auto& x : t) x = std::int64_t(rng() % V);
  auto targets = index_to_device<typename C::IndexView>(t);
  typename C::VectorView nobias;
  typename C::IntView none;
  typename C::AccView loss("loss", 1), lse("lse", N), dloss("dloss", 1);
  Kokkos::deep_copy(dloss, 1);
  typename C::Exec exec;
  auto o = exact();
  tlse::cross_entropy(exec, E, Cm, nobias, targets, loss, lse, none, o);
  auto dE = to_device<C>(Eh, "dE");  // start from E itself
  o.accumulate = true;
  tlse::cross_entropy_backward(exec, E, Cm, nobias, targets, lse, none, dloss, dE, typename C::MatrixView(), nobias, o);
  const auto ref = tlse::testing::cross_entropy_reference(Eh, Ch, {}, t, o, {1.0});
  const auto got = to_host(dE);
  for (std::size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], Eh.v[i] + ref.dE.v[i], 1e-12) << i;
}

TYPED_TEST(CrossEntropy, FiniteDifferenceSpotCheck) {
  using C = TypeParam;
  using T = typename C::Scalar;
  if (!std::is_same<T, double>::value) GTEST_SKIP() << "finite differences need float64";
  TLSE_SEEDED(rng);
  const std::int64_t N = 11, V = 29, D = 7;
  Matrix Eh = random_matrix<T>(rng, N, D), Ch = random_matrix<T>(rng, V, D);
  std::vector<std::int64_t> t(N);
  for (auto& x : t) x = std::int64_t(rng() % V);
  auto targets = index_to_device<typename C::IndexView>(t);
  typename C::VectorView nobias;
  typename C::IntView none;
  typename C::Exec exec;
  auto o = exact();
  o.softcap = 5;
  o.z_loss = 0.01;
  auto loss_at = [&](const Matrix& e, const Matrix& c) {
    typename C::AccView loss("loss", 1), lse("lse", N);
    tlse::cross_entropy(exec, to_device<C>(e), to_device<C>(c), nobias, targets, loss, lse, none, o);
    return to_host(loss)[0];
  };
  typename C::AccView loss("loss", 1), lse("lse", N), dloss("dloss", 1);
  Kokkos::deep_copy(dloss, 1);
  auto E = to_device<C>(Eh), Cm = to_device<C>(Ch);
  tlse::cross_entropy(exec, E, Cm, nobias, targets, loss, lse, none, o);
  typename C::MatrixView dE("dE", N, D), dC("dC", V, D);
  tlse::cross_entropy_backward(exec, E, Cm, nobias, targets, lse, none, dloss, dE, dC, nobias, o);
  const auto gE = to_host(dE), gC = to_host(dC);
  const double h = 1e-6;
  for (int trial = 0; trial < 5; ++trial) {
    const std::int64_t i = rng() % N, j = rng() % V, d = rng() % D;
    Matrix ep = Eh, em = Eh, cp = Ch, cm = Ch;
    ep(i, d) += h, em(i, d) -= h, cp(j, d) += h, cm(j, d) -= h;
    EXPECT_NEAR(gE[i * D + d], (loss_at(ep, Ch) - loss_at(em, Ch)) / (2 * h), 1e-6);
    EXPECT_NEAR(gC[j * D + d], (loss_at(Eh, cp) - loss_at(Eh, cm)) / (2 * h), 1e-6);
  }
}

}  // namespace
