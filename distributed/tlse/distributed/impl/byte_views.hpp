#pragma once
// What the communicators send: the contiguous bytes of a view, passed straight to MPI or NCCL
// when the library can read that memory, otherwise staged through a host buffer.
#include <Kokkos_Core.hpp>

#include <cstddef>
#include <stdexcept>
#include <string>

namespace tlse::distributed::impl {

template <class V>
std::size_t contiguous_bytes(const char* function, const char* name, const V& v) {
  if (!v.span_is_contiguous())
    throw std::invalid_argument(std::string(function) + ": argument '" + name +
                                "' must be contiguous; the communicators send views as one block of bytes");
  return v.span() * sizeof(typename V::value_type);
}

using HostBytes = Kokkos::View<char*, Kokkos::HostSpace>;

template <class Mem>
using UnmanagedBytes = Kokkos::View<char*, Mem, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

template <class V>
constexpr bool host_accessible() {
  return Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename V::memory_space>::accessible;
}

}  // namespace tlse::distributed::impl
