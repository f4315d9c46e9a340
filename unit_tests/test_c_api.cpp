// The C API's own checks, called from C++ as a C caller would: one regression test per bug found
// while fuzzing the C API (c_api/fuzz, its sanitizers, and the model of valid calls it checks
// against). Each call fails with a status and a message naming the argument and the values, and
// leaves every output as it was. CI also runs these under ASan and UBSan (scripts/sanitize.sh),
// where some of the bugs were undefined behaviour only. Last, the training step in one call
// (tlse_cross_entropy_with_gradients) against the forward and the backward, and its checks, and
// the query of whether it runs fused (tlse_cross_entropy_step_fused); the self-similarity
// contrastive calls against a float64 reference that materializes the logits, and their checks;
// the distillation calls likewise, and their step in one call (tlse_distillation_loss_with_gradients,
// the pair on the host, bitwise) and its query (tlse_distillation_step_fused).
#include <gtest/gtest.h>
#include <tlse.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <random>
#include <string>
#include <vector>

namespace {

constexpr std::int64_t N = 10, V = 7, D = 3;

tlse_context* context() {
  static tlse_context* ctx = [] {
    tlse_context* c = nullptr;
    EXPECT_EQ(tlse_context_create(&c, -1), TLSE_SUCCESS) << tlse_last_error();
    return c;
  }();
  return ctx;
}

/// Inputs of a float64 cross-entropy, and its outputs filled with -1.
struct CrossEntropy {
  std::vector<double> E = std::vector<double>(N * D, 0.25), C = std::vector<double>(V * D, -0.5);
  std::vector<std::int64_t> targets = std::vector<std::int64_t>(N, 2);
  std::vector<double> loss = std::vector<double>(1, -1.0), lse = std::vector<double>(N, -1.0);
  std::vector<double> dloss = std::vector<double>(1, 1.0), dE = std::vector<double>(N * D, -1.0);
  tlse_cross_entropy_options options;
  CrossEntropy() { tlse_cross_entropy_options_default(&options); }

  tlse_status forward(std::int64_t n = N, std::int64_t v = V, std::int64_t d = D, tlse_device device = TLSE_DEVICE_HOST,
                      tlse_dtype dtype = TLSE_F64) {
    return tlse_cross_entropy_forward(context(), device, nullptr, dtype, n, v, d, E.data(), C.data(), nullptr,
                                      targets.data(), loss.data(), lse.data(), nullptr, nullptr, &options);
  }
  /// The step in one call, with this struct's options, no bias and no dC or dbias.
  tlse_status step(const void* dloss_at, void* loss_at, void* dE_at, tlse_dtype dtype = TLSE_F64) {
    return tlse_cross_entropy_with_gradients(context(), TLSE_DEVICE_HOST, nullptr, dtype, N, V, D, E.data(), C.data(),
                                             nullptr, targets.data(), dloss_at, loss_at, dE_at, nullptr, nullptr,
                                             nullptr, &options);
  }
  bool untouched() const {
    for (const auto* out : {&loss, &lse, &dE})
      for (double x : *out)
        if (x != -1.0) return false;
    return true;
  }
};

/// Expects `status` to be TLSE_ERROR_INVALID_ARGUMENT with a message containing every needle.
void expect_invalid(tlse_status status, std::initializer_list<const char*> needles) {
  EXPECT_EQ(status, TLSE_ERROR_INVALID_ARGUMENT);
  const std::string message = tlse_last_error();
  for (const char* n : needles) EXPECT_NE(message.find(n), std::string::npos) << message << "\nmissing: " << n;
}

TEST(CApi, EnumValuesOutOfRangeAreErrors) {
  // Regression (fuzzer + UBSan): an int outside an enum's values, as C, Fortran and ctypes callers
  // can pass, was loaded as the enum type (undefined behaviour in C++); tlse.h's enums are int-based
  // in C++ now.
  EXPECT_EQ(tlse_device_available(static_cast<tlse_device>(-1)), 0);
  CrossEntropy ce;
  expect_invalid(ce.forward(N, V, D, static_cast<tlse_device>(-1)), {"argument 'device' is -1"});
  expect_invalid(ce.forward(N, V, D, TLSE_DEVICE_HOST, static_cast<tlse_dtype>(7)), {"argument 'dtype' is 7"});
  EXPECT_TRUE(ce.untouched());
}

TEST(CApi, SizesBeyond32BitsFailBeforeAnyRead) {
  // Regression: n = 2^31 + 5 read past `targets` (a segfault); n = 2^62 with d = 4 overflowed n * d
  // (a SIGFPE). The kernels index rows, classes and features with 32-bit ints.
  CrossEntropy ce;
  expect_invalid(ce.forward((std::int64_t(1) << 31) + 5), {"argument 'n' is 2147483653, more than 2147483647"});
  expect_invalid(ce.forward(std::int64_t(1) << 62, V, 4), {"argument 'n' is 4611686018427387904"});
  expect_invalid(ce.forward(N, V, std::int64_t(1) << 40), {"argument 'd' is 1099511627776"});
  expect_invalid(ce.forward(N, INT64_MIN), {"argument 'v' must be >= 0"});
  EXPECT_TRUE(ce.untouched());
}

TEST(CApi, OutputsMustNotShareMemoryWithAnotherArray) {
  // Regression: an output overlapping an input or another output was accepted, and the call read
  // what it was writing.
  CrossEntropy ce;
  EXPECT_EQ(
      tlse_cross_entropy_forward(context(), TLSE_DEVICE_HOST, nullptr, TLSE_F64, N, V, D, ce.E.data(), ce.C.data(),
                                 nullptr, ce.targets.data(), ce.E.data(), nullptr, nullptr, nullptr, &ce.options),
      TLSE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(tlse_last_error()).find("argument 'loss' overlaps argument 'E'"), std::string::npos);
  // The loss written over the last lse.
  expect_invalid(tlse_cross_entropy_forward(context(), TLSE_DEVICE_HOST, nullptr, TLSE_F64, N, V, D, ce.E.data(),
                                            ce.C.data(), nullptr, ce.targets.data(), ce.lse.data() + N - 1,
                                            ce.lse.data(), nullptr, nullptr, &ce.options),
                 {"argument 'lse' overlaps argument 'loss'"});
  // The backward's dE over its own lse.
  std::vector<double> both(N * D, -1.0);
  expect_invalid(tlse_cross_entropy_backward(context(), TLSE_DEVICE_HOST, nullptr, TLSE_F64, N, V, D, ce.E.data(),
                                             ce.C.data(), nullptr, ce.targets.data(), both.data(), nullptr,
                                             ce.dloss.data(), both.data(), nullptr, nullptr, nullptr, &ce.options),
                 {"argument 'dE' overlaps argument 'lse'"});
  // A lent workspace over the loss.
  std::vector<double> arena(4096, -1.0);
  ce.options.workspace = arena.data() + 1, ce.options.workspace_bytes = 4000 * sizeof(double);
  expect_invalid(
      tlse_cross_entropy_forward(context(), TLSE_DEVICE_HOST, nullptr, TLSE_F64, N, V, D, ce.E.data(), ce.C.data(),
                                 nullptr, ce.targets.data(), arena.data() + 10, nullptr, nullptr, nullptr, &ce.options),
      {"argument 'loss' overlaps argument 'workspace'"});
  EXPECT_TRUE(ce.untouched());
  for (double x : both) EXPECT_EQ(x, -1.0);
  for (double x : arena) EXPECT_EQ(x, -1.0);
}

TEST(CApi, MisalignedArraysAreErrors) {
  // Regression: a double array at an odd address was read through misaligned loads (undefined
  // behaviour, which UBSan reports; a fault on GPUs).
  CrossEntropy ce;
  std::vector<double> raw(N * D + 1);
  const void* odd = reinterpret_cast<const char*>(raw.data()) + 4;
  expect_invalid(
      tlse_cross_entropy_forward(context(), TLSE_DEVICE_HOST, nullptr, TLSE_F64, N, V, D, odd, ce.C.data(), nullptr,
                                 ce.targets.data(), ce.loss.data(), nullptr, nullptr, nullptr, &ce.options),
      {"argument 'E' is at address", "not a multiple of 8 bytes"});
  EXPECT_TRUE(ce.untouched());
}

TEST(CApi, OptionsBeyondTheAccumulatorAreErrors) {
  // Regression: float inputs accumulate in float, where softcap 1e39 is inf (every logit NaN) and
  // softcap 1e-300 is 0 (the softcap silently off); z_loss and scale 1e39 are inf too.
  std::vector<float> E(N * D, 0.25f), C(V * D, 0.5f);
  std::vector<std::int64_t> targets(N, 1);
  float loss = -1.0f;
  auto forward = [&](const tlse_cross_entropy_options& o) {
    return tlse_cross_entropy_forward(context(), TLSE_DEVICE_HOST, nullptr, TLSE_F32, N, V, D, E.data(), C.data(),
                                      nullptr, targets.data(), &loss, nullptr, nullptr, nullptr, &o);
  };
  tlse_cross_entropy_options o;
  tlse_cross_entropy_options_default(&o);
  o.softcap = 1e39;
  expect_invalid(forward(o), {"argument 'softcap' is 1e+39, more than the largest float"});
  o.softcap = 1e-300;
  expect_invalid(forward(o), {"argument 'softcap' is 1e-300, which rounds to 0 (off) in float"});
  o.softcap = 0, o.z_loss = 1e39;
  expect_invalid(forward(o), {"argument 'z_loss' is 1e+39, more than the largest float"});
  tlse_contrastive_options c;
  tlse_contrastive_options_default(&c);
  c.scale = 1e39;
  expect_invalid(tlse_contrastive_forward(context(), TLSE_DEVICE_HOST, nullptr, TLSE_F32, 4, D, E.data(), C.data(),
                                          nullptr, &loss, nullptr, nullptr, &c),
                 {"argument 'scale' is 1e+39, more than the largest float"});
  EXPECT_EQ(loss, -1.0f);
  o.z_loss = 0, o.softcap = 1e39;  // double inputs accumulate in double: fine there
  std::vector<double> E64(N * D, 0.25), C64(V * D, 0.5);
  double loss64 = -1;
  EXPECT_EQ(tlse_cross_entropy_forward(context(), TLSE_DEVICE_HOST, nullptr, TLSE_F64, N, V, D, E64.data(), C64.data(),
                                       nullptr, targets.data(), &loss64, nullptr, nullptr, nullptr, &o),
            TLSE_SUCCESS)
      << tlse_last_error();
}

TEST(CApi, PrecisionIsATlsePrecision) {
  // options.precision (once a reserved field, 0 by default): TLSE_PRECISION_TF32 asks for TF32
  // products of float inputs where a GPU has them; the host ignores it, so there the results are
  // the exact ones, bit for bit. Any other value fails naming it.
  CrossEntropy ce;
  std::vector<float> E(N * D), C(V * D);
  for (std::size_t i = 0; i < E.size(); ++i) E[i] = float(std::sin(0.3 * double(i)));
  for (std::size_t i = 0; i < C.size(); ++i) C[i] = float(std::cos(0.7 * double(i)));
  const auto forward = [&](std::int32_t precision, float* loss) {
    ce.options.precision = precision;
    return tlse_cross_entropy_forward(context(), TLSE_DEVICE_HOST, nullptr, TLSE_F32, N, V, D, E.data(), C.data(),
                                      nullptr, ce.targets.data(), loss, nullptr, nullptr, nullptr, &ce.options);
  };
  float exact = -1, tf32 = -1, untouched = -1;
  ASSERT_EQ(forward(TLSE_PRECISION_EXACT, &exact), TLSE_SUCCESS) << tlse_last_error();
  ASSERT_EQ(forward(TLSE_PRECISION_TF32, &tf32), TLSE_SUCCESS) << tlse_last_error();
  EXPECT_EQ(exact, tf32);
  expect_invalid(forward(2, &untouched),
                 {"tlse_cross_entropy_forward: argument 'options.precision' is 2, not a tlse_precision"});
  tlse_contrastive_options c;
  tlse_contrastive_options_default(&c);
  EXPECT_EQ(c.precision, TLSE_PRECISION_EXACT);
  c.precision = -1;
  expect_invalid(tlse_contrastive_forward(context(), TLSE_DEVICE_HOST, nullptr, TLSE_F32, 4, D, E.data(), C.data(),
                                          nullptr, &untouched, nullptr, nullptr, &c),
                 {"argument 'options.precision' is -1"});
  std::size_t bytes = 0;
  expect_invalid(
      tlse_self_contrastive_workspace_bytes(context(), TLSE_DEVICE_HOST, nullptr, TLSE_F32, 4, D, &c, &bytes),
      {"tlse_self_contrastive_workspace_bytes: argument 'options.precision' is -1"});
  EXPECT_EQ(untouched, -1.0f);
  EXPECT_EQ(bytes, 0u);
}

/// One cross-entropy problem of storage type T (float or double: the accumulator type too) run
/// both ways, the step in one call and the forward then the backward, with the same options and
/// dloss, from the same starting gradients (they matter with `accumulate`).
template <class T>
struct StepAgainstPair {
  static constexpr std::int64_t n = 37, v = 53, d = 19;  // not multiples of the host's 32-wide tiles
  tlse_dtype dtype = sizeof(T) == 8 ? TLSE_F64 : TLSE_F32;
  tlse_cross_entropy_options options;
  std::vector<T> E = std::vector<T>(n * d), C = std::vector<T>(v * d), bias = std::vector<T>(v);
  std::vector<std::int64_t> targets = std::vector<std::int64_t>(n);
  bool with_bias = false;

