#pragma once
/// \file materialized_baseline.hpp
/// The baseline TiledLSE is measured against: the textbook implementation that materializes
/// the whole logit matrix with KokkosBlas::gemm, takes its LSEs with plain Kokkos kernels and
/// back-propagates with two more gemms (dA = G B, dB = G^T A, G = dL/dx).
///
/// It is deliberately lean, so that the comparison flatters the baseline rather than TiledLSE:
/// one rows x cols buffer, which the backward overwrites in place with G (a framework would
/// keep logits and probabilities apart). Its cost is that backward() consumes the logits of the
/// forward() just before it. All buffers are allocated once, by the constructor, zero-filled
/// there (so that no timed call pays for touching fresh pages) and counted by extra_bytes().
/// The interface matches tiled_runner.hpp: forward(), backward(dA, dB) for dloss = 1, loss(),
/// extra_bytes().
///
/// gemm runs in accumulator_t<T>: double for double inputs, float otherwise. KokkosBlas has no
/// gemm on tlse::bfloat16 / tlse::float16, so 16-bit inputs are widened to float copies and
/// the float gradients narrowed back, as a mixed-precision framework would.
#include <tlse/impl/kokkos_compat.hpp>
#include <tlse/scalar_types.hpp>

#include <KokkosBlas3_gemm.hpp>
#include <Kokkos_Core.hpp>

#include <cstddef>
#include <string>
#include <type_traits>

namespace tlse::baseline {

namespace detail {

/// Every baseline view carries Exec in its device type, because KokkosBlas 3.4's gemm has no
/// execution-space argument: it runs on the default instance of the view's execution space.
template <class Exec>
using Device = Kokkos::Device<Exec, typename Exec::memory_space>;
template <class Exec, class T>
using Matrix = Kokkos::View<T**, Kokkos::LayoutRight, Device<Exec>>;
template <class Exec, class T>
using Vector = Kokkos::View<T*, Device<Exec>>;

/// Counts the bytes of every view it hands out.
class Allocations {
 public:
  template <class View>
  View add(const View& v) {
    bytes_ += v.span() * sizeof(typename View::value_type);
    return v;
  }
  std::size_t bytes() const { return bytes_; }

 private:
  std::size_t bytes_ = 0;
};

template <class Exec, class T>
Matrix<Exec, T> matrix(Allocations& a, const char* label, std::size_t rows, std::size_t cols) {
  return a.add(Matrix<Exec, T>(std::string(label), rows, cols));
}
template <class Exec, class T>
Vector<Exec, T> vector(Allocations& a, const char* label, std::size_t n) {
  return a.add(Vector<Exec, T>(std::string(label), n));
}

/// C = alpha op(A) op(B) + beta C. The fences order gemm (on the default instance) after the work
/// queued on `exec` and before the work queued after it, should `exec` be another instance.
template <class Exec, class AV, class BV, class CV>
void gemm(const Exec& exec, const char* transA, const char* transB, typename CV::value_type alpha, const AV& A,
          const BV& B, const CV& C, typename CV::value_type beta = 0) {
  exec.fence();
  KokkosBlas::gemm(transA, transB, alpha, A, B, beta, C);
  Exec().fence();
}

/// A gemm operand in the accumulator type: the input itself, or (16-bit inputs) a float copy
/// that widen() refreshes.
template <class Exec, class T>
class Operand {
 public:
  using Acc = accumulator_t<T>;
  static constexpr bool copied = !std::is_same<T, Acc>::value;
  using Input = Kokkos::View<const T**, Kokkos::LayoutRight, Device<Exec>>;

  Operand(Allocations& a, const char* label, const Input& in)
      : in_(in), acc_(copied ? matrix<Exec, Acc>(a, label, in.extent(0), in.extent(1)) : Matrix<Exec, Acc>()) {}

  void widen(const Exec& exec) const {
    if constexpr (copied) {
      const auto in = in_;
      const auto out = acc_;
      Kokkos::parallel_for(
          "tlse::baseline::widen",
          Kokkos::MDRangePolicy<Exec, Kokkos::Rank<2>>(exec, {0, 0}, {in.extent(0), in.extent(1)}),
          KOKKOS_LAMBDA(std::size_t i, std::size_t k) { out(i, k) = impl::to_acc<Acc>(in(i, k)); });
    }
  }
  Kokkos::View<const Acc**, Kokkos::LayoutRight, Device<Exec>> view() const {
    if constexpr (copied)
      return acc_;
    else
      return in_;
  }

