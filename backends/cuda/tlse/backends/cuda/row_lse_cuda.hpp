#pragma once
// Registers the tensor-core forward (lse_forward_mma.hpp) for Kokkos::Cuda.
#include <tlse/backends/cuda/lse_forward_mma.hpp>
#include <tlse/impl/backend_dispatch.hpp>

namespace tlse::impl {

template <>
struct RowLseSpecialization<Kokkos::Cuda> {
  template <class T, class Acc>
  static int run(const Kokkos::Cuda& exec, const TileProblem<T, Acc>& prob, index_t max_splits, Acc* partials) {
    if constexpr (std::is_same<T, bfloat16>::value || std::is_same<T, float16>::value) {
      if (!cuda::LseForwardMma::applies(prob)) return 0;
      int splits = 0;
      cuda::LseForwardMma::run(exec.cuda_stream(), exec.cuda_device(), prob, max_splits, partials, splits);
      return splits;
    } else {
      return 0;
    }
  }
};

}  // namespace tlse::impl
