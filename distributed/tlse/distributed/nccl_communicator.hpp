#pragma once
/// \file nccl_communicator.hpp
/// tlse::distributed::NcclCommunicator: a non-owning handle on an `ncclComm_t` that the caller
/// initialized (e.g. the one PyTorch's ProcessGroupNCCL holds), with the Kokkos::Cuda instance
/// the distributed calls compute on.
///
/// Ring steps are grouped ncclSend/ncclRecv on a second stream that this object creates, so a
/// transfer runs while the next kernels run on the execution space's stream; wait() synchronizes
/// that stream. All-reduces and all-gathers run on the execution space's stream itself.
#include <tlse/distributed/impl/byte_views.hpp>
#include <tlse/distributed/reduce_op.hpp>

#include <cuda_runtime.h>
#include <nccl.h>
#include <Kokkos_Core.hpp>

#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace tlse::distributed {

namespace impl {

inline void nccl_check(ncclResult_t rc, const char* what) {
  if (rc != ncclSuccess)
    throw std::runtime_error(std::string("tlse::distributed: ") + what + " failed: " + ncclGetErrorString(rc));
}
inline void cuda_check(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess)
    throw std::runtime_error(std::string("tlse::distributed: ") + what + " failed: " + cudaGetErrorString(rc));
}

template <class U>
ncclDataType_t nccl_type() {
  if (std::is_same<U, float>::value) return ncclFloat32;
  if (std::is_same<U, double>::value) return ncclFloat64;
  if (std::is_same<U, std::int64_t>::value) return ncclInt64;
  if (std::is_same<U, int>::value) return ncclInt32;
  return ncclInt8;
}

/// The stream ring transfers run on, destroyed with the last communicator copy that uses it.
struct TransferStream {
  cudaStream_t stream = nullptr;
  TransferStream() { cuda_check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate"); }
  ~TransferStream() {
    cudaStreamSynchronize(stream);
    cudaStreamDestroy(stream);
  }
  TransferStream(const TransferStream&) = delete;
  TransferStream& operator=(const TransferStream&) = delete;
};

}  // namespace impl

/// A communicator over an NCCL communicator, for Kokkos::Cuda: ring steps as ncclSend / ncclRecv
/// pairs on a transfer stream of its own (so that they overlap the compute on exec()), reductions
/// as NCCL all-reduces.
class NcclCommunicator {
 public:
  using execution_space = Kokkos::Cuda;  ///< where the distributed calls compute

  /// `comm` stays owned by the caller and must outlive this object.
  NcclCommunicator(const Kokkos::Cuda& exec, ncclComm_t comm)
      : exec_(exec), comm_(comm), transfer_(std::make_shared<impl::TransferStream>()) {
    impl::nccl_check(ncclCommUserRank(comm, &rank_), "ncclCommUserRank");
    impl::nccl_check(ncclCommCount(comm, &size_), "ncclCommCount");
  }

  int rank() const { return rank_; }                  ///< this process' rank in comm()
  int size() const { return size_; }                  ///< the number of ranks
  const Kokkos::Cuda& exec() const { return exec_; }  ///< the execution space instance
  ncclComm_t comm() const { return comm_; }           ///< the caller's communicator

  /// A ring transfer in flight on the transfer stream; wait() blocks until it is done (an event
  /// recorded after it, so that waiting does not also wait for transfers posted later).
  class Request {
   public:
    Request() = default;
    /// The transfers posted so far on `s`'s stream (an event recorded after them).
    explicit Request(std::shared_ptr<impl::TransferStream> s) : stream_(std::move(s)) {
      impl::cuda_check(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming), "cudaEventCreate");
      impl::cuda_check(cudaEventRecord(done_, stream_->stream), "cudaEventRecord");
    }
    Request(Request&& o) noexcept { *this = std::move(o); }  ///< takes o's transfer over
    /// Swaps the transfers.
    Request& operator=(Request&& o) noexcept {
      std::swap(stream_, o.stream_);
      std::swap(done_, o.done_);
      return *this;
    }
    ~Request() { release(); }
    /// Blocks until the transfer is done; throws std::runtime_error naming CUDA's failure.
    void wait() {
      if (done_) impl::cuda_check(cudaEventSynchronize(done_), "cudaEventSynchronize (ring step)");
      release();
    }