  StepAgainstPair() {
    tlse_cross_entropy_options_default(&options);
    options.filter_eps = 0;  // the fused step never filters (tlse.h): compare exact gradients
    for (std::int64_t i = 0; i < n * d; ++i) E[i] = T(std::sin(0.37 * double(i)));
    for (std::int64_t i = 0; i < v * d; ++i) C[i] = T(std::cos(0.11 * double(i)));
    for (std::int64_t j = 0; j < v; ++j) bias[j] = T(0.25 * double(j % 5));
    for (std::int64_t i = 0; i < n; ++i) targets[i] = i % 5 == 4 ? options.ignore_index : (13 * i) % v;
  }

  /// Runs both and expects the same loss and gradients up to rounding: |a - b| <= 64 u (1 + max |b|),
  /// u the accumulator's unit roundoff (the float storage of float gradients rounds at the same u).
  void check() const {
    const std::int64_t losses = options.reduction == TLSE_REDUCTION_NONE ? n : 1;
    std::vector<T> dloss(losses), loss(losses, T(-1)), pair_loss(losses, T(-2)), lse(n);
    for (std::int64_t i = 0; i < losses; ++i) dloss[i] = T(0.5 + 0.1 * double(i));
    std::vector<T> dE(n * d), dC(v * d), dbias(v);
    for (std::int64_t i = 0; i < n * d; ++i) dE[i] = T(0.01 * double(i % 7));
    for (std::int64_t i = 0; i < v * d; ++i) dC[i] = T(-0.02 * double(i % 3));
    for (std::int64_t j = 0; j < v; ++j) dbias[j] = T(0.5);
    std::vector<T> pair_dE = dE, pair_dC = dC, pair_dbias = dbias;
    const T* b = with_bias ? bias.data() : nullptr;

    ASSERT_EQ(tlse_cross_entropy_with_gradients(context(), TLSE_DEVICE_HOST, nullptr, dtype, n, v, d, E.data(),
                                                C.data(), b, targets.data(), dloss.data(), loss.data(), dE.data(),
                                                dC.data(), with_bias ? dbias.data() : nullptr, nullptr, &options),
              TLSE_SUCCESS)
        << tlse_last_error();
    ASSERT_EQ(tlse_cross_entropy_forward(context(), TLSE_DEVICE_HOST, nullptr, dtype, n, v, d, E.data(), C.data(), b,
                                         targets.data(), pair_loss.data(), lse.data(), nullptr, nullptr, &options),
              TLSE_SUCCESS)
        << tlse_last_error();
    ASSERT_EQ(tlse_cross_entropy_backward(context(), TLSE_DEVICE_HOST, nullptr, dtype, n, v, d, E.data(), C.data(),
                                          b, targets.data(), lse.data(), nullptr, dloss.data(), pair_dE.data(),
                                          pair_dC.data(), with_bias ? pair_dbias.data() : nullptr, nullptr, &options),
              TLSE_SUCCESS)
        << tlse_last_error();
    expect_close("loss", loss, pair_loss);
    expect_close("dE", dE, pair_dE);
    expect_close("dC", dC, pair_dC);
    expect_close("dbias", dbias, pair_dbias);
  }

