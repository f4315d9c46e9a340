// Cut cross-entropy through the C++ API, on Kokkos' default execution space: the loss of
// N tokens over a V-word vocabulary without the N x V logits, checked against a plain loop.
#include <tlse/tlse.hpp>

#include <cmath>
#include <cstdio>

int main(int argc, char* argv[]) {
  Kokkos::ScopeGuard kokkos(argc, argv);
  using Exec = Kokkos::DefaultExecutionSpace;
  const int N = 100, V = 1000, D = 64;
  Kokkos::View<float**, Kokkos::LayoutRight, Exec::memory_space> E("E", N, D), C("C", V, D);
  Kokkos::View<long*, Exec::memory_space> targets("targets", N);
  Kokkos::View<float*, Exec::memory_space> loss("loss", 1);
  auto hE = Kokkos::create_mirror_view(E), hC = Kokkos::create_mirror_view(C);
  auto ht = Kokkos::create_mirror_view(targets);
  for (int i = 0; i < N; ++i) {
    for (int k = 0; k < D; ++k) hE(i, k) = std::sin(0.1f * float(i * D + k));
    ht(i) = (7 * i) % V;
  }
  for (int j = 0; j < V; ++j)
    for (int k = 0; k < D; ++k) hC(j, k) = std::cos(0.03f * float(j * D + k));
  Kokkos::deep_copy(E, hE), Kokkos::deep_copy(C, hC), Kokkos::deep_copy(targets, ht);

  tlse::cross_entropy(Exec(), E, C, targets, loss);  // Reduction::mean, ignore_index -100
  auto h_loss = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), loss);

  double expected = 0;  // the same loss from the materialized logits, in double
  for (int i = 0; i < N; ++i) {
    double m = -INFINITY, s = 0, target_logit = 0;
    for (int j = 0; j < V; ++j) {
      double x = 0;
      for (int k = 0; k < D; ++k) x += double(hE(i, k)) * double(hC(j, k));
      if (j == ht(i)) target_logit = x;
      if (x > m) s = s * std::exp(m - x) + 1, m = x;
      else s += std::exp(x - m);
    }
    expected += (m + std::log(s) - target_logit) / N;
  }
  std::printf("TiledLSE cross-entropy %.6f, materialized %.6f\n", double(h_loss(0)), expected);
  return std::fabs(h_loss(0) - expected) <= 1e-4 * (1 + std::fabs(expected)) ? 0 : 1;
}
