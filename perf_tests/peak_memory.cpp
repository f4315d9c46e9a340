// Measures the peak extra memory of one forward+backward step, TiledLSE against the
// materialized baseline, by watching every Kokkos allocation (Kokkos Tools allocate/deallocate
// callbacks, registered in-process): extra = peak of live Kokkos bytes during the step minus
// the bytes live before it. Inputs and gradient views are allocated before the step; what the
// step allocates itself is counted: TiledLSE's saved LSEs and the workspace the call allocates
// (opts.workspace left empty), the baseline's logit matrix, LSE vectors and copies. Kokkos'
// per-thread team scratch pool (a fixed size per thread, docs/api.md) is not: an unreported
// warm-up step at the first size grows it before anything is measured.
//
//   peak_memory contrastive   C  b1 b2 ...        symmetric CLIP loss, c = C, f32
//   peak_memory cross-entropy D  V  N1 N2 ...     mean cross-entropy, f32
//   peak_memory cross-entropy-vocab D N V1 V2 ... the same, against the vocabulary
// Prints one JSON object per line: {"loss", sizes, "tiledlse_bytes", "materialized_bytes"}.
#include <tlse_bench/materialized_baseline.hpp>
#include <tlse_bench/random_inputs.hpp>

#include <tlse/tlse.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

using Exec = Kokkos::DefaultExecutionSpace;
using Mem = Exec::memory_space;

std::int64_t live_bytes = 0, peak_bytes = 0;

/// Only allocations in the memory space of the execution space count (on a GPU: device memory).
bool counted(const Kokkos::Tools::SpaceHandle& space) { return std::strcmp(space.name, Mem::name()) == 0; }
void on_allocate(Kokkos::Tools::SpaceHandle space, const char*, const void*, std::uint64_t size) {
  if (!counted(space)) return;
  live_bytes += std::int64_t(size);
  peak_bytes = std::max(peak_bytes, live_bytes);
}
void on_deallocate(Kokkos::Tools::SpaceHandle space, const char*, const void*, std::uint64_t size) {
  if (counted(space)) live_bytes -= std::int64_t(size);
}

/// Peak live Kokkos bytes while `step` runs, above those live before it.
template <class Step>
std::int64_t peak_extra(Step&& step) {
  Kokkos::fence();
  const std::int64_t before = live_bytes;
  peak_bytes = live_bytes;
  step();
  Kokkos::fence();
  return peak_bytes - before;
}

using Acc = float;
using Gradient = Kokkos::View<float**, Kokkos::LayoutRight, Mem>;

void contrastive(std::int64_t b, std::int64_t c, bool report = true) {
  auto p = tlse::perf::contrastive_problem(42, b, c);
  const auto I = tlse::perf::upload<float>("I", p.I), T = tlse::perf::upload<float>("T", p.T);
  Gradient dI("dI", b, c), dT("dT", b, c);
  Kokkos::View<Acc*, Mem> loss("loss", 1), dloss("dloss", 1);
  Kokkos::deep_copy(dloss, 1.0f);
  const Exec exec;
  tlse::ContrastiveOptions opts;
  opts.scale = 1 / 0.07;
  const auto tiled = peak_extra([&] {
    Kokkos::View<Acc*, Mem> row_lse("row_lse", b), col_lse("col_lse", b);
    tlse::contrastive_loss(exec, I, T, Kokkos::View<const int*, Mem>(), loss, row_lse, col_lse, opts);
    tlse::contrastive_loss_backward(exec, I, T, Kokkos::View<const int*, Mem>(), row_lse, col_lse, dloss, dI, dT,
                                    Kokkos::View<Acc*, Mem>(), opts);
  });
  const auto materialized = peak_extra([&] {
    tlse::baseline::MaterializedContrastive<Exec, float> base(exec, I, T, opts.scale);
    base.forward();
    base.backward(dI, dT);
  });
  if (!report) return;
  std::printf("{\"loss\": \"contrastive\", \"b\": %lld, \"c\": %lld, \"tiledlse_bytes\": %lld, "
              "\"materialized_bytes\": %lld}\n",
              (long long)b, (long long)c, (long long)tiled, (long long)materialized);
  std::fflush(stdout);
}

void cross_entropy(std::int64_t N, std::int64_t D, std::int64_t V, bool report = true) {
  auto p = tlse::perf::cross_entropy_problem(42, N, D, V);
  const auto E = tlse::perf::upload<float>("E", p.E), C = tlse::perf::upload<float>("C", p.C);
  const auto targets = tlse::perf::upload_targets(p.targets);
  Gradient dE("dE", N, D), dC("dC", V, D);
  Kokkos::View<Acc*, Mem> loss("loss", 1), dloss("dloss", 1);
  Kokkos::deep_copy(dloss, 1.0f);
  const Exec exec;
  const tlse::CrossEntropyOptions opts{};
  const auto tiled = peak_extra([&] {
    Kokkos::View<Acc*, Mem> lse("lse", N);
    tlse::cross_entropy(exec, E, C, Kokkos::View<const float*, Mem>(), targets, loss, lse, Kokkos::View<int*, Mem>(),
                        opts);
    tlse::cross_entropy_backward(exec, E, C, Kokkos::View<const float*, Mem>(), targets, lse,
                                 Kokkos::View<int*, Mem>(), dloss, dE, dC, Kokkos::View<float*, Mem>(), opts);
  });
  const auto materialized = peak_extra([&] {
    tlse::baseline::MaterializedCrossEntropy<Exec, float> base(exec, E, C, targets);
    base.forward();
    base.backward(dE, dC);
  });
  if (!report) return;
  std::printf("{\"loss\": \"cross_entropy\", \"N\": %lld, \"D\": %lld, \"V\": %lld, \"tiledlse_bytes\": %lld, "
              "\"materialized_bytes\": %lld}\n",
              (long long)N, (long long)D, (long long)V, (long long)tiled, (long long)materialized);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  Kokkos::ScopeGuard guard(argc, argv);
  Kokkos::Tools::Experimental::set_allocate_data_callback(on_allocate);
  Kokkos::Tools::Experimental::set_deallocate_data_callback(on_deallocate);
  const std::string what = argc > 1 ? argv[1] : "";
  std::vector<std::int64_t> n;
  for (int i = 2; i < argc; ++i) n.push_back(std::atoll(argv[i]));
  if (what == "contrastive" && n.size() >= 2) {
    contrastive(n[1], n[0], false);
    for (std::size_t i = 1; i < n.size(); ++i) contrastive(n[i], n[0]);
  } else if (what == "cross-entropy" && n.size() >= 3) {
    cross_entropy(n[2], n[0], n[1], false);
    for (std::size_t i = 2; i < n.size(); ++i) cross_entropy(n[i], n[0], n[1]);
  } else if (what == "cross-entropy-vocab" && n.size() >= 3) {
    cross_entropy(n[1], n[0], n[2], false);
    for (std::size_t i = 2; i < n.size(); ++i) cross_entropy(n[1], n[0], n[i]);
  } else {
    std::fprintf(stderr,
                 "usage: peak_memory contrastive C b...\n"
                 "       peak_memory cross-entropy D V N...\n"
                 "       peak_memory cross-entropy-vocab D N V...\n");
    return 2;
  }
  return 0;
}