  static void expect_close(const char* name, const std::vector<T>& got, const std::vector<T>& want) {
    double magnitude = 0;
    for (T x : want) magnitude = std::max(magnitude, std::fabs(double(x)));
    const double u = sizeof(T) == 8 ? 0x1p-53 : 0x1p-24, tolerance = 64 * u * (1 + magnitude);
    for (std::size_t i = 0; i < want.size(); ++i)
      EXPECT_LE(std::fabs(double(got[i]) - double(want[i])), tolerance)
          << name << "[" << i << "] = " << got[i] << ", forward and backward: " << want[i];
  }
};

/// F.cross_entropy(weight, label_smoothing) with mean reduction, plus dlse reaching the LSE, in
/// float64 from the materialized logits: the loss, the argmax, the accuracy and dE (this test's
/// oracle: the C API's tests link no Kokkos, so not tlse::testing's).
struct SmoothedReference {
  double loss = 0, accuracy = 0;
  std::vector<std::int64_t> predicted = std::vector<std::int64_t>(N, -1);
  std::vector<double> lse = std::vector<double>(N, 0.0), dE = std::vector<double>(N * D, 0.0);
  SmoothedReference(const std::vector<double>& E, const std::vector<double>& C, const std::vector<std::int64_t>& t,
                    const std::vector<double>& u, const std::vector<double>& dlse, double eps, double dloss) {
    double weight_total = 0, u_total = 0;
    int scored = 0, hits = 0;
    for (double w : u) u_total += w;
    for (std::int64_t i = 0; i < N; ++i)
      if (t[i] >= 0) weight_total += u[t[i]], ++scored;
    std::vector<double> x(V);
    for (std::int64_t i = 0; i < N; ++i) {
      if (t[i] < 0) continue;
      double m = -INFINITY, sum = 0, smooth = 0;
      for (std::int64_t j = 0; j < V; ++j) {
        x[j] = 0;
        for (std::int64_t k = 0; k < D; ++k) x[j] += E[i * D + k] * C[j * D + k];
        if (x[j] > m) m = x[j], predicted[i] = j;
      }
      for (std::int64_t j = 0; j < V; ++j) sum += std::exp(x[j] - m);
      const double l = lse[i] = m + std::log(sum);
      for (std::int64_t j = 0; j < V; ++j) smooth += u[j] * (l - x[j]);
      loss += ((1 - eps) * u[t[i]] * (l - x[t[i]]) + eps / V * smooth) / weight_total;
      hits += predicted[i] == t[i];
      const double c = dloss / weight_total;
      for (std::int64_t j = 0; j < V; ++j) {
        const double g = (c * ((1 - eps) * u[t[i]] + eps * u_total / V) + dlse[i]) * std::exp(x[j] - l) -
                         (j == t[i] ? c * (1 - eps) * u[t[i]] : 0.0) - c * eps / V * u[j];
        for (std::int64_t k = 0; k < D; ++k) dE[i * D + k] += g * C[j * D + k];
      }
    }
    accuracy = double(hits) / scored;
  }
};

TEST(CApiExtras, WeightsSmoothingArgmaxAndDlseAgainstTheReference) {
  // Class weights, label smoothing, a gradient reaching the LSE, the predicted classes and the
  // accuracy through tlse_cross_entropy_extras, in float64 against the materialized reference.
  std::vector<double> E(N * D), C(V * D), weight(V), dlse(N), dloss{1.5};
  for (std::int64_t i = 0; i < N * D; ++i) E[i] = std::sin(0.7 * double(i));
  for (std::int64_t i = 0; i < V * D; ++i) C[i] = 2 * std::cos(0.3 * double(i));
  std::vector<std::int64_t> targets(N);
  for (std::int64_t i = 0; i < N; ++i) targets[i] = i % 4 == 3 ? -100 : (5 * i) % V, dlse[i] = 0.1 * double(i % 3);
  for (std::int64_t j = 0; j < V; ++j) weight[j] = 0.5 + 0.25 * double(j % 4);
  const SmoothedReference ref(E, C, targets, weight, dlse, 0.2, dloss[0]);
  tlse_cross_entropy_options options;
  tlse_cross_entropy_options_default(&options);
  options.label_smoothing = 0.2;
  options.filter_eps = 0;
  std::vector<double> loss(1), lse(N), dE(N * D), dC(V * D), accuracy(1);
  std::vector<std::int64_t> predicted(N, 99);
  tlse_cross_entropy_extras forward{weight.data(), nullptr, predicted.data(), accuracy.data()};
  ASSERT_EQ(tlse_cross_entropy_forward(context(), TLSE_DEVICE_HOST, nullptr, TLSE_F64, N, V, D, E.data(), C.data(),
                                       nullptr, targets.data(), loss.data(), lse.data(), nullptr, &forward, &options),
            TLSE_SUCCESS)
      << tlse_last_error();
  EXPECT_NEAR(loss[0], ref.loss, 1e-12);
  EXPECT_NEAR(accuracy[0], ref.accuracy, 1e-12);
  for (std::int64_t i = 0; i < N; ++i) EXPECT_EQ(predicted[i], ref.predicted[i]) << "row " << i;
  tlse_cross_entropy_extras backward{weight.data(), dlse.data(), nullptr, nullptr};
  ASSERT_EQ(tlse_cross_entropy_backward(context(), TLSE_DEVICE_HOST, nullptr, TLSE_F64, N, V, D, E.data(), C.data(),
                                        nullptr, targets.data(), lse.data(), nullptr, dloss.data(), dE.data(),
                                        dC.data(), nullptr, &backward, &options),
            TLSE_SUCCESS)
      << tlse_last_error();
  for (std::int64_t i = 0; i < N * D; ++i) EXPECT_NEAR(dE[i], ref.dE[i], 1e-12) << "dE " << i;
  // The backward writes no argmax: an output of the forward given to it is an error, and nothing
  // is written.
  const std::vector<double> before = dE;
  expect_invalid(tlse_cross_entropy_backward(context(), TLSE_DEVICE_HOST, nullptr, TLSE_F64, N, V, D, E.data(),
                                             C.data(), nullptr, targets.data(), lse.data(), nullptr, dloss.data(),
                                             dE.data(), dC.data(), nullptr, &forward, &options),
                 {"cross_entropy_backward", "'predicted'", "output of the forward"});
  EXPECT_EQ(dE, before);
  options.label_smoothing = 2;
  expect_invalid(tlse_cross_entropy_forward(context(), TLSE_DEVICE_HOST, nullptr, TLSE_F64, N, V, D, E.data(),
                                            C.data(), nullptr, targets.data(), loss.data(), lse.data(), nullptr,
                                            nullptr, &options),
                 {"'label_smoothing'", "must be in [0, 1], got 2"});
}

TEST(CApiTrainingStep, MatchesForwardAndBackward) {
  {
    SCOPED_TRACE("f64, mean");
    StepAgainstPair<double>().check();
  }
  {
    SCOPED_TRACE("f64, sum, bias and dbias, softcap, z_loss, accumulate");
    StepAgainstPair<double> p;
    p.with_bias = true;
    p.options.reduction = TLSE_REDUCTION_SUM, p.options.softcap = 3.0, p.options.z_loss = 1e-3;
    p.options.accumulate = 1;
    p.check();
  }
  {
    SCOPED_TRACE("f64, none (one dloss per row), shift");
    StepAgainstPair<double> p;
    p.options.reduction = TLSE_REDUCTION_NONE, p.options.shift = 2;
    p.check();
  }
  {
    SCOPED_TRACE("f32, mean, bias without dbias, every row ignored but one");
    StepAgainstPair<float> p;
    p.with_bias = true;
    std::fill(p.targets.begin() + 1, p.targets.end(), p.options.ignore_index);
    p.check();
  }
  {
    SCOPED_TRACE("f32, mean, the gradient filter (the same filter both ways on the host)");
    StepAgainstPair<float> p;
    p.options.filter_eps = TLSE_FILTER_EPS_AUTO;
    p.check();
  }
}

TEST(CApiTrainingStep, BadInputFailsBeforeAnyWrite) {
  CrossEntropy ce;
  expect_invalid(ce.step(ce.dloss.data(), nullptr, ce.dE.data()),
                 {"tlse_cross_entropy_with_gradients: argument 'loss' is NULL but has 1 elements"});
  expect_invalid(ce.step(nullptr, ce.loss.data(), ce.dE.data()), {"argument 'dloss' is NULL but has 1 elements"});
  // The loss written over dloss, which the backward half reads after the forward half wrote the loss.
  expect_invalid(ce.step(ce.lse.data(), ce.lse.data(), ce.dE.data()), {"argument 'dloss' overlaps argument 'loss'"});
  expect_invalid(ce.step(ce.dloss.data(), ce.loss.data(), ce.E.data()), {"argument 'dE' overlaps argument 'E'"});
  ce.options.reduction = TLSE_REDUCTION_NONE;  // loss and dloss: N values each, here sharing one
  std::vector<double> both(2 * N, -1.0);
  expect_invalid(ce.step(both.data(), both.data() + N - 1, ce.dE.data()),
                 {"argument 'dloss' overlaps argument 'loss'"});
  ce.options.reduction = 7;
  expect_invalid(ce.step(ce.dloss.data(), ce.loss.data(), ce.dE.data()), {"argument 'options.reduction' is 7"});
  ce.options.reduction = TLSE_REDUCTION_MEAN;
  expect_invalid(ce.step(ce.dloss.data(), ce.loss.data(), ce.dE.data(), static_cast<tlse_dtype>(9)),
                 {"argument 'dtype' is 9"});
  // The C++ checks, with the step's name.
  ce.targets[3] = V;
  expect_invalid(ce.step(ce.dloss.data(), ce.loss.data(), ce.dE.data()),
                 {"tlse::cross_entropy_with_gradients: argument 'targets' has targets[3] = 7"});
  ce.targets[3] = 2;
  ce.options.detect_non_finite = 1;
  std::vector<double> nan_dloss(1, std::nan(""));
  expect_invalid(ce.step(nan_dloss.data(), ce.loss.data(), ce.dE.data()), {"argument 'dloss' contains NaN or Inf"});
  // A lent workspace smaller than tlse_cross_entropy_workspace_bytes says, even where one half of
  // the step would fit in it.
  ce.options.detect_non_finite = 0;
  std::size_t need = 0;
  ASSERT_EQ(tlse_cross_entropy_workspace_bytes(context(), TLSE_DEVICE_HOST, nullptr, TLSE_F64, N, V, D, &ce.options,
                                               &need),
            TLSE_SUCCESS);
  std::vector<char> arena(need);
  ce.options.workspace = arena.data(), ce.options.workspace_bytes = need - 1;
  const std::string holds = "argument 'workspace' holds " + std::to_string(need - 1) + " bytes but this call needs";
  expect_invalid(ce.step(ce.dloss.data(), ce.loss.data(), ce.dE.data()), {holds.c_str()});
  EXPECT_TRUE(ce.untouched());
  for (double x : both) EXPECT_EQ(x, -1.0);
  ce.options.workspace_bytes = need;
  EXPECT_EQ(ce.step(ce.dloss.data(), ce.loss.data(), ce.dE.data()), TLSE_SUCCESS) << tlse_last_error();
  EXPECT_FALSE(ce.untouched());
}

TEST(CApiTrainingStep, StepFusedQuery) {
  tlse_cross_entropy_options options;
  tlse_cross_entropy_options_default(&options);
  const auto query = [&](tlse_dtype dtype, int want_dbias, int* fused, std::int64_t n = N,
                         tlse_device device = TLSE_DEVICE_HOST, tlse_context* ctx = context()) {
    return tlse_cross_entropy_step_fused(ctx, device, nullptr, dtype, n, V, D, &options, want_dbias, fused);
  };
  // The host backend has no fused step: always the forward then the backward, whatever the
  // budget (here one that would hold every row's logits many times over).
  options.memory_budget = std::uint64_t(1) << 40;
  for (tlse_dtype dtype : {TLSE_F32, TLSE_F64, TLSE_BF16, TLSE_F16})
    for (int want_dbias : {0, 1}) {
      int fused = -1;
      EXPECT_EQ(query(dtype, want_dbias, &fused), TLSE_SUCCESS) << tlse_last_error();
      EXPECT_EQ(fused, 0) << "dtype " << dtype << ", want_dbias " << want_dbias;
    }
  int fused = -1;  // NULL options: the defaults
  EXPECT_EQ(tlse_cross_entropy_step_fused(context(), TLSE_DEVICE_HOST, nullptr, TLSE_BF16, N, V, D, nullptr, 0, &fused),
            TLSE_SUCCESS)
      << tlse_last_error();
  EXPECT_EQ(fused, 0);
  // Bad arguments fail naming them, and leave *fused as it was.
  fused = -1;
  expect_invalid(query(TLSE_BF16, 0, nullptr), {"tlse_cross_entropy_step_fused: argument 'fused' is NULL"});
  expect_invalid(query(TLSE_BF16, 0, &fused, -1), {"tlse_cross_entropy_step_fused: argument 'n' must be >= 0, got -1"});
  expect_invalid(query(static_cast<tlse_dtype>(9), 0, &fused), {"argument 'dtype' is 9"});
  expect_invalid(query(TLSE_BF16, 0, &fused, N, static_cast<tlse_device>(5)), {"argument 'device' is 5"});
  expect_invalid(query(TLSE_BF16, 0, &fused, N, TLSE_DEVICE_HOST, nullptr), {"argument 'context' is NULL"});
  options.reduction = 7;
  expect_invalid(query(TLSE_BF16, 0, &fused), {"argument 'options.reduction' is 7"});
  EXPECT_EQ(fused, -1);
}

/// The distillation loss of the student (Hs n x ds, Ws v x ds) and the teacher (Ht n x dt, Wt v x
/// dt) in float64 with every logit formed, and its gradients for upstream gradients `dloss` (one
/// per row, or one): per row, z = H W^T / T, p = softmax(z); forward KL sum_j p_t (log p_t - log
/// p_s), reverse KL the same swapped, JSD(beta) beta KL(p_t || m) + (1 - beta) KL(p_s || m) with m
/// = beta p_t + (1 - beta) p_s; plus alpha times the student's cross-entropy at T = 1. Row i is
/// scored against targets[i + shift] unless that is ignore_index or past the end (or always,
/// without targets).
struct DistillationReference {
  std::vector<double> loss, dHs, dWs, dHt, dWt;
  DistillationReference(const std::vector<double>& Hs, const std::vector<double>& Ws, const std::vector<double>& Ht,
                        const std::vector<double>& Wt, const std::vector<std::int64_t>* targets, std::int64_t n,
                        std::int64_t v, std::int64_t ds, std::int64_t dt, const tlse_distillation_options& o,
                        const std::vector<double>& dloss)
      : dHs(n * ds, 0.0), dWs(v * ds, 0.0), dHt(n * dt, 0.0), dWt(v * dt, 0.0) {
    const double beta = o.divergence == TLSE_DIVERGENCE_FORWARD_KL   ? 0.0
                        : o.divergence == TLSE_DIVERGENCE_REVERSE_KL ? 1.0
                                                                     : o.beta;
    std::vector<std::int64_t> target(n, -1);  // -2: scored without a target, -1: not scored
    std::int64_t scored = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      if (!targets)
        target[i] = -2;
      else if (i + o.shift < n && (*targets)[i + o.shift] != o.ignore_index)
        target[i] = (*targets)[i + o.shift];
      scored += target[i] != -1;
    }
    std::vector<double> rows(n, 0.0);
    const auto log_softmax = [](std::vector<double>& z) {
      double top = -INFINITY, sum = 0;
      for (double x : z) top = std::max(top, x);
      for (double x : z) sum += std::exp(x - top);
      for (double& x : z) x -= top + std::log(sum);
    };
    for (std::int64_t i = 0; i < n; ++i) {
      if (target[i] == -1) continue;
      std::vector<double> x(v), ls(v), lt(v);
      for (std::int64_t j = 0; j < v; ++j) {
        double a = 0, b = 0;
        for (std::int64_t k = 0; k < ds; ++k) a += Hs[i * ds + k] * Ws[j * ds + k];
        for (std::int64_t k = 0; k < dt; ++k) b += Ht[i * dt + k] * Wt[j * dt + k];
        x[j] = a, ls[j] = a / o.temperature, lt[j] = b / o.temperature;
      }
      log_softmax(x), log_softmax(ls), log_softmax(lt);
      // The divergence, and its gradients with respect to the logits z_s, z_t written as
      // g_j - p_j sum(g): for a KL(a || b) term, g_a = p_a (log p_a - log b) and the other side's
      // is p_b - p_a (no sum); JSD's m makes both sides of the first kind.
      std::vector<double> gs(v, 0.0), gt(v, 0.0);
      double div = 0, ks = 0, kt = 0;
      for (std::int64_t j = 0; j < v; ++j) {
        const double ps = std::exp(ls[j]), pt = std::exp(lt[j]);
        if (beta == 0) {  // forward KL
          gt[j] = pt > 0 ? pt * (lt[j] - ls[j]) : 0.0, gs[j] = ps - pt;
          div += gt[j], kt += gt[j];
        } else if (beta == 1) {  // reverse KL
          gs[j] = ps > 0 ? ps * (ls[j] - lt[j]) : 0.0, gt[j] = pt - ps;
          div += gs[j], ks += gs[j];
        } else {
          const double lm = std::log(beta * pt + (1 - beta) * ps);
          gs[j] = ps > 0 ? (1 - beta) * ps * (ls[j] - lm) : 0.0, gt[j] = pt > 0 ? beta * pt * (lt[j] - lm) : 0.0;
          div += gs[j] + gt[j], ks += gs[j], kt += gt[j];
        }
      }
      const double ce = target[i] >= 0 ? -x[target[i]] : 0.0;
      rows[i] = o.alpha * ce + (1 - o.alpha) * div;
      const double g = o.reduction == TLSE_REDUCTION_NONE  ? dloss[i]
                       : o.reduction == TLSE_REDUCTION_SUM ? dloss[0]
                                                           : dloss[0] / double(scored);
      for (std::int64_t j = 0; j < v; ++j) {
        const double cs = g * (1 - o.alpha) * (gs[j] - std::exp(ls[j]) * ks) / o.temperature +
                          (target[i] >= 0 ? g * o.alpha * (std::exp(x[j]) - (j == target[i])) : 0.0);
        const double ct = g * (1 - o.alpha) * (gt[j] - std::exp(lt[j]) * kt) / o.temperature;
        for (std::int64_t k = 0; k < ds; ++k)
          dHs[i * ds + k] += cs * Ws[j * ds + k], dWs[j * ds + k] += cs * Hs[i * ds + k];
        for (std::int64_t k = 0; k < dt; ++k)
          dHt[i * dt + k] += ct * Wt[j * dt + k], dWt[j * dt + k] += ct * Ht[i * dt + k];
      }
    }
    double total = 0;
    for (double r : rows) total += r;
    if (o.reduction == TLSE_REDUCTION_NONE)
      loss = rows;
    else
      loss = {o.reduction == TLSE_REDUCTION_SUM ? total : scored ? total / double(scored) : 0.0};
  }
};

