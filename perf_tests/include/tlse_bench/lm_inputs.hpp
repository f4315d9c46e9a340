#pragma once
/// \file lm_inputs.hpp
/// Cross-entropy inputs shaped like the output layer of a trained language model, next to the
/// uniform random ones of random_inputs.hpp (which stay the worst case: there, every tile of the
/// backward holds softmax entries above the filter threshold, so gradient filtering skips nothing).
///
/// What the generator reproduces of a trained LM (the statistics it reaches are measured by
/// softmax_statistics.hpp, printed by `tlse cross-entropy --inputs lm` and listed in
/// docs/notes/2026-11-23.md, "Trained-LM-like inputs: what gradient filtering can skip (host, 2026-11-23)"):
/// - token frequencies follow Zipf's law, f_r ~ r^-s (s = 1.1) for the token of frequency rank r,
///   and targets are drawn from it. Token ids are a fixed random permutation of the ranks (a
///   tokenizer's ids do not follow frequency), so that sorting the vocabulary has work to do;
/// - every logit carries a bias that grows with its token's frequency, b_r = top_bias + ln(f_r / f_1)
///   (the unigram prior a trained head learns). It is folded into C through a constant feature of
///   E (E_i,D-1 = 1, C_j,D-1 = b_j), so that the kernels see a plain E C^T;
/// - a row puts most of its probability on a few plausible tokens: `candidates` distinct tokens
///   drawn like targets, whose logits fall by `decay` per slot (slot k: -decay k). The target
///   takes slot k with probability ~ e^(-decay k), the row's own softmax over the slots, as in a
///   calibrated model, whose target is a sample of its own prediction;
/// - every logit has Gaussian noise of standard deviation `noise`.
///
/// Construction: token j has a random unit direction v_j in R^(D-1) and C_j = [v_j, b_j]. Row i is
/// E_i = [u_i, 1], u_i = sum_k a_k v_(c_k) + sigma z_i with a_k = -decay k - b_(c_k) and
/// z_i ~ N(0, I): its dot product with candidate c_k is the slot logit, with any other token that
/// token's bias, both plus noise. Random directions are not orthogonal: the candidates' crosstalk
/// already adds variance sum_k a_k^2 / (D-1) to every logit, so sigma^2 is noise^2 minus that, or 0
/// where the crosstalk alone exceeds noise^2 (below D of about 1000 at the default shape: the
/// noise is then larger than asked, and the statistics drift; the tool prints what they are).
#include <tlse_bench/random_inputs.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <utility>
#include <vector>

namespace tlse::perf {

/// The knobs of lm_cross_entropy_problem. The defaults are calibrated so that at D = 4096,
/// V = 128256 the mean loss is 2-3 nats and a row has well under 100 softmax entries at or above
/// 2^-12 (bf16's filter threshold); the measured values are in the note named at the top.
struct LmShape {
  double zipf_exponent = 1.1;  ///< s in f_r ~ r^-s
  int candidates = 32;         ///< plausible tokens per row, target included (at most V)
  double decay = 0.3;          ///< logit drop per candidate slot
  double top_bias = -3;        ///< bias of the most frequent token, relative to the first slot's logit
  double noise = 1;            ///< standard deviation of every logit's noise
};

/// Frequency ranks (0-based) drawn from Zipf's law over V tokens, by inverting the cumulative sum.
class ZipfRanks {
 public:
  ZipfRanks(std::int64_t V, double exponent) : cdf_(std::size_t(V)) {
    double sum = 0;
    for (std::int64_t r = 0; r < V; ++r) cdf_[std::size_t(r)] = sum += std::pow(double(r + 1), -exponent);
    for (double& c : cdf_) c /= sum;
  }
  std::int64_t draw(Random& rng) const {
    const auto at = std::upper_bound(cdf_.begin(), cdf_.end(), rng.uniform()) - cdf_.begin();
    return std::min<std::int64_t>(at, std::int64_t(cdf_.size()) - 1);  // u near 1 beyond a rounded cdf
  }

