#pragma once
// The C API's calls as templates over the storage type T: unmanaged views over the caller's
// pointers (no copies), then the C++ API. Included by the per-dtype translation units only.
#include "arguments.hpp"

#include <tlse/distributed/contrastive_loss.hpp>
#include <tlse/distributed/cross_entropy.hpp>

namespace tlse::capi {

template <class Exec>
using Mem = typename Exec::memory_space;
using Unmanaged = Kokkos::MemoryTraits<Kokkos::Unmanaged>;
template <class U, class Exec>
using Matrix = Kokkos::View<U**, Kokkos::LayoutRight, Mem<Exec>, Unmanaged>;
template <class U, class Exec>
using Vector = Kokkos::View<U*, Mem<Exec>, Unmanaged>;

/// A view of `count` elements at `p`; NULL with a non-zero count is an optional argument that
/// was not given, and becomes an empty view (the C++ API's "not requested").
template <class U, class Exec, class P>
Vector<U, Exec> vec(const Exec&, P* p, std::int64_t count) {
  return Vector<U, Exec>(static_cast<U*>(const_cast<void*>(static_cast<const void*>(p))), p ? count : 0);
}
template <class U, class Exec, class P>
Matrix<U, Exec> mat(const Exec&, P* p, std::int64_t rows, std::int64_t cols) {
  const bool given = p || rows * cols == 0;  // an empty batch keeps its shape: (0, d) must still match d
  return Matrix<U, Exec>(static_cast<U*>(const_cast<void*>(static_cast<const void*>(p))), given ? rows : 0,
                         given ? cols : 0);
}

/// The call's tlse_cross_entropy_extras as the C++ API's.
template <class Acc, class Exec>
CrossEntropyExtras<Acc, typename Exec::memory_space> extras(const Exec& exec, const CrossEntropyArgs& a) {
  CrossEntropyExtras<Acc, typename Exec::memory_space> x;
  x.class_weight = vec<const Acc>(exec, a.class_weight, a.v);
  x.dlse = vec<const Acc>(exec, a.dlse, a.n);
  x.predicted = vec<std::int64_t>(exec, a.predicted, a.n);
  x.accuracy = vec<Acc>(exec, a.accuracy, 1);
  return x;
}

template <class T>
std::size_t cross_entropy_workspace(const Launch& l, const CrossEntropyArgs& a) {
  std::size_t bytes = 0;
  on_exec(l, [&](const auto& exec) {
    using Exec = std::decay_t<decltype(exec)>;
    bytes = tlse::cross_entropy_workspace_bytes(exec, Matrix<const T, Exec>(nullptr, a.n, a.d),
                                                Matrix<const T, Exec>(nullptr, a.v, a.d), a.options);
  });
  return bytes;
}

template <class T>
bool cross_entropy_step_fuses(const Launch& l, const CrossEntropyArgs& a, bool want_dbias) {
  bool fuses = false;
  on_exec(l, [&](const auto& exec) {
    using Exec = std::decay_t<decltype(exec)>;
    fuses = tlse::cross_entropy_step_fuses(exec, Matrix<const T, Exec>(nullptr, a.n, a.d),
                                           Matrix<const T, Exec>(nullptr, a.v, a.d), a.options, want_dbias);
  });
  return fuses;
}

template <class T>
void cross_entropy_forward(const Launch& l, const CrossEntropyArgs& a) {
  using Acc = accumulator_t<T>;
  on_exec(l, [&](const auto& exec) {
    tlse::cross_entropy(exec, mat<const T>(exec, a.E, a.n, a.d), mat<const T>(exec, a.C, a.v, a.d),
                        vec<const T>(exec, a.bias, a.v), vec<const std::int64_t>(exec, a.targets, a.n),
                        vec<Acc>(exec, a.loss, a.loss_size()), vec<Acc>(exec, a.lse_out, a.n),
                        vec<int>(exec, a.order_out, a.v), extras<Acc>(exec, a), a.options);
  });
}

template <class T>
void cross_entropy_backward(const Launch& l, const CrossEntropyArgs& a) {
  using Acc = accumulator_t<T>;
  on_exec(l, [&](const auto& exec) {
    tlse::cross_entropy_backward(
        exec, mat<const T>(exec, a.E, a.n, a.d), mat<const T>(exec, a.C, a.v, a.d), vec<const T>(exec, a.bias, a.v),
        vec<const std::int64_t>(exec, a.targets, a.n), vec<const Acc>(exec, a.lse, a.n),
        vec<const int>(exec, a.order, a.v), vec<const Acc>(exec, a.dloss, a.loss_size()), mat<T>(exec, a.dE, a.n, a.d),
        mat<T>(exec, a.dC, a.v, a.d), vec<T>(exec, a.dbias, a.v), extras<Acc>(exec, a), a.options);
  });
}

template <class T>
void cross_entropy_with_gradients(const Launch& l, const CrossEntropyArgs& a) {
  using Acc = accumulator_t<T>;
  on_exec(l, [&](const auto& exec) {
    tlse::cross_entropy_with_gradients(
        exec, mat<const T>(exec, a.E, a.n, a.d), mat<const T>(exec, a.C, a.v, a.d), vec<const T>(exec, a.bias, a.v),
        vec<const std::int64_t>(exec, a.targets, a.n), vec<const Acc>(exec, a.dloss, a.loss_size()),
        vec<Acc>(exec, a.loss, a.loss_size()), mat<T>(exec, a.dE, a.n, a.d), mat<T>(exec, a.dC, a.v, a.d),
        vec<T>(exec, a.dbias, a.v), extras<Acc>(exec, a), a.options);
  });
}

template <class T>
std::size_t contrastive_workspace(const Launch& l, const ContrastiveArgs& a) {
  std::size_t bytes = 0;
  on_exec(l, [&](const auto& exec) {
    using Exec = std::decay_t<decltype(exec)>;
    const Matrix<const T, Exec> features(nullptr, a.b, a.c);
    bytes = tlse::contrastive_loss_workspace_bytes(exec, features, features, a.options);
  });
  return bytes;
}

template <class T>
void contrastive_forward(const Launch& l, const ContrastiveArgs& a) {
  using Acc = accumulator_t<T>;
  on_exec(l, [&](const auto& exec) {
    tlse::contrastive_loss(exec, mat<const T>(exec, a.I, a.b, a.c), mat<const T>(exec, a.T, a.b, a.c),
                           vec<const std::int64_t>(exec, a.labels, a.b), vec<Acc>(exec, a.loss, 1),
                           vec<Acc>(exec, a.row_lse_out, a.b), vec<Acc>(exec, a.col_lse_out, a.b), a.options);
  });
}

template <class T>
void contrastive_backward(const Launch& l, const ContrastiveArgs& a) {
  using Acc = accumulator_t<T>;
  on_exec(l, [&](const auto& exec) {
    ContrastiveExtras<Acc, typename std::decay_t<decltype(exec)>::memory_space> x;
    x.d_row_lse = vec<const Acc>(exec, a.d_row_lse, a.b);
    x.d_col_lse = vec<const Acc>(exec, a.d_col_lse, a.b);
    tlse::contrastive_loss_backward(
        exec, mat<const T>(exec, a.I, a.b, a.c), mat<const T>(exec, a.T, a.b, a.c),
        vec<const std::int64_t>(exec, a.labels, a.b), vec<const Acc>(exec, a.row_lse, a.b),
        vec<const Acc>(exec, a.col_lse, a.b), vec<const Acc>(exec, a.dloss, 1), mat<T>(exec, a.dI, a.b, a.c),
        mat<T>(exec, a.dT, a.b, a.c), vec<Acc>(exec, a.dscale, 1), x, a.options);
  });
}

template <class T>
std::size_t self_contrastive_workspace(const Launch& l, const SelfContrastiveArgs& a) {
  std::size_t bytes = 0;
  on_exec(l, [&](const auto& exec) {
    using Exec = std::decay_t<decltype(exec)>;
    bytes = tlse::self_contrastive_loss_workspace_bytes(exec, Matrix<const T, Exec>(nullptr, a.n, a.c), a.options);
  });
  return bytes;
}

template <class T>
void self_contrastive_forward(const Launch& l, const SelfContrastiveArgs& a) {
  using Acc = accumulator_t<T>;
  on_exec(l, [&](const auto& exec) {
    tlse::self_contrastive_loss(exec, mat<const T>(exec, a.Z, a.n, a.c), vec<Acc>(exec, a.loss, 1),
                                vec<Acc>(exec, a.lse_out, a.n), a.options);
  });
}

template <class T>
void self_contrastive_backward(const Launch& l, const SelfContrastiveArgs& a) {
  using Acc = accumulator_t<T>;
  on_exec(l, [&](const auto& exec) {
    tlse::self_contrastive_loss_backward(exec, mat<const T>(exec, a.Z, a.n, a.c), vec<const Acc>(exec, a.lse, a.n),
                                         vec<const Acc>(exec, a.dloss, 1), mat<T>(exec, a.dZ, a.n, a.c),
                                         vec<Acc>(exec, a.dscale, 1), a.options);
  });
}

template <class T>
std::size_t distillation_workspace(const Launch& l, const DistillationArgs& a) {
  std::size_t bytes = 0;
  on_exec(l, [&](const auto& exec) {
    using Exec = std::decay_t<decltype(exec)>;
    bytes = tlse::distillation_loss_workspace_bytes(
        exec, Matrix<const T, Exec>(nullptr, a.n, a.d_s), Matrix<const T, Exec>(nullptr, a.v, a.d_s),
        Matrix<const T, Exec>(nullptr, a.n, a.d_t), Matrix<const T, Exec>(nullptr, a.v, a.d_t), a.options);
  });
  return bytes;
}

template <class T>
void distillation_forward(const Launch& l, const DistillationArgs& a) {
  using Acc = accumulator_t<T>;
  on_exec(l, [&](const auto& exec) {
    tlse::distillation_loss(exec, mat<const T>(exec, a.Hs, a.n, a.d_s), mat<const T>(exec, a.Ws, a.v, a.d_s),
                            mat<const T>(exec, a.Ht, a.n, a.d_t), mat<const T>(exec, a.Wt, a.v, a.d_t),
                            vec<const std::int64_t>(exec, a.targets, a.n), vec<Acc>(exec, a.loss, a.loss_size()),
                            mat<Acc>(exec, a.row_stats_out, a.n, distillation_row_stats), a.options);
  });
}

template <class T>
void distillation_backward(const Launch& l, const DistillationArgs& a) {
  using Acc = accumulator_t<T>;
  on_exec(l, [&](const auto& exec) {
    tlse::distillation_loss_backward(
        exec, mat<const T>(exec, a.Hs, a.n, a.d_s), mat<const T>(exec, a.Ws, a.v, a.d_s),
        mat<const T>(exec, a.Ht, a.n, a.d_t), mat<const T>(exec, a.Wt, a.v, a.d_t),
        vec<const std::int64_t>(exec, a.targets, a.n), mat<const Acc>(exec, a.row_stats, a.n, distillation_row_stats),
        vec<const Acc>(exec, a.dloss, a.loss_size()), mat<T>(exec, a.dHs, a.n, a.d_s), mat<T>(exec, a.dWs, a.v, a.d_s),
        mat<T>(exec, a.dHt, a.n, a.d_t), mat<T>(exec, a.dWt, a.v, a.d_t), a.options);
  });
}

template <class T>
bool distillation_step_fuses(const Launch& l, const DistillationArgs& a, bool want_teacher_gradients) {
  bool fuses = false;
  on_exec(l, [&](const auto& exec) {
    using Exec = std::decay_t<decltype(exec)>;
    fuses = tlse::distillation_step_fuses(
        exec, Matrix<const T, Exec>(nullptr, a.n, a.d_s), Matrix<const T, Exec>(nullptr, a.v, a.d_s),
        Matrix<const T, Exec>(nullptr, a.n, a.d_t), Matrix<const T, Exec>(nullptr, a.v, a.d_t), a.options,
        want_teacher_gradients);
  });
  return fuses;
}

template <class T>
void distillation_with_gradients(const Launch& l, const DistillationArgs& a) {
  using Acc = accumulator_t<T>;
  on_exec(l, [&](const auto& exec) {
    tlse::distillation_loss_with_gradients(
        exec, mat<const T>(exec, a.Hs, a.n, a.d_s), mat<const T>(exec, a.Ws, a.v, a.d_s),
        mat<const T>(exec, a.Ht, a.n, a.d_t), mat<const T>(exec, a.Wt, a.v, a.d_t),
        vec<const std::int64_t>(exec, a.targets, a.n), vec<const Acc>(exec, a.dloss, a.loss_size()),
        vec<Acc>(exec, a.loss, a.loss_size()), mat<T>(exec, a.dHs, a.n, a.d_s), mat<T>(exec, a.dWs, a.v, a.d_s),
        mat<T>(exec, a.dHt, a.n, a.d_t), mat<T>(exec, a.dWt, a.v, a.d_t), a.options);
  });
}

template <class T>
void cross_entropy_forward_distributed(const Launch& l, const Callbacks& cb, const CrossEntropyArgs& a) {
  using Acc = accumulator_t<T>;
  on_exec(l, [&](const auto& exec) {
    const distributed::CallbackCommunicator<std::decay_t<decltype(exec)>> comm(exec, cb);
    distributed::cross_entropy(comm, mat<const T>(exec, a.E, a.n, a.d), mat<const T>(exec, a.C, a.v, a.d),
                               vec<const T>(exec, a.bias, a.v), vec<const std::int64_t>(exec, a.targets, a.n),
                               vec<Acc>(exec, a.loss, a.loss_size()), vec<Acc>(exec, a.lse_out, a.n),
                               extras<Acc>(exec, a), a.options);
  });
}

template <class T>
void cross_entropy_backward_distributed(const Launch& l, const Callbacks& cb, const CrossEntropyArgs& a) {
  using Acc = accumulator_t<T>;
  on_exec(l, [&](const auto& exec) {
    const distributed::CallbackCommunicator<std::decay_t<decltype(exec)>> comm(exec, cb);
    distributed::cross_entropy_backward(
        comm, mat<const T>(exec, a.E, a.n, a.d), mat<const T>(exec, a.C, a.v, a.d), vec<const T>(exec, a.bias, a.v),
        vec<const std::int64_t>(exec, a.targets, a.n), vec<const Acc>(exec, a.lse, a.n),
        vec<const Acc>(exec, a.dloss, a.loss_size()), mat<T>(exec, a.dE, a.n, a.d), mat<T>(exec, a.dC, a.v, a.d),
        vec<T>(exec, a.dbias, a.v), extras<Acc>(exec, a), a.options);
  });
}

template <class T>
void contrastive_forward_distributed(const Launch& l, const Callbacks& cb, const ContrastiveArgs& a) {
  using Acc = accumulator_t<T>;
  on_exec(l, [&](const auto& exec) {
    const distributed::CallbackCommunicator<std::decay_t<decltype(exec)>> comm(exec, cb);
    distributed::contrastive_loss(comm, mat<const T>(exec, a.I, a.b, a.c), mat<const T>(exec, a.T, a.b, a.c),
                                  vec<const std::int64_t>(exec, a.labels, a.b), vec<Acc>(exec, a.loss, 1),
                                  vec<Acc>(exec, a.row_lse_out, a.b), vec<Acc>(exec, a.col_lse_out, a.b), a.options);
  });
}

template <class T>
void contrastive_backward_distributed(const Launch& l, const Callbacks& cb, const ContrastiveArgs& a) {
  using Acc = accumulator_t<T>;
  on_exec(l, [&](const auto& exec) {
    const distributed::CallbackCommunicator<std::decay_t<decltype(exec)>> comm(exec, cb);
    distributed::contrastive_loss_backward(
        comm, mat<const T>(exec, a.I, a.b, a.c), mat<const T>(exec, a.T, a.b, a.c),
        vec<const std::int64_t>(exec, a.labels, a.b), vec<const Acc>(exec, a.row_lse, a.b),
        vec<const Acc>(exec, a.col_lse, a.b), vec<const Acc>(exec, a.dloss, 1), mat<T>(exec, a.dI, a.b, a.c),
        mat<T>(exec, a.dT, a.b, a.c), vec<Acc>(exec, a.dscale, 1), a.options);
  });
}

}  // namespace tlse::capi

