// Google Benchmark sweep: the contrastive loss and cross-entropy, forward and forward+backward,
// TiledLSE against the materialized baseline, float32, on Kokkos' default execution space.
//
//   tlse_benchmarks [Google Benchmark flags, e.g. --benchmark_out=r.json
//                    --benchmark_out_format=json --benchmark_filter=contrastive] [--kokkos-...]
//
// Names read <loss>/<pass>/<implementation>/<size>:<value>/...; plot.py relies on that.
// Counters: `GFLOP/s` counts the useful work only, the matrix products of the materialized
// formulation (2 rows cols depth forward, three times that forward+backward), the same for
// both implementations, so TiledLSE is not credited for the tiles it recomputes;
// `extra_bytes` is the memory allocated beyond inputs and gradients. The baseline is reported
// as skipped where its logit matrix would exceed TLSE_BASELINE_CAP_GIB (default 4).
#include <tlse_bench/materialized_baseline.hpp>
#include <tlse_bench/random_inputs.hpp>
#include <tlse_bench/tiled_runner.hpp>

#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

using Exec = Kokkos::DefaultExecutionSpace;
using T = float;
using tlse::perf::DeviceMatrix;

constexpr std::uint64_t seed = 42;
constexpr double clip_scale = 1 / 0.07;

enum class Pass { forward, forward_backward };
enum class Impl { tiled, materialized };

const char* name(Pass p) { return p == Pass::forward ? "forward" : "forward_backward"; }
const char* name(Impl i) { return i == Impl::tiled ? "tiledlse" : "materialized"; }

double baseline_cap_bytes() {
  const char* env = std::getenv("TLSE_BASELINE_CAP_GIB");
  return (env ? std::atof(env) : 4.0) * 1024 * 1024 * 1024;
}

/// The timed loop, shared by every benchmark: one untimed warm-up step, then fenced steps.
template <class Loss>
void time_steps(benchmark::State& state, Loss& loss, Pass pass, const DeviceMatrix<T>& dA,
                const DeviceMatrix<T>& dB, double forward_flops) {
  const Exec exec;
  const auto step = [&] {
    loss.forward();
    if (pass == Pass::forward_backward) loss.backward(dA, dB);
    exec.fence();
  };
  step();
  for (auto _ : state) step();
  const double flops = forward_flops * (pass == Pass::forward ? 1 : 3);
  state.counters["GFLOP/s"] = benchmark::Counter(1e-9 * flops, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["extra_bytes"] = double(loss.extra_bytes());
}

/// Skips the baseline, with the reason in the JSON, when its logits would not fit the cap.
bool over_cap(benchmark::State& state, double logit_bytes) {
  const double cap = baseline_cap_bytes(), gib = 1 << 30;
  if (logit_bytes <= cap) return false;
  char why[160];
  std::snprintf(why, sizeof why,
                "not run: its logit matrix needs %.3g GiB, over the %.3g GiB cap (TLSE_BASELINE_CAP_GIB)",
                logit_bytes / gib, cap / gib);
  state.SkipWithError(why);
  return true;
}

void contrastive(benchmark::State& state, Impl impl, Pass pass, std::int64_t b, std::int64_t c) {
  if (impl == Impl::materialized && over_cap(state, double(b) * double(b) * sizeof(T))) return;
  auto problem = tlse::perf::contrastive_problem(seed, b, c);
  const auto I = tlse::perf::upload<T>("I", problem.I), Tx = tlse::perf::upload<T>("T", problem.T);
  DeviceMatrix<T> dI("dI", b, c), dT("dT", b, c);
  const double flops = 2.0 * double(b) * double(b) * double(c);
  if (impl == Impl::tiled) {
    tlse::perf::TiledContrastive<Exec, T> loss(Exec(), I, Tx, clip_scale);
    time_steps(state, loss, pass, dI, dT, flops);
  } else {
    tlse::baseline::MaterializedContrastive<Exec, T> loss(Exec(), I, Tx, clip_scale);
    time_steps(state, loss, pass, dI, dT, flops);
  }
}

void cross_entropy(benchmark::State& state, Impl impl, Pass pass, std::int64_t N, std::int64_t D, std::int64_t V) {
  if (impl == Impl::materialized && over_cap(state, double(N) * double(V) * sizeof(T))) return;
  auto problem = tlse::perf::cross_entropy_problem(seed, N, D, V);
  const auto E = tlse::perf::upload<T>("E", problem.E), C = tlse::perf::upload<T>("C", problem.C);
  const auto targets = tlse::perf::upload_targets(problem.targets);
  DeviceMatrix<T> dE("dE", N, D), dC("dC", V, D);
  const double flops = 2.0 * double(N) * double(V) * double(D);
  if (impl == Impl::tiled) {
    tlse::perf::TiledCrossEntropy<Exec, T> loss(Exec(), E, C, targets);
    time_steps(state, loss, pass, dE, dC, flops);
  } else {
    tlse::baseline::MaterializedCrossEntropy<Exec, T> loss(Exec(), E, C, targets);
    time_steps(state, loss, pass, dE, dC, flops);
  }
}

// The host sweep: a few minutes on 2 cores, baseline matrices up to 512 MiB.
constexpr std::int64_t batches[] = {1024, 2048, 4096, 8192}, contrastive_dim = 256;
constexpr std::int64_t tokens[] = {1024, 2048, 4096}, vocabularies[] = {8192, 32768}, ce_dim = 256;

void register_sweep() {
  const auto add = [](const std::string& label, auto fn) {
    benchmark::RegisterBenchmark(label.c_str(), fn)->Unit(benchmark::kMillisecond)->UseRealTime();
  };
  for (Pass pass : {Pass::forward, Pass::forward_backward})
    for (Impl impl : {Impl::tiled, Impl::materialized}) {
      for (std::int64_t b : batches) {
        const std::int64_t c = contrastive_dim;
        add(std::string("contrastive/") + name(pass) + "/" + name(impl) + "/b:" + std::to_string(b) +
                "/c:" + std::to_string(c),
            [=](benchmark::State& st) { contrastive(st, impl, pass, b, c); });
      }
      for (std::int64_t V : vocabularies)
        for (std::int64_t N : tokens) {
          const std::int64_t D = ce_dim;
          add(std::string("cross_entropy/") + name(pass) + "/" + name(impl) + "/N:" + std::to_string(N) +
                  "/D:" + std::to_string(D) + "/V:" + std::to_string(V),
              [=](benchmark::State& st) { cross_entropy(st, impl, pass, N, D, V); });
        }
    }
}

}  // namespace

int main(int argc, char** argv) {
  Kokkos::ScopeGuard kokkos(argc, argv);  // takes the --kokkos-* arguments out of argv
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 2;
  benchmark::AddCustomContext("kokkos_execution_space", Exec::name());
  benchmark::AddCustomContext("kokkos_concurrency", std::to_string(Exec().concurrency()));
  register_sweep();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