 private:
  std::vector<double> cdf_;
};

/// A fixed random permutation of 0..n-1 (Fisher-Yates written out: std::shuffle's algorithm differs
/// between standard libraries, and the inputs must not).
inline std::vector<std::int64_t> random_permutation(Random& rng, std::int64_t n) {
  std::vector<std::int64_t> p(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) p[std::size_t(i)] = i;
  for (std::int64_t i = n - 1; i > 0; --i) std::swap(p[std::size_t(i)], p[std::size_t(rng.below(i + 1))]);
  return p;
}

/// N tokens of dimension D (>= 2: one feature carries the bias) over a vocabulary of V.
inline CrossEntropyProblem lm_cross_entropy_problem(std::uint64_t seed, std::int64_t N, std::int64_t D, std::int64_t V,
                                                    const LmShape& shape = {}) {
  if (D < 2) throw std::invalid_argument("lm_cross_entropy_problem: D must be at least 2 (one feature is the bias)");
  if (V < 1) throw std::invalid_argument("lm_cross_entropy_problem: V must be at least 1");
  Random rng(seed);
  const ZipfRanks zipf(V, shape.zipf_exponent);
  const std::vector<std::int64_t> id_of_rank = random_permutation(rng, V);
  const std::int64_t H = D - 1;  // the directions' dimension
  const auto bias_of_rank = [&](std::int64_t r) {
    return shape.top_bias - shape.zipf_exponent * std::log(double(r + 1));
  };

  CrossEntropyProblem p;
  p.C = Matrix(V, D);
  for (std::int64_t r = 0; r < V; ++r) {
    const std::int64_t j = id_of_rank[std::size_t(r)];
    double norm2 = 0;
    for (std::int64_t k = 0; k < H; ++k) norm2 += (p.C(j, k) = rng.normal()) * p.C(j, k);
    const double inv = norm2 > 0 ? 1 / std::sqrt(norm2) : 0;
    for (std::int64_t k = 0; k < H; ++k) p.C(j, k) *= inv;
    p.C(j, H) = bias_of_rank(r);
  }

  // The target's slot: probability ~ e^(-decay k) over the row's candidates.
  const int K = int(std::min<std::int64_t>(shape.candidates, V));
  std::vector<double> slot_cdf(static_cast<std::size_t>(K));
  double total = 0;
  for (int k = 0; k < K; ++k) slot_cdf[std::size_t(k)] = total += std::exp(-shape.decay * k);
  for (double& c : slot_cdf) c /= total;

  p.E = Matrix(N, D);
  p.targets.resize(std::size_t(N));
  std::vector<std::int64_t> ranks(static_cast<std::size_t>(K));
  std::vector<double> weight(static_cast<std::size_t>(K));
  for (std::int64_t i = 0; i < N; ++i) {
    const std::int64_t target = zipf.draw(rng);
    const int target_slot = int(std::min<std::ptrdiff_t>(
        std::upper_bound(slot_cdf.begin(), slot_cdf.end(), rng.uniform()) - slot_cdf.begin(), K - 1));
    for (int k = 0; k < K; ++k) {
      std::int64_t r = target;
      if (k != target_slot) do
          r = zipf.draw(rng);
        while (r == target || std::find(ranks.begin(), ranks.begin() + k, r) != ranks.begin() + k);
      ranks[std::size_t(k)] = r;
    }
    double crosstalk = 0;
    for (int k = 0; k < K; ++k) {
      weight[std::size_t(k)] = -shape.decay * k - bias_of_rank(ranks[std::size_t(k)]);
      crosstalk += weight[std::size_t(k)] * weight[std::size_t(k)] / double(H);
    }
    const double sigma = std::sqrt(std::max(0.0, shape.noise * shape.noise - crosstalk));
    for (std::int64_t d = 0; d < H; ++d) p.E(i, d) = sigma * rng.normal();
    for (int k = 0; k < K; ++k) {
      const std::int64_t j = id_of_rank[std::size_t(ranks[std::size_t(k)])];
      for (std::int64_t d = 0; d < H; ++d) p.E(i, d) += weight[std::size_t(k)] * p.C(j, d);
    }
    p.E(i, H) = 1;
    p.targets[std::size_t(i)] = id_of_rank[std::size_t(target)];
  }
  return p;
}

}  // namespace tlse::perf
