#pragma once
/// \file softmax_statistics.hpp
/// What gradient filtering can skip on a cross-entropy problem (no bias, no ignored rows), measured
/// in float64 on a sample of whole 128-row tiles: the mean loss, the mean number of softmax entries
/// per row at or above a threshold, and the fraction of backward tiles whose entries are all below
/// it and that hold no target - the tiles the filter skips (CCE's rule, lse_backward.hpp) - for the
/// tile shapes of the CUDA kernels (128 x 128: mma.sync; 128 rows x 256 columns: Hopper) and for
/// 64-column groups (what a finer skip would find), with the vocabulary in id order and sorted as
/// the forward's vocab_order sorts it.
///
/// The sample's logits come from KokkosBlas::gemm in double on the default execution space (the
/// GPU in a CUDA build), a block of columns at a time: rows x V x D multiply-adds, a few seconds
/// for 256 rows at D = 4096, V = 128256 on a GPU, about a minute on 2 host cores.
#include <tlse_bench/random_inputs.hpp>

#include <KokkosBlas3_gemm.hpp>
#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

namespace tlse::perf {

/// The tile shapes whose skipping is counted: the mma.sync kernels', the Hopper kernels', and
/// 64-column groups.
struct TileShape {
  int rows, cols;
  const char* what;
};
constexpr TileShape filter_tile_shapes[] = {
    {128, 128, "mma.sync tiles"}, {128, 256, "Hopper tiles"}, {128, 64, "64-column groups"}};
constexpr int filter_tile_shape_count = 3;
constexpr int filter_tile_rows = 128;

/// Logits of sampled rows against the whole vocabulary, in float64, with each row's LSE.
struct SampledLogits {
  std::vector<std::int64_t> rows;  ///< the sampled rows of E, whole 128-row tiles in order
  Matrix x;                        ///< rows.size() x V
  std::vector<double> lse;         ///< per sampled row
};

/// The rows of `row_tiles` 128-row tiles of E spread evenly over its rows (all rows if fewer).
inline std::vector<std::int64_t> sampled_rows(std::int64_t N, std::int64_t row_tiles) {
  const std::int64_t tiles = (N + filter_tile_rows - 1) / filter_tile_rows;
  const std::int64_t take = std::min(tiles, std::max<std::int64_t>(row_tiles, 1));
  std::vector<std::int64_t> rows;
  for (std::int64_t t = 0; t < take; ++t)
    for (std::int64_t i = (t * tiles / take) * filter_tile_rows, end = std::min(N, i + filter_tile_rows); i < end; ++i)
      rows.push_back(i);
  return rows;
}

/// x = E[rows] C^T + bias in float64 (bias (V) or empty), computed on the default execution space a
/// column block at a time; with softcap > 0, x = softcap tanh((E[rows] C^T + bias) / softcap).
inline SampledLogits sample_logits(const Matrix& E, const Matrix& C, std::int64_t row_tiles, double softcap = 0,
                                   const std::vector<double>& bias = {}) {
  using Exec = Kokkos::DefaultExecutionSpace;
  using View = Kokkos::View<double**, Kokkos::LayoutRight, Kokkos::Device<Exec, Exec::memory_space>>;
  SampledLogits s;
  s.rows = sampled_rows(E.rows, row_tiles);
  const std::int64_t S = std::int64_t(s.rows.size()), V = C.rows, D = C.cols;
  s.x = Matrix(S, V);
  View Es("sampled E", S, D);
  auto Es_h = Kokkos::create_mirror_view(Es);
  for (std::int64_t i = 0; i < S; ++i)
    for (std::int64_t k = 0; k < D; ++k) Es_h(i, k) = E(s.rows[std::size_t(i)], k);
  Kokkos::deep_copy(Es, Es_h);
  const std::int64_t block =
      std::min(V, std::max<std::int64_t>(256, (std::int64_t(32) << 20) / 8 / std::max<std::int64_t>(D, 1)));
  View Cb("C block", block, D), Xb("logit block", S, block);
  auto Cb_h = Kokkos::create_mirror_view(Cb);
  auto Xb_h = Kokkos::create_mirror_view(Xb);
  for (std::int64_t j0 = 0; j0 < V; j0 += block) {
    const std::int64_t n = std::min(block, V - j0);
    for (std::int64_t j = 0; j < block; ++j)
      for (std::int64_t k = 0; k < D; ++k) Cb_h(j, k) = j < n ? C(j0 + j, k) : 0.0;
    Kokkos::deep_copy(Cb, Cb_h);
    KokkosBlas::gemm("N", "T", 1.0, Es, Cb, 0.0, Xb);
    Kokkos::deep_copy(Xb_h, Xb);
    for (std::int64_t i = 0; i < S; ++i)
      for (std::int64_t j = 0; j < n; ++j) {
        const double z = Xb_h(i, j) + (bias.empty() ? 0.0 : bias[std::size_t(j0 + j)]);
        s.x(i, j0 + j) = softcap > 0 ? softcap * std::tanh(z / softcap) : z;
      }
  }
  s.lse.resize(std::size_t(S));
  for (std::int64_t i = 0; i < S; ++i) {
    double m = -INFINITY, sum = 0;
    for (std::int64_t j = 0; j < V; ++j) m = std::max(m, s.x(i, j));
    for (std::int64_t j = 0; j < V; ++j) sum += std::exp(s.x(i, j) - m);
    s.lse[std::size_t(i)] = m + std::log(sum);
  }
  return s;
}

/// The vocabulary sorted as the forward's vocab_order: by decreasing column logit sum over all rows
/// of E (here in float64: (sum_i E_i) . C_j + N bias_j, bias (V) or empty), ties by id.
inline std::vector<int> vocabulary_order(const Matrix& E, const Matrix& C, const std::vector<double>& bias = {}) {
  std::vector<double> e_sum(static_cast<std::size_t>(E.cols), 0.0), col_sum(static_cast<std::size_t>(C.rows), 0.0);
  for (std::int64_t i = 0; i < E.rows; ++i)
    for (std::int64_t k = 0; k < E.cols; ++k) e_sum[std::size_t(k)] += E(i, k);
  for (std::int64_t j = 0; j < C.rows; ++j) {
    for (std::int64_t k = 0; k < C.cols; ++k) col_sum[std::size_t(j)] += e_sum[std::size_t(k)] * C(j, k);
    if (!bias.empty()) col_sum[std::size_t(j)] += double(E.rows) * bias[std::size_t(j)];
  }
  std::vector<int> order(static_cast<std::size_t>(C.rows));
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) {
    return col_sum[std::size_t(a)] > col_sum[std::size_t(b)] ||
           (col_sum[std::size_t(a)] == col_sum[std::size_t(b)] && a < b);
  });
  return order;
}

