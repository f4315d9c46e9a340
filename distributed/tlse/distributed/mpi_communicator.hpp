#pragma once
/// \file mpi_communicator.hpp
/// tlse::distributed::MpiCommunicator: a non-owning handle on an MPI communicator that the
/// caller initialized, with the execution space the distributed calls compute on, and the few
/// operations they need: a ring step (send to rank+1, receive from rank-1, asynchronous), small
/// all-reduces and all-gathers.
///
/// Views in host-accessible memory go to MPI directly. Device views go directly too when the
/// communicator is built with `gpu_aware = true` (the MPI library must be CUDA-aware); otherwise
/// they are staged through host buffers.
#include <tlse/distributed/impl/byte_views.hpp>
#include <tlse/distributed/reduce_op.hpp>

#include <mpi.h>

#include <climits>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace tlse::distributed {

namespace impl {

inline void mpi_check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw std::runtime_error(std::string("tlse::distributed: ") + what + " failed: " + std::string(text, len));
}

template <class U>
MPI_Datatype mpi_type() {
  if (std::is_same<U, float>::value) return MPI_FLOAT;
  if (std::is_same<U, double>::value) return MPI_DOUBLE;
  if (std::is_same<U, std::int64_t>::value) return MPI_INT64_T;
  if (std::is_same<U, int>::value) return MPI_INT;
  return MPI_BYTE;
}

inline int mpi_count(std::size_t n, const char* what) {
  if (n > std::size_t(INT_MAX))
    throw std::invalid_argument(std::string("tlse::distributed: ") + what + " of " + std::to_string(n) +
                                " elements exceeds MPI's int count");
  return int(n);
}

}  // namespace impl

/// A communicator over an MPI communicator, with the execution space the distributed calls
/// compute on: ring steps as MPI_Isend / MPI_Irecv pairs (through host staging buffers unless
/// `gpu_aware`), reductions as MPI_Allreduce.
template <class Exec>
class MpiCommunicator {
 public:
  using execution_space = Exec;  ///< where the distributed calls compute

  /// `comm` stays owned by the caller and must outlive this object. `gpu_aware`: hand device
  /// pointers to MPI (needs a CUDA-aware MPI); ignored for host execution spaces.
  MpiCommunicator(const Exec& exec, MPI_Comm comm, bool gpu_aware = false)
      : exec_(exec), comm_(comm), gpu_aware_(gpu_aware) {
    impl::mpi_check(MPI_Comm_rank(comm, &rank_), "MPI_Comm_rank");
    impl::mpi_check(MPI_Comm_size(comm, &size_), "MPI_Comm_size");
  }

  int rank() const { return rank_; }             ///< this process' rank in comm()
  int size() const { return size_; }             ///< the number of ranks
  const Exec& exec() const { return exec_; }     ///< the execution space instance
  MPI_Comm comm() const { return comm_; }        ///< the caller's communicator
  bool gpu_aware() const { return gpu_aware_; }  ///< whether MPI gets device pointers

  /// A ring transfer in flight. wait() blocks until the received view holds the data (and the
  /// sent one may be reused). Destroying an unfinished request waits for it: MPI must be done
  /// with the buffers before they can go.
  class Request {
   public:
    Request() = default;
    Request(Request&& o) noexcept { *this = std::move(o); }  ///< takes o's transfer over
    /// Swaps the transfers.
    Request& operator=(Request&& o) noexcept {
      std::swap(reqs_[0], o.reqs_[0]);
      std::swap(reqs_[1], o.reqs_[1]);
      std::swap(send_stage_, o.send_stage_);
      std::swap(recv_stage_, o.recv_stage_);
      std::swap(recv_device_, o.recv_device_);
      std::swap(exec_, o.exec_);
      return *this;
    }
    ~Request() {
      if (reqs_[0] != MPI_REQUEST_NULL || reqs_[1] != MPI_REQUEST_NULL) MPI_Waitall(2, reqs_, MPI_STATUSES_IGNORE);
    }
    /// Blocks until the transfer is done; throws std::runtime_error naming MPI's failure.
    void wait() {
      impl::mpi_check(MPI_Waitall(2, reqs_, MPI_STATUSES_IGNORE), "MPI_Waitall (ring step)");
      if (recv_stage_.size() > 0) {
        Kokkos::deep_copy(exec_, recv_device_, recv_stage_);
        exec_.fence();  // the staging buffer dies with this request
        recv_stage_ = impl::HostBytes();
      }
      send_stage_ = impl::HostBytes();
    }

   private:
    friend class MpiCommunicator;
    MPI_Request reqs_[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    impl::HostBytes send_stage_, recv_stage_;
    impl::UnmanagedBytes<typename Exec::memory_space> recv_device_;
    Exec exec_;
  };

