#pragma once
// Registers the Kokkos::Cuda specializations (kernel_path.hpp says which run):
// - the Hopper kernels (hopper/forward.hpp, hopper/backward.hpp; built with TLSE_HAVE_HOPPER):
//   the forward for bf16, fp16 and float in TF32, the fused backward for the same when its plan fits
//   the call's memory budget, cross-entropy's training step for bf16 and fp16 when its plan fits,
//   and the distillation's tile pairs for bf16 (hopper/distillation.hpp) when a panel fits;
// - the mma.sync tensor-core kernels (mma/forward.hpp, mma/backward.hpp): the forward
//   and the two backward passes for bf16, fp16 and float in TF32, on sm_80 and later;
// - the same kernels for exact float, with 3xTF32 products on tensor cores (the default) or FFMA
//   products (mma/ffma_product.hpp), as TLSE_CUDA_EXACT_F32 says (kernel_path.hpp);
// - anything else runs the generic kernels.
#include <tlse/backends/cuda/kernel_path.hpp>
#include <tlse/backends/cuda/mma/backward.hpp>
#include <tlse/backends/cuda/mma/ffma_product.hpp>
#include <tlse/backends/cuda/mma/forward.hpp>
#include <tlse/impl/backend_dispatch.hpp>
#if defined(TLSE_HAVE_HOPPER)
#include <tlse/backends/cuda/hopper/backward.hpp>
#include <tlse/backends/cuda/hopper/distillation.hpp>
#include <tlse/backends/cuda/hopper/forward.hpp>
#include <tlse/backends/cuda/hopper/step.hpp>
#endif

#include <type_traits>

