#pragma once
/// \file callback_communicator.hpp
/// tlse::distributed::CallbackCommunicator: a communicator whose transfers are done by the
/// caller, through a plain C struct of function pointers (tlse::distributed::Callbacks). It
/// needs neither MPI nor NCCL: a framework plugs in its own collectives (the C API's
/// tlse_communicator and the Python package's torch.distributed groups use it).
///
/// Every buffer handed to a callback lives in the memory of the execution space (device
/// memory for Kokkos::Cuda, host memory for host spaces), except allgather_host's, which are
/// host memory. The execution space is fenced before a buffer is handed over, so its contents
/// are complete; when a callback returns (ring_wait: when the transfer is done) the received
/// data must be readable by the next kernels of the execution space. A callback returning
/// nonzero makes the call throw std::runtime_error naming the operation and the code.
#include <tlse/distributed/impl/byte_views.hpp>
#include <tlse/distributed/reduce_op.hpp>

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace tlse::distributed {

/// Element types of CallbackCommunicator's all-reduces (the `dtype` argument of Callbacks::allreduce).
enum CallbackDtype : int { callback_f32 = 0, callback_f64 = 1, callback_i32 = 2, callback_i64 = 3 };

/// Reductions of CallbackCommunicator's all-reduces (the `op` argument of Callbacks::allreduce).
enum CallbackOp : int { callback_sum = 0, callback_max = 1 };

/// The caller's communication, as C function pointers; each returns 0 on success. `user` is
/// passed back unchanged. The layout is the C API's tlse_communicator.
struct Callbacks {
  void* user = nullptr;  ///< the caller's state, passed to every callback
  int rank = 0;          ///< this process' rank in [0, size)
  int size = 0;          ///< number of ranks
  /// Starts sending `bytes` bytes at `send` to rank+1 and receiving as many from rank-1 into
  /// `recv`; stores an opaque handle for ring_wait in `*handle`. May return before the transfer ends.
  int (*ring_start)(void* user, const void* send, void* recv, std::size_t bytes, void** handle) = nullptr;
  /// Waits for the transfer `handle` (from ring_start) and releases the handle.
  int (*ring_wait)(void* user, void* handle) = nullptr;
  /// In place: `data` (`count` elements of CallbackDtype `dtype`) becomes the element-wise
  /// CallbackOp `op` over the ranks. Blocking.
  int (*allreduce)(void* user, void* data, std::size_t count, int dtype, int op) = nullptr;
  /// `recv` (size * bytes) becomes every rank's `bytes` bytes at `send`, in rank order. Blocking.
  int (*allgather)(void* user, const void* send, void* recv, std::size_t bytes) = nullptr;
  /// As allgather, for host memory (small: the agreement on arguments before any data moves).
  int (*allgather_host)(void* user, const void* send, void* recv, std::size_t bytes) = nullptr;
};

namespace impl {

inline void callback_check(int rc, const char* what) {
  if (rc != 0)
    throw std::runtime_error(std::string("tlse::distributed: the communicator's ") + what + " callback failed (code " +
                             std::to_string(rc) + ")");
}

template <class U>
constexpr int callback_dtype() {
  static_assert(std::is_same<U, float>::value || std::is_same<U, double>::value || std::is_same<U, int>::value ||
                    std::is_same<U, std::int64_t>::value,
                "tlse::distributed::CallbackCommunicator all-reduces float, double, int or int64");
  return std::is_same<U, float>::value ? callback_f32
         : std::is_same<U, double>::value ? callback_f64
         : std::is_same<U, int>::value    ? callback_i32
                                          : callback_i64;
}

}  // namespace impl

/// A communicator over Callbacks, with the execution space the distributed calls compute on.
/// Non-owning: `user` and whatever it refers to must outlive this object.
template <class Exec>
class CallbackCommunicator {
 public:
  using execution_space = Exec;  ///< where the distributed calls compute

  /// Throws std::invalid_argument when a callback is NULL or rank/size are out of range.
  CallbackCommunicator(const Exec& exec, const Callbacks& callbacks) : exec_(exec), cb_(callbacks) {
    const char* fn = "tlse::distributed::CallbackCommunicator";
    if (!cb_.ring_start || !cb_.ring_wait || !cb_.allreduce || !cb_.allgather || !cb_.allgather_host)
      throw std::invalid_argument(std::string(fn) + ": every callback must be set (one is NULL)");
    if (cb_.size < 1 || cb_.rank < 0 || cb_.rank >= cb_.size)
      throw std::invalid_argument(std::string(fn) + ": rank " + std::to_string(cb_.rank) + " and size " +
                                  std::to_string(cb_.size) + " must satisfy 0 <= rank < size");
  }

  int rank() const { return cb_.rank; }               ///< this process' rank
  int size() const { return cb_.size; }               ///< the number of ranks
  const Exec& exec() const { return exec_; }          ///< the execution space instance
  const Callbacks& callbacks() const { return cb_; }  ///< the caller's callbacks

  /// A ring transfer in flight: wait() calls ring_wait. Destroying an unfinished request waits
  /// for it (ignoring a failure: destructors do not throw), since the buffers must outlive it.
  class Request {
   public:
    Request() = default;
    Request(Request&& o) noexcept { *this = std::move(o); }  ///< takes o's transfer over
    /// Swaps the transfers.
    Request& operator=(Request&& o) noexcept {
      std::swap(cb_, o.cb_);
      std::swap(handle_, o.handle_);
      return *this;
    }
    ~Request() {
      if (cb_) cb_->ring_wait(cb_->user, handle_);
    }
    /// Blocks until the received buffer holds the data; throws std::runtime_error if ring_wait fails.
    void wait() {
      if (!cb_) return;
      const Callbacks* cb = cb_;
      cb_ = nullptr;
      impl::callback_check(cb->ring_wait(cb->user, handle_), "ring_wait");
    }

   private:
    friend class CallbackCommunicator;
    const Callbacks* cb_ = nullptr;  // null: nothing pending
    void* handle_ = nullptr;
  };

  /// Sends `send` to rank+1 and receives the same number of bytes from rank-1 into `recv`
  /// (contiguous views of the execution space, same extents on every rank), after a fence of
  /// the execution space. One rank alone copies, and empty views move nothing, without a callback.
  template <class SendV, class RecvV>
  Request ring_step(const SendV& send, const RecvV& recv) const {
    const std::size_t bytes = impl::contiguous_bytes("tlse::distributed::ring_step", "send", send);
    if (impl::contiguous_bytes("tlse::distributed::ring_step", "recv", recv) != bytes)
      throw std::invalid_argument("tlse::distributed::ring_step: 'send' and 'recv' must have the same size");
    using Mem = typename Exec::memory_space;
    if (bytes == 0) return Request();
    if (cb_.size == 1) {
      Kokkos::deep_copy(
          exec_, impl::UnmanagedBytes<Mem>(reinterpret_cast<char*>(recv.data()), bytes),
          impl::UnmanagedBytes<Mem>(const_cast<char*>(reinterpret_cast<const char*>(send.data())), bytes));
      return Request();
    }
    exec_.fence();
    Request r;
    impl::callback_check(cb_.ring_start(cb_.user, send.data(), recv.data(), bytes, &r.handle_), "ring_start");
    r.cb_ = &cb_;
    return r;
  }

  /// In-place element-wise all-reduce of a contiguous view of float, double, int or int64 in
  /// the execution space's memory. Blocking; an empty view moves nothing.
  template <class V>
  void allreduce(const V& v, ReduceOp op) const {
    using U = typename V::non_const_value_type;
    const std::size_t n = impl::contiguous_bytes("tlse::distributed::allreduce", "v", v) / sizeof(U);
    if (n == 0) return;
    exec_.fence();
    impl::callback_check(cb_.allreduce(cb_.user, v.data(), n, impl::callback_dtype<U>(),
                                       op == ReduceOp::sum ? callback_sum : callback_max),
                         "allreduce");
  }

  /// recv (size() * send.size() elements) = every rank's `send` in rank order. Blocking; empty
  /// views move nothing.
  template <class SendV, class RecvV>
  void allgather(const SendV& send, const RecvV& recv) const {
    const std::size_t bytes = impl::contiguous_bytes("tlse::distributed::allgather", "send", send);
    if (impl::contiguous_bytes("tlse::distributed::allgather", "recv", recv) != bytes * std::size_t(cb_.size))
      throw std::invalid_argument("tlse::distributed::allgather: 'recv' must hold size() times 'send'");
    if (bytes == 0) return;
    exec_.fence();
    impl::callback_check(cb_.allgather(cb_.user, send.data(), recv.data(), bytes), "allgather");
  }

  /// Every rank's `bytes` host bytes at `mine`, concatenated in rank order. Blocking.
  std::vector<char> allgather_host(const void* mine, std::size_t bytes) const {
    std::vector<char> all(bytes * std::size_t(cb_.size));
    impl::callback_check(cb_.allgather_host(cb_.user, mine, all.data(), bytes), "allgather_host");
    return all;
  }

 private:
  Exec exec_;
  Callbacks cb_;
};

}  // namespace tlse::distributed