/// The self-similarity (NT-Xent) loss of Z (n x c, n even) in float64 with every logit formed:
/// x_ij = scale Z_i . Z_j for j != i, loss = mean_i lse_i - x_{i,(i+n/2) mod n}. Its gradient with
/// respect to x is G_ij = (p_ij - [j = positive of i]) / n; dZ = scale (G + G^T) Z and dscale =
/// sum_ij G_ij Z_i . Z_j, both times dloss.
struct SelfContrastiveReference {
  double loss = 0, dscale = 0;
  std::vector<double> lse, dZ;
  SelfContrastiveReference(const std::vector<double>& Z, std::int64_t n, std::int64_t c, double scale, double dloss)
      : lse(n), dZ(n * c, 0.0) {
    std::vector<double> dot(n * n), G(n * n, 0.0);
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (std::int64_t k = 0; k < c; ++k) s += Z[i * c + k] * Z[j * c + k];
        dot[i * n + j] = s;
      }
    for (std::int64_t i = 0; i < n; ++i) {
      double top = -INFINITY, sum = 0;
      for (std::int64_t j = 0; j < n; ++j)
        if (j != i) top = std::max(top, scale * dot[i * n + j]);
      for (std::int64_t j = 0; j < n; ++j)
        if (j != i) sum += std::exp(scale * dot[i * n + j] - top);
      lse[i] = top + std::log(sum);
      const std::int64_t positive = (i + n / 2) % n;
      loss += (lse[i] - scale * dot[i * n + positive]) / double(n);
      for (std::int64_t j = 0; j < n; ++j)
        if (j != i) G[i * n + j] = dloss * (std::exp(scale * dot[i * n + j] - lse[i]) - (j == positive)) / double(n);
    }
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t j = 0; j < n; ++j) {
        dscale += G[i * n + j] * dot[i * n + j];
        for (std::int64_t k = 0; k < c; ++k) dZ[i * c + k] += scale * (G[i * n + j] + G[j * n + i]) * Z[j * c + k];
      }
  }
};

/// |got - want| <= tolerance (1 + max |want|) entry by entry.
template <class T>
void expect_near_all(const char* name, const std::vector<T>& got, const std::vector<double>& want, double tolerance) {
  double magnitude = 0;
  for (double x : want) magnitude = std::max(magnitude, std::fabs(x));
  ASSERT_EQ(got.size(), want.size()) << name;
  for (std::size_t i = 0; i < want.size(); ++i)
    EXPECT_LE(std::fabs(double(got[i]) - want[i]), tolerance * (1 + magnitude)) << name << "[" << i << "]";
}

