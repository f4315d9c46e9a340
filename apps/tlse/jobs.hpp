#pragma once
// The two jobs of `tlse`: build the problem (random, or for cross-entropy trained-LM-like), time
// TiledLSE and the materialized baseline on it, print the table and, with --check, compare both
// with the float64 reference.
#include "check.hpp"
#include "cli.hpp"
#include "filter_study.hpp"
#include "input_report.hpp"
#include "outcome.hpp"
#include "timing.hpp"

#include <tlse_bench/lm_inputs.hpp>
#include <tlse_bench/materialized_baseline.hpp>
#include <tlse_bench/random_inputs.hpp>
#include <tlse_bench/tiled_runner.hpp>

#include <cstdio>
#include <string>
#include <type_traits>

namespace tlse::app {

using Exec = Kokkos::DefaultExecutionSpace;
using perf::DeviceMatrix;

/// A training step of `loss`: its step() where it has one (one call), else forward() then backward().
template <class Loss, class Grad>
auto training_step(Loss& loss, Grad& dA, Grad& dB, int) -> decltype(loss.step(dA, dB)) {
  return loss.step(dA, dB);
}
template <class Loss, class Grad>
void training_step(Loss& loss, Grad& dA, Grad& dB, long) {
  loss.forward();
  loss.backward(dA, dB);
}

/// Times forward() and a training step (forward() + backward(), or step()) of `loss` (TiledLSE or baseline, same
/// interface) and keeps its loss and the gradients of its last step.
template <class T, class Loss>
Outcome measure(const Options& o, const std::string& name, Loss& loss, std::int64_t rows_a, std::int64_t rows_b,
                std::int64_t depth) {
  const Exec exec;
  DeviceMatrix<T> dA(name + " dA", rows_a, depth), dB(name + " dB", rows_b, depth);
  Outcome r(name);
  r.forward_ms = median_ms(exec, o.iterations, name + " forward", [&] { loss.forward(); });
  r.step_ms = median_ms(exec, o.iterations, name + " forward+backward", [&] { training_step(loss, dA, dB, 0); });
  r.loss = loss.loss();
  r.extra_bytes = loss.extra_bytes();
  r.grads = {perf::download(dA), perf::download(dB)};
  return r;
}

inline Precision precision(const Options& o) { return o.tf32 ? Precision::tf32 : Precision::exact; }

inline void print_header(const Options& o, const char* dtype, const std::string& sizes) {
  const Exec exec;
  std::printf("tlse %s: %s, dtype %s%s, seed %llu\n", o.job == Job::contrastive ? "contrastive" : "cross-entropy",
              sizes.c_str(), dtype, o.tf32 ? " (products in tf32)" : "", (unsigned long long)o.seed);
  std::printf("Kokkos %s, concurrency %d; times: median of %d after 1 warm-up, fenced\n", Exec::name(),
              int(exec.concurrency()), o.iterations);
}

inline void announce_reference(double multiply_adds) {
  std::fprintf(stderr, "[tlse] computing the float64 reference (%.1f G multiply-adds, serial)\n", multiply_adds * 1e-9);
}

template <class T>
int run_contrastive(const Options& o) {
  using Acc = accumulator_t<T>;
  const std::int64_t b = o.batch, c = o.dim;
  const bool self = o.self_similarity;  // Z = the problem's I; T is not used
  const std::string form = self ? " (self-similarity: two views of " + std::to_string(b / 2) + " samples)" : "";
  print_header(
      o, scalar_name<T>(),
      "batch " + std::to_string(b) + form + ", dim " + std::to_string(c) + ", scale " + std::to_string(o.scale));
  auto problem = perf::contrastive_problem(o.seed, b, c);
  const DeviceMatrix<T> I = perf::upload<T>("I", problem.I);
  const DeviceMatrix<T> Tx = self ? DeviceMatrix<T>() : perf::upload<T>("T", problem.T);
  const std::int64_t rows_b = self ? 0 : b;  // no dT in the self-similarity form

  std::vector<Outcome> outcomes;
  {
    perf::TiledContrastive<Exec, T> tiled(Exec(), I, Tx, o.scale, precision(o), o.memory_budget, self);
    outcomes.push_back(measure<T>(o, "TiledLSE", tiled, b, rows_b, c));
    outcomes.back().memory_note = "workspace " + bytes_text(double(tiled.workspace_bytes())) +
                                  (self ? " + saved row LSEs" : " + saved row/column LSEs") + "; plus team scratch " +
                                  bytes_text(double(tiled.team_scratch_bytes())) +
                                  " per team (tile-sized, independent of the batch)";
  }
  if (o.baseline) {
    baseline::MaterializedContrastive<Exec, T> base(Exec(), I, Tx, o.scale, self);
    outcomes.push_back(measure<T>(o, "materialized", base, b, rows_b, c));
    outcomes.back().memory_note = "logits " + std::to_string(b) + " x " + std::to_string(b) + " " +
                                  bytes_text(double(base.logit_bytes())) + " + LSEs" +
                                  (std::is_same<T, Acc>::value ? ""
                                   : self                      ? " + float copies of Z, dZ"
                                                               : " + float copies of I, T, dI, dT");
  }
  print_table(outcomes);
  if (!o.check) return 0;

  announce_reference(5.0 * double(b) * double(b) * double(c));
  ContrastiveOptions ref_opts;
  ref_opts.scale = o.scale;
  if (self) {
    const auto ref = testing::self_contrastive_reference(problem.I, ref_opts, 1.0);
    return check_outcomes(outcomes, ref.loss, {&ref.dI}, {"dZ"}, tolerance<T>(o.tf32)) ? 0 : 1;
  }
  const auto ref = testing::contrastive_reference(problem.I, problem.T, {}, ref_opts, 1.0);
  return check_outcomes(outcomes, ref.loss, {&ref.dI, &ref.dT}, {"dI", "dT"}, tolerance<T>(o.tf32)) ? 0 : 1;
}

template <class T>
int run_cross_entropy(const Options& o) {
  using Acc = accumulator_t<T>;
  const std::int64_t N = o.tokens, D = o.dim, V = o.vocab;
  print_header(o, scalar_name<T>(),
               "tokens " + std::to_string(N) + ", dim " + std::to_string(D) + ", vocab " + std::to_string(V) +
                   (o.softcap > 0 ? ", softcap " + detail::number_text(o.softcap) : "") +
                   (o.bias ? ", bias N(0,1)" : "") +
                   (o.ignore_fraction > 0 ? ", ignored rows " + detail::number_text(o.ignore_fraction) : ""));
  auto problem = o.inputs == Inputs::lm ? perf::lm_cross_entropy_problem(o.seed, N, D, V)
                                        : perf::cross_entropy_problem(o.seed, N, D, V);
  if (o.bias) perf::add_random_bias(problem, o.seed);
  perf::ignore_rows(problem, o.ignore_fraction, CrossEntropyOptions{}.ignore_index);  // the calls' default
  const DeviceMatrix<T> E = perf::upload<T>("E", problem.E), C = perf::upload<T>("C", problem.C);
  const auto bias = perf::upload_vector<T>("bias", problem.bias);  // empty without --bias
  const auto targets = perf::upload_targets(problem.targets);
  CrossEntropyOptions filter;
  filter.filter_eps = o.filter_eps;
  const perf::SoftmaxStatistics stats = print_input_statistics(o, problem, impl::resolved_filter_eps<T>(filter));
  if (o.statistics_only) return 0;

  std::vector<Outcome> outcomes;
  for (const TiledRun& run : tiled_runs(o)) {
    perf::TiledCrossEntropy<Exec, T> tiled(Exec(), E, C, targets, precision(o), o.memory_budget, run.filter_eps,
                                           run.sort_vocabulary, run.training_step, o.softcap, bias);
    outcomes.push_back(measure<T>(o, run.name, tiled, N, V, D));
    outcomes.back().filter_eps = tiled.filter_eps();
    outcomes.back().memory_note = "workspace " + bytes_text(double(tiled.workspace_bytes())) + " + saved LSEs" +
                                  (run.sort_vocabulary ? " + vocabulary order" : "") + "; plus team scratch " +
                                  bytes_text(double(tiled.team_scratch_bytes())) +
                                  " per team (tile-sized, independent of N and V)";
  }
  if (o.baseline) {
    baseline::MaterializedCrossEntropy<Exec, T> base(Exec(), E, C, targets, o.softcap, bias);
    outcomes.push_back(measure<T>(o, "materialized", base, N, V, D));
    outcomes.back().memory_note = "logits " + std::to_string(N) + " x " + std::to_string(V) + " " +
                                  bytes_text(double(base.logit_bytes())) + " + LSEs" +
                                  (std::is_same<T, Acc>::value ? "" : " + float copies of E, C, dE, dC");
  }
  print_table(outcomes);
  if (o.filter_study) print_filter_study(outcomes, stats);
  const bool sampled_ok = !o.check_sampled || check_sampled(outcomes, problem, tolerance<T>(o.tf32));
  if (!o.check) return sampled_ok ? 0 : 1;

  announce_reference(5.0 * double(N) * double(V) * double(D));
  CrossEntropyOptions ref_opts;
  ref_opts.softcap = o.softcap;
  const auto ref =
      testing::cross_entropy_reference(problem.E, problem.C, problem.bias, problem.targets, ref_opts, {1.0});
  const bool ok = check_outcomes(outcomes, ref.loss, {&ref.dE, &ref.dC}, {"dE", "dC"}, tolerance<T>(o.tf32));
  return ok && sampled_ok ? 0 : 1;
}

}  // namespace tlse::app
