#pragma once
/// \file options.hpp
/// Options shared by the TiledLSE calls: reductions, directions, the non-finite policy and the
/// caller-provided workspace.
#include <cstddef>
#include <cstdint>

namespace tlse {

/// How per-row losses are combined. `mean` averages over the rows that are not ignored;
/// with no such row the loss is 0 and every gradient is 0.
enum class Reduction { none, sum, mean };

/// Which directions of the contrastive loss are summed. `symmetric` is
/// (image-to-text + text-to-image) / 2, as CLIP.
enum class Direction { symmetric, image_to_text, text_to_image };

/// What a call does with NaN or Inf in its inputs. `propagate` (default) costs nothing and lets
/// them flow into the outputs as IEEE arithmetic does; `detect` scans every floating-point
/// input first and throws std::invalid_argument naming the argument and the first bad element,
/// before anything is written.
enum class NonFinite { propagate, detect };

/// Arithmetic of the tile products for float inputs. `exact` (default) multiplies in float on
/// every backend. `tf32` lets a backend with TF32 tensor cores (CUDA, sm_80+) round both operands
/// to TF32 (10-bit mantissa, round to nearest) and accumulate in float: several times faster, with
/// logits accurate to about 2^-11 of scale * |a| |b| instead of float's 2^-24. Backends without
/// TF32 ignore it. It has no effect on bf16/fp16 inputs (always on tensor cores where available,
/// exact products accumulated in float) nor on double.
enum class Precision { exact, tf32 };

/// Scratch memory a caller lends to a call, in the memory space of the call's execution space.
/// Ask for its size with the `*_workspace_bytes` function of the call. Left empty, the call
/// allocates (and frees) what it needs itself. Apart from this buffer a call only uses Kokkos
/// team scratch (see docs/api.md for its size).
struct Workspace {
  /// start of the buffer (any alignment; the call aligns inside it), or nullptr
  void* data = nullptr;
  /// its size; a call throws std::invalid_argument if it is smaller than needed
  std::size_t bytes = 0;
};

/// Default of the options' `memory_budget`: 256 MiB. A call picks the fastest algorithm whose
/// scratch fits its budget: on a GPU a larger budget lets a backward recompute the logits fewer
/// times, and the training step keep more of the forward's logits, so the call may run faster.
/// Host backends need far less and ignore it. The call's per-row arrays (a few bytes a row) come
/// on top. `*_workspace_bytes` report what a call will use under the budget; a budget below the
/// smallest algorithm's needs gets that minimum. Which algorithm a budget selects: docs/options.md
/// (the fused training step it may select filters no gradient: cross_entropy_with_gradients).
constexpr std::size_t memory_budget_default = std::size_t(256) << 20;

/// Value of `filter_eps` meaning "the default for the input dtype": eps(dtype) / 32 as CCE
/// (2^-12 for bf16, 2^-15 for fp16, 2^-28 for float, 2^-57 for double).
constexpr double filter_eps_auto = -1.0;

}  // namespace tlse