 private:
  Input in_;
  Matrix<Exec, Acc> acc_;
};

/// A gradient output: gemm writes straight into it, or (16-bit outputs) into a float buffer
/// that narrow() rounds into it.
template <class Exec, class T>
class GradientBuffer {
 public:
  using Acc = accumulator_t<T>;
  static constexpr bool copied = !std::is_same<T, Acc>::value;

  GradientBuffer(Allocations& a, const char* label, std::size_t rows, std::size_t cols)
      : acc_(copied ? matrix<Exec, Acc>(a, label, rows, cols) : Matrix<Exec, Acc>()) {}

  Matrix<Exec, Acc> target(const Matrix<Exec, T>& out) const {
    if constexpr (copied)
      return acc_;
    else
      return out;
  }
  void narrow(const Exec& exec, const Matrix<Exec, T>& out) const {
    if constexpr (copied) {
      const auto in = acc_;
      Kokkos::parallel_for(
          "tlse::baseline::narrow",
          Kokkos::MDRangePolicy<Exec, Kokkos::Rank<2>>(exec, {0, 0}, {in.extent(0), in.extent(1)}),
          KOKKOS_LAMBDA(std::size_t i, std::size_t k) { out(i, k) = impl::from_acc<T>(in(i, k)); });
    }
  }

 private:
  Matrix<Exec, Acc> acc_;
};

/// out(i) = log sum_j exp(X(i, j)), one team per row (rows are contiguous).
template <class Exec, class Acc>
void row_lse(const Exec& exec, const Matrix<Exec, Acc>& X, const Vector<Exec, Acc>& out) {
  using Member = typename Kokkos::TeamPolicy<Exec>::member_type;
  const int cols = int(X.extent(1));
  Kokkos::parallel_for(
      "tlse::baseline::row_lse", Kokkos::TeamPolicy<Exec>(exec, int(X.extent(0)), Kokkos::AUTO),
      KOKKOS_LAMBDA(const Member& m) {
        const int i = m.league_rank();
        Acc max = 0, sum = 0;
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(m, cols), [&](int j, Acc& v) { v = X(i, j) > v ? X(i, j) : v; },
            Kokkos::Max<Acc>(max));
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(m, cols), [&](int j, Acc& v) { v += impl::exp(X(i, j) - max); }, sum);
        Kokkos::single(Kokkos::PerTeam(m), [&]() { out(i) = max + impl::log(sum); });
      });
}

/// out(j) = log sum_i exp(X(i, j)), one thread per strip of 16 columns: the thread walks down
/// its strip a row at a time, reading a whole 64-byte line per row (one thread per column
/// would use one float of each line it pulls in on a CPU).
template <class Exec, class Acc>
void col_lse(const Exec& exec, const Matrix<Exec, Acc>& X, const Vector<Exec, Acc>& out) {
  constexpr std::size_t W = 16;
  const std::size_t rows = X.extent(0), cols = X.extent(1);
  Kokkos::parallel_for(
      "tlse::baseline::col_lse", Kokkos::RangePolicy<Exec>(exec, 0, (cols + W - 1) / W), KOKKOS_LAMBDA(std::size_t s) {
        const std::size_t j0 = s * W, w = cols - j0 < W ? cols - j0 : W;
        Acc max[W], sum[W];
        for (std::size_t k = 0; k < w; ++k) max[k] = -impl::infinity<Acc>(), sum[k] = 0;
        for (std::size_t i = 0; i < rows; ++i)
          for (std::size_t k = 0; k < w; ++k) max[k] = X(i, j0 + k) > max[k] ? X(i, j0 + k) : max[k];
        for (std::size_t i = 0; i < rows; ++i)
          for (std::size_t k = 0; k < w; ++k) sum[k] += impl::exp(X(i, j0 + k) - max[k]);
        for (std::size_t k = 0; k < w; ++k) out(j0 + k) = max[k] + impl::log(sum[k]);
      });
}

}  // namespace detail

