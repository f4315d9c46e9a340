// Times the forward passes that have a device specialization, on random 16-bit inputs shaped
// like a trained model's (logits std ~4): cross-entropy forward and linear LSE.
//   forward_timing <N> <D> <V> [bf16|f16] [iterations]
// Prints one JSON line: median milliseconds (fenced, after one warm-up) and TFLOP/s (2 N V D).
#include <tlse/tlse.hpp>
#include <tlse_bench/hashed_normal.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

template <class T>
int run(long N, long D, long V, int iterations, const char* dtype) {
  using Exec = Kokkos::DefaultExecutionSpace;
  using Mem = Exec::memory_space;
  Kokkos::View<T**, Kokkos::LayoutRight, Mem> E("E", N, D), C("C", V, D);
  Kokkos::View<long*, Mem> targets("t", N);
  Kokkos::View<float*, Mem> loss("loss", 1);
  const float c_std = 4.0f / std::sqrt(float(D));
  Kokkos::parallel_for(
      "init", Kokkos::RangePolicy<Exec>(0, std::max(N, V) * D), KOKKOS_LAMBDA(long i) {
        const float g = tlse::perf::hashed_normal((unsigned long)i);
        if (i < N * D) E.data()[i] = T(g);
        if (i < V * D) C.data()[(i * 7919) % (V * D)] = T(g * c_std);  // scattered: C is not E's twin
        if (i < N) targets(i) = long((i * 2654435761UL) % V);
      });
  Exec exec;
  std::vector<double> ms;
  for (int it = 0; it <= iterations; ++it) {
    exec.fence();
    Kokkos::Timer timer;
    tlse::cross_entropy(exec, E, C, targets, loss);
    exec.fence();
    if (it > 0) ms.push_back(timer.seconds() * 1e3);
  }
  std::sort(ms.begin(), ms.end());
  const double med = ms[ms.size() / 2];
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), loss);
  std::printf("{\"kind\": \"ce_forward\", \"N\": %ld, \"D\": %ld, \"V\": %ld, \"dtype\": \"%s\", \"loss\": %.6f, "
              "\"ms\": %.3f, \"tflops\": %.1f, \"exec\": \"%s\"}\n",
              N, D, V, dtype, double(h(0)), med, 2.0 * N * V * D / (med * 1e-3) / 1e12, Exec::name());
  return 0;
}

int main(int argc, char** argv) {
  Kokkos::ScopeGuard guard(argc, argv);
  if (argc < 4) {
    std::fprintf(stderr, "usage: forward_timing N D V [bf16|f16] [iterations]\n");
    return 2;
  }
  const long N = std::atol(argv[1]), D = std::atol(argv[2]), V = std::atol(argv[3]);
  const std::string dtype = argc > 4 ? argv[4] : "bf16";
  const int iterations = argc > 5 ? std::atoi(argv[5]) : 10;
  return dtype == "f16" ? run<tlse::float16>(N, D, V, iterations, "f16")
                        : run<tlse::bfloat16>(N, D, V, iterations, "bf16");
}