struct SoftmaxStatistics {
  std::int64_t sampled_rows = 0;
  double threshold = 0;
  double mean_loss = 0;        ///< mean over the sampled rows with a target of lse_i - x_i,target (nats)
  double entries_per_row = 0;  ///< mean number of entries with p >= threshold
  /// skipped[s][o]: fraction of the sampled row tiles' tiles of shape filter_tile_shapes[s] that the
  /// filter skips, o = 0 with the vocabulary in id order, o = 1 in `order`.
  double skipped[filter_tile_shape_count][2] = {};
};

inline SoftmaxStatistics softmax_statistics(const SampledLogits& s, const std::vector<std::int64_t>& targets,
                                            const std::vector<int>& order, double threshold) {
  const std::int64_t S = std::int64_t(s.rows.size()), V = s.x.cols;
  SoftmaxStatistics st;
  st.sampled_rows = S;
  st.threshold = threshold;
  std::vector<int> id_order(static_cast<std::size_t>(V));
  std::iota(id_order.begin(), id_order.end(), 0);
  std::int64_t skipped[filter_tile_shape_count][2] = {}, tiles[filter_tile_shape_count] = {};
  std::vector<char> significant(static_cast<std::size_t>(V));
  std::int64_t with_target = 0;
  for (std::int64_t t0 = 0; t0 < S;) {  // one row tile of E at a time: the sample holds whole ones
    const std::int64_t tile = s.rows[std::size_t(t0)] / filter_tile_rows;
    std::fill(significant.begin(), significant.end(), 0);
    std::int64_t i = t0;
    for (; i < S && s.rows[std::size_t(i)] / filter_tile_rows == tile; ++i) {
      const std::int64_t target = targets[std::size_t(s.rows[std::size_t(i)])];
      const double lse = s.lse[std::size_t(i)];
      for (std::int64_t j = 0; j < V; ++j)
        if (std::exp(s.x(i, j) - lse) >= threshold) {
          significant[std::size_t(j)] = 1;
          st.entries_per_row += 1;
        }
      if (target >= 0 && target < V) {
        significant[std::size_t(target)] = 1;
        st.mean_loss += lse - s.x(i, target);
        ++with_target;
      }
    }
    for (int shape = 0; shape < filter_tile_shape_count; ++shape) {
      const std::int64_t w = filter_tile_shapes[shape].cols;
      tiles[shape] += (V + w - 1) / w;
      for (int o = 0; o < 2; ++o) {
        const std::vector<int>& by_position = o == 0 ? id_order : order;
        for (std::int64_t c0 = 0; c0 < V; c0 += w) {
          bool any = false;
          for (std::int64_t c = c0; c < std::min(V, c0 + w) && !any; ++c)
            any = significant[std::size_t(by_position[std::size_t(c)])];
          skipped[shape][o] += any ? 0 : 1;
        }
      }
    }
    t0 = i;
  }
  if (with_target > 0) st.mean_loss /= double(with_target);
  if (S > 0) st.entries_per_row /= double(S);
  for (int shape = 0; shape < filter_tile_shape_count; ++shape)
    for (int o = 0; o < 2; ++o)
      st.skipped[shape][o] = tiles[shape] ? double(skipped[shape][o]) / double(tiles[shape]) : 0;
  return st;
}

}  // namespace tlse::perf
