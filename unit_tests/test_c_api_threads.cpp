// The C API called from several host threads at once (docs/errors.md, Concurrency): every call
// returns a correct result or a status with a message, never a crash; results do not depend on
// what other threads do; a destroyed context and a host call from a thread Kokkos does not take
// work from are errors. Only the C API is linked: the library's Kokkos is private to it, and the
// thread that creates the first context (the test's main thread) initializes it.
#include <gtest/gtest.h>
#include <tlse.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#if defined(TLSE_TEST_HOST_OPENMP)
#include <omp.h>
#endif
#if defined(TLSE_TEST_CUDA)
#include <cuda_runtime_api.h>
#endif

namespace {

constexpr int kThreads = 8, kRounds = 20;
constexpr std::int64_t N = 37, V = 53, D = 19;

/// The context every test shares: it stays alive for the whole run, so that destroying other
/// contexts never finalizes Kokkos (which cannot be initialized twice in a process).
tlse_context* shared_context() {
  static tlse_context* ctx = [] {
    tlse_context* c = nullptr;
    EXPECT_EQ(tlse_context_create(&c, -1), TLSE_SUCCESS) << tlse_last_error();
    return c;
  }();
  return ctx;
}

/// One cross-entropy forward and backward: the inputs, and every output as bytes.
struct CrossEntropyRun {
  std::vector<float> E, C, bias;
  std::vector<std::int64_t> targets;
  std::vector<float> loss = std::vector<float>(1, -1.0f), lse = std::vector<float>(N, -1.0f);
  std::vector<float> dloss = std::vector<float>(1, 1.0f);
  std::vector<float> dE = std::vector<float>(N * D, -1.0f), dC = std::vector<float>(V * D, -1.0f);