   private:
    void release() {
      if (done_) cudaEventDestroy(done_);  // a pending event completes on its own
      done_ = nullptr;
      stream_.reset();
    }
    std::shared_ptr<impl::TransferStream> stream_;  // keeps the stream alive while the event is pending
    cudaEvent_t done_ = nullptr;
  };

  /// Sends `send` to rank+1 and receives the same number of bytes from rank-1 into `recv`
  /// (device views, contiguous, same extents on every rank). The execution space is fenced
  /// first so that the data to send is complete; the transfer is enqueued on the transfer
  /// stream and the call returns at once.
  template <class SendV, class RecvV>
  Request ring_step(const SendV& send, const RecvV& recv) const {
    static_assert(
        !impl::host_accessible<SendV>() || std::is_same<typename SendV::memory_space, Kokkos::CudaUVMSpace>::value,
        "tlse::distributed::NcclCommunicator sends device views");
    const std::size_t bytes = impl::contiguous_bytes("tlse::distributed::ring_step", "send", send);
    if (impl::contiguous_bytes("tlse::distributed::ring_step", "recv", recv) != bytes)
      throw std::invalid_argument("tlse::distributed::ring_step: 'send' and 'recv' must have the same size");
    exec_.fence();
    if (size_ == 1) {  // the ring is this rank alone: a copy, without relying on NCCL's self send
      impl::cuda_check(cudaMemcpyAsync(recv.data(), send.data(), bytes, cudaMemcpyDeviceToDevice, transfer_->stream),
                       "cudaMemcpyAsync (ring step)");
      return Request(transfer_);
    }
    const int to = (rank_ + 1) % size_, from = (rank_ + size_ - 1) % size_;
    impl::nccl_check(ncclGroupStart(), "ncclGroupStart");
    impl::nccl_check(ncclSend(send.data(), bytes, ncclInt8, to, comm_, transfer_->stream), "ncclSend");
    impl::nccl_check(ncclRecv(recv.data(), bytes, ncclInt8, from, comm_, transfer_->stream), "ncclRecv");
    impl::nccl_check(ncclGroupEnd(), "ncclGroupEnd");
    return Request(transfer_);
  }

  /// In-place element-wise all-reduce of a contiguous device view of float, double or int64,
  /// on the execution space's stream. Blocking, like MpiCommunicator::allreduce.
  template <class V>
  void allreduce(const V& v, ReduceOp op) const {
    using U = typename V::non_const_value_type;
    const std::size_t n = impl::contiguous_bytes("tlse::distributed::allreduce", "v", v) / sizeof(U);
    if (n == 0) return;
    impl::nccl_check(ncclAllReduce(v.data(), v.data(), n, impl::nccl_type<U>(), op == ReduceOp::sum ? ncclSum : ncclMax,
                                   comm_, exec_.cuda_stream()),
                     "ncclAllReduce");
    exec_.fence();
  }

  /// recv (size() * send.size() elements) = every rank's `send` in rank order. Blocking.
  template <class SendV, class RecvV>
  void allgather(const SendV& send, const RecvV& recv) const {
    const std::size_t bytes = impl::contiguous_bytes("tlse::distributed::allgather", "send", send);
    impl::nccl_check(ncclAllGather(send.data(), recv.data(), bytes, ncclInt8, comm_, exec_.cuda_stream()),
                     "ncclAllGather");
    exec_.fence();
  }

  /// Every rank's `bytes` host bytes at `mine`, concatenated in rank order (staged through the
  /// device: NCCL moves device memory only). Blocking.
  std::vector<char> allgather_host(const void* mine, std::size_t bytes) const {
    Kokkos::View<char*, Kokkos::CudaSpace> send("tlse::gather_send", bytes), recv("tlse::gather_recv", bytes * size_);
    Kokkos::deep_copy(exec_, send,
                      Kokkos::View<const char*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>(
                          static_cast<const char*>(mine), bytes));
    allgather(send, recv);
    std::vector<char> all(bytes * std::size_t(size_));
    Kokkos::deep_copy(
        Kokkos::View<char*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>(all.data(), all.size()), recv);
    return all;
  }

 private:
  Kokkos::Cuda exec_;
  ncclComm_t comm_;
  std::shared_ptr<impl::TransferStream> transfer_;
  int rank_ = 0, size_ = 1;
};

}  // namespace tlse::distributed