/// Symmetric CLIP loss with diagonal positives, mean over the batch:
/// L = (1/b) sum_i [ (row_lse_i - x_ii) + (col_lse_i - x_ii) ] / 2, x = scale I T^T;
/// or with `self_similarity` NT-Xent over Z = I (T unused, may be empty): x = scale Z Z^T with the
/// diagonal at -inf, L = (1/b) sum_i (row_lse_i - x_{i,p(i)}), p(i) = (i + b/2) mod b.
template <class Exec, class T>
class MaterializedContrastive {
 public:
  using Acc = accumulator_t<T>;
  using Mem = typename Exec::memory_space;
  using Input = Kokkos::View<const T**, Kokkos::LayoutRight, Mem>;
  using Gradient = Kokkos::View<T**, Kokkos::LayoutRight, Mem>;

  MaterializedContrastive(const Exec& exec, const Input& I, const Input& Tx, double scale, bool self_similarity = false)
      : exec_(exec),
        scale_(Acc(scale)),
        self_(self_similarity),
        I_(alloc_, "tlse::baseline::I", I),
        T_(alloc_, "tlse::baseline::T", self_similarity ? Input() : Tx),
        x_(detail::matrix<Exec, Acc>(alloc_, "tlse::baseline::logits", I.extent(0),
                                     self_similarity ? I.extent(0) : Tx.extent(0))),
        row_lse_(detail::vector<Exec, Acc>(alloc_, "tlse::baseline::row_lse", I.extent(0))),
        col_lse_(detail::vector<Exec, Acc>(alloc_, "tlse::baseline::col_lse", self_similarity ? 0 : Tx.extent(0))),
        dI_(alloc_, "tlse::baseline::dI", I.extent(0), I.extent(1)),
        dT_(alloc_, "tlse::baseline::dT", self_similarity ? 0 : Tx.extent(0), I.extent(1)) {}

  /// Materializes x, the LSE vectors and the loss.
  void forward() {
    I_.widen(exec_);
    T_.widen(exec_);
    detail::gemm(exec_, "N", "T", scale_, I_.view(), self_ ? I_.view() : T_.view(), x_);
    const auto x = x_;
    const auto row = row_lse_, col = col_lse_;
    if (self_) {
      Kokkos::parallel_for(
          "tlse::baseline::exclude_diagonal", Kokkos::RangePolicy<Exec>(exec_, 0, x.extent(0)),
          KOKKOS_LAMBDA(std::size_t i) { x(i, i) = -impl::infinity<Acc>(); });
      detail::row_lse(exec_, x_, row_lse_);
      const std::size_t b = x.extent(0);
      const Acc w = Acc(1) / Acc(b);
      Kokkos::parallel_reduce(
          "tlse::baseline::self_contrastive_loss", Kokkos::RangePolicy<Exec>(exec_, 0, b),
          KOKKOS_LAMBDA(std::size_t i, Acc & s) { s += w * (row(i) - x(i, self_positive(i, b))); }, loss_);
      return;
    }
    detail::row_lse(exec_, x_, row_lse_);
    detail::col_lse(exec_, x_, col_lse_);
    const Acc w = Acc(1) / Acc(2 * x.extent(0));
    Kokkos::parallel_reduce(
        "tlse::baseline::contrastive_loss", Kokkos::RangePolicy<Exec>(exec_, 0, x.extent(0)),
        KOKKOS_LAMBDA(std::size_t i, Acc& s) { s += w * (row(i) + col(i) - 2 * x(i, i)); }, loss_);
  }

