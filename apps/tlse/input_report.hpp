#pragma once
// What gradient filtering can skip on the cross-entropy inputs of a run: the statistics of
// tlse_bench/softmax_statistics.hpp, printed before the timings so that results come with them.
#include "cli.hpp"

#include <tlse_bench/softmax_statistics.hpp>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

namespace tlse::app {

/// Row tiles of 128 rows the statistics sample (256 rows).
constexpr std::int64_t statistics_row_tiles = 2;

/// "2^-12" for a power of two, else "%.3g".
inline std::string threshold_text(double t) {
  int e = 0;
  char s[32];
  if (std::frexp(t, &e) == 0.5)
    std::snprintf(s, sizeof s, "2^%d", e - 1);
  else
    std::snprintf(s, sizeof s, "%.3g", t);
  return s;
}

inline const char* inputs_description(Inputs inputs) {
  return inputs == Inputs::lm ? "lm (trained-LM-like: Zipf targets, frequency bias; tlse_bench/lm_inputs.hpp)"
                              : "random (uniform targets, logit std ~4; the worst case for filtering)";
}

/// Prints the statistics at bf16's filter threshold (2^-12) and at the run's own, `filter_eps`
/// (0: filtering off), for inputs `problem` already rounded to the run's dtype; returns those at
/// the run's threshold (at 2^-12 when filtering is off).
inline perf::SoftmaxStatistics print_input_statistics(const Options& o, const perf::CrossEntropyProblem& problem,
                                                      double filter_eps) {
  std::fprintf(stderr, "[tlse] input statistics: float64 logits of %lld sampled rows\n",
               (long long)std::min<std::int64_t>(problem.E.rows, statistics_row_tiles * perf::filter_tile_rows));
  const perf::SampledLogits sample =
      perf::sample_logits(problem.E, problem.C, statistics_row_tiles, o.softcap, problem.bias);
  const std::vector<int> order = perf::vocabulary_order(problem.E, problem.C, problem.bias);
  std::vector<double> thresholds{0x1p-12};
  if (filter_eps > 0 && filter_eps != 0x1p-12) thresholds.push_back(filter_eps);
  std::printf("inputs %s\n", inputs_description(o.inputs));
  perf::SoftmaxStatistics at_run;
  for (double t : thresholds) {
    const perf::SoftmaxStatistics st = perf::softmax_statistics(sample, problem.targets, order, t);
    at_run = st;
    const std::string th = threshold_text(t);
    std::printf("  on %lld sampled rows (float64): mean loss %.3f nats, %.1f softmax entries per row >= %s\n",
                (long long)st.sampled_rows, st.mean_loss, st.entries_per_row, th.c_str());
    std::printf("  backward tiles with every entry < %s and no target, in id order / vocabulary sorted:\n", th.c_str());
    for (int s = 0; s < perf::filter_tile_shape_count; ++s) {
      const perf::TileShape& shape = perf::filter_tile_shapes[s];
      std::printf("    %3dx%-3d %-17s %5.1f%% / %5.1f%%\n", shape.rows, shape.cols, shape.what, 100 * st.skipped[s][0],
                  100 * st.skipped[s][1]);
    }
  }
  if (!o.filter_study)
    std::printf("  (filtering in this run: %s%s)\n",
                filter_eps > 0 ? ("filter_eps " + threshold_text(filter_eps)).c_str() : "off",
                o.sort_vocabulary ? ", vocabulary sorted" : "");
  return at_run;
}

}  // namespace tlse::app
