// Every documented bad input raises std::invalid_argument naming the argument and the values,
// and leaves every output exactly as it was.
#include "test_support.hpp"

namespace {
using namespace tlse::test;
using C = Config<Kokkos::DefaultHostExecutionSpace, float>;
using Exec = C::Exec;
constexpr float sentinel = 1234.5f;

/// Runs `call`, expects std::invalid_argument whose message contains every `needle`.
template <class F>
void expect_rejected(F call, std::initializer_list<const char*> needles) {
  try {
    call();
    ADD_FAILURE() << "no exception";
  } catch (const std::invalid_argument& e) {
    for (const char* n : needles)
      EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what() << "\nmissing: " << n;
  }
}
template <class V>
void fill_sentinel(const V& v) {
  Kokkos::deep_copy(v, sentinel);
}
template <class V>
void expect_untouched(const V& v, const char* name) {
  for (double x : to_host(v)) ASSERT_EQ(x, double(sentinel)) << name << " was written";
}

struct CeFixture : ::testing::Test {
  std::mt19937_64 rng{42};
  const std::int64_t N = 10, V = 20, D = 6;
  C::MatrixView E = to_device<C>(random_matrix<float>(rng, N, D)), Cm = to_device<C>(random_matrix<float>(rng, V, D));
  C::IndexView targets{"t", std::size_t(N)};
  C::AccView loss{"loss", 1}, lse{"lse", std::size_t(N)}, dloss{"dloss", 1};
  C::IntView order{"order", std::size_t(V)};
  C::VectorView nobias;
  C::MatrixView dE{"dE", std::size_t(N), std::size_t(D)}, dC{"dC", std::size_t(V), std::size_t(D)};
  void SetUp() override {
    Kokkos::deep_copy(targets, 3);
    for (auto v : {loss, lse}) fill_sentinel(v);
    fill_sentinel(dE);
    fill_sentinel(dC);
    Kokkos::deep_copy(order, -7);
  }
  void forward(const tlse::CrossEntropyOptions& o = {}) {
    tlse::cross_entropy(Exec(), E, Cm, nobias, targets, loss, lse, order, o);
  }
  void untouched() {
    expect_untouched(loss, "loss");
    expect_untouched(lse, "lse");
    for (double x : to_host(order)) ASSERT_EQ(x, -7.0);
  }
};

TEST_F(CeFixture, TargetOutOfRangeNamesIndexAndValue) {
  Kokkos::deep_copy(Kokkos::subview(targets, 7), 20);
  expect_rejected([&] { forward(); },
                  {"tlse::cross_entropy", "'targets'", "targets[7] = 20", "[0, 20)", "ignore_index (-100)"});
  untouched();
  Kokkos::deep_copy(Kokkos::subview(targets, 7), -5);
  expect_rejected([&] { forward(); }, {"targets[7] = -5"});
  untouched();
}

TEST_F(CeFixture, TargetOutOfRangeInBackward) {
  Kokkos::deep_copy(Kokkos::subview(targets, 2), 99);
  expect_rejected(
      [&] { tlse::cross_entropy_backward(Exec(), E, Cm, nobias, targets, lse, order, dloss, dE, dC, nobias); },
      {"tlse::cross_entropy_backward", "targets[2] = 99"});
  expect_untouched(dE, "dE");
  expect_untouched(dC, "dC");
}

TEST_F(CeFixture, FeatureDimensionMismatch) {
  C::MatrixView C7("C7", V, D + 1);
  expect_rejected([&] { tlse::cross_entropy(Exec(), E, C7, nobias, targets, loss, lse, order); },
                  {"'C'", "7 columns", "'E' has 6"});
  untouched();
}

TEST_F(CeFixture, TargetsOfWrongLength) {
  C::IndexView t("t", N - 1);
  expect_rejected([&] { tlse::cross_entropy(Exec(), E, Cm, nobias, t, loss, lse, order); },
                  {"'targets'", "extent 9", "10"});
  untouched();
}

TEST_F(CeFixture, LossExtentMustFollowReduction) {
  tlse::CrossEntropyOptions o;
  o.reduction = tlse::Reduction::none;
  expect_rejected([&] { forward(o); }, {"'loss'", "extent 1", "Reduction::none", "10"});
  untouched();
}

TEST_F(CeFixture, BadOptionValues) {
  tlse::CrossEntropyOptions o;
  o.shift = -1;
  expect_rejected([&] { forward(o); }, {"'shift'", "-1"});
  o = {};
  o.softcap = -2;
  expect_rejected([&] { forward(o); }, {"'softcap'", "-2"});
  o = {};
  o.z_loss = NAN;
  expect_rejected([&] { forward(o); }, {"'z_loss'", "nan"});
  o = {};
  o.ignore_index = 4;
  expect_rejected([&] { forward(o); }, {"'ignore_index'", "4"});
  o = {};
  o.filter_eps = 2;
  expect_rejected([&] { forward(o); }, {"'filter_eps'", "2"});
  untouched();
}

TEST_F(CeFixture, LabelSmoothingOutsideZeroToOne) {
  for (double bad : {-0.1, 1.5, std::nan("")}) {
    tlse::CrossEntropyOptions o;
    o.label_smoothing = bad;
    expect_rejected([&] { forward(o); }, {"tlse::cross_entropy", "'label_smoothing'", "must be in [0, 1]"});
    untouched();
  }
}

TEST_F(CeFixture, ClassWeightsOfWrongShapeOrValue) {
  using Extras = tlse::CrossEntropyExtras<float, C::Mem>;
  C::AccView short_weight("w", V - 1);
  Kokkos::deep_copy(short_weight, 1);
  Extras x;
  x.class_weight = short_weight;
  expect_rejected([&] { tlse::cross_entropy(Exec(), E, Cm, nobias, targets, loss, lse, order, x); },
                  {"'class_weight'", "extent 19", "needs 20"});
  untouched();
  for (float bad : {-1.0f, std::nanf(""), INFINITY}) {
    C::AccView weight("w", V);
    Kokkos::deep_copy(weight, 1);
    Kokkos::deep_copy(Kokkos::subview(weight, 4), bad);
    x.class_weight = weight;
    expect_rejected([&] { tlse::cross_entropy(Exec(), E, Cm, nobias, targets, loss, lse, order, x); },
                    {"'class_weight'", "class_weight[4] = ", "finite and >= 0"});
    untouched();
    expect_rejected(
        [&] { tlse::cross_entropy_backward(Exec(), E, Cm, nobias, targets, lse, order, dloss, dE, dC, nobias, x); },
        {"tlse::cross_entropy_backward", "class_weight[4]"});
    expect_untouched(dE, "dE");
    expect_untouched(dC, "dC");
  }
}

TEST_F(CeFixture, ExtrasOfTheWrongShapeOrCall) {
  using Extras = tlse::CrossEntropyExtras<float, C::Mem>;
  C::AccView dlse("dlse", N + 1), accuracy("accuracy", 2);
  Kokkos::View<std::int64_t*, C::Mem> predicted("predicted", N);
  Extras backward_only;
  backward_only.dlse = dlse;
  expect_rejected([&] { tlse::cross_entropy(Exec(), E, Cm, nobias, targets, loss, lse, order, backward_only); },
                  {"'dlse'", "input of the backward"});
  untouched();
  expect_rejected([&] {
    tlse::cross_entropy_backward(Exec(), E, Cm, nobias, targets, lse, order, dloss, dE, dC, nobias, backward_only);
  }, {"'dlse'", "extent 11", "needs 10"});
  expect_untouched(dE, "dE");
  Extras forward_only;
  forward_only.predicted = predicted;
  expect_rejected([&] {
    tlse::cross_entropy_backward(Exec(), E, Cm, nobias, targets, lse, order, dloss, dE, dC, nobias, forward_only);
  }, {"'predicted'", "output of the forward"});
  expect_untouched(dE, "dE");
  expect_untouched(dC, "dC");
  Extras two_accuracies;
  two_accuracies.accuracy = accuracy;
  expect_rejected([&] { tlse::cross_entropy(Exec(), E, Cm, nobias, targets, loss, lse, order, two_accuracies); },
                  {"'accuracy'", "extent 2"});
  untouched();
}

TEST_F(CeFixture, NonFiniteDetectedOnRequestOnly) {
  Kokkos::deep_copy(Kokkos::subview(E, 4, 2), NAN);
  tlse::CrossEntropyOptions o;
  o.non_finite = tlse::NonFinite::detect;
  expect_rejected([&] { forward(o); }, {"'E'", "NaN or Inf", "row 4, column 2"});
  untouched();
  forward();  // propagate: the row's loss is NaN, and so is the mean
  EXPECT_TRUE(std::isnan(to_host(loss)[0]));
}

TEST_F(CeFixture, StridedAndColumnMajorViewsAreRejected) {
  C::MatrixView wide("wide", N, 2 * D);
  auto strided = Kokkos::subview(wide, Kokkos::ALL, std::make_pair(std::int64_t(0), D));
  expect_rejected([&] { tlse::cross_entropy(Exec(), strided, Cm, nobias, targets, loss, lse, order); },
                  {"'E'", "row-major contiguous", "strides are (12, 1)"});
  Kokkos::View<float**, Kokkos::LayoutLeft, Kokkos::HostSpace> left("left", N, D);
  expect_rejected([&] { tlse::cross_entropy(Exec(), left, Cm, nobias, targets, loss, lse, order); },
                  {"'E'", "strides are (1, 10)"});
  untouched();
}

TEST_F(CeFixture, WorkspaceTooSmall) {
  std::vector<char> small(64);
  tlse::CrossEntropyOptions o;
  o.workspace = {small.data(), small.size()};
  expect_rejected([&] { forward(o); }, {"'workspace'", "holds 64 bytes", "needs"});
  untouched();
  // Exactly the advertised size works.
  std::vector<char> ws(tlse::cross_entropy_workspace_bytes(Exec(), E, Cm, o));
  o.workspace = {ws.data(), ws.size()};
  forward(o);
  EXPECT_TRUE(std::isfinite(to_host(loss)[0]));
}

TEST_F(CeFixture, BackwardShapeErrors) {
  C::MatrixView dE_bad("dE", N, D + 2);
  C::IntView natural_order;
  expect_rejected(
      [&] {
        tlse::cross_entropy_backward(Exec(), E, Cm, nobias, targets, lse, natural_order, dloss, dE_bad, dC, nobias);
      },
      {"'dE'", "extent 8", "6"});
  C::IntView bad_order("o", V);
  Kokkos::deep_copy(bad_order, 25);
  expect_rejected(
      [&] { tlse::cross_entropy_backward(Exec(), E, Cm, nobias, targets, lse, bad_order, dloss, dE, dC, nobias); },
      {"'vocab_order'", "vocab_order[0] = 25"});
  // In range but not a permutation: class 0 twice, class 1 nowhere.
  C::IntView repeated("r", V);
  auto repeated_host = Kokkos::create_mirror_view(repeated);
  for (std::int64_t j = 0; j < V; ++j) repeated_host(j) = j == 1 ? 0 : int(j);
  Kokkos::deep_copy(repeated, repeated_host);
  expect_rejected(
      [&] { tlse::cross_entropy_backward(Exec(), E, Cm, nobias, targets, lse, repeated, dloss, dE, dC, nobias); },
      {"'vocab_order'", "not a permutation", "class 1 is missing"});
  C::AccView dloss_n("dl", N);
  expect_rejected(
      [&] {
        tlse::cross_entropy_backward(Exec(), E, Cm, nobias, targets, lse, natural_order, dloss_n, dE, dC, nobias);
      },
      {"'dloss'", "extent 10", "a reduced loss", "1"});
  expect_untouched(dE, "dE");
  expect_untouched(dC, "dC");
}

TEST_F(CeFixture, EmptyBatchIsDefined) {
  C::MatrixView E0("E0", 0, D);
  C::IndexView t0("t0", 0);
  C::AccView lse0("lse0", 0);
  tlse::cross_entropy(Exec(), E0, Cm, nobias, t0, loss, lse0, order);
  EXPECT_EQ(to_host(loss)[0], 0.0);
  Kokkos::deep_copy(dloss, 1);
  tlse::cross_entropy_backward(Exec(), E0, Cm, nobias, t0, lse0, order, dloss, C::MatrixView("dE0", 0, D), dC, nobias);
  for (double x : to_host(dC)) ASSERT_EQ(x, 0.0);
}

TEST_F(CeFixture, OptionsMustSurviveTheAccumulatorType) {
  // Regression: softcap 1e39 became inf in float, and every logit NaN; softcap 1e-300 became 0,
  // which silently turned the softcap off.
  tlse::CrossEntropyOptions o;
  o.softcap = 1e39;
  expect_rejected([&] { forward(o); }, {"'softcap'", "1e+39", "more than the largest float"});
  o.softcap = 1e-300;
  expect_rejected([&] { forward(o); }, {"'softcap'", "1e-300", "rounds to 0 (off) in float"});
  o = {};
  o.z_loss = 1e39;
  expect_rejected([&] { forward(o); }, {"'z_loss'", "more than the largest float"});
  untouched();
  o = {};
  o.softcap = 3e38;  // representable: accepted
  forward(o);
  EXPECT_TRUE(std::isfinite(to_host(loss)[0]));
}

TEST(ExtentBadInput, MoreThan32BitRowsAreRejectedBeforeAnyRead) {
  // Regression: through the C API, n = 2^31 + 5 rows were truncated by the kernels' 32-bit row
  // indices and the call read past `targets` (a segfault). These views point nowhere: nothing may
  // be read.
  using Unmanaged =
      Kokkos::View<const float**, Kokkos::LayoutRight, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  const std::size_t rows = std::size_t(1) << 31;
  Unmanaged E(nullptr, rows, 4), Cm(nullptr, 3, 4);
  Kokkos::View<const std::int64_t*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>> targets(nullptr, rows);
  C::AccView loss("loss", 1);
  expect_rejected([&] { tlse::cross_entropy(Exec(), E, Cm, targets, loss); },
                  {"'E'", "(2147483648, 4)", "32-bit integers (at most 2147483647)"});
  C::AccView lse("lse", 3);
  expect_rejected([&] { tlse::linear_lse(Exec(), Unmanaged(nullptr, 3, rows), Cm, lse); }, {"'A'", "(3, 2147483648)"});
}

struct ClFixture : ::testing::Test {
  std::mt19937_64 rng{7};
  const std::int64_t b = 12, c = 5;
  C::MatrixView I = to_device<C>(random_matrix<float>(rng, b, c, 1, true)),
                T = to_device<C>(random_matrix<float>(rng, b, c, 1, true));
  C::AccView loss{"loss", 1}, rl{"rl", std::size_t(b)}, cl{"cl", std::size_t(b)}, dscale{"ds", 1}, dloss{"dl", 1};
  C::IntView none;
  C::MatrixView dI{"dI", std::size_t(b), std::size_t(c)}, dT{"dT", std::size_t(b), std::size_t(c)};
  void SetUp() override {
    for (auto v : {loss, rl, cl, dscale}) fill_sentinel(v);
    fill_sentinel(dI);
    fill_sentinel(dT);
  }
  void untouched() {
    expect_untouched(loss, "loss");
    expect_untouched(rl, "row_lse");
    expect_untouched(cl, "col_lse");
    expect_untouched(dI, "dI");
    expect_untouched(dT, "dT");
    expect_untouched(dscale, "dscale");
  }
};

TEST_F(ClFixture, RowCountsAndFeatureDimsMustMatch) {
  C::MatrixView T11("T", b - 1, c), T6("T", b, c + 1);
  expect_rejected([&] { tlse::contrastive_loss(Exec(), I, T11, none, loss, rl, cl); },
                  {"'T'", "11 rows", "'I' has 12"});
  expect_rejected([&] { tlse::contrastive_loss(Exec(), I, T6, none, loss, rl, cl); },
                  {"'T'", "6 columns", "'I' has 5"});
  untouched();
}

TEST_F(ClFixture, ScaleMustBeFiniteAndNonNegative) {
  for (double s : {-1.0, double(NAN), double(INFINITY)}) {
    tlse::ContrastiveOptions o;
    o.scale = s;
    expect_rejected([&] { tlse::contrastive_loss(Exec(), I, T, none, loss, rl, cl, o); },
                    {"'scale'", "finite and >= 0"});
    expect_rejected([&] { tlse::contrastive_loss_backward(Exec(), I, T, none, rl, cl, dloss, dI, dT, dscale, o); },
                    {"'scale'"});
  }
  untouched();
}

TEST_F(ClFixture, ScaleMustNotOverflowFloat) {
  tlse::ContrastiveOptions o;
  o.scale = 1e39;  // inf in float: every logit inf or NaN
  expect_rejected([&] { tlse::contrastive_loss(Exec(), I, T, none, loss, rl, cl, o); },
                  {"'scale'", "more than the largest float"});
  untouched();
}

TEST_F(ClFixture, LabelsOutOfRange) {
  C::IntView labels("labels", b);
  Kokkos::deep_copy(Kokkos::subview(labels, 5), 12);
  expect_rejected([&] { tlse::contrastive_loss(Exec(), I, T, labels, loss, rl, cl); },
                  {"'labels'", "labels[5] = 12", "[0, 12)"});
  untouched();
}

TEST_F(ClFixture, BackwardNeedsTheSavedLse) {
  C::AccView short_lse("rl", b - 2);
  expect_rejected([&] { tlse::contrastive_loss_backward(Exec(), I, T, none, short_lse, cl, dloss, dI, dT, dscale); },
                  {"'row_lse'", "extent 10", "12"});
  untouched();
}

TEST_F(ClFixture, NonFiniteFeaturesDetectedOnRequest) {
  Kokkos::deep_copy(Kokkos::subview(T, 3, 4), INFINITY);
  tlse::ContrastiveOptions o;
  o.non_finite = tlse::NonFinite::detect;
  expect_rejected([&] { tlse::contrastive_loss(Exec(), I, T, none, loss, rl, cl, o); }, {"'T'", "row 3, column 4"});
  untouched();
}

TEST_F(ClFixture, SelfSimilarityNeedsAnEvenRowCount) {
  C::MatrixView Z("Z", 7, c);
  expect_rejected([&] { tlse::self_contrastive_loss(Exec(), Z, loss, rl); }, {"'Z'", "7 rows", "2B"});
  untouched();
}

TEST(LinearLseBadInput, ValidColumnsOutOfRange) {
  C::MatrixView A("A", 3, 2), B("B", 4, 2);
  C::AccView lse("lse", 3);
  Kokkos::deep_copy(lse, sentinel);
  tlse::LinearLseOptions o;
  o.valid_cols = 5;
  expect_rejected([&] { tlse::linear_lse(Exec(), A, B, lse, o); }, {"'valid_cols'", "5", "[-1, 4]"});
  expect_untouched(lse, "lse");
}

struct DistillFixture : ::testing::Test {
  std::mt19937_64 rng{7};
  const std::int64_t N = 10, V = 20, Ds = 6, Dt = 9;
  C::MatrixView Hs = to_device<C>(random_matrix<float>(rng, N, Ds)),
                Ws = to_device<C>(random_matrix<float>(rng, V, Ds));
  C::MatrixView Ht = to_device<C>(random_matrix<float>(rng, N, Dt)),
                Wt = to_device<C>(random_matrix<float>(rng, V, Dt));
  C::IndexView targets{"t", std::size_t(N)};
  C::AccView loss{"loss", 1}, dloss{"dloss", 1};
  Kokkos::View<float**, Kokkos::LayoutRight, C::Mem> stats{"row_stats", std::size_t(N),
                                                           std::size_t(tlse::distillation_row_stats)};
  C::MatrixView dHs{"dHs", std::size_t(N), std::size_t(Ds)}, dWs{"dWs", std::size_t(V), std::size_t(Ds)};
  C::MatrixView dHt{"dHt", std::size_t(N), std::size_t(Dt)}, dWt{"dWt", std::size_t(V), std::size_t(Dt)};
  void SetUp() override {
    Kokkos::deep_copy(targets, 3);
    Kokkos::deep_copy(dloss, 1);
    fill_sentinel(loss);
    fill_sentinel(stats);
    for (auto v : {dHs, dWs, dHt, dWt}) fill_sentinel(v);
  }
  template <class HsV, class WsV, class HtV, class WtV, class TV>
  void forward(const HsV& hs, const WsV& ws, const HtV& ht, const WtV& wt, const TV& t,
               const tlse::DistillationOptions& o = {}) {
    tlse::distillation_loss(Exec(), hs, ws, ht, wt, t, loss, stats, o);
  }
  void forward(const tlse::DistillationOptions& o = {}) { forward(Hs, Ws, Ht, Wt, targets, o); }
  void backward(const tlse::DistillationOptions& o = {}) {
    tlse::distillation_loss_backward(Exec(), Hs, Ws, Ht, Wt, targets, stats, dloss, dHs, dWs, dHt, dWt, o);
  }
  void step(const tlse::DistillationOptions& o = {}) {
    tlse::distillation_loss_with_gradients(Exec(), Hs, Ws, Ht, Wt, targets, dloss, loss, dHs, dWs, dHt, dWt, o);
  }
  void untouched() {
    expect_untouched(loss, "loss");
    expect_untouched(stats, "row_stats");
    expect_untouched(dHs, "dHs");
    expect_untouched(dWs, "dWs");
    expect_untouched(dHt, "dHt");
    expect_untouched(dWt, "dWt");
  }
};

TEST_F(DistillFixture, VocabularySizesDiffer) {
  C::MatrixView Wt19("Wt19", V - 1, Dt);
  expect_rejected([&] { forward(Hs, Ws, Ht, Wt19, targets); },
                  {"tlse::distillation_loss", "'Wt'", "19 rows", "'Ws' has 20", "vocabulary sizes differ"});
  untouched();
}

TEST_F(DistillFixture, RowCountsDiffer) {
  C::MatrixView Ht9("Ht9", N - 1, Dt);
  expect_rejected([&] { forward(Hs, Ws, Ht9, Wt, targets); }, {"'Ht'", "9 rows", "'Hs' has 10"});
  untouched();
}

TEST_F(DistillFixture, DepthsMismatch) {
  C::MatrixView Ws7("Ws7", V, Ds + 1), Wt8("Wt8", V, Dt - 1);
  expect_rejected([&] { forward(Hs, Ws7, Ht, Wt, targets); }, {"'Ws'", "7 columns", "'Hs' has 6"});
  expect_rejected([&] { forward(Hs, Ws, Ht, Wt8, targets); }, {"'Wt'", "8 columns", "'Ht' has 9"});
  untouched();
}

TEST_F(DistillFixture, OptionsOutOfRange) {
  for (double bad : {-0.1, 1.5, std::nan("")}) {
    tlse::DistillationOptions o;
    o.divergence = tlse::Divergence::jsd;
    o.beta = bad;
    expect_rejected([&] { forward(o); }, {"tlse::distillation_loss", "'beta'", "must be in [0, 1]"});
    o = {};
    o.alpha = bad;
    expect_rejected([&] { forward(o); }, {"'alpha'", "must be in [0, 1]"});
  }
  for (double bad : {0.0, -1.0, double(INFINITY), std::nan(""), 1e-300}) {
    tlse::DistillationOptions o;
    o.temperature = bad;
    expect_rejected([&] { forward(o); }, {"'temperature'", "finite and > 0"});
  }
  tlse::DistillationOptions o;
  o.shift = -2;
  expect_rejected([&] { forward(o); }, {"'shift'", "-2"});
  o = {};
  o.ignore_index = 4;
  expect_rejected([&] { forward(o); }, {"'ignore_index'", "4"});
  untouched();
}

TEST_F(DistillFixture, AlphaWithoutTargets) {
  tlse::DistillationOptions o;
  o.alpha = 0.5;
  expect_rejected([&] { forward(Hs, Ws, Ht, Wt, C::IndexView(), o); }, {"'targets'", "empty", "alpha = 0.5"});
  untouched();
}

TEST_F(DistillFixture, TargetsOutOfRangeOrOfWrongLength) {
  Kokkos::deep_copy(Kokkos::subview(targets, 6), 20);
  expect_rejected([&] { forward(); }, {"'targets'", "targets[6] = 20", "[0, 20)"});
  expect_rejected([&] { backward(); }, {"tlse::distillation_loss_backward", "targets[6] = 20"});
  expect_rejected([&] { step(); }, {"tlse::distillation_loss_with_gradients", "targets[6] = 20"});
  C::IndexView t9("t9", N - 1);
  expect_rejected([&] { forward(Hs, Ws, Ht, Wt, t9); }, {"'targets'", "extent 9", "10"});
  untouched();
}

TEST_F(DistillFixture, OutputsOfWrongShape) {
  tlse::DistillationOptions o;
  o.reduction = tlse::Reduction::none;
  expect_rejected([&] { forward(o); }, {"'loss'", "extent 1", "Reduction::none"});
  expect_rejected([&] { backward(o); }, {"'dloss'", "extent 1", "Reduction::none"});
  expect_rejected([&] { step(o); }, {"tlse::distillation_loss_with_gradients", "'loss'", "extent 1"});
  Kokkos::View<float**, Kokkos::LayoutRight, C::Mem> stats4("stats4", N, 4), stats9("stats9", N - 1, 5);
  expect_rejected([&] { tlse::distillation_loss(Exec(), Hs, Ws, Ht, Wt, targets, loss, stats4); },
                  {"'row_stats'", "extent 4", "distillation_row_stats"});
  expect_rejected([&] { tlse::distillation_loss(Exec(), Hs, Ws, Ht, Wt, targets, loss, stats9); },
                  {"'row_stats'", "extent 9", "10"});
  expect_rejected(
      [&] { tlse::distillation_loss_backward(Exec(), Hs, Ws, Ht, Wt, targets, stats4, dloss, dHs, dWs, dHt, dWt); },
      {"tlse::distillation_loss_backward", "'row_stats'", "extent 4"});
  C::MatrixView dWt_short("dWt_short", V, Dt - 1);
  expect_rejected(
      [&] {
        tlse::distillation_loss_backward(Exec(), Hs, Ws, Ht, Wt, targets, stats, dloss, dHs, dWs, dHt, dWt_short);
      },
      {"'dWt'", "extent 8", "9"});
  untouched();
}

TEST_F(DistillFixture, WorkspaceTooSmall) {
  tlse::DistillationOptions o;
  std::vector<char> small(64);
  o.workspace = {small.data(), small.size()};
  expect_rejected([&] { forward(o); }, {"'workspace'", "holds 64 bytes", "needs"});
  expect_rejected([&] { backward(o); }, {"'workspace'", "holds 64 bytes", "needs"});
  // The step checks the workspace against both halves before its forward writes the loss.
  expect_rejected([&] { step(o); }, {"tlse::distillation_loss_with_gradients", "'workspace'", "holds 64 bytes"});
  untouched();
  std::vector<char> ws(tlse::distillation_loss_workspace_bytes(Exec(), Hs, Ws, Ht, Wt, o));
  o.workspace = {ws.data(), ws.size()};
  forward(o);  // enough: runs
  backward(o);
  step(o);
}

TEST_F(DistillFixture, NonFiniteInputsDetected) {
  tlse::DistillationOptions o;
  o.non_finite = tlse::NonFinite::detect;
  Kokkos::deep_copy(Kokkos::subview(Wt, 3, 2), NAN);
  expect_rejected([&] { forward(o); }, {"'Wt'", "row 3, column 2", "NonFinite::detect"});
  expect_rejected([&] { backward(o); }, {"'Wt'", "row 3, column 2"});
  expect_rejected([&] { step(o); }, {"tlse::distillation_loss_with_gradients", "'Wt'", "row 3, column 2"});
  untouched();
}

}  // namespace
