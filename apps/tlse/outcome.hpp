#pragma once
// What one implementation produced in a run, and the table that puts TiledLSE and the
// materialized baseline side by side.
#include <tlse/testing/reference.hpp>

#include <cstddef>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace tlse::app {

struct Outcome {
  explicit Outcome(std::string n) : name(std::move(n)) {}
  std::string name;
  double loss = 0;
  double forward_ms = 0, step_ms = 0;  ///< forward, and forward + backward
  std::size_t extra_bytes = 0;         ///< memory allocated beyond inputs, outputs and gradients
  std::string memory_note;             ///< what extra_bytes is made of
  std::vector<testing::Matrix> grads;  ///< of the last timed step, as float64
  double filter_eps = 0;               ///< the gradient filter's threshold of the run (0: exact)
};

inline std::string bytes_text(double bytes) {
  const char* unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  for (; bytes >= 1024 && u < 4; ++u) bytes /= 1024;
  char s[32];
  std::snprintf(s, sizeof s, u ? "%.1f %s" : "%.0f %s", bytes, unit[u]);
  return s;
}

/// Prints loss, times and memory of each outcome; with two outcomes (TiledLSE first), also
/// the ratios second / first.
inline void print_table(const std::vector<Outcome>& rows) {
  std::printf("\n%-18s %14s %13s %13s %13s\n", "", "loss", "forward ms", "fwd+bwd ms", "extra memory");
  for (const Outcome& r : rows)
    std::printf("%-18s %14.7g %13.3f %13.3f %13s\n", r.name.c_str(), r.loss, r.forward_ms, r.step_ms,
                bytes_text(double(r.extra_bytes)).c_str());
  if (rows.size() == 2) {
    const Outcome &t = rows[0], &b = rows[1];
    const std::string ratio = b.name + "/" + t.name;
    std::printf("%-18s %14s %12.2fx %12.2fx %12.1fx\n", ratio.c_str(), "", b.forward_ms / t.forward_ms,
                b.step_ms / t.step_ms, double(b.extra_bytes) / double(t.extra_bytes));
  }
  std::printf("\n");
  for (const Outcome& r : rows) std::printf("%s extra memory: %s\n", r.name.c_str(), r.memory_note.c_str());
}

}  // namespace tlse::app