/// Forward then backward through the C API in float (T = float) or double, with a lent workspace
/// and with `accumulate`, against the float64 reference on inputs drawn fresh per run. Tolerances:
/// the kernels accumulate in T over c products and n exponentials, so 2^-40 (double) and 2^-17
/// (float: about 64 roundings of 2^-24) of the largest reference magnitude.
template <class T>
void check_self_contrastive(std::int64_t n, std::int64_t c, double scale) {
  const tlse_dtype dtype = sizeof(T) == 8 ? TLSE_F64 : TLSE_F32;
  const double tolerance = sizeof(T) == 8 ? 0x1p-40 : 0x1p-17;
  std::mt19937_64 rng(std::random_device{}());
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<double> Z64(n * c);
  for (double& z : Z64) z = T(normal(rng));  // exactly representable in T: both sides see the same input
  const std::vector<T> Z(Z64.begin(), Z64.end());
  const double dloss = 1.25;
  const SelfContrastiveReference ref(Z64, n, c, scale, dloss);

  tlse_contrastive_options options;
  tlse_contrastive_options_default(&options);
  options.scale = scale;
  std::size_t bytes = 0;
  ASSERT_EQ(tlse_self_contrastive_workspace_bytes(context(), TLSE_DEVICE_HOST, nullptr, dtype, n, c, &options, &bytes),
            TLSE_SUCCESS)
      << tlse_last_error();
  std::vector<char> arena(bytes + 64);
  options.workspace = arena.data(), options.workspace_bytes = arena.size();
  std::vector<T> loss(1, T(-1)), lse(n, T(-1)), dZ(n * c, T(-1)), dscale(1, T(-1)), one(1, T(dloss));
  ASSERT_EQ(tlse_self_contrastive_forward(context(), TLSE_DEVICE_HOST, nullptr, dtype, n, c, Z.data(), loss.data(),
                                          lse.data(), &options),
            TLSE_SUCCESS)
      << tlse_last_error();
  ASSERT_EQ(tlse_self_contrastive_backward(context(), TLSE_DEVICE_HOST, nullptr, dtype, n, c, Z.data(), lse.data(),
                                           one.data(), dZ.data(), dscale.data(), &options),
            TLSE_SUCCESS)
      << tlse_last_error();
  expect_near_all("loss", loss, {ref.loss}, tolerance);
  expect_near_all("lse", lse, ref.lse, tolerance);
  expect_near_all("dZ", dZ, ref.dZ, tolerance);
  expect_near_all("dscale", dscale, {ref.dscale}, tolerance);

  // accumulate adds to what dZ and dscale hold; the internal workspace (NULL) gives the same.
  options.accumulate = 1, options.workspace = nullptr, options.workspace_bytes = 0;
  ASSERT_EQ(tlse_self_contrastive_backward(context(), TLSE_DEVICE_HOST, nullptr, dtype, n, c, Z.data(), lse.data(),
                                           one.data(), dZ.data(), dscale.data(), &options),
            TLSE_SUCCESS)
      << tlse_last_error();
  std::vector<double> twice_dZ(ref.dZ);
  for (double& x : twice_dZ) x *= 2;
  expect_near_all("accumulated dZ", dZ, twice_dZ, tolerance);
  expect_near_all("accumulated dscale", dscale, {2 * ref.dscale}, tolerance);
}

TEST(CApiSelfContrastive, MatchesAFloat64Reference) {
  for (double scale : {0.5, 3.0}) {
    SCOPED_TRACE("scale " + std::to_string(scale));
    check_self_contrastive<double>(38, 5, scale);  // 38 rows: not a multiple of the host's 32-wide tiles
    check_self_contrastive<float>(70, 19, scale);
  }
  check_self_contrastive<double>(2, 3, 1.0);  // one sample: each row's only other row is its positive
}

TEST(CApiSelfContrastive, BadInputFailsBeforeAnyWrite) {
  constexpr std::int64_t n = 6, c = 4;
  std::vector<double> Z(n * c, 0.5), loss(1, -1.0), lse(n, -1.0), dloss(1, 1.0), dZ(n * c, -1.0), dscale(1, -1.0);
  tlse_contrastive_options options;
  tlse_contrastive_options_default(&options);
  const auto forward = [&](std::int64_t rows, const void* z, void* loss_at, void* lse_at) {
    return tlse_self_contrastive_forward(context(), TLSE_DEVICE_HOST, nullptr, TLSE_F64, rows, c, z, loss_at, lse_at,
                                         &options);
  };
  const auto backward = [&](std::int64_t rows, const void* lse_at, void* dZ_at) {
    return tlse_self_contrastive_backward(context(), TLSE_DEVICE_HOST, nullptr, TLSE_F64, rows, c, Z.data(), lse_at,
                                          dloss.data(), dZ_at, dscale.data(), &options);
  };
  expect_invalid(forward(5, Z.data(), loss.data(), lse.data()),
                 {"tlse_self_contrastive_forward: argument 'n' is 5;", "n must be even"});
  expect_invalid(backward(-2, lse.data(), dZ.data()), {"tlse_self_contrastive_backward: argument 'n' must be >= 0"});
  expect_invalid(forward(n, Z.data(), nullptr, lse.data()), {"argument 'loss' is NULL"});
  expect_invalid(forward(n, nullptr, loss.data(), lse.data()), {"argument 'Z' is NULL"});
  expect_invalid(backward(n, nullptr, dZ.data()), {"argument 'lse' is NULL"});
  expect_invalid(backward(n, lse.data(), Z.data()), {"argument 'dZ' overlaps argument 'Z'"});
  options.direction = TLSE_DIRECTION_IMAGE_TO_TEXT;
  expect_invalid(forward(n, Z.data(), loss.data(), lse.data()),
                 {"argument 'options.direction' is 1;", "leave it TLSE_DIRECTION_SYMMETRIC"});
  options.direction = TLSE_DIRECTION_SYMMETRIC, options.scale = -1;
  expect_invalid(forward(n, Z.data(), loss.data(), lse.data()), {"tlse::self_contrastive_loss: argument 'scale'"});
  options.scale = 1, options.detect_non_finite = 1;
  Z[7] = std::nan("");
  expect_invalid(backward(n, lse.data(), dZ.data()), {"argument 'Z' contains NaN or Inf"});
  Z[7] = 0.5, options.detect_non_finite = 0;
  std::size_t need = 0;
  ASSERT_EQ(
      tlse_self_contrastive_workspace_bytes(context(), TLSE_DEVICE_HOST, nullptr, TLSE_F64, n, c, &options, &need),
      TLSE_SUCCESS);
  expect_invalid(
      tlse_self_contrastive_workspace_bytes(context(), TLSE_DEVICE_HOST, nullptr, TLSE_F64, 3, c, &options, &need),
      {"argument 'n' is 3"});
  std::vector<char> arena(need);
  options.workspace = arena.data(), options.workspace_bytes = need - 1;
  expect_invalid(forward(n, Z.data(), loss.data(), lse.data()), {"argument 'workspace' holds"});
  for (const auto* out : {&loss, &lse, &dZ, &dscale})
    for (double x : *out) EXPECT_EQ(x, -1.0);
  options.workspace_bytes = need;
  EXPECT_EQ(forward(n, Z.data(), loss.data(), lse.data()), TLSE_SUCCESS) << tlse_last_error();
  EXPECT_EQ(backward(n, lse.data(), dZ.data()), TLSE_SUCCESS) << tlse_last_error();
  EXPECT_NE(dZ[0], -1.0);
}

