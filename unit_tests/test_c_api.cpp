// The C API's own checks, called from C++ as a C caller would: one regression test per bug found
// while fuzzing the C API (c_api/fuzz, its sanitizers, and the model of valid calls it checks
// against). Each call fails with a status and a message naming the argument and the values, and
// leaves every output as it was. CI also runs these under ASan and UBSan (scripts/sanitize.sh),
// where some of the bugs were undefined behaviour only.
#include <gtest/gtest.h>
#include <tlse.h>

#include <cstdint>
#include <initializer_list>
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
                                      targets.data(), loss.data(), lse.data(), nullptr, &options);
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
                                 nullptr, ce.targets.data(), ce.E.data(), nullptr, nullptr, &ce.options),
      TLSE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(tlse_last_error()).find("argument 'loss' overlaps argument 'E'"), std::string::npos);
  // The loss written over the last lse.
  expect_invalid(tlse_cross_entropy_forward(context(), TLSE_DEVICE_HOST, nullptr, TLSE_F64, N, V, D, ce.E.data(),
                                            ce.C.data(), nullptr, ce.targets.data(), ce.lse.data() + N - 1,
                                            ce.lse.data(), nullptr, &ce.options),
                 {"argument 'lse' overlaps argument 'loss'"});
  // The backward's dE over its own lse.
  std::vector<double> both(N * D, -1.0);
  expect_invalid(tlse_cross_entropy_backward(context(), TLSE_DEVICE_HOST, nullptr, TLSE_F64, N, V, D, ce.E.data(),
                                             ce.C.data(), nullptr, ce.targets.data(), both.data(), nullptr,
                                             ce.dloss.data(), both.data(), nullptr, nullptr, &ce.options),
                 {"argument 'dE' overlaps argument 'lse'"});
  // A lent workspace over the loss.
  std::vector<double> arena(4096, -1.0);
  ce.options.workspace = arena.data() + 1, ce.options.workspace_bytes = 4000 * sizeof(double);
  expect_invalid(
      tlse_cross_entropy_forward(context(), TLSE_DEVICE_HOST, nullptr, TLSE_F64, N, V, D, ce.E.data(), ce.C.data(),
                                 nullptr, ce.targets.data(), arena.data() + 10, nullptr, nullptr, &ce.options),
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
  expect_invalid(tlse_cross_entropy_forward(context(), TLSE_DEVICE_HOST, nullptr, TLSE_F64, N, V, D, odd, ce.C.data(),
                                            nullptr, ce.targets.data(), ce.loss.data(), nullptr, nullptr, &ce.options),
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
                                      nullptr, targets.data(), &loss, nullptr, nullptr, &o);
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
                                       nullptr, targets.data(), &loss64, nullptr, nullptr, &o),
            TLSE_SUCCESS)
      << tlse_last_error();
}

}  // namespace