/// Explicit instantiations of one loss for one storage type (one translation unit each), inside
/// namespace tlse::capi.
#define TLSE_CAPI_CROSS_ENTROPY(T)                                                                          \
  template std::size_t cross_entropy_workspace<T>(const Launch&, const CrossEntropyArgs&);     \
  template bool cross_entropy_step_fuses<T>(const Launch&, const CrossEntropyArgs&, bool);              \
  template void cross_entropy_forward<T>(const Launch&, const CrossEntropyArgs&);              \
  template void cross_entropy_backward<T>(const Launch&, const CrossEntropyArgs&);                      \
  template void cross_entropy_with_gradients<T>(const Launch&, const CrossEntropyArgs&);                \
  template void cross_entropy_forward_distributed<T>(const Launch&, const Callbacks&, const CrossEntropyArgs&); \
  template void cross_entropy_backward_distributed<T>(const Launch&, const Callbacks&, const CrossEntropyArgs&)
#define TLSE_CAPI_CONTRASTIVE(T)                                                                             \
  template std::size_t contrastive_workspace<T>(const Launch&, const ContrastiveArgs&);                      \
  template void contrastive_forward<T>(const Launch&, const ContrastiveArgs&);                               \
  template void contrastive_backward<T>(const Launch&, const ContrastiveArgs&);                              \
  template std::size_t self_contrastive_workspace<T>(const Launch&, const SelfContrastiveArgs&);             \
  template void self_contrastive_forward<T>(const Launch&, const SelfContrastiveArgs&);                      \
  template void self_contrastive_backward<T>(const Launch&, const SelfContrastiveArgs&);                     \
  template void contrastive_forward_distributed<T>(const Launch&, const Callbacks&, const ContrastiveArgs&); \
  template void contrastive_backward_distributed<T>(const Launch&, const Callbacks&, const ContrastiveArgs&)
#define TLSE_CAPI_DISTILLATION(T)                                                         \
  template std::size_t distillation_workspace<T>(const Launch&, const DistillationArgs&); \
  template void distillation_forward<T>(const Launch&, const DistillationArgs&);          \
  template void distillation_backward<T>(const Launch&, const DistillationArgs&);         \
  template bool distillation_step_fuses<T>(const Launch&, const DistillationArgs&, bool); \
  template void distillation_with_gradients<T>(const Launch&, const DistillationArgs&)