/// Forward then backward of the distillation loss through the C API in float (T = float) or
/// double, with a lent workspace, then the backward again with `accumulate`, against the float64
/// reference on inputs drawn per run (exactly representable in T). Tolerances as
/// check_self_contrastive's, times 1 + the largest |logit| of either model: each logit is
/// rounded by about u |z| in T, and the divergence's gradients carry log p_t - log p_s, whose
/// error grows with it (seen: dWt off by 1.0004x the unscaled bound in float at temperature 0.5).
template <class T>
void check_distillation(std::int64_t n, std::int64_t v, std::int64_t ds, std::int64_t dt, tlse_distillation_options o,
                        bool with_targets) {
  const tlse_dtype dtype = sizeof(T) == 8 ? TLSE_F64 : TLSE_F32;
  std::mt19937_64 rng(std::random_device{}());
  std::normal_distribution<double> normal(0.0, 1.0);
  const auto draw = [&](std::int64_t count) {
    std::vector<double> x(count);
    for (double& e : x) e = double(T(normal(rng)));
    return x;
  };
  const std::vector<double> Hs64 = draw(n * ds), Ws64 = draw(v * ds), Ht64 = draw(n * dt), Wt64 = draw(v * dt);
  const std::vector<T> Hs(Hs64.begin(), Hs64.end()), Ws(Ws64.begin(), Ws64.end()), Ht(Ht64.begin(), Ht64.end()),
      Wt(Wt64.begin(), Wt64.end());
  std::vector<std::int64_t> targets(n);
  for (std::int64_t i = 0; i < n; ++i) targets[i] = i % 4 == 1 ? o.ignore_index : (7 * i + 3) % v;
  const std::int64_t losses = o.reduction == TLSE_REDUCTION_NONE ? n : 1;
  std::vector<double> dloss64(losses);
  for (std::int64_t i = 0; i < losses; ++i) dloss64[i] = 0.75 + 0.125 * double(i % 5);
  const std::vector<T> dloss(dloss64.begin(), dloss64.end());
  const DistillationReference ref(Hs64, Ws64, Ht64, Wt64, with_targets ? &targets : nullptr, n, v, ds, dt, o, dloss64);
  const std::int64_t* t = with_targets ? targets.data() : nullptr;
  double largest_logit = 0;
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t j = 0; j < v; ++j) {
      double zs = 0, zt = 0;
      for (std::int64_t k = 0; k < ds; ++k) zs += Hs64[i * ds + k] * Ws64[j * ds + k];
      for (std::int64_t k = 0; k < dt; ++k) zt += Ht64[i * dt + k] * Wt64[j * dt + k];
      largest_logit = std::max({largest_logit, std::fabs(zs) / o.temperature, std::fabs(zt) / o.temperature});
    }
  const double tolerance = (sizeof(T) == 8 ? 0x1p-40 : 0x1p-17) * (1 + largest_logit);

  std::size_t bytes = 0;
  ASSERT_EQ(
      tlse_distillation_loss_workspace_bytes(context(), TLSE_DEVICE_HOST, nullptr, dtype, n, v, ds, dt, &o, &bytes),
      TLSE_SUCCESS)
      << tlse_last_error();
  std::vector<char> arena(bytes + 64);
  o.workspace = arena.data(), o.workspace_bytes = arena.size();
  std::vector<T> loss(losses, T(-1)), stats(n * TLSE_DISTILLATION_ROW_STATS, T(-1));
  std::vector<T> dHs(n * ds, T(-1)), dWs(v * ds, T(-1)), dHt(n * dt, T(-1)), dWt(v * dt, T(-1));
  ASSERT_EQ(tlse_distillation_loss(context(), TLSE_DEVICE_HOST, nullptr, dtype, n, v, ds, dt, Hs.data(), Ws.data(),
                                   Ht.data(), Wt.data(), t, loss.data(), stats.data(), &o),
            TLSE_SUCCESS)
      << tlse_last_error();
  expect_near_all("loss", loss, ref.loss, tolerance);
  ASSERT_EQ(tlse_distillation_loss_backward(context(), TLSE_DEVICE_HOST, nullptr, dtype, n, v, ds, dt, Hs.data(),
                                            Ws.data(), Ht.data(), Wt.data(), t, stats.data(), dloss.data(), dHs.data(),
                                            dWs.data(), dHt.data(), dWt.data(), &o),
            TLSE_SUCCESS)
      << tlse_last_error();
  expect_near_all("dHs", dHs, ref.dHs, tolerance);
  expect_near_all("dWs", dWs, ref.dWs, tolerance);
  expect_near_all("dHt", dHt, ref.dHt, tolerance);
  expect_near_all("dWt", dWt, ref.dWt, tolerance);

  // accumulate adds to what the gradients hold; the internal workspace (NULL) gives the same. The
  // teacher frozen: dHt and dWt NULL, left as they were.
  o.accumulate = 1, o.workspace = nullptr, o.workspace_bytes = 0;
  const std::vector<T> dHt_before = dHt;
  ASSERT_EQ(tlse_distillation_loss_backward(context(), TLSE_DEVICE_HOST, nullptr, dtype, n, v, ds, dt, Hs.data(),
                                            Ws.data(), Ht.data(), Wt.data(), t, stats.data(), dloss.data(), dHs.data(),
                                            dWs.data(), nullptr, nullptr, &o),
            TLSE_SUCCESS)
      << tlse_last_error();
  std::vector<double> twice_dHs(ref.dHs), twice_dWs(ref.dWs);
  for (double& x : twice_dHs) x *= 2;
  for (double& x : twice_dWs) x *= 2;
  expect_near_all("accumulated dHs", dHs, twice_dHs, tolerance);
  expect_near_all("accumulated dWs", dWs, twice_dWs, tolerance);
  EXPECT_EQ(dHt, dHt_before);
}

TEST(CApiDistillation, MatchesAFloat64Reference) {
  tlse_distillation_options o;
  tlse_distillation_options_default(&o);
  EXPECT_EQ(o.divergence, TLSE_DIVERGENCE_FORWARD_KL);
  EXPECT_EQ(o.reduction, TLSE_REDUCTION_MEAN);
  EXPECT_EQ(o.beta, 0.5);
  EXPECT_EQ(o.temperature, 1.0);
  EXPECT_EQ(o.alpha, 0.0);
  EXPECT_EQ(o.ignore_index, -100);
  // 37 rows, 53 classes, depths 19 and 11: no multiples of the host's 32-wide tiles.
  for (std::int32_t divergence : {TLSE_DIVERGENCE_FORWARD_KL, TLSE_DIVERGENCE_REVERSE_KL, TLSE_DIVERGENCE_JSD})
    for (double temperature : {0.5, 3.0}) {
      SCOPED_TRACE("divergence " + std::to_string(divergence) + ", temperature " + std::to_string(temperature));
      tlse_distillation_options_default(&o);
      o.divergence = divergence, o.temperature = temperature, o.beta = 0.3;
      check_distillation<double>(37, 53, 19, 11, o, true);
      check_distillation<float>(37, 53, 19, 11, o, true);
      o.alpha = 0.4, o.shift = 1, o.reduction = TLSE_REDUCTION_NONE;
      check_distillation<double>(37, 53, 19, 11, o, true);
      o.reduction = TLSE_REDUCTION_SUM;
      check_distillation<float>(37, 53, 19, 11, o, true);
      o.alpha = 0, o.shift = 0, o.reduction = TLSE_REDUCTION_MEAN;
      check_distillation<double>(37, 53, 19, 11, o, false);  // no targets: every row scored
    }
  for (double beta : {0.0, 1.0}) {  // JSD's ends: the forward and the reverse KL
    SCOPED_TRACE("JSD beta " + std::to_string(beta));
    tlse_distillation_options_default(&o);
    o.divergence = TLSE_DIVERGENCE_JSD, o.beta = beta, o.temperature = 2.0;
    check_distillation<double>(9, 40, 5, 7, o, true);
  }
}

TEST(CApiDistillation, BadInputFailsBeforeAnyWrite) {
  constexpr std::int64_t n = 6, v = 5, ds = 3, dt = 4;
  std::vector<double> Hs(n * ds, 0.25), Ws(v * ds, -0.5), Ht(n * dt, 0.5), Wt(v * dt, 0.125);
  std::vector<std::int64_t> targets(n, 2);
  std::vector<double> loss(n, -1.0), stats(n * TLSE_DISTILLATION_ROW_STATS, -1.0), dloss(n, 1.0);
  std::vector<double> dHs(n * ds, -1.0), dWs(v * ds, -1.0), dHt(n * dt, -1.0), dWt(v * dt, -1.0);
  tlse_distillation_options o;
  tlse_distillation_options_default(&o);
  const auto forward = [&](std::int64_t rows = 6, const void* hs = nullptr, void* loss_at = nullptr,
                           const std::int64_t* t = nullptr) {
    return tlse_distillation_loss(context(), TLSE_DEVICE_HOST, nullptr, TLSE_F64, rows, v, ds, dt, hs ? hs : Hs.data(),
                                  Ws.data(), Ht.data(), Wt.data(), t ? t : targets.data(),
                                  loss_at ? loss_at : loss.data(), stats.data(), &o);
  };
  const auto backward = [&](const void* stats_at, void* dhs_at, const void* dloss_at = nullptr) {
    return tlse_distillation_loss_backward(
        context(), TLSE_DEVICE_HOST, nullptr, TLSE_F64, n, v, ds, dt, Hs.data(), Ws.data(), Ht.data(), Wt.data(),
        targets.data(), stats_at, dloss_at ? dloss_at : dloss.data(), dhs_at, dWs.data(), dHt.data(), dWt.data(), &o);
  };
  expect_invalid(forward(-1), {"tlse_distillation_loss: argument 'n' must be >= 0, got -1"});
  expect_invalid(tlse_distillation_loss(context(), TLSE_DEVICE_HOST, nullptr, TLSE_F64, n, v, ds, dt, nullptr,
                                        Ws.data(), Ht.data(), Wt.data(), nullptr, loss.data(), nullptr, &o),
                 {"argument 'Hs' is NULL but has 18 elements"});
  expect_invalid(tlse_distillation_loss(context(), TLSE_DEVICE_HOST, nullptr, TLSE_F64, n, v, ds, dt, Hs.data(),
                                        Ws.data(), Ht.data(), nullptr, nullptr, loss.data(), nullptr, &o),
                 {"argument 'Wt' is NULL but has 20 elements"});
  expect_invalid(tlse_distillation_loss(context(), TLSE_DEVICE_HOST, nullptr, TLSE_F64, n, v, ds, dt, Hs.data(),
                                        Ws.data(), Ht.data(), Wt.data(), nullptr, nullptr, nullptr, &o),
                 {"argument 'loss' is NULL but has 1 elements"});
  expect_invalid(tlse_distillation_loss(context(), TLSE_DEVICE_HOST, nullptr, TLSE_F64, n, v, ds, dt, Hs.data(),
                                        Ws.data(), Ht.data(), Wt.data(), nullptr, loss.data(), nullptr, &o),
                 {"tlse_distillation_loss: argument 'row_stats' is NULL but has"});
  expect_invalid(tlse_distillation_loss(context(), TLSE_DEVICE_HOST, nullptr, static_cast<tlse_dtype>(8), n, v, ds, dt,
                                        Hs.data(), Ws.data(), Ht.data(), Wt.data(), nullptr, loss.data(), nullptr, &o),
                 {"argument 'dtype' is 8"});
  expect_invalid(forward(n, nullptr, Hs.data() + 1), {"argument 'loss' overlaps argument 'Hs'"});
  expect_invalid(backward(nullptr, dHs.data()), {"tlse_distillation_loss_backward: argument 'row_stats' is NULL"});
  expect_invalid(backward(stats.data(), Hs.data()), {"argument 'dHs' overlaps argument 'Hs'"});
  std::vector<double> raw(n * ds + 1);
  expect_invalid(backward(stats.data(), reinterpret_cast<char*>(raw.data()) + 4),
                 {"argument 'dHs' is at address", "not a multiple of 8 bytes"});
  o.divergence = 3;
  expect_invalid(forward(), {"argument 'options.divergence' is 3, not a tlse_divergence"});
  o.divergence = TLSE_DIVERGENCE_JSD, o.reduction = -1;
  expect_invalid(forward(), {"argument 'options.reduction' is -1, not a tlse_reduction"});
  o.reduction = TLSE_REDUCTION_NONE;
  // The C++ layer's checks, named as the core names them.
  o.beta = 1.5;
  expect_invalid(forward(), {"distillation_loss", "'beta'", "1.5"});
  o.beta = 0.5, o.temperature = 0;
  expect_invalid(forward(), {"distillation_loss", "'temperature'"});
  o.temperature = -2;
  expect_invalid(backward(stats.data(), dHs.data()), {"distillation_loss_backward", "'temperature'"});
  o.temperature = 1, o.alpha = 1.5;
  expect_invalid(forward(), {"distillation_loss", "'alpha'", "1.5"});
  o.alpha = 0.5;
  expect_invalid(tlse_distillation_loss(context(), TLSE_DEVICE_HOST, nullptr, TLSE_F64, n, v, ds, dt, Hs.data(),
                                        Ws.data(), Ht.data(), Wt.data(), nullptr, loss.data(), stats.data(), &o),
                 {"distillation_loss", "'targets'", "alpha"});
  o.alpha = 0, o.shift = -1;
  expect_invalid(forward(), {"distillation_loss", "'shift'"});
  o.shift = 0;
  targets[4] = v;
  expect_invalid(forward(), {"distillation_loss", "targets[4] = 5"});
  targets[4] = 2;
  std::size_t need = 0;
  ASSERT_EQ(
      tlse_distillation_loss_workspace_bytes(context(), TLSE_DEVICE_HOST, nullptr, TLSE_F64, n, v, ds, dt, &o, &need),
      TLSE_SUCCESS)
      << tlse_last_error();
  expect_invalid(
      tlse_distillation_loss_workspace_bytes(context(), TLSE_DEVICE_HOST, nullptr, TLSE_F64, n, v, -3, dt, &o, &need),
      {"tlse_distillation_loss_workspace_bytes: argument 'd_s' must be >= 0, got -3"});
  expect_invalid(
      tlse_distillation_loss_workspace_bytes(context(), TLSE_DEVICE_HOST, nullptr, TLSE_F64, n, v, ds, dt, &o, nullptr),
      {"argument 'bytes' is NULL"});
  for (const auto* out : {&loss, &stats, &dHs, &dWs, &dHt, &dWt})
    for (double x : *out) EXPECT_EQ(x, -1.0);
  EXPECT_EQ(forward(), TLSE_SUCCESS) << tlse_last_error();
  EXPECT_EQ(backward(stats.data(), dHs.data()), TLSE_SUCCESS) << tlse_last_error();
  EXPECT_NE(dHs[0], -1.0);
}

