// The benchmark inputs: the trained-LM-like generator (lm_inputs.hpp) reproduces its inputs from a
// seed, has the structure it documents (Zipf targets, frequency bias, ids a permutation of ranks)
// and reaches the stated statistics at a small size; the statistics themselves
// (softmax_statistics.hpp) count what they say on hand-made logits; the random inputs stay the
// worst case for gradient filtering; the filter's error bound that --check-sampled adds.
#include <tlse_bench/lm_inputs.hpp>
#include <tlse_bench/sampled_reference.hpp>
#include <tlse_bench/softmax_statistics.hpp>

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <vector>

namespace {

using tlse::perf::CrossEntropyProblem;
using tlse::perf::lm_cross_entropy_problem;
using tlse::perf::LmShape;

/// The frequency rank (0-based) of token j, read back from its bias b = top_bias - s ln(rank + 1).
std::int64_t rank_of(const CrossEntropyProblem& p, std::int64_t j, const LmShape& shape = {}) {
  const double b = p.C(j, p.C.cols - 1);
  return std::llround(std::exp((shape.top_bias - b) / shape.zipf_exponent)) - 1;
}

TEST(LmInputs, TheSameSeedGivesTheSameInputs) {
  const auto a = lm_cross_entropy_problem(7, 64, 24, 500), b = lm_cross_entropy_problem(7, 64, 24, 500);
  EXPECT_EQ(a.E.v, b.E.v);
  EXPECT_EQ(a.C.v, b.C.v);
  EXPECT_EQ(a.targets, b.targets);
  const auto c = lm_cross_entropy_problem(8, 64, 24, 500);
  EXPECT_NE(a.E.v, c.E.v);
  EXPECT_NE(a.targets, c.targets);
}

TEST(LmInputs, BiasIsALastFeatureAndDirectionsAreUnitVectors) {
  const std::int64_t N = 50, D = 16, V = 300;
  const auto p = lm_cross_entropy_problem(3, N, D, V);
  for (std::int64_t i = 0; i < N; ++i) EXPECT_EQ(p.E(i, D - 1), 1.0) << i;
  std::vector<int> seen(V, 0);
  for (std::int64_t j = 0; j < V; ++j) {
    double norm2 = 0;
    for (std::int64_t k = 0; k < D - 1; ++k) norm2 += p.C(j, k) * p.C(j, k);
    EXPECT_NEAR(norm2, 1.0, 1e-12) << j;
    const std::int64_t r = rank_of(p, j);
    ASSERT_GE(r, 0);
    ASSERT_LT(r, V);
    EXPECT_EQ(seen[std::size_t(r)]++, 0) << "rank " << r << " twice";  // the bias of every rank, once
  }
  for (auto t : p.targets) {
    EXPECT_GE(t, 0);
    EXPECT_LT(t, V);
  }
}

TEST(LmInputs, TargetsFollowZipfAndIdsAreAPermutationOfRanks) {
  const std::int64_t N = 20000, V = 1000;
  const LmShape shape;
  const auto p = lm_cross_entropy_problem(11, N, 2, V);  // D = 2: cheap, the targets do not depend on D
  std::vector<double> f(V);
  double H = 0;
  for (std::int64_t r = 0; r < V; ++r) H += f[std::size_t(r)] = std::pow(double(r + 1), -shape.zipf_exponent);
  std::vector<double> count(V, 0.0);
  for (auto t : p.targets) count[std::size_t(rank_of(p, t))] += 1;
  // Ranks 0, 1, 2..9, 10..99, 100..999: each group's share of the targets against Zipf's law,
  // within 4 binomial standard deviations.
  for (const auto group : {std::array<std::int64_t, 2>{0, 1}, {1, 2}, {2, 10}, {10, 100}, {100, 1000}}) {
    double expected = 0, got = 0;
    for (std::int64_t r = group[0]; r < group[1]; ++r)
      expected += f[std::size_t(r)] / H, got += count[std::size_t(r)] / N;
    EXPECT_NEAR(got, expected, 4 * std::sqrt(expected * (1 - expected) / N))
        << "ranks " << group[0] << ".." << group[1];
  }
  // Ids do not follow frequency: the rank correlation of (id, rank) is near 0 (1 for the identity).
  double mean = (V - 1) / 2.0, sxy = 0, sxx = 0;
  for (std::int64_t j = 0; j < V; ++j) sxy += (j - mean) * (rank_of(p, j) - mean), sxx += (j - mean) * (j - mean);
  EXPECT_LT(std::fabs(sxy / sxx), 0.15);
}

TEST(LmInputs, StatisticsWithinTheirStatedRangesAtASmallSize) {
  // D = 1024 keeps the candidates' crosstalk within the noise budget (lm_inputs.hpp); V = 32768
  // has enough column tiles for sorting to matter. The values measured at this size:
  // docs/notes/2026-11-23.md, "The trained-LM-like inputs at a small size".
  const auto p = lm_cross_entropy_problem(42, 256, 1024, 32768);
  const auto sample = tlse::perf::sample_logits(p.E, p.C, 2);
  const auto st = tlse::perf::softmax_statistics(sample, p.targets, tlse::perf::vocabulary_order(p.E, p.C), 0x1p-12);
  EXPECT_EQ(st.sampled_rows, 256);
  EXPECT_GE(st.mean_loss, 2.0);
  EXPECT_LE(st.mean_loss, 3.0);
  EXPECT_GE(st.entries_per_row, 20.0);
  EXPECT_LE(st.entries_per_row, 100.0);
  EXPECT_GT(st.skipped[0][1], st.skipped[0][0] + 0.1) << "sorting groups the likely classes";
  EXPECT_GT(st.skipped[1][1], st.skipped[1][0]);
  EXPECT_GE(st.skipped[0][1], st.skipped[1][1]) << "a wider tile is skipped less often";
  EXPECT_GE(st.skipped[2][1], st.skipped[0][1]);
}

TEST(LmInputs, RandomInputsStayTheWorstCaseForFiltering) {
  const auto p = tlse::perf::cross_entropy_problem(42, 256, 64, 8192);
  const auto sample = tlse::perf::sample_logits(p.E, p.C, 2);
  const auto st = tlse::perf::softmax_statistics(sample, p.targets, tlse::perf::vocabulary_order(p.E, p.C), 0x1p-12);
  for (int shape = 0; shape < tlse::perf::filter_tile_shape_count; ++shape)
    for (int order = 0; order < 2; ++order) EXPECT_EQ(st.skipped[shape][order], 0.0) << shape << " " << order;
  EXPECT_GT(st.entries_per_row, 100.0);
}

TEST(SoftmaxStatistics, CountsEntriesLossAndSkippableTilesOfHandMadeLogits) {
  // One row tile of 128 rows over V = 600 (column tiles of 128: 5, of 256: 3). Every row puts
  // logit 0 on class 10 and -inf-like logits elsewhere, except row 0 (also class 300 at 0) and
  // row 5 (target 550, whose logit is -50: p ~ e^-50, below any threshold, but a target).
  const std::int64_t S = 128, V = 600;
  tlse::perf::SampledLogits s;
  s.x = tlse::testing::Matrix(S, V);
  for (double& v : s.x.v) v = -1000;
  std::vector<std::int64_t> targets(S, 10);
  for (std::int64_t i = 0; i < S; ++i) s.rows.push_back(i), s.x(i, 10) = 0;
  s.x(0, 300) = 0;
  targets[5] = 550;
  s.x(5, 550) = -50;
  for (std::int64_t i = 0; i < S; ++i) s.lse.push_back(i == 0 ? std::log(2.0) : 0.0);
  std::vector<int> sorted{10, 300, 550};  // the significant classes first, then the others by id
  for (int j = 0; j < V; ++j)
    if (j != 10 && j != 300 && j != 550) sorted.push_back(j);
  const auto st = tlse::perf::softmax_statistics(s, targets, sorted, 0x1p-12);
  EXPECT_DOUBLE_EQ(st.entries_per_row, 129.0 / 128);
  EXPECT_NEAR(st.mean_loss, (std::log(2.0) + 50.0) / 128, 1e-12);  // row 0: ln 2, row 5: 50, others 0
  // Significant classes 10, 300, 550. Id order: tiles [0,128) [256,384) [512,600) hold them, 2 of 5
  // skipped; 256 wide: [0,256) [256,512) [512,600), none skipped; 64 wide: 3 of 10 tiles hold one.
  // Sorted: all three in the first tile, 4 of 5, 2 of 3 and 9 of 10 skipped.
  EXPECT_DOUBLE_EQ(st.skipped[0][0], 2.0 / 5);
  EXPECT_DOUBLE_EQ(st.skipped[1][0], 0.0);
  EXPECT_DOUBLE_EQ(st.skipped[2][0], 7.0 / 10);
  EXPECT_DOUBLE_EQ(st.skipped[0][1], 4.0 / 5);
  EXPECT_DOUBLE_EQ(st.skipped[1][1], 2.0 / 3);
  EXPECT_DOUBLE_EQ(st.skipped[2][1], 9.0 / 10);
}

TEST(SoftmaxStatistics, SamplesWholeRowTilesAndSortsLikeVocabOrder) {
  const auto rows = tlse::perf::sampled_rows(1000, 2);  // 8 tiles of 128 (the last has 104 rows): take 0 and 4
  ASSERT_EQ(rows.size(), 256u);
  EXPECT_EQ(rows[0], 0);
  EXPECT_EQ(rows[128], 512);
  EXPECT_EQ(tlse::perf::sampled_rows(100, 2).size(), 100u);
  // Column logit sums (sum_i E_i) . C_j = 3 C_j0: classes 2, 0 (tie with 3, lower id first), 3, 1.
  tlse::testing::Matrix E(3, 1), C(4, 1);
  E.v = {1, 1, 1};
  C.v = {1, -1, 2, 1};
  EXPECT_EQ(tlse::perf::vocabulary_order(E, C), (std::vector<int>{2, 0, 3, 1}));
}

TEST(SampledCheck, FilterBoundPerColumnRelativeToTheSample) {
  // other: 3 rows x 2 columns; column 0 has sum |.| 4.5 and max 3, column 1 sum 3.5 and max 2.
  tlse::perf::Matrix other(3, 2), ref(1, 2);
  const double entries[] = {1, -2, 3, 0.5, -0.5, 1};
  for (int i = 0; i < 6; ++i) other.v[std::size_t(i)] = entries[i];
  ref(0, 0) = -0.5, ref(0, 1) = 0.25;  // the sample's largest |ref|: 0.5
  using tlse::perf::FilterBound;
  using tlse::perf::GradientSum;
  const FilterBound over_rows(other, 4, ref, GradientSum::over_rows);
  const FilterBound over_classes(other, 4, ref, GradientSum::over_classes);
  // eps 0.1: eps * sum below the max in both columns: 0.45 / 4 rows / 0.5.
  EXPECT_DOUBLE_EQ(over_rows.relative(0.1), 0.225);
  EXPECT_DOUBLE_EQ(over_classes.relative(0.1), 0.225);
  // eps 1: over the classes a row's dropped entries add up to at most 1, so the max bounds it.
  EXPECT_DOUBLE_EQ(over_rows.relative(1), 2.25);
  EXPECT_DOUBLE_EQ(over_classes.relative(1), 1.5);
  EXPECT_EQ(over_classes.relative(0), 0.0);  // no filter
}

}  // namespace
