#pragma once
/// \file tiled_runner.hpp
/// TiledLSE's losses packaged like the materialized baseline (materialized_baseline.hpp), so
/// that the `tlse` tool and the benchmarks drive both the same way: the constructor allocates
/// every buffer, including the workspace lent to each call so that no timed call allocates;
/// then forward(), backward(dA, dB) for dloss = 1, loss() and extra_bytes().
#include <tlse/impl/lse_backward.hpp>
#include <tlse/impl/lse_forward.hpp>
#include <tlse/tlse.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace tlse::perf {

/// The Kokkos team scratch of the generic kernels, per team. It is not in the workspace:
/// Kokkos provides it to each running team (on-chip shared memory on GPUs), and its size is set
/// by the tile shape and the depth, whatever the batch or vocabulary. Read from tlse::impl
/// until the library exposes it.
template <class T>
std::size_t team_scratch_bytes(std::int64_t depth) {
  using Acc = accumulator_t<T>;
  using Backward = impl::BackwardTiles<T, Acc>;
  return std::max(impl::ForwardTiles<T, Acc>::scratch_bytes(),
                  Backward::scratch0_bytes() + Backward::scratch1_bytes(depth));
}

/// Symmetric CLIP loss with diagonal positives (tlse::contrastive_loss and its backward), or with
/// `self_similarity` the NT-Xent form over Z = I (tlse::self_contrastive_loss: rows i and i + b/2
/// are each other's positive, the diagonal excluded; T is not used, and backward() leaves dB alone).
template <class Exec, class T>
class TiledContrastive {
 public:
  using Acc = accumulator_t<T>;
  using Mem = typename Exec::memory_space;
  using Input = Kokkos::View<const T**, Kokkos::LayoutRight, Mem>;
  using Gradient = Kokkos::View<T**, Kokkos::LayoutRight, Mem>;

  TiledContrastive(const Exec& exec, const Input& I, const Input& Tx, double scale,
                   Precision precision = Precision::exact, std::size_t memory_budget = memory_budget_default,
                   bool self_similarity = false)
      : exec_(exec),
        I_(I),
        T_(Tx),
        self_(self_similarity),
        row_lse_("row_lse", I.extent(0)),
        col_lse_("col_lse", self_similarity ? 0 : I.extent(0)) {
    opts_.scale = scale;
    opts_.precision = precision;
    opts_.memory_budget = memory_budget;
    workspace_ =
        Kokkos::View<char*, Mem>("tlse::workspace", self_ ? self_contrastive_loss_workspace_bytes(exec, I, opts_)
                                                          : contrastive_loss_workspace_bytes(exec, I, Tx, opts_));
    opts_.workspace = {workspace_.data(), workspace_.size()};
    Kokkos::deep_copy(dloss_, Acc(1));
  }

  void forward() {
    if (self_)
      self_contrastive_loss(exec_, I_, loss_, row_lse_, opts_);
    else
      contrastive_loss(exec_, I_, T_, Labels(), loss_, row_lse_, col_lse_, opts_);
  }
  void backward(const Gradient& dI, const Gradient& dT) {
    if (self_)
      self_contrastive_loss_backward(exec_, I_, row_lse_, dloss_, dI, AccVector(), opts_);
    else
      contrastive_loss_backward(exec_, I_, T_, Labels(), row_lse_, col_lse_, dloss_, dI, dT, AccVector(), opts_);
  }
  double loss() const { return Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), loss_)(0); }
  /// Workspace and the row and column LSEs saved for the backward: O(b).
  std::size_t extra_bytes() const { return workspace_bytes() + (row_lse_.size() + col_lse_.size()) * sizeof(Acc); }
  std::size_t workspace_bytes() const { return workspace_.size(); }
  std::size_t team_scratch_bytes() const { return perf::team_scratch_bytes<T>(I_.extent(1)); }

 private:
  using AccVector = Kokkos::View<Acc*, Mem>;
  using Labels = Kokkos::View<const int*, Mem>;  // empty: diagonal positives
  Exec exec_;
  Input I_, T_;
  bool self_;
  ContrastiveOptions opts_;
  Kokkos::View<char*, Mem> workspace_;
  AccVector loss_{"loss", 1}, dloss_{"dloss", 1}, row_lse_, col_lse_;
};