  /// dI = scale G T and dT = scale G^T I for dloss = 1, with
  /// G_ij = (softmax_row_ij + softmax_col_ij - 2 [i == j]) / (2b); self-similarity: dI = dZ =
  /// scale (G + G^T) Z with G_ij = (softmax_row_ij - [j == p(i)]) / b, dT untouched. Overwrites
  /// the logits with G.
  void backward(const Gradient& dI, const Gradient& dT) {
    const auto x = x_;
    const auto row = row_lse_, col = col_lse_;
    const std::size_t b = x.extent(0);
    const auto all = Kokkos::MDRangePolicy<Exec, Kokkos::Rank<2>>(exec_, {0, 0}, {b, x.extent(1)});
    if (self_) {
      const Acc w = Acc(1) / Acc(b);
      Kokkos::parallel_for(
          "tlse::baseline::self_contrastive_dlogits", all, KOKKOS_LAMBDA(std::size_t i, std::size_t j) {
            x(i, j) = w * (impl::exp(x(i, j) - row(i)) - (j == self_positive(i, b) ? Acc(1) : Acc(0)));
          });
      detail::gemm(exec_, "N", "N", scale_, x_, I_.view(), dI_.target(dI));
      detail::gemm(exec_, "T", "N", scale_, x_, I_.view(), dI_.target(dI), Acc(1));
      dI_.narrow(exec_, dI);
      return;
    }
    const Acc w = Acc(1) / Acc(2 * b);
    Kokkos::parallel_for(
        "tlse::baseline::contrastive_dlogits", all, KOKKOS_LAMBDA(std::size_t i, std::size_t j) {
          const Acc xij = x(i, j);
          x(i, j) = w * (impl::exp(xij - row(i)) + impl::exp(xij - col(j)) - (i == j ? Acc(2) : Acc(0)));
        });
    detail::gemm(exec_, "N", "N", scale_, x_, T_.view(), dI_.target(dI));
    detail::gemm(exec_, "T", "N", scale_, x_, I_.view(), dT_.target(dT));
    dI_.narrow(exec_, dI);
    dT_.narrow(exec_, dT);
  }

  double loss() const { return Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), loss_)(); }
  /// Row i's positive in the self-similarity form of b rows: the other view of its sample.
  KOKKOS_INLINE_FUNCTION static std::size_t self_positive(std::size_t i, std::size_t b) { return (i + b / 2) % b; }
  /// Bytes allocated beyond the inputs and gradients: logits, LSEs, float copies.
  std::size_t extra_bytes() const { return alloc_.bytes(); }
  /// The part of extra_bytes() that is the b x b logit matrix.
  std::size_t logit_bytes() const { return x_.span() * sizeof(Acc); }

 private:
  Exec exec_;
  Acc scale_;
  bool self_;
  detail::Allocations alloc_;  // declared before the buffers it counts
  detail::Operand<Exec, T> I_, T_;
  detail::Matrix<Exec, Acc> x_;
  detail::Vector<Exec, Acc> row_lse_, col_lse_;
  Kokkos::View<Acc, detail::Device<Exec>> loss_{"loss"};
  detail::GradientBuffer<Exec, T> dI_, dT_;
};

namespace detail {
/// 1 / the rows with a target (>= 0), the weight of each in the mean; 0 for none (the mean over no
/// rows is 0).
template <class Acc, class Exec, class Targets>
Acc mean_row_weight(const Exec& exec, const Targets& targets) {
  std::int64_t scored = 0;
  Kokkos::parallel_reduce(
      "tlse::baseline::scored_rows", Kokkos::RangePolicy<Exec>(exec, 0, targets.extent(0)),
      KOKKOS_LAMBDA(std::size_t i, std::int64_t & n) { n += targets(i) >= 0 ? 1 : 0; }, scored);
  return scored > 0 ? Acc(1) / Acc(scored) : Acc(0);
}
}  // namespace detail

/// Cross-entropy, mean over the scored rows (a negative target: ignored, adds 0): L = (1/n) sum_i
/// (lse_i - x_{i,target_i}), x = E C^T + b (b: a fixed per-class bias, or none), or with a softcap
/// s > 0 (Gemma 2) x = s tanh((E C^T + b) / s).
template <class Exec, class T>
class MaterializedCrossEntropy {
 public:
  using Acc = accumulator_t<T>;
  using Mem = typename Exec::memory_space;
  using Input = Kokkos::View<const T**, Kokkos::LayoutRight, Mem>;
  using Targets = Kokkos::View<const int*, Mem>;
  using Gradient = Kokkos::View<T**, Kokkos::LayoutRight, Mem>;
  using Bias = Kokkos::View<const T*, Mem>;  ///< (V) or empty; fixed: no dbias is computed

