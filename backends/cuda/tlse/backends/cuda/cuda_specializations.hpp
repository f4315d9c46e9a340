#pragma once
// Registers the tensor-core kernels for Kokkos::Cuda: the forward LSE (lse_forward_mma.hpp) and
// the backward passes (lse_backward_mma.hpp), for bf16 and fp16 inputs, and
// for float inputs in TF32 when the call asks for Precision::tf32.
#include <tlse/backends/cuda/lse_backward_mma.hpp>
#include <tlse/backends/cuda/lse_forward_mma.hpp>
#include <tlse/impl/backend_dispatch.hpp>

#include <type_traits>

namespace tlse::impl {

/// 16-bit inputs always; float inputs when the call allows TF32 (checked at run time).
template <class T>
constexpr bool on_tensor_cores =
    std::is_same<T, bfloat16>::value || std::is_same<T, float16>::value || std::is_same<T, float>::value;

template <>
struct LseForwardSpecialization<Kokkos::Cuda> {
  template <class T, class Acc>
  static bool run(const Kokkos::Cuda& exec, const TileProblem<T, Acc>& prob, ForwardPartials<Acc>& parts) {
    if constexpr (on_tensor_cores<T> && std::is_same<Acc, float>::value) {
      if (!cuda::LseForwardMma::applies(prob)) return false;
      cuda::LseForwardMma::run(exec.cuda_stream(), exec.cuda_device(), prob, parts);
      return true;
    } else {
      return false;
    }
  }
};

/// The backward stores G = scale * dL/dx in the input type for the tensor cores (fp16 scaled by
/// rows, see lse_backward_mma.hpp); float only in TF32 (checked at run time).
template <class T>
constexpr bool backward_on_tensor_cores = on_tensor_cores<T>;

template <>
struct LseBackwardSpecialization<Kokkos::Cuda> {
  template <class T>
  static std::size_t scratch_bytes(const Kokkos::Cuda& exec, index_t owned, index_t other, index_t depth,
                                   Precision precision) {
    if constexpr (backward_on_tensor_cores<T>) {
      if (sizeof(T) == 4 && precision != Precision::tf32) return 0;
      return cuda::LseBackwardMma::scratch_bytes(exec.cuda_device(), owned, other, depth, sizeof(T));
    } else {
      return 0;
    }
  }
  template <class F>
  static bool run(const Kokkos::Cuda& exec, const F& f) {
    using T = typename std::remove_const<typename std::remove_pointer<decltype(f.prob.rows.data)>::type>::type;
    if constexpr (backward_on_tensor_cores<T>) {
      return cuda::LseBackwardMma::run<T>(exec.cuda_stream(), exec.cuda_device(), f, f.scratch, f.scratch_bytes);
    } else {
      return false;
    }
  }
};

}  // namespace tlse::impl
