#pragma once
/// \file cross_entropy_options.hpp
/// What the cross-entropy calls take besides their operands: the options (CrossEntropyOptions)
/// and the optional arrays (CrossEntropyExtras), shared by the single-device and the
/// vocabulary-parallel calls. The argument names follow PyTorch's F.cross_entropy, CCE's and
/// Liger-Kernel's where they have one (docs/python.md has the map).
#include <tlse/impl/kokkos_compat.hpp>
#include <tlse/options.hpp>

#include <cstdint>

namespace tlse {

/// Options of cross_entropy(), cross_entropy_backward() and cross_entropy_with_gradients()
/// (pass the same to the forward and the backward).
struct CrossEntropyOptions {
  /// Rows whose target equals this add nothing to the loss and get zero gradient.
  std::int64_t ignore_index = -100;
  /// none (one loss per row), sum, or mean: the sum divided by the number of scored rows (with
  /// class weights, by the sum of their targets' weights, as F.cross_entropy; the z-loss by the
  /// number of scored rows). A batch with no scored row (or zero total weight) has mean 0.
  Reduction reduction = Reduction::mean;
  std::int64_t shift = 0;            ///< row i is scored against targets(i + shift); the last `shift` rows are ignored
  double softcap = 0;                ///< logits become softcap * tanh(logit / softcap) (Gemma 2); 0: off
  double z_loss = 0;                 ///< adds z_loss * lse_i^2 to each row's loss
  /// F.cross_entropy's label_smoothing, in [0, 1]: the target distribution puts 1 - label_smoothing
  /// on the target and label_smoothing / V on every class (times the class weights when given),
  /// i.e. row i adds label_smoothing / V * sum_j w_j (lse_i - x_ij) to (1 - label_smoothing) times
  /// its weighted loss.
  double label_smoothing = 0;
  double filter_eps = filter_eps_auto;  ///< backward: skip tiles whose softmax is all below this; 0: exact
  bool accumulate = false;           ///< backward: dE += ..., dC += ..., dbias += ... instead of overwriting
  Precision precision = Precision::exact;  ///< float inputs: Precision::tf32 allows TF32 tensor cores
  /// NaN/Inf policy for the inputs (see NonFinite)
  NonFinite non_finite = NonFinite::propagate;
  /// bytes of workspace the calls may use; each picks the fastest algorithm that fits (see memory_budget_default)
  std::size_t memory_budget = memory_budget_default;
  /// memory lent to the call; empty: the call allocates and frees it
  Workspace workspace{};
};

/// The optional arrays of the cross-entropy calls, each left empty (the default) when not used.
/// Acc is the accumulator type of the inputs (accumulator_t<T>), Mem the memory space of the
/// call's execution space. Which call takes which is said per member; giving one to a call that
/// does not take it is an error.
template <class Acc, class Mem>
struct CrossEntropyExtras {
  /// Input of every call (V, or this rank's V_r classes for a vocabulary shard): F.cross_entropy's
  /// `weight`. Row i's loss is multiplied by class_weight[target_i], and with label smoothing the
  /// smoothed targets are weighted too. Finite and >= 0. Pass the same to the forward and the backward.
  Kokkos::View<const Acc*, Mem> class_weight;
  /// Input of cross_entropy_backward and cross_entropy_with_gradients (N): the gradient of the
  /// caller's loss with respect to the forward's `lse` output, added to the gradients (d lse_i /
  /// d x_ij = softmax_ij), so that a loss built from the returned LSE (a z-loss, an entropy bonus)
  /// trains. Entries of rows that are not scored are ignored (their lse is the constant 0).
  Kokkos::View<const Acc*, Mem> dlse;
  /// Output of cross_entropy and cross_entropy_with_gradients (N): each scored row's predicted class,
  /// the argmax of its logits (ties: the lowest class id, as torch.argmax; NaN logits are skipped),
  /// computed by the forward; -1 for rows that are not scored.
  Kokkos::View<std::int64_t*, Mem> predicted;
  /// Output of cross_entropy and cross_entropy_with_gradients (1): the fraction of scored rows whose
  /// predicted class is their target (0 when none is scored).
  Kokkos::View<Acc*, Mem> accuracy;
};

}  // namespace tlse
