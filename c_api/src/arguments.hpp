#pragma once
// Internals of the C API: the arguments of each call once the C layer (entry_points.cpp) has
// checked them, and the per-dtype templates that run them. The templates are defined in
// dtype_calls.hpp and explicitly instantiated one dtype and one loss per translation unit, so the
// library builds in parallel.
#include <tlse.h>

#include <tlse/contrastive_loss.hpp>
#include <tlse/cross_entropy.hpp>
#include <tlse/distillation_loss.hpp>
#include <tlse/distributed/callback_communicator.hpp>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace tlse::capi {

/// Where a call runs: the host execution space, or a Kokkos::Cuda instance on the caller's stream.
struct Launch {
  tlse_device device = TLSE_DEVICE_HOST;
#if defined(KOKKOS_ENABLE_CUDA)
  Kokkos::Cuda cuda;
#endif
};

/// Calls `f(exec)` with the execution space instance of `launch`.
template <class F>
void on_exec(const Launch& launch, F&& f) {
#if defined(KOKKOS_ENABLE_CUDA)
  if (launch.device == TLSE_DEVICE_CUDA) return f(launch.cuda);
#else
  (void)launch;
#endif
  f(Kokkos::DefaultHostExecutionSpace());
}

/// An error of the C layer itself (before any kernel is enqueued), with its status.
struct Error : std::runtime_error {
  tlse_status status;
  Error(tlse_status s, const std::string& message) : std::runtime_error(message), status(s) {}
};

/// The arguments of a cross-entropy call; the step in one call takes the forward's loss and the
/// backward's dloss and gradients.
struct CrossEntropyArgs {
  std::int64_t n = 0, v = 0, d = 0;
  const void *E = nullptr, *C = nullptr, *bias = nullptr;
  const std::int64_t* targets = nullptr;
  void *loss = nullptr, *lse_out = nullptr;  // forward outputs
  std::int32_t* order_out = nullptr;
  const void *lse = nullptr, *dloss = nullptr;  // backward inputs
  const std::int32_t* order = nullptr;
  void *dE = nullptr, *dC = nullptr, *dbias = nullptr;  // backward outputs
  const void *class_weight = nullptr, *dlse = nullptr;  // tlse_cross_entropy_extras
  std::int64_t* predicted = nullptr;
  void* accuracy = nullptr;
  CrossEntropyOptions options;

  /// Elements of loss and dloss: one per row under Reduction::none, else one.
  std::int64_t loss_size() const { return options.reduction == Reduction::none ? n : 1; }
};

struct ContrastiveArgs {
  std::int64_t b = 0, c = 0;
  const void *I = nullptr, *T = nullptr;
  const std::int64_t* labels = nullptr;
  void *loss = nullptr, *row_lse_out = nullptr, *col_lse_out = nullptr;  // forward outputs
  const void *row_lse = nullptr, *col_lse = nullptr, *dloss = nullptr;  // backward inputs
  void *dI = nullptr, *dT = nullptr, *dscale = nullptr;                  // backward outputs
  const void *d_row_lse = nullptr, *d_col_lse = nullptr;                 // tlse_contrastive_extras
  ContrastiveOptions options;
};

/// The arguments of a self-similarity contrastive call: Z (n x c) against itself.
struct SelfContrastiveArgs {
  std::int64_t n = 0, c = 0;
  const void *Z = nullptr;
  void *loss = nullptr, *lse_out = nullptr;     // forward outputs
  const void *lse = nullptr, *dloss = nullptr;  // backward inputs
  void *dZ = nullptr, *dscale = nullptr;        // backward outputs
  ContrastiveOptions options;
};

/// The arguments of a distillation call: the student's Hs (n x d_s) and Ws (v x d_s), the
/// teacher's Ht (n x d_t) and Wt (v x d_t); the step in one call takes the forward's loss and the
/// backward's dloss and gradients.
struct DistillationArgs {
  std::int64_t n = 0, v = 0, d_s = 0, d_t = 0;
  const void *Hs = nullptr, *Ws = nullptr, *Ht = nullptr, *Wt = nullptr;
  const std::int64_t* targets = nullptr;
  void *loss = nullptr, *row_stats_out = nullptr;                       // forward outputs
  const void *row_stats = nullptr, *dloss = nullptr;                    // backward inputs
  void *dHs = nullptr, *dWs = nullptr, *dHt = nullptr, *dWt = nullptr;  // backward outputs
  DistillationOptions options;

  /// Elements of loss and dloss: one per row under Reduction::none, else one.
  std::int64_t loss_size() const { return options.reduction == Reduction::none ? n : 1; }
};

template <class T>
std::size_t cross_entropy_workspace(const Launch&, const CrossEntropyArgs&);
template <class T>
bool cross_entropy_step_fuses(const Launch&, const CrossEntropyArgs&, bool want_dbias);
template <class T>
void cross_entropy_forward(const Launch&, const CrossEntropyArgs&);
template <class T>
void cross_entropy_backward(const Launch&, const CrossEntropyArgs&);
template <class T>
void cross_entropy_with_gradients(const Launch&, const CrossEntropyArgs&);

template <class T>
std::size_t contrastive_workspace(const Launch&, const ContrastiveArgs&);
template <class T>
void contrastive_forward(const Launch&, const ContrastiveArgs&);
template <class T>
void contrastive_backward(const Launch&, const ContrastiveArgs&);
template <class T>
std::size_t self_contrastive_workspace(const Launch &, const SelfContrastiveArgs &);
template <class T>
void self_contrastive_forward(const Launch &, const SelfContrastiveArgs &);
template <class T>
void self_contrastive_backward(const Launch &, const SelfContrastiveArgs &);

template <class T>
std::size_t distillation_workspace(const Launch&, const DistillationArgs&);
template <class T>
void distillation_forward(const Launch&, const DistillationArgs&);
template <class T>
void distillation_backward(const Launch&, const DistillationArgs&);
template <class T>
bool distillation_step_fuses(const Launch&, const DistillationArgs&, bool want_teacher_gradients);
template <class T>
void distillation_with_gradients(const Launch&, const DistillationArgs&);

// The distributed calls take the same arguments (vocab_order and the workspace unused) and the
// caller's communicator.
using distributed::Callbacks;
template <class T>
void cross_entropy_forward_distributed(const Launch&, const Callbacks&, const CrossEntropyArgs&);
template <class T>
void cross_entropy_backward_distributed(const Launch&, const Callbacks&, const CrossEntropyArgs&);
template <class T>
void contrastive_forward_distributed(const Launch&, const Callbacks&, const ContrastiveArgs&);
template <class T>
void contrastive_backward_distributed(const Launch&, const Callbacks&, const ContrastiveArgs&);

}  // namespace tlse::capi