  MaterializedCrossEntropy(const Exec& exec, const Input& E, const Input& C, const Targets& targets, double softcap = 0,
                           const Bias& bias = {})
      : exec_(exec),
        targets_(targets),
        bias_(bias),
        softcap_(Acc(softcap)),
        E_(alloc_, "tlse::baseline::E", E),
        C_(alloc_, "tlse::baseline::C", C),
        x_(detail::matrix<Exec, Acc>(alloc_, "tlse::baseline::logits", E.extent(0), C.extent(0))),
        lse_(detail::vector<Exec, Acc>(alloc_, "tlse::baseline::lse", E.extent(0))),
        dE_(alloc_, "tlse::baseline::dE", E.extent(0), E.extent(1)),
        dC_(alloc_, "tlse::baseline::dC", C.extent(0), C.extent(1)),
        row_weight_(detail::mean_row_weight<Acc>(exec, targets)) {}

  /// Materializes x, the row LSEs and the loss.
  void forward() {
    E_.widen(exec_);
    C_.widen(exec_);
    detail::gemm(exec_, "N", "T", Acc(1), E_.view(), C_.view(), x_);
    if (softcap_ > 0 || bias_.extent(0) > 0) {
      const auto x = x_;
      const auto b = bias_;
      const Acc s = softcap_;
      Kokkos::parallel_for(
          "tlse::baseline::bias_softcap",
          Kokkos::MDRangePolicy<Exec, Kokkos::Rank<2>>(exec_, {0, 0}, {x.extent(0), x.extent(1)}),
          KOKKOS_LAMBDA(std::size_t i, std::size_t j) {
            const Acc z = b.extent(0) > 0 ? x(i, j) + Acc(b(j)) : x(i, j);
            x(i, j) = s > 0 ? s * impl::tanh(z / s) : z;
          });
    }
    detail::row_lse(exec_, x_, lse_);
    const auto x = x_;
    const auto lse = lse_;
    const auto t = targets_;
    const Acc w = row_weight_;
    Kokkos::parallel_reduce(
        "tlse::baseline::cross_entropy_loss", Kokkos::RangePolicy<Exec>(exec_, 0, x.extent(0)),
        KOKKOS_LAMBDA(std::size_t i, Acc & s) { s += t(i) < 0 ? Acc(0) : w * (lse(i) - x(i, t(i))); }, loss_);
  }

  /// dE = G C and dC = G^T E for dloss = 1, with G_ij = (softmax_ij - [j == target_i]) / n (0 in an
  /// ignored row), times dx/d(E C^T) = 1 - (x / s)^2 under a softcap. Overwrites the logits with G.
  void backward(const Gradient& dE, const Gradient& dC) {
    const auto x = x_;
    const auto lse = lse_;
    const auto t = targets_;
    const Acc w = row_weight_, s = softcap_;
    Kokkos::parallel_for(
        "tlse::baseline::cross_entropy_dlogits",
        Kokkos::MDRangePolicy<Exec, Kokkos::Rank<2>>(exec_, {0, 0}, {x.extent(0), x.extent(1)}),
        KOKKOS_LAMBDA(std::size_t i, std::size_t j) {
          const Acc dz = t(i) < 0 ? Acc(0) : w * (impl::exp(x(i, j) - lse(i)) - (int(j) == t(i) ? Acc(1) : Acc(0)));
          x(i, j) = s > 0 ? dz * (Acc(1) - (x(i, j) / s) * (x(i, j) / s)) : dz;
        });
    detail::gemm(exec_, "N", "N", Acc(1), x_, C_.view(), dE_.target(dE));
    detail::gemm(exec_, "T", "N", Acc(1), x_, E_.view(), dC_.target(dC));
    dE_.narrow(exec_, dE);
    dC_.narrow(exec_, dC);
  }

  double loss() const { return Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), loss_)(); }
  /// Bytes allocated beyond the inputs and gradients: logits, LSEs, float copies.
  std::size_t extra_bytes() const { return alloc_.bytes(); }
  /// The part of extra_bytes() that is the N x V logit matrix.
  std::size_t logit_bytes() const { return x_.span() * sizeof(Acc); }

 private:
  Exec exec_;
  Targets targets_;
  Bias bias_;
  Acc softcap_;                // 0: off
  detail::Allocations alloc_;  // declared before the buffers it counts
  detail::Operand<Exec, T> E_, C_;
  detail::Matrix<Exec, Acc> x_;
  detail::Vector<Exec, Acc> lse_;
  Kokkos::View<Acc, detail::Device<Exec>> loss_{"loss"};
  detail::GradientBuffer<Exec, T> dE_, dC_;
  Acc row_weight_;  // 1 / the scored rows
};

}  // namespace tlse::baseline
