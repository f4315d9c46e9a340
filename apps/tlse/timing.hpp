#pragma once
// Fenced wall-clock timing: one untimed warm-up, then the median of the timed runs. Runs that
// take more than a few seconds announce each iteration on stderr, so a long job shows life.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

namespace tlse::app {

/// Median milliseconds of `iterations` calls of `step()` followed by `exec.fence()`.
template <class Exec, class Step>
double median_ms(const Exec& exec, int iterations, const std::string& label, const Step& step) {
  using clock = std::chrono::steady_clock;
  const auto timed = [&] {
    const auto start = clock::now();
    step();
    exec.fence();
    return std::chrono::duration<double, std::milli>(clock::now() - start).count();
  };
  const double warm_up = timed();
  const bool announce = warm_up * iterations > 3000;
  std::vector<double> ms;
  for (int k = 0; k < iterations; ++k) {
    if (announce)
      std::fprintf(stderr, "[tlse] %s: iteration %d/%d (~%.1f s each)\n", label.c_str(), k + 1, iterations,
                   warm_up / 1000);
    ms.push_back(timed());
  }
  std::sort(ms.begin(), ms.end());
  const std::size_t mid = ms.size() / 2;
  return ms.size() % 2 ? ms[mid] : (ms[mid - 1] + ms[mid]) / 2;
}

}  // namespace tlse::app