  /// Sends `send` to rank+1 and receives the same number of bytes from rank-1 into `recv`
  /// (both contiguous, same extents on every rank): fence of the execution space (the data to
  /// send must be complete), MPI_Irecv, MPI_Isend. Returns at once; call wait() on the result.
  template <class SendV, class RecvV>
  Request ring_step(const SendV& send, const RecvV& recv) const {
    const std::size_t bytes = impl::contiguous_bytes("tlse::distributed::ring_step", "send", send);
    if (impl::contiguous_bytes("tlse::distributed::ring_step", "recv", recv) != bytes)
      throw std::invalid_argument("tlse::distributed::ring_step: 'send' and 'recv' must have the same size");
    const int count = impl::mpi_count(bytes, "a ring step");
    const int to = (rank_ + 1) % size_, from = (rank_ + size_ - 1) % size_;
    Request r;
    r.exec_ = exec_;
    char* recv_ptr = reinterpret_cast<char*>(recv.data());
    const char* send_ptr = reinterpret_cast<const char*>(send.data());
    const bool direct = direct_access<RecvV>();
    if (!direct) {
      r.recv_device_ = impl::UnmanagedBytes<typename Exec::memory_space>(recv_ptr, bytes);
      r.recv_stage_ = impl::HostBytes(Kokkos::view_alloc(Kokkos::WithoutInitializing, "tlse::ring_recv"), bytes);
      r.send_stage_ = impl::HostBytes(Kokkos::view_alloc(Kokkos::WithoutInitializing, "tlse::ring_send"), bytes);
      recv_ptr = r.recv_stage_.data();
    }
    // The fence comes first: kernels in flight may still read the receive buffer or write the
    // one to send.
    if (!direct) {
      Kokkos::deep_copy(exec_, r.send_stage_,
                        impl::UnmanagedBytes<typename Exec::memory_space>(const_cast<char*>(send_ptr), bytes));
      send_ptr = r.send_stage_.data();
    }
    exec_.fence();
    impl::mpi_check(MPI_Irecv(recv_ptr, count, MPI_BYTE, from, tag, comm_, &r.reqs_[0]), "MPI_Irecv (ring step)");
    impl::mpi_check(MPI_Isend(send_ptr, count, MPI_BYTE, to, tag, comm_, &r.reqs_[1]), "MPI_Isend (ring step)");
    return r;
  }

  /// In-place element-wise all-reduce of a contiguous view of float, double or int64 in the
  /// execution space's memory. Blocking: the result is in `v` when it returns.
  template <class V>
  void allreduce(const V& v, ReduceOp op) const {
    using U = typename V::non_const_value_type;
    const std::size_t bytes = impl::contiguous_bytes("tlse::distributed::allreduce", "v", v);
    const int count = impl::mpi_count(bytes / sizeof(U), "an all-reduce");
    if (count == 0) return;
    const MPI_Op mop = op == ReduceOp::sum ? MPI_SUM : MPI_MAX;
    exec_.fence();
    if (direct_access<V>()) {
      impl::mpi_check(MPI_Allreduce(MPI_IN_PLACE, v.data(), count, impl::mpi_type<U>(), mop, comm_), "MPI_Allreduce");
      return;
    }
    auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
    impl::mpi_check(MPI_Allreduce(MPI_IN_PLACE, h.data(), count, impl::mpi_type<U>(), mop, comm_), "MPI_Allreduce");
    Kokkos::deep_copy(v, h);
  }

  /// Every rank's `bytes` bytes at `mine` (host memory), concatenated in rank order. Blocking;
  /// used to agree on shapes and on argument checks before any data moves.
  std::vector<char> allgather_host(const void* mine, std::size_t bytes) const {
    std::vector<char> all(bytes * std::size_t(size_));
    impl::mpi_check(
        MPI_Allgather(mine, impl::mpi_count(bytes, "an all-gather"), MPI_BYTE, all.data(), int(bytes), MPI_BYTE, comm_),
        "MPI_Allgather");
    return all;
  }

  /// recv (size() * send.size() elements) = every rank's `send` in rank order. Blocking.
  template <class SendV, class RecvV>
  void allgather(const SendV& send, const RecvV& recv) const {
    const std::size_t bytes = impl::contiguous_bytes("tlse::distributed::allgather", "send", send);
    exec_.fence();
    if (direct_access<SendV>() && direct_access<RecvV>()) {
      impl::mpi_check(MPI_Allgather(send.data(), impl::mpi_count(bytes, "an all-gather"), MPI_BYTE, recv.data(),
                                    int(bytes), MPI_BYTE, comm_),
                      "MPI_Allgather");
      return;
    }
    auto hs = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), send);
    auto hr = Kokkos::create_mirror_view(recv);
    impl::mpi_check(MPI_Allgather(hs.data(), impl::mpi_count(bytes, "an all-gather"), MPI_BYTE, hr.data(), int(bytes),
                                  MPI_BYTE, comm_),
                    "MPI_Allgather");
    Kokkos::deep_copy(recv, hr);
  }

 private:
  /// A private tag keeps ring messages apart from the caller's own point-to-point traffic on
  /// the same communicator; successive ring steps match in order (MPI's non-overtaking rule).
  static constexpr int tag = 0x715e;

  template <class V>
  bool direct_access() const {
    return impl::host_accessible<V>() || gpu_aware_;
  }

  Exec exec_;
  MPI_Comm comm_;
  bool gpu_aware_;
  int rank_ = 0, size_ = 1;
};

}  // namespace tlse::distributed