  CrossEntropyRun() : E(N * D), C(V * D), bias(V), targets(N) {
    for (std::int64_t i = 0; i < N * D; ++i) E[i] = float((i * 7919) % 29) / 16 - 0.9f;
    for (std::int64_t i = 0; i < V * D; ++i) C[i] = float((i * 104729) % 31) / 16 - 1.0f;
    for (std::int64_t j = 0; j < V; ++j) bias[j] = float(j % 5) / 4;
    for (std::int64_t i = 0; i < N; ++i) targets[i] = i % 9 == 4 ? -100 : (i * 13) % V;
  }
  /// Forward then backward on `device` (host pointers, or device copies made by the caller).
  tlse_status run(tlse_context* ctx, tlse_device device = TLSE_DEVICE_HOST, void* stream = nullptr) {
    tlse_cross_entropy_options o;
    tlse_cross_entropy_options_default(&o);
    o.filter_eps = 0;
    const tlse_status s =
        tlse_cross_entropy_forward(ctx, device, stream, TLSE_F32, N, V, D, E.data(), C.data(), bias.data(),
                                   targets.data(), loss.data(), lse.data(), nullptr, nullptr, &o);
    if (s != TLSE_SUCCESS) return s;
    return tlse_cross_entropy_backward(ctx, device, stream, TLSE_F32, N, V, D, E.data(), C.data(), bias.data(),
                                       targets.data(), lse.data(), nullptr, dloss.data(), dE.data(), dC.data(), nullptr,
                                       nullptr, &o);
  }
  bool same_outputs(const CrossEntropyRun& o) const {
    return loss == o.loss && lse == o.lse && dE == o.dE && dC == o.dC;
  }
  bool outputs_untouched() const { return same_outputs(CrossEntropyRun()); }
};

/// A host call from a thread that did not initialize Kokkos is accepted when Kokkos' host space
/// is Serial, or OpenMP from Kokkos 4 on (its launches take a per-instance lock, and the thread
/// is in no parallel region); Kokkos 3's OpenMP backend takes work only from the thread that
/// initialized it, and the library refuses the others' calls (tlse.h, tlse_context_create).
bool other_threads_may_run_host_calls() {
#if defined(TLSE_TEST_HOST_OPENMP) && TLSE_TEST_KOKKOS_MAJOR < 4
  return false;
#else
  return true;
#endif
}

TEST(CApiThreads, ManyThreadsOneContextGetTheSameResultOrAClearError) {
  tlse_context* ctx = shared_context();
  CrossEntropyRun expected;
  ASSERT_EQ(expected.run(ctx), TLSE_SUCCESS) << tlse_last_error();
  std::atomic<int> wrong{0}, refused{0};
  std::vector<std::string> failures(kThreads);
  auto worker = [&](int id) {
    for (int round = 0; round < kRounds; ++round) {
      CrossEntropyRun r;
      const tlse_status s = r.run(ctx);
      if (s == TLSE_SUCCESS && r.same_outputs(expected)) continue;
      const std::string message = tlse_last_error();
      if (s == TLSE_ERROR_UNSUPPORTED && !other_threads_may_run_host_calls() && r.outputs_untouched() &&
          message.find("the thread that initialized Kokkos") != std::string::npos) {
        ++refused;
        continue;
      }
      ++wrong;
      failures[id] = "status " + std::to_string(s) + ": " + message;
    }
  };
  std::vector<std::thread> threads;
  for (int id = 0; id < kThreads; ++id) threads.emplace_back(worker, id);
  // The initializing thread keeps computing while the others call.
  for (int round = 0; round < kRounds; ++round) {
    CrossEntropyRun r;
    ASSERT_EQ(r.run(ctx), TLSE_SUCCESS) << tlse_last_error();
    EXPECT_TRUE(r.same_outputs(expected)) << "round " << round;
  }
  for (auto& t : threads) t.join();
  for (const auto& f : failures) EXPECT_TRUE(f.empty()) << f;
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(refused.load(), other_threads_may_run_host_calls() ? 0 : kThreads * kRounds);
}

TEST(CApiThreads, ContextsComeAndGoWhileOthersCompute) {
  tlse_context* ctx = shared_context();
  CrossEntropyRun expected;
  ASSERT_EQ(expected.run(ctx), TLSE_SUCCESS) << tlse_last_error();
  std::atomic<int> failed{0};
  std::vector<std::thread> threads;
  for (int id = 0; id < kThreads; ++id)
    threads.emplace_back([&] {
      for (int round = 0; round < kRounds; ++round) {
        tlse_context* mine = nullptr;
        int device = 0;
        if (tlse_context_create(&mine, -1) != TLSE_SUCCESS || tlse_context_cuda_device(mine, &device) != TLSE_SUCCESS ||
            tlse_context_destroy(mine) != TLSE_SUCCESS)
          ++failed;
      }
    });
  for (int round = 0; round < kRounds; ++round) {
    CrossEntropyRun r;
    ASSERT_EQ(r.run(ctx), TLSE_SUCCESS) << tlse_last_error();
    EXPECT_TRUE(r.same_outputs(expected));
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failed.load(), 0);
}

TEST(CApiThreads, ADestroyedContextIsAnError) {
  shared_context();  // keeps Kokkos alive when `ctx` goes
  tlse_context* ctx = nullptr;
  ASSERT_EQ(tlse_context_create(&ctx, -1), TLSE_SUCCESS) << tlse_last_error();
  ASSERT_EQ(tlse_context_destroy(ctx), TLSE_SUCCESS) << tlse_last_error();
  CrossEntropyRun r;
  EXPECT_EQ(r.run(ctx), TLSE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(tlse_last_error()).find("argument 'context' is not a live context"), std::string::npos)
      << tlse_last_error();
  EXPECT_TRUE(r.outputs_untouched());
  EXPECT_EQ(tlse_context_destroy(ctx), TLSE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(tlse_last_error()).find("destroyed already"), std::string::npos) << tlse_last_error();
}

TEST(CApiThreads, LastErrorBelongsToTheCallingThread) {
  tlse_context* ctx = shared_context();
  std::atomic<int> mixed{0};
  auto fail_with = [&](std::int64_t n) {
    for (int round = 0; round < kRounds; ++round) {
      std::size_t bytes = 0;
      tlse_cross_entropy_workspace_bytes(ctx, TLSE_DEVICE_HOST, nullptr, TLSE_F32, n, V, D, nullptr, &bytes);
      if (std::string(tlse_last_error()).find("got " + std::to_string(n)) == std::string::npos) ++mixed;
    }
  };
  std::vector<std::thread> threads;
  for (int id = 0; id < kThreads; ++id) threads.emplace_back(fail_with, -1 - id);
  for (auto& t : threads) t.join();
  EXPECT_EQ(mixed.load(), 0);
}

#if defined(TLSE_TEST_HOST_OPENMP)
TEST(CApiThreads, HostCallsInsideAParallelRegionAreRefused) {
  tlse_context* ctx = shared_context();
  std::atomic<int> refused{0};
#pragma omp parallel num_threads(2)
  {
    CrossEntropyRun r;
    if (r.run(ctx) == TLSE_ERROR_UNSUPPORTED && r.outputs_untouched() &&
        std::string(tlse_last_error()).find("outside any parallel region") != std::string::npos)
      ++refused;
  }
  EXPECT_EQ(refused.load(), 2);
  CrossEntropyRun after;  // outside the region the initializing thread works again
  EXPECT_EQ(after.run(ctx), TLSE_SUCCESS) << tlse_last_error();
}
#endif

#if defined(TLSE_TEST_CUDA)
/// A device copy of a host vector, freed with the object.
template <class U>
struct DeviceCopy {
  U* p = nullptr;
  std::size_t n;
  explicit DeviceCopy(const std::vector<U>& h) : n(h.size()) {
    cudaMalloc(&p, n * sizeof(U));
    cudaMemcpy(p, h.data(), n * sizeof(U), cudaMemcpyHostToDevice);
  }
  ~DeviceCopy() { cudaFree(p); }
  std::vector<U> host() const {
    std::vector<U> h(n);
    cudaMemcpy(h.data(), p, n * sizeof(U), cudaMemcpyDeviceToHost);
    return h;
  }
};

/// Forward and backward on the GPU on `stream`; returns the outputs copied back.
tlse_status run_on_cuda(tlse_context* ctx, cudaStream_t stream, CrossEntropyRun& r) {
  DeviceCopy<float> E(r.E), C(r.C), bias(r.bias), loss(r.loss), lse(r.lse), dloss(r.dloss), dE(r.dE), dC(r.dC);
  DeviceCopy<std::int64_t> targets(r.targets);
  tlse_cross_entropy_options o;
  tlse_cross_entropy_options_default(&o);
  o.filter_eps = 0;
  tlse_status s = tlse_cross_entropy_forward(ctx, TLSE_DEVICE_CUDA, stream, TLSE_F32, N, V, D, E.p, C.p, bias.p,
                                             targets.p, loss.p, lse.p, nullptr, nullptr, &o);
  if (s == TLSE_SUCCESS)
    s = tlse_cross_entropy_backward(ctx, TLSE_DEVICE_CUDA, stream, TLSE_F32, N, V, D, E.p, C.p, bias.p, targets.p,
                                    lse.p, nullptr, dloss.p, dE.p, dC.p, nullptr, nullptr, &o);
  cudaStreamSynchronize(stream);
  r.loss = loss.host(), r.lse = lse.host(), r.dE = dE.host(), r.dC = dC.host();
  return s;
}

TEST(CApiThreads, CudaCallsFromManyThreadsOnSharedAndOwnStreams) {
  if (!tlse_device_available(TLSE_DEVICE_CUDA)) GTEST_SKIP() << "a library without CUDA";
  tlse_context* ctx = shared_context();
  int device = -1;
  ASSERT_EQ(tlse_context_cuda_device(ctx, &device), TLSE_SUCCESS);
  cudaSetDevice(device);
  CrossEntropyRun expected;
  ASSERT_EQ(run_on_cuda(ctx, nullptr, expected), TLSE_SUCCESS) << tlse_last_error();
  cudaStream_t shared;
  cudaStreamCreate(&shared);
  std::atomic<int> wrong{0};
  auto worker = [&](int id) {
    cudaSetDevice(device);
    cudaStream_t own;
    cudaStreamCreate(&own);
    // Threads 0-1: the legacy default stream; 2-3: one stream they share; the others their own.
    cudaStream_t stream = id < 2 ? nullptr : id < 4 ? shared : own;
    for (int round = 0; round < kRounds; ++round) {
      CrossEntropyRun r;
      if (run_on_cuda(ctx, stream, r) != TLSE_SUCCESS || !r.same_outputs(expected)) ++wrong;
    }
    cudaStreamDestroy(own);
  };
  std::vector<std::thread> threads;
  for (int id = 0; id < kThreads; ++id) threads.emplace_back(worker, id);
  for (auto& t : threads) t.join();
  cudaStreamDestroy(shared);
  EXPECT_EQ(wrong.load(), 0);
}
#endif

}  // namespace
