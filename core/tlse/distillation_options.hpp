#pragma once
/// \file distillation_options.hpp
/// What the distillation calls take besides their operands: the divergence between the teacher's
/// and the student's softmax (Divergence) and the options (DistillationOptions), shared by the
/// single-device and the vocabulary-parallel calls. Names and defaults follow Liger-Kernel's
/// fused linear distillation losses and TRL's generalized JSD.
#include <tlse/options.hpp>

#include <cstddef>
#include <cstdint>

namespace tlse {

/// Which divergence between the teacher's softmax p_t and the student's p_s a row contributes.
enum class Divergence {
  /// KL(p_t || p_s) = sum_j p_t,j (log p_t,j - log p_s,j) (Liger's and TRL's beta = 0)
  forward_kl,
  /// KL(p_s || p_t) (Liger's and TRL's beta = 1)
  reverse_kl,
  /// beta KL(p_t || m) + (1 - beta) KL(p_s || m), m = beta p_t + (1 - beta) p_s; beta = 0 is
  /// taken as forward_kl and beta = 1 as reverse_kl (as Liger-Kernel and TRL special-case them)
  jsd
};

/// Options of distillation_loss() and distillation_loss_backward() (pass the same to both).
struct DistillationOptions {
  /// The divergence of each row (see Divergence).
  Divergence divergence = Divergence::forward_kl;
  /// Divergence::jsd's mixing weight of the teacher, in [0, 1]; ignored by the KLs.
  double beta = 0.5;
  /// T > 0 divides both heads' logits before their softmaxes. The loss is not multiplied by
  /// T^2 (as Liger-Kernel's fused linear distillation losses): scale it yourself for Hinton's
  /// convention. The hard-label cross-entropy (alpha) always uses T = 1.
  double temperature = 1.0;
  /// Rows whose target equals this add nothing to the loss and get zero gradient.
  std::int64_t ignore_index = -100;
  /// Row i is scored against targets(i + shift); the last `shift` rows are not scored (with
  /// targets; without them every row is scored). Must be >= 0.
  std::int64_t shift = 0;
  /// In [0, 1]: row loss = alpha * CE_i + (1 - alpha) * divergence_i, CE_i the student's
  /// hard-label cross-entropy on its unscaled logits (Liger's weight_hard_loss; 1 - alpha is its
  /// weight_soft_loss). alpha > 0 needs targets.
  double alpha = 0.0;
  /// none (one loss per row), sum, or mean over the scored rows (0 when none is scored).
  Reduction reduction = Reduction::mean;
  /// backward: dHs += ..., dWs += ..., dHt += ..., dWt += ... instead of overwriting
  bool accumulate = false;
  /// NaN/Inf policy for the inputs (see NonFinite)
  NonFinite non_finite = NonFinite::propagate;
  /// bytes of workspace the calls may use (see memory_budget_default): the GPU's tile-pair
  /// kernels (bf16 on Hopper) take panels of the vocabulary as wide as it holds; the generic
  /// kernels need O(N + V) whatever the budget
  std::size_t memory_budget = memory_budget_default;
  /// memory lent to the call; empty: the call allocates and frees it
  Workspace workspace{};
};

/// Values per row that distillation_loss saves for distillation_loss_backward: its `row_stats`
/// output is an (N x distillation_row_stats) row-major view of accumulator_t<T> (O(N) memory),
/// opaque to callers (the LSEs of both heads, the cross-entropy's, and the divergence's sums).
constexpr int distillation_row_stats = 5;

}  // namespace tlse
