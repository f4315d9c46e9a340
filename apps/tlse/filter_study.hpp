#pragma once
// What gradient filtering buys and costs on a cross-entropy problem: the TiledLSE runs of
// --filter-study (filtering off, on, on with the vocabulary sorted) and their table, and
// --check-sampled, the gradients' error against float64 gradients on a sample of rows and classes.
#include "check.hpp"
#include "cli.hpp"
#include "outcome.hpp"

#include <tlse_bench/sampled_reference.hpp>
#include <tlse_bench/softmax_statistics.hpp>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

namespace tlse::app {

/// One TiledLSE run of a cross-entropy job.
struct TiledRun {
  std::string name;
  double filter_eps;
  bool sort_vocabulary;
  bool training_step = false;  // fwd+bwd as one cross_entropy_with_gradients call
};

/// The runs: one as the options say, or with --filter-study the three of the study; with
/// --training-step, then the step in one call.
inline std::vector<TiledRun> tiled_runs(const Options& o) {
  std::vector<TiledRun> runs;
  if (!o.filter_study)
    runs = {{"TiledLSE", o.filter_eps, o.sort_vocabulary}};
  else
    runs = {{"no filter", 0.0, false}, {"filter", o.filter_eps, false}, {"filter+sorted", o.filter_eps, true}};
  if (o.training_step) runs.push_back({"TiledLSE step", o.filter_eps, false, true});
  return runs;
}

/// The backward's time (fwd+bwd - forward) of each study run, its speedup over the unfiltered
/// one, and the share of tiles its filter can skip (`stats`: 128x128 for the mma.sync kernels,
/// 128x256 for the Hopper kernels). `runs` are the first three outcomes.
inline void print_filter_study(const std::vector<Outcome>& runs, const perf::SoftmaxStatistics& stats) {
  std::printf("\nfiltering study: backward = fwd+bwd - forward; skippable tiles from the input statistics\n");
  std::printf("%-15s %12s %12s %12s %10s %18s %18s\n", "", "forward ms", "fwd+bwd ms", "backward ms", "speedup",
              "skippable 128x128", "skippable 128x256");
  const double off = runs[0].step_ms - runs[0].forward_ms;
  for (std::size_t k = 0; k < 3 && k < runs.size(); ++k) {
    const Outcome& r = runs[k];
    const double backward = r.step_ms - r.forward_ms;
    const double s128 = k == 0 ? 0 : stats.skipped[0][k - 1], s256 = k == 0 ? 0 : stats.skipped[1][k - 1];
    std::printf("%-15s %12.3f %12.3f %12.3f %9.2fx %17.1f%% %17.1f%%\n", r.name.c_str(), r.forward_ms, r.step_ms,
                backward, off / backward, 100 * s128, 100 * s256);
  }
}

/// The classes --check-sampled looks at: the 128 likeliest (first in `order`), then 128 spread
/// evenly over the ids, without repeats.
inline std::vector<std::int64_t> sampled_classes(const std::vector<int>& order) {
  const std::int64_t V = std::int64_t(order.size()), likely = std::min<std::int64_t>(128, V);
  std::vector<std::int64_t> classes(order.begin(), order.begin() + likely);
  for (std::int64_t k = 0; k < 128 && k < V; ++k) {
    const std::int64_t j = k * V / 128;
    if (std::find(classes.begin(), classes.end(), j) == classes.end()) classes.push_back(j);
  }
  return classes;
}

/// Prints each outcome's dE and dC error on the sample against float64 gradients (max |g - ref| /
/// max |ref| over the sample, like --check) and, for a filtered run, the most its filter can add
/// (perf::FilterBound); returns whether all are within tol.grad plus that bound.
inline bool check_sampled(const std::vector<Outcome>& outcomes, const perf::CrossEntropyProblem& p,
                          const Tolerance& tol) {
  const std::vector<std::int64_t> rows = perf::sampled_rows(p.E.rows, 2);
  const std::vector<std::int64_t> classes = sampled_classes(perf::vocabulary_order(p.E, p.C));
  std::fprintf(stderr, "[tlse] float64 gradients on %zu rows and %zu classes (%.1f G multiply-adds, on the device)\n",
               rows.size(), classes.size(), 1e-9 * double(p.E.rows) * double(p.C.rows) * double(p.E.cols));
  const perf::SampledGradients ref = perf::sampled_cross_entropy_gradients(p.E, p.C, p.targets, rows, classes);
  std::printf("\nsampled check against float64 gradients (dE on %zu rows, dC on %zu classes):\n", rows.size(),
              classes.size());
  const perf::FilterBound bound_E(p.C, p.E.rows, ref.dE, perf::GradientSum::over_classes);
  const perf::FilterBound bound_C(p.E, p.E.rows, ref.dC, perf::GradientSum::over_rows);
  bool all_ok = true;
  for (const Outcome& o : outcomes) {
    const double eE = perf::sampled_relative_error(o.grads[0], ref.dE, rows);
    const double eC = perf::sampled_relative_error(o.grads[1], ref.dC, classes);
    const double bE = bound_E.relative(o.filter_eps), bC = bound_C.relative(o.filter_eps);
    const bool ok = eE <= tol.grad + bE && eC <= tol.grad + bC;
    std::printf("  %-13s dE err %.2e  dC err %.2e (tol %.2e, relative to max|ref| on the sample", o.name.c_str(), eE,
                eC, tol.grad);
    if (o.filter_eps > 0) std::printf("; the filter's bound adds dE %.2e, dC %.2e", bE, bC);
    std::printf(")  %s\n", ok ? "ok" : "MISMATCH");
    all_ok = all_ok && ok;
  }
  std::printf("sampled check %s\n", all_ok ? "passed" : "FAILED");
  return all_ok;
}

}  // namespace tlse::app