namespace tlse::impl {

/// The input types the tile kernels take: 16-bit inputs always; float inputs in TF32 on tensor
/// cores, or exact with 3xTF32 or FFMA products unless TLSE_CUDA_EXACT_F32=generic (checked at run time).
template <class T>
constexpr bool on_tile_kernels =
    std::is_same<T, bfloat16>::value || std::is_same<T, float16>::value || std::is_same<T, float>::value;

/// run(product) with the Product the tile kernels multiply T with (float: in TF32 where `tf32`,
/// else exact with 3xTF32 or FFMA as TLSE_CUDA_EXACT_F32 says); false where none does.
template <class T, class Run>
bool with_tile_product(bool tf32, const Run& run) {
  if constexpr (std::is_same<T, float>::value) {
    if (!tf32) {
      const cuda::ExactF32 kernels = cuda::exact_f32_kernels();
      if (kernels == cuda::ExactF32::tf32x3) return run(cuda::Tf32x3Product{});
      return kernels == cuda::ExactF32::ffma && run(cuda::FfmaProduct{});
    }
  }
  return run(cuda::TensorCoreProduct<T>{});
}

template <>
struct LseForwardSpecialization<Kokkos::Cuda> {
  template <class T, class Acc>
  static bool run(const Kokkos::Cuda& exec, const TileProblem<T, Acc>& prob, ForwardPartials<Acc>& parts) {
    // Weighted row logit sums (label smoothing under a softcap): the generic kernel; the argmax
    // comes with the rows alone.
    if (parts.row_weighted_sums || (parts.row_best && (parts.cols || parts.col_sums))) return false;
    if constexpr (on_tile_kernels<T> && std::is_same<Acc, float>::value) {
      const cuda::KernelPath path = cuda::kernel_path(exec.cuda_device());
#if defined(TLSE_HAVE_HOPPER)
      if (path == cuda::KernelPath::hopper && cuda::LseForwardHopper::run(exec.cuda_stream(), prob, parts)) return true;
#endif
      if (path == cuda::KernelPath::generic) return false;
      return with_tile_product<T>(prob.tf32, [&](auto product) {
        using Product = decltype(product);
        if (!cuda::LseForwardMma::applies<T, Product>(prob)) return false;
        cuda::LseForwardMma::run<T, Product>(exec.cuda_stream(), exec.cuda_device(), prob, parts);
        return true;
      });
    } else {
      return false;
    }
  }
};

/// Whether a side's softmax terms carry label smoothing's spread (under a softcap): the tile
/// kernels here know no such term, the generic ones do.
template <class Acc>
bool takes_spread(const SoftmaxTerms<Acc>& terms) {
  return terms.spread != nullptr;
}

/// The backward stores G = scale * dL/dx in the input type for the tile kernels' product (fp16
/// scaled by rows, see mma/backward.hpp); float in TF32, or exact with 3xTF32 or FFMA.
template <class T>
constexpr bool backward_on_tile_kernels = on_tile_kernels<T>;

/// Whether the tile kernels take float inputs of this precision on the device (the mma.sync
/// kernels' fused backward and passes).
inline bool tile_kernels_take_float(const Kokkos::Cuda& exec, Precision precision) {
  return cuda::kernel_path(exec.cuda_device()) != cuda::KernelPath::generic &&
         (precision == Precision::tf32 || cuda::exact_f32_kernels() != cuda::ExactF32::generic);
}

/// The whole backward: the Hopper kernels' (hopper/backward.hpp) where their plan fits, else for
/// float the mma.sync kernels' (LseBackwardMma::run_fused), whose scratch also holds the passes'
/// for the calls it leaves to them.
template <>
struct LseBackwardFusedSpecialization<Kokkos::Cuda> {
  template <class T>
  static std::size_t scratch_bytes(const Kokkos::Cuda& exec, const BackwardShape& shape) {
#if defined(TLSE_HAVE_HOPPER)
    cuda::FusedBackwardPlan plan;
    if (cuda::kernel_path(exec.cuda_device()) == cuda::KernelPath::hopper &&
        cuda::LseBackwardHopper::plan<T>(exec.cuda_device(), shape, plan))
      return plan.bytes;
#endif
    if constexpr (std::is_same<T, float>::value) {
      if (!tile_kernels_take_float(exec, shape.precision)) return 0;
      const std::size_t fused = cuda::LseBackwardMma::fused_scratch_bytes(exec.cuda_device(), shape.rows, shape.cols,
                                                                          shape.depth, shape.memory_budget);
      const std::size_t passes = pass_scratch_bytes<T>(exec, shape);
      return fused == 0 ? 0 : fused > passes ? fused : passes;
    }
    (void)exec, (void)shape;
    return 0;
  }
  template <class T, class Acc>
  static bool run(const Kokkos::Cuda& exec, const BackwardRequest<T, Acc>& r) {
    if (takes_spread(r.row_terms) || takes_spread(r.col_terms)) return false;
    if constexpr (std::is_same<Acc, float>::value) {
#if defined(TLSE_HAVE_HOPPER)
      if (cuda::kernel_path(exec.cuda_device()) == cuda::KernelPath::hopper &&
          cuda::LseBackwardHopper::run<T>(exec.cuda_stream(), exec.cuda_device(), r))
        return true;
#endif
      if constexpr (std::is_same<T, float>::value) {
        // Only both gradients gain (one wanted is one pass anyway); the self-similarity form's
        // columns add into the rows the chunks are writing, and dbias would need column sums.
        if (!r.grad_rows || !r.grad_cols || r.cols_into_rows || r.dbias ||
            !tile_kernels_take_float(exec, r.prob.tf32 ? Precision::tf32 : Precision::exact))
          return false;
        const auto rows = BackwardTiles<T, Acc>::row_pass(r);  // its sweep serves both products
        return with_tile_product<float>(r.prob.tf32, [&](auto product) {
          return cuda::LseBackwardMma::run_fused<decltype(product)>(exec.cuda_stream(), exec.cuda_device(), rows,
                                                                    r.grad_cols);
        });
      }
    }
    (void)exec, (void)r;
    return false;
  }
};

template <>
struct LseStepSpecialization<Kokkos::Cuda> {
  template <class T>
  static std::size_t scratch_bytes(const Kokkos::Cuda& exec, const BackwardShape& shape) {
#if defined(TLSE_HAVE_HOPPER)
    if (cuda::kernel_path(exec.cuda_device()) == cuda::KernelPath::hopper)
      return cuda::LseStepHopper::scratch_bytes<T>(exec.cuda_device(), shape);
#else
    (void)exec, (void)shape;
#endif
    return 0;
  }
  template <class T, class Acc>
  static bool run(const Kokkos::Cuda& exec, const StepRequest<T, Acc>& r) {
#if defined(TLSE_HAVE_HOPPER)
    if constexpr (cuda::LseStepHopper::takes<T> && std::is_same<Acc, float>::value)
      return cuda::kernel_path(exec.cuda_device()) == cuda::KernelPath::hopper &&
             cuda::LseStepHopper::run<T>(exec.cuda_stream(), exec.cuda_device(), r);
#else
    (void)exec, (void)r;
#endif
    return false;
  }
};

template <>
struct DistillationSpecialization<Kokkos::Cuda> {
  template <class T>
  static std::size_t scratch_bytes(const Kokkos::Cuda& exec, const DistillationShape& shape) {
#if defined(TLSE_HAVE_HOPPER)
    if (cuda::kernel_path(exec.cuda_device()) == cuda::KernelPath::hopper)
      return cuda::DistillationHopper::scratch_bytes<T>(shape);
#else
    (void)exec, (void)shape;
#endif
    return 0;
  }
  template <class Request>
  static bool statistics(const Kokkos::Cuda& exec, const Request& r) {
#if defined(TLSE_HAVE_HOPPER)
    return cuda::kernel_path(exec.cuda_device()) == cuda::KernelPath::hopper &&
           cuda::DistillationHopper::statistics(exec.cuda_stream(), r);
#else
    (void)exec, (void)r;
    return false;
#endif
  }
  template <class Request>
  static bool terms(const Kokkos::Cuda& exec, const Request& r) {
#if defined(TLSE_HAVE_HOPPER)
    return cuda::kernel_path(exec.cuda_device()) == cuda::KernelPath::hopper &&
           cuda::DistillationHopper::terms(exec.cuda_stream(), r);
#else
    (void)exec, (void)r;
    return false;
#endif
  }
  template <class Request>
  static bool backward(const Kokkos::Cuda& exec, const Request& r) {
#if defined(TLSE_HAVE_HOPPER)
    return cuda::kernel_path(exec.cuda_device()) == cuda::KernelPath::hopper &&
           cuda::DistillationHopper::backward(exec.cuda_stream(), r);
#else
    (void)exec, (void)r;
    return false;
#endif
  }
  template <class T>
  static index_t step_kept_columns(const Kokkos::Cuda& exec, const DistillationStepShape& shape) {
#if defined(TLSE_HAVE_HOPPER)
    if (cuda::kernel_path(exec.cuda_device()) == cuda::KernelPath::hopper)
      return cuda::DistillationHopper::step_kept_columns<T>(shape);
#else
    (void)exec, (void)shape;
#endif
    return 0;
  }
  template <class Request>
  static bool step(const Kokkos::Cuda& exec, const Request& r) {
#if defined(TLSE_HAVE_HOPPER)
    return cuda::kernel_path(exec.cuda_device()) == cuda::KernelPath::hopper &&
           cuda::DistillationHopper::step(exec.cuda_stream(), r);
#else
    (void)exec, (void)r;
    return false;
#endif
  }
};

template <>
struct LseBackwardSpecialization<Kokkos::Cuda> {
  template <class T>
  static std::size_t scratch_bytes(const Kokkos::Cuda& exec, index_t owned, index_t other, index_t depth,
                                   Precision precision) {
    if constexpr (backward_on_tile_kernels<T>) {
      if (sizeof(T) == 4 && precision != Precision::tf32 && cuda::exact_f32_kernels() == cuda::ExactF32::generic)
        return 0;
      if (cuda::kernel_path(exec.cuda_device()) == cuda::KernelPath::generic) return 0;
      return cuda::LseBackwardMma::scratch_bytes(exec.cuda_device(), owned, other, depth, sizeof(T));
    } else {
      return 0;
    }
  }
  template <class F>
  static bool run(const Kokkos::Cuda& exec, const F& f) {
    if (takes_spread(f.row_terms) || takes_spread(f.col_terms)) return false;
    using T = typename std::remove_const<typename std::remove_pointer<decltype(f.prob.rows.data)>::type>::type;
    if constexpr (backward_on_tile_kernels<T>) {
      if (cuda::kernel_path(exec.cuda_device()) == cuda::KernelPath::generic) return false;
      return with_tile_product<T>(f.prob.tf32, [&](auto product) {
        return cuda::LseBackwardMma::run<T, decltype(product)>(exec.cuda_stream(), exec.cuda_device(), f, f.scratch,
                                                               f.scratch_bytes);
      });
    } else {
      return false;
    }
  }
};

}  // namespace tlse::impl