/// Mean cross-entropy (tlse::cross_entropy and its backward), with a fixed bias or none. By default
/// as the library's defaults: gradient filtering at filter_eps_auto, no vocabulary sorting; with
/// `sort_vocabulary` the forward returns the vocabulary order and the backward visits it.
template <class Exec, class T>
class TiledCrossEntropy {
 public:
  using Acc = accumulator_t<T>;
  using Mem = typename Exec::memory_space;
  using Input = Kokkos::View<const T**, Kokkos::LayoutRight, Mem>;
  using Targets = Kokkos::View<const int*, Mem>;
  using Gradient = Kokkos::View<T**, Kokkos::LayoutRight, Mem>;
  using Bias = Kokkos::View<const T*, Mem>;  ///< (V) or empty; fixed: no dbias is computed

  TiledCrossEntropy(const Exec& exec, const Input& E, const Input& C, const Targets& targets,
                    Precision precision = Precision::exact, std::size_t memory_budget = memory_budget_default,
                    double filter_eps = filter_eps_auto, bool sort_vocabulary = false, bool one_call_step = false,
                    double softcap = 0, const Bias& bias = {})
      : exec_(exec),
        E_(E),
        C_(C),
        bias_(bias),
        targets_(targets),
        lse_("lse", E.extent(0)),
        one_call_step_(one_call_step) {
    opts_.precision = precision;
    opts_.softcap = softcap;
    opts_.memory_budget = memory_budget;
    opts_.filter_eps = filter_eps;
    if (sort_vocabulary) order_ = VocabOrder("vocab_order", C.extent(0));
    workspace_ = Kokkos::View<char*, Mem>("tlse::workspace", cross_entropy_workspace_bytes(exec, E, C, opts_));
    opts_.workspace = {workspace_.data(), workspace_.size()};
    Kokkos::deep_copy(dloss_, Acc(1));
  }

  void forward() { cross_entropy(exec_, E_, C_, bias_, targets_, loss_, lse_, order_, opts_); }
  void backward(const Gradient& dE, const Gradient& dC) {
    cross_entropy_backward(exec_, E_, C_, bias_, targets_, lse_, order_, dloss_, dE, dC, Kokkos::View<T*, Mem>(),
                           opts_);
  }
  /// The training step: cross_entropy_with_gradients in one call, or the forward and the backward.
  void step(const Gradient& dE, const Gradient& dC) {
    if (!one_call_step_) {
      forward();
      backward(dE, dC);
      return;
    }
    cross_entropy_with_gradients(exec_, E_, C_, bias_, targets_, dloss_, loss_, dE, dC, Kokkos::View<T*, Mem>(), opts_);
  }
  double loss() const { return Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), loss_)(0); }
  /// Workspace, the LSEs saved for the backward and the vocabulary order: O(N + V).
  std::size_t extra_bytes() const {
    return workspace_bytes() + lse_.size() * sizeof(Acc) + order_.size() * sizeof(int);
  }
  std::size_t workspace_bytes() const { return workspace_.size(); }
  std::size_t team_scratch_bytes() const { return perf::team_scratch_bytes<T>(E_.extent(1)); }
  /// The gradient filter's threshold as the calls resolve it (filter_eps_auto: T's default).
  double filter_eps() const { return impl::resolved_filter_eps<T>(opts_); }

 private:
  using AccVector = Kokkos::View<Acc*, Mem>;
  using VocabOrder = Kokkos::View<int*, Mem>;
  Exec exec_;
  Input E_, C_;
  Bias bias_;
  Targets targets_;
  CrossEntropyOptions opts_;
  Kokkos::View<char*, Mem> workspace_;
  AccVector loss_{"loss", 1}, dloss_{"dloss", 1}, lse_;
  VocabOrder order_;  // empty: natural order
  bool one_call_step_;
};

}  // namespace tlse::perf