/// One distillation problem of storage type T (float or double: the accumulator type too) run both
/// ways, the step in one call (tlse_distillation_loss_with_gradients) and the forward then the
/// backward, with the same options and dloss, from the same starting gradients (they matter with
/// `accumulate`). On the host the step runs the pair: its results bitwise (tlse.h).
template <class T>
struct DistillationStepAgainstPair {
  static constexpr std::int64_t n = 37, v = 53, ds = 19, dt = 11;  // no multiples of the host's 32-wide tiles
  tlse_dtype dtype = sizeof(T) == 8 ? TLSE_F64 : TLSE_F32;
  tlse_distillation_options options;
  std::vector<T> Hs = std::vector<T>(n * ds), Ws = std::vector<T>(v * ds), Ht = std::vector<T>(n * dt),
                 Wt = std::vector<T>(v * dt);
  std::vector<std::int64_t> targets = std::vector<std::int64_t>(n);
  bool with_targets = true, teacher_gradients = true;

  DistillationStepAgainstPair() {
    tlse_distillation_options_default(&options);
    for (std::int64_t i = 0; i < n * ds; ++i) Hs[i] = T(std::sin(0.37 * double(i)));
    for (std::int64_t i = 0; i < v * ds; ++i) Ws[i] = T(std::cos(0.11 * double(i)));
    for (std::int64_t i = 0; i < n * dt; ++i) Ht[i] = T(std::sin(0.23 * double(i) + 1));
    for (std::int64_t i = 0; i < v * dt; ++i) Wt[i] = T(std::cos(0.29 * double(i) + 2));
    for (std::int64_t i = 0; i < n; ++i) targets[i] = i % 5 == 4 ? options.ignore_index : (13 * i) % v;
  }

  void check() const {
    const std::int64_t losses = options.reduction == TLSE_REDUCTION_NONE ? n : 1;
    std::vector<T> dloss(losses), loss(losses, T(-1)), pair_loss(losses, T(-2));
    std::vector<T> stats(n * TLSE_DISTILLATION_ROW_STATS);
    for (std::int64_t i = 0; i < losses; ++i) dloss[i] = T(0.5 + 0.1 * double(i));
    std::vector<T> dHs(n * ds), dWs(v * ds), dHt(n * dt), dWt(v * dt);
    for (std::int64_t i = 0; i < n * ds; ++i) dHs[i] = T(0.01 * double(i % 7));
    for (std::int64_t i = 0; i < v * ds; ++i) dWs[i] = T(-0.02 * double(i % 3));
    for (std::int64_t i = 0; i < n * dt; ++i) dHt[i] = T(0.03 * double(i % 5));
    for (std::int64_t i = 0; i < v * dt; ++i) dWt[i] = T(-0.5);
    std::vector<T> pair_dHs = dHs, pair_dWs = dWs, pair_dHt = dHt, pair_dWt = dWt;
    const std::int64_t* t = with_targets ? targets.data() : nullptr;
    const auto teacher = [&](std::vector<T>& g) { return teacher_gradients ? g.data() : nullptr; };

    ASSERT_EQ(tlse_distillation_loss_with_gradients(
                  context(), TLSE_DEVICE_HOST, nullptr, dtype, n, v, ds, dt, Hs.data(), Ws.data(), Ht.data(), Wt.data(),
                  t, dloss.data(), loss.data(), dHs.data(), dWs.data(), teacher(dHt), teacher(dWt), &options),
              TLSE_SUCCESS)
        << tlse_last_error();
    ASSERT_EQ(tlse_distillation_loss(context(), TLSE_DEVICE_HOST, nullptr, dtype, n, v, ds, dt, Hs.data(), Ws.data(),
                                     Ht.data(), Wt.data(), t, pair_loss.data(), stats.data(), &options),
              TLSE_SUCCESS)
        << tlse_last_error();
    ASSERT_EQ(
        tlse_distillation_loss_backward(context(), TLSE_DEVICE_HOST, nullptr, dtype, n, v, ds, dt, Hs.data(), Ws.data(),
                                        Ht.data(), Wt.data(), t, stats.data(), dloss.data(), pair_dHs.data(),
                                        pair_dWs.data(), teacher(pair_dHt), teacher(pair_dWt), &options),
        TLSE_SUCCESS)
        << tlse_last_error();
    EXPECT_EQ(loss, pair_loss);
    EXPECT_EQ(dHs, pair_dHs);
    EXPECT_EQ(dWs, pair_dWs);
    EXPECT_EQ(dHt, pair_dHt);  // left as they were when the teacher is frozen
    EXPECT_EQ(dWt, pair_dWt);
    if (options.accumulate == 0) {
      EXPECT_NE(dHs[0], T(0.0)) << "the step wrote no gradient";
    }
  }
};

template <class T>
void check_distillation_steps() {
  for (std::int32_t divergence : {TLSE_DIVERGENCE_FORWARD_KL, TLSE_DIVERGENCE_REVERSE_KL, TLSE_DIVERGENCE_JSD}) {
    SCOPED_TRACE("divergence " + std::to_string(divergence) + (sizeof(T) == 8 ? ", f64" : ", f32"));
    {
      SCOPED_TRACE("mean, temperature 2");
      DistillationStepAgainstPair<T> p;
      p.options.divergence = divergence, p.options.temperature = 2.0, p.options.beta = 0.3;
      p.check();
    }
    {
      SCOPED_TRACE("none (one dloss per row), alpha, shift, the teacher frozen");
      DistillationStepAgainstPair<T> p;
      p.options.divergence = divergence, p.options.reduction = TLSE_REDUCTION_NONE;
      p.options.alpha = 0.4, p.options.shift = 1, p.teacher_gradients = false;
      p.check();
    }
    {
      SCOPED_TRACE("sum, accumulate");
      DistillationStepAgainstPair<T> p;
      p.options.divergence = divergence, p.options.reduction = TLSE_REDUCTION_SUM, p.options.accumulate = 1;
      p.check();
    }
    {
      SCOPED_TRACE("no targets: every row scored");
      DistillationStepAgainstPair<T> p;
      p.options.divergence = divergence, p.options.temperature = 0.5, p.with_targets = false;
      p.check();
    }
  }
}

TEST(CApiDistillationStep, MatchesForwardAndBackward) {
  check_distillation_steps<double>();
  check_distillation_steps<float>();
}

