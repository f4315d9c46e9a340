#pragma once
// Carves the typed arrays of a call out of one caller-provided (or self-allocated) buffer.
// The same carving code runs once without a buffer to size it, so the size a caller is told
// and the layout a call uses cannot drift apart.
#include <tlse/options.hpp>

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <stdexcept>
#include <string>

namespace tlse::impl {

class WorkspaceCarver {
 public:
  explicit WorkspaceCarver(char* base = nullptr) : base_(base) {}
  template <class U>
  U* take(std::int64_t count) {
    used_ = (used_ + alignment - 1) / alignment * alignment;
    U* p = base_ ? reinterpret_cast<U*>(base_ + used_) : nullptr;
    used_ += std::size_t(count > 0 ? count : 0) * sizeof(U);
    return p;
  }
  std::size_t bytes() const { return used_ + alignment; }  // slack for aligning the base
  bool empty() const { return used_ == 0; }
  static constexpr std::size_t alignment = 64;  // of every array (and of the base: aligned_base)

 private:
  char* base_;
  std::size_t used_ = 0;
};

/// The first 64-byte boundary in a buffer, where its carver starts (bytes() reserves the slack).
inline char* aligned_base(char* buffer) {
  const std::size_t misalign = reinterpret_cast<std::uintptr_t>(buffer) % WorkspaceCarver::alignment;
  return buffer + (misalign ? WorkspaceCarver::alignment - misalign : 0);
}

/// Runs `body(carver)` on the caller's workspace, or on a buffer allocated for this call.
/// `Layout` is a callable that carves the call's arrays from a carver and returns them.
template <class Exec, class Layout, class Body>
void with_workspace(const char* function, const Exec& exec, const Workspace& ws, const Layout& layout,
                    const Body& body) {
  WorkspaceCarver sizing;
  layout(sizing);
  const std::size_t need = sizing.bytes();
  Kokkos::View<char*, typename Exec::memory_space> owned;
  char* base = static_cast<char*>(ws.data);
  if (base == nullptr && sizing.empty()) {
    body(layout(sizing));  // nothing to carve: every array is empty, no allocation
    return;
  }
  if (base == nullptr) {
    owned = Kokkos::View<char*, typename Exec::memory_space>(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(function) + "::workspace"), need);
    base = owned.data();
  } else if (ws.bytes < need) {
    throw std::invalid_argument(std::string(function) + ": argument 'workspace' holds " + std::to_string(ws.bytes) +
                                " bytes but this call needs " + std::to_string(need));
  }
  WorkspaceCarver carver(aligned_base(base));
  body(layout(carver));
  if (owned.data()) exec.fence();  // the buffer is freed on return: let the kernels finish with it
}

}  // namespace tlse::impl