TEST(CApiDistillationStep, BadInputFailsBeforeAnyWrite) {
  constexpr std::int64_t n = 6, v = 5, ds = 3, dt = 4;
  std::vector<double> Hs(n * ds, 0.25), Ws(v * ds, -0.5), Ht(n * dt, 0.5), Wt(v * dt, 0.125);
  std::vector<std::int64_t> targets(n, 2);
  std::vector<double> loss(n, -1.0), dloss(n, 1.0);
  std::vector<double> dHs(n * ds, -1.0), dWs(v * ds, -1.0), dHt(n * dt, -1.0), dWt(v * dt, -1.0);
  tlse_distillation_options o;
  tlse_distillation_options_default(&o);
  struct Args {
    std::int64_t rows = n, d_s = ds;
    const void *hs = nullptr, *wt = nullptr, *dloss = nullptr;
    void *loss = nullptr, *dhs = nullptr;
    tlse_dtype dtype = TLSE_F64;
  };
  const auto step = [&](Args a) {
    return tlse_distillation_loss_with_gradients(
        context(), TLSE_DEVICE_HOST, nullptr, a.dtype, a.rows, v, a.d_s, dt, a.hs ? a.hs : Hs.data(), Ws.data(),
        Ht.data(), a.wt ? a.wt : Wt.data(), targets.data(), a.dloss ? a.dloss : dloss.data(),
        a.loss ? a.loss : loss.data(), a.dhs ? a.dhs : dHs.data(), dWs.data(), dHt.data(), dWt.data(), &o);
  };
  const auto untouched = [&] {
    for (const auto* out : {&loss, &dHs, &dWs, &dHt, &dWt})
      for (double x : *out)
        if (x != -1.0) return false;
    return true;
  };
  const auto with = [](auto set) {
    Args a;
    set(a);
    return a;
  };
  // Sizes, NULL pointers, overlaps, dtype and options: the C layer's checks, named for the step.
  expect_invalid(step(with([](Args& a) { a.rows = -1; })),
                 {"tlse_distillation_loss_with_gradients: argument 'n' must be >= 0, got -1"});
  expect_invalid(step(with([](Args& a) { a.d_s = std::int64_t(1) << 31; })),
                 {"tlse_distillation_loss_with_gradients: argument 'd_s' is 2147483648, more than"});
  expect_invalid(tlse_distillation_loss_with_gradients(
                     context(), TLSE_DEVICE_HOST, nullptr, TLSE_F64, n, v, ds, dt, nullptr, Ws.data(), Ht.data(),
                     Wt.data(), targets.data(), dloss.data(), loss.data(), nullptr, nullptr, nullptr, nullptr, &o),
                 {"tlse_distillation_loss_with_gradients: argument 'Hs' is NULL but has 18 elements"});
  expect_invalid(tlse_distillation_loss_with_gradients(
                     context(), TLSE_DEVICE_HOST, nullptr, TLSE_F64, n, v, ds, dt, Hs.data(), Ws.data(), Ht.data(),
                     nullptr, targets.data(), dloss.data(), loss.data(), nullptr, nullptr, nullptr, nullptr, &o),
                 {"tlse_distillation_loss_with_gradients: argument 'Wt' is NULL but has 20 elements"});
  expect_invalid(tlse_distillation_loss_with_gradients(
                     context(), TLSE_DEVICE_HOST, nullptr, TLSE_F64, n, v, ds, dt, Hs.data(), Ws.data(), Ht.data(),
                     Wt.data(), targets.data(), dloss.data(), nullptr, dHs.data(), nullptr, nullptr, nullptr, &o),
                 {"tlse_distillation_loss_with_gradients: argument 'loss' is NULL but has 1 elements"});
  expect_invalid(tlse_distillation_loss_with_gradients(context(), TLSE_DEVICE_HOST, nullptr, TLSE_F64, n, v, ds, dt,
                                                       Hs.data(), Ws.data(), Ht.data(), Wt.data(), targets.data(),
                                                       nullptr, loss.data(), dHs.data(), nullptr, nullptr, nullptr, &o),
                 {"tlse_distillation_loss_with_gradients: argument 'dloss' is NULL but has 1 elements"});
  expect_invalid(step(with([](Args& a) { a.dtype = static_cast<tlse_dtype>(9); })), {"argument 'dtype' is 9"});
  // The loss written over dloss, which the backward half reads after the forward half wrote the loss.
  expect_invalid(step(with([&](Args& a) { a.dloss = a.loss = loss.data(); })),
                 {"argument 'dloss' overlaps argument 'loss'"});
  expect_invalid(step(with([&](Args& a) { a.dhs = Hs.data(); })), {"argument 'dHs' overlaps argument 'Hs'"});
  std::vector<double> raw(n * ds + 1);
  expect_invalid(step(with([&](Args& a) { a.dhs = reinterpret_cast<char*>(raw.data()) + 4; })),
                 {"argument 'dHs' is at address", "not a multiple of 8 bytes"});
  o.divergence = 3;
  expect_invalid(step({}), {"tlse_distillation_loss_with_gradients: argument 'options.divergence' is 3"});
  o.divergence = TLSE_DIVERGENCE_JSD, o.reduction = TLSE_REDUCTION_NONE;  // loss and dloss: n values each
  std::vector<double> both(2 * n, -1.0);
  expect_invalid(step(with([&](Args& a) { a.dloss = both.data(), a.loss = both.data() + n - 1; })),
                 {"argument 'dloss' overlaps argument 'loss'"});
  expect_invalid(tlse_distillation_loss_with_gradients(context(), TLSE_DEVICE_HOST, nullptr, TLSE_F64, n, v, ds, dt,
                                                       Hs.data(), Ws.data(), Ht.data(), Wt.data(), targets.data(),
                                                       nullptr, loss.data(), dHs.data(), nullptr, nullptr, nullptr, &o),
                 {"argument 'dloss' is NULL but has 6 elements"});
  // The C++ layer's checks, with the step's name.
  o.temperature = 0;
  expect_invalid(step({}), {"distillation_loss_with_gradients", "'temperature'"});
  o.temperature = 1, o.alpha = 1.5;
  expect_invalid(step({}), {"distillation_loss_with_gradients", "'alpha'", "1.5"});
  o.alpha = 0;
  targets[4] = v;
  expect_invalid(step({}), {"distillation_loss_with_gradients", "targets[4] = 5"});
  targets[4] = 2;
  // A lent workspace smaller than tlse_distillation_loss_workspace_bytes says.
  std::size_t need = 0;
  ASSERT_EQ(
      tlse_distillation_loss_workspace_bytes(context(), TLSE_DEVICE_HOST, nullptr, TLSE_F64, n, v, ds, dt, &o, &need),
      TLSE_SUCCESS)
      << tlse_last_error();
  std::vector<char> arena(need);
  o.workspace = arena.data(), o.workspace_bytes = need - 1;
  const std::string holds = "argument 'workspace' holds " + std::to_string(need - 1) + " bytes but this call needs";
  expect_invalid(step({}), {holds.c_str()});
  EXPECT_TRUE(untouched());
  for (double x : both) EXPECT_EQ(x, -1.0);
  o.workspace_bytes = need;
  EXPECT_EQ(step({}), TLSE_SUCCESS) << tlse_last_error();
  EXPECT_FALSE(untouched());
}

TEST(CApiDistillationStep, StepFusedQuery) {
  constexpr std::int64_t v = 53, ds = 64, dt = 128;  // depths of 8s: the GPU's tile-pair kernels would take them
  tlse_distillation_options options;
  tlse_distillation_options_default(&options);
  const auto query = [&](tlse_dtype dtype, int want_teacher, int* fused, std::int64_t n = 37,
                         tlse_device device = TLSE_DEVICE_HOST, tlse_context* ctx = context()) {
    return tlse_distillation_step_fused(ctx, device, nullptr, dtype, n, v, ds, dt, &options, want_teacher, fused);
  };
  // The host backend has no fused step: always the forward then the backward, whatever the
  // divergence and the budget (here one that would hold every logit many times over).
  options.memory_budget = std::uint64_t(1) << 40;
  for (std::int32_t divergence : {TLSE_DIVERGENCE_FORWARD_KL, TLSE_DIVERGENCE_REVERSE_KL, TLSE_DIVERGENCE_JSD})
    for (tlse_dtype dtype : {TLSE_F32, TLSE_F64, TLSE_BF16, TLSE_F16})
      for (int want_teacher : {0, 1}) {
        options.divergence = divergence;
        int fused = -1;
        EXPECT_EQ(query(dtype, want_teacher, &fused), TLSE_SUCCESS) << tlse_last_error();
        EXPECT_EQ(fused, 0) << "divergence " << divergence << ", dtype " << dtype << ", want_teacher " << want_teacher;
      }
  int fused = -1;  // NULL options: the defaults
  EXPECT_EQ(
      tlse_distillation_step_fused(context(), TLSE_DEVICE_HOST, nullptr, TLSE_BF16, 37, v, ds, dt, nullptr, 0, &fused),
      TLSE_SUCCESS)
      << tlse_last_error();
  EXPECT_EQ(fused, 0);
  // Bad arguments fail naming them, and leave *fused as it was.
  fused = -1;
  expect_invalid(query(TLSE_BF16, 0, nullptr), {"tlse_distillation_step_fused: argument 'fused' is NULL"});
  expect_invalid(query(TLSE_BF16, 0, &fused, -1), {"tlse_distillation_step_fused: argument 'n' must be >= 0, got -1"});
  expect_invalid(query(static_cast<tlse_dtype>(9), 0, &fused), {"argument 'dtype' is 9"});
  expect_invalid(query(TLSE_BF16, 0, &fused, 37, static_cast<tlse_device>(5)), {"argument 'device' is 5"});
  expect_invalid(query(TLSE_BF16, 0, &fused, 37, TLSE_DEVICE_HOST, nullptr), {"argument 'context' is NULL"});
  options.divergence = 3;
  expect_invalid(query(TLSE_BF16, 0, &fused), {"argument 'options.divergence' is 3"});
  options.divergence = TLSE_DIVERGENCE_FORWARD_KL, options.reduction = 7;
  expect_invalid(query(TLSE_BF16, 0, &fused), {"argument 'options.reduction' is 7"});
  EXPECT_EQ(fused, -1);
}

}  // namespace
