// Times the distributed losses, forward + backward. Run under mpirun, one rank per GPU on a GPU
// build:
//   mpirun -np 2 distributed_benchmark <B> <c> [f32|tf32|bf16|f64] [iterations] [mpi|nccl|mpi-gpu-aware] [budget MiB]
//     the contrastive loss at a global batch split evenly over the ranks, and how long the ranks
//     waited on ring transfers (communication not hidden behind compute);
//   mpirun -np 2 distributed_benchmark ce <N> <D> <V> [dtype] [iterations] [comm] [budget MiB]
//     the vocabulary-parallel cross-entropy: every rank holds E (N x D) and the targets, and a
//     contiguous shard of about V / ranks classes of C;
//   mpirun -np 2 distributed_benchmark distill <N> <D_s> <D_t> <V> [dtype] [iterations] [comm] [budget MiB]
//     the vocabulary-parallel distillation (forward KL, teacher frozen: dHs and dWs): every rank
//     holds Hs, Ht and the targets, and its shard of both heads' classifiers.
// budget: each rank's options.memory_budget in MiB (default: the library's, 256 MiB).
// Prints one JSON line (rank 0): median over iterations of the slowest rank's step time (and for
// the contrastive loss the slowest rank's exposed communication and bytes sent per rank).
// Ranks beyond the node's GPUs share them (rank % GPUs): "2 ranks on one GPU" measures what the
// split costs where no second GPU is lent (no NCCL then: it takes one rank a GPU).
#include <tlse/distributed.hpp>
#include <tlse_bench/hashed_normal.hpp>

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

namespace {

using tlse::perf::hashed_normal;

struct Setup {
  long B, c;
  int iterations;
  std::string dtype, comm;
  std::size_t memory_budget = tlse::memory_budget_default;
  long V = 0;    // > 0: the vocabulary-parallel cross-entropy with N = B tokens, D = c, V classes
  long D_t = 0;  // > 0 (with V): the vocabulary-parallel distillation, D_s = c
};

/// Median over iterations of the slowest rank's forward + backward time, in ms.
template <class Exec, class Step>
double timed_median(const Exec& exec, int iterations, const Step& step) {
  std::vector<double> ms;
  for (int it = 0; it <= iterations; ++it) {  // iteration 0 warms up
    exec.fence();
    MPI_Barrier(MPI_COMM_WORLD);
    Kokkos::Timer timer;
    step();
    exec.fence();
    double t = timer.seconds() * 1e3;
    MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (it > 0) ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

/// This rank's share of `total` items split as evenly as possible over `ranks`: {count, offset}.
std::pair<long, long> share_of(long total, int rank, int ranks) {
  return {total / ranks + (rank < total % ranks ? 1 : 0), rank * (total / ranks) + std::min<long>(rank, total % ranks)};
}

/// Vocabulary-parallel cross-entropy: E (N x D, logits of std ~4 as in the single-GPU benchmarks)
/// and targets on every rank, this rank's shard of C.
template <class T, class Comm>
int run_cross_entropy(const Setup& s, const Comm& comm) {
  using Exec = typename Comm::execution_space;
  using Mem = typename Exec::memory_space;
  using Acc = tlse::accumulator_t<T>;
  const int rank = comm.rank(), n = comm.size();
  const long N = s.B, D = s.c, V = s.V;
  const std::pair<long, long> shard = share_of(V, rank, n);  // named: lambdas cannot capture bindings
  const long v = shard.first, voff = shard.second;
  Kokkos::View<T**, Kokkos::LayoutRight, Mem> E("E", N, D), C("C", v, D), dE("dE", N, D), dC("dC", v, D);
  Kokkos::View<int*, Mem> targets("targets", N);
  Kokkos::parallel_for(
      "init", Kokkos::RangePolicy<Exec>(comm.exec(), 0, std::max(N, v) * D), KOKKOS_LAMBDA(long i) {
        if (i < N * D) E.data()[i] = T(hashed_normal((unsigned long)i));
        if (i < v * D) C.data()[i] = T(hashed_normal((unsigned long)(N * D + voff * D + i)) * 4.0f / sqrtf(float(D)));
        if (i < N) targets(i) = int((hashed_normal((unsigned long)(N * D + V * D + i)) + 8.0f) * 1e6f) % int(V);
      });
  Kokkos::View<Acc*, Mem> loss("loss", 1), lse("lse", N), dloss("dloss", 1);
  Kokkos::deep_copy(dloss, Acc(1));
  Kokkos::View<const T*, Mem> bias;
  Kokkos::View<T*, Mem> dbias;
  tlse::CrossEntropyOptions o;
  o.memory_budget = s.memory_budget;
  if (s.dtype == "tf32") o.precision = tlse::Precision::tf32;
  const double ms = timed_median(comm.exec(), s.iterations, [&] {
    tlse::distributed::cross_entropy(comm, E, C, bias, targets, loss, lse, o);
    tlse::distributed::cross_entropy_backward(comm, E, C, bias, targets, lse, dloss, dE, dC, dbias, o);
  });
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), loss);
  if (rank == 0)
    std::printf(
        "{\"kind\": \"distributed_cross_entropy_fwd_bwd\", \"ranks\": %d, \"comm\": \"%s\", \"N\": %ld, "
        "\"D\": %ld, \"V\": %ld, \"dtype\": \"%s\", \"loss\": %.6f, \"ms_step\": %.3f, \"exec\": \"%s\", "
        "\"iterations\": %d, \"budget_MiB\": %zu}\n",
        n, s.comm.c_str(), N, D, V, s.dtype.c_str(), double(h(0)), ms, Exec::name(), s.iterations,
        s.memory_budget >> 20);
  return 0;
}

/// Vocabulary-parallel distillation: Hs (N x D_s), Ht (N x D_t) and targets on every rank (a
/// tenth of them ignored), this rank's shards of Ws and Wt (logits of std ~4), forward KL at
/// T = 1, the teacher frozen.
template <class T, class Comm>
int run_distillation(const Setup& s, const Comm& comm) {
  using Exec = typename Comm::execution_space;
  using Mem = typename Exec::memory_space;
  using Acc = tlse::accumulator_t<T>;
  const int rank = comm.rank(), n = comm.size();
  const long N = s.B, Ds = s.c, Dt = s.D_t, V = s.V;
  const std::pair<long, long> shard = share_of(V, rank, n);
  const long v = shard.first, voff = shard.second;
  using Matrix = Kokkos::View<T**, Kokkos::LayoutRight, Mem>;
  Matrix Hs("Hs", N, Ds), Ws("Ws", v, Ds), Ht("Ht", N, Dt), Wt("Wt", v, Dt), dHs("dHs", N, Ds), dWs("dWs", v, Ds);
  Matrix dHt("dHt", 0, Dt), dWt("dWt", 0, Dt);
  Kokkos::View<int*, Mem> targets("targets", N);
  const long most = std::max(N, v) * std::max(Ds, Dt);
  // The same global data whatever the number of ranks: each array's entries hashed from its own
  // base, the shards' by global row.
  const unsigned long hs = 0, ht = N * Ds, ws = N * (Ds + Dt) + voff * Ds, wt = N * (Ds + Dt) + V * Ds + voff * Dt,
                      tg = N * (Ds + Dt) + V * (Ds + Dt);
  Kokkos::parallel_for(
      "init", Kokkos::RangePolicy<Exec>(comm.exec(), 0, most), KOKKOS_LAMBDA(long i) {
        if (i < N * Ds) Hs.data()[i] = T(hashed_normal(hs + i));
        if (i < N * Dt) Ht.data()[i] = T(hashed_normal(ht + i));
        if (i < v * Ds) Ws.data()[i] = T(hashed_normal(ws + i) * 4.0f / sqrtf(float(Ds)));
        if (i < v * Dt) Wt.data()[i] = T(hashed_normal(wt + i) * 4.0f / sqrtf(float(Dt)));
        if (i < N) {
          const int t = int((hashed_normal(tg + i) + 8.0f) * 1e6f) % int(V);
          targets(i) = t % 10 == 0 ? -100 : t;
        }
      });
  Kokkos::View<Acc*, Mem> loss("loss", 1), dloss("dloss", 1);
  Kokkos::View<Acc**, Kokkos::LayoutRight, Mem> stats("row_stats", N, tlse::distillation_row_stats);
  Kokkos::deep_copy(dloss, Acc(1));
  tlse::DistillationOptions o;
  o.memory_budget = s.memory_budget;
  const double ms = timed_median(comm.exec(), s.iterations, [&] {
    tlse::distributed::distillation_loss(comm, Hs, Ws, Ht, Wt, targets, loss, stats, o);
    tlse::distributed::distillation_loss_backward(comm, Hs, Ws, Ht, Wt, targets, stats, dloss, dHs, dWs, dHt, dWt, o);
  });
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), loss);
  if (rank == 0)
    std::printf(
        "{\"kind\": \"distributed_distillation_fwd_bwd\", \"ranks\": %d, \"comm\": \"%s\", \"N\": %ld, "
        "\"D_s\": %ld, \"D_t\": %ld, \"V\": %ld, \"dtype\": \"%s\", \"loss\": %.6f, \"ms_step\": %.3f, "
        "\"exec\": \"%s\", \"iterations\": %d, \"budget_MiB\": %zu}\n",
        n, s.comm.c_str(), N, Ds, Dt, V, s.dtype.c_str(), double(h(0)), ms, Exec::name(), s.iterations,
        s.memory_budget >> 20);
  return 0;
}

template <class T, class Comm>
int run(const Setup& s, const Comm& comm) {
  using Exec = typename Comm::execution_space;
  using Mem = typename Exec::memory_space;
  using Acc = tlse::accumulator_t<T>;
  const int rank = comm.rank(), n = comm.size();
  const std::pair<long, long> block = share_of(s.B, rank, n);
  const long b = block.first, off = block.second;
  Kokkos::View<T**, Kokkos::LayoutRight, Mem> I("I", b, s.c), T_("T", b, s.c), dI("dI", b, s.c), dT("dT", b, s.c);
  const long c = s.c;
  Kokkos::parallel_for(
      "init", Kokkos::RangePolicy<Exec>(comm.exec(), 0, b * c), KOKKOS_LAMBDA(long i) {
        // Rows of about unit norm, the same global data whatever the number of ranks.
        const unsigned long g = (unsigned long)(off * c + i);
        const float scale = 1.0f / sqrtf(float(c));
        I.data()[i] = T(hashed_normal(2 * g) * scale);
        T_.data()[i] = T(hashed_normal(2 * g + 1) * scale);
      });
  Kokkos::View<Acc*, Mem> loss("loss", 1), row_lse("row_lse", b), col_lse("col_lse", b), dloss("dloss", 1),
      dscale("dscale", 1);
  Kokkos::deep_copy(dloss, Acc(1));
  Kokkos::View<const int*, Mem> labels;
  tlse::ContrastiveOptions o;
  o.scale = 1 / 0.07;
  o.memory_budget = s.memory_budget;
  if (s.dtype == "tf32") o.precision = tlse::Precision::tf32;  // float inputs, TF32 products
  std::vector<double> step_ms, exposed_ms;
  long bytes = 0;
  for (int it = 0; it <= s.iterations; ++it) {  // iteration 0 warms up
    tlse::distributed::RingStatistics stats;
    comm.exec().fence();
    MPI_Barrier(MPI_COMM_WORLD);
    Kokkos::Timer timer;
    tlse::distributed::contrastive_loss(comm, I, T_, labels, loss, row_lse, col_lse, o, &stats);
    tlse::distributed::contrastive_loss_backward(comm, I, T_, labels, row_lse, col_lse, dloss, dI, dT, dscale, o,
                                                 &stats);
    comm.exec().fence();
    double t[2] = {timer.seconds() * 1e3, stats.wait_seconds * 1e3};
    MPI_Allreduce(MPI_IN_PLACE, t, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (it > 0) step_ms.push_back(t[0]), exposed_ms.push_back(t[1]);
    bytes = stats.bytes_sent;
  }
  std::sort(step_ms.begin(), step_ms.end());
  std::sort(exposed_ms.begin(), exposed_ms.end());
  const double ms = step_ms[step_ms.size() / 2], exposed = exposed_ms[exposed_ms.size() / 2];
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), loss);
  if (rank == 0)
    std::printf(
        "{\"kind\": \"distributed_contrastive_fwd_bwd\", \"ranks\": %d, \"comm\": \"%s\", \"B\": %ld, \"c\": %ld, "
        "\"dtype\": \"%s\", \"loss\": %.6f, \"ms_step\": %.3f, \"ms_exposed_comm\": %.3f, "
        "\"MB_sent_per_rank\": %.2f, \"exec\": \"%s\", \"iterations\": %d, \"budget_MiB\": %zu}\n",
        n, s.comm.c_str(), s.B, s.c, s.dtype.c_str(), double(h(0)), ms, exposed, bytes / 1e6, Exec::name(),
        s.iterations, s.memory_budget >> 20);
  return 0;
}

template <class Comm>
int dispatch(const Setup& s, const Comm& comm) {
  if (s.D_t > 0) {
    if (s.dtype == "f64") return run_distillation<double>(s, comm);
    if (s.dtype == "bf16") return run_distillation<tlse::bfloat16>(s, comm);
    return run_distillation<float>(s, comm);
  }
  if (s.V > 0) {
    if (s.dtype == "f64") return run_cross_entropy<double>(s, comm);
    if (s.dtype == "bf16") return run_cross_entropy<tlse::bfloat16>(s, comm);
    return run_cross_entropy<float>(s, comm);
  }
  if (s.dtype == "f64") return run<double>(s, comm);
  if (s.dtype == "bf16") return run<tlse::bfloat16>(s, comm);
  return run<float>(s, comm);
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1, status = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const bool ce = argc > 1 && std::string(argv[1]) == "ce", distill = argc > 1 && std::string(argv[1]) == "distill";
  const int a = ce ? 2 : distill ? 3 : 0;  // offset of the shared arguments: dtype, iterations, comm
  if (argc < 3 + a) {
    if (rank == 0)
      std::fprintf(stderr,
                   "usage: distributed_benchmark B c [f32|tf32|bf16|f64] [iterations] [mpi|nccl|mpi-gpu-aware] "
                   "[budget MiB]\n"
                   "       distributed_benchmark ce N D V [f32|tf32|bf16|f64] [iterations] [mpi|nccl|mpi-gpu-aware] "
                   "[budget MiB]\n"
                   "       distributed_benchmark distill N D_s D_t V [f32|bf16|f64] [iterations] "
                   "[mpi|nccl|mpi-gpu-aware] [budget MiB]\n");
    MPI_Finalize();
    return 2;
  }
  const int named = ce || distill ? 1 : 0;  // the mode's name before the sizes
  Setup s{std::atol(argv[1 + named]), std::atol(argv[2 + named]), argc > 4 + a ? std::atoi(argv[4 + a]) : 5,
          argc > 3 + a ? argv[3 + a] : "f32", argc > 5 + a ? argv[5 + a] : "mpi"};
  if (ce) s.V = std::atol(argv[4]);
  if (distill) s.D_t = std::atol(argv[4]), s.V = std::atol(argv[5]);
  if (argc > 6 + a) {
    const long mib = std::atol(argv[6 + a]);
    if (mib < 1) {
      if (rank == 0)
        std::fprintf(stderr, "distributed_benchmark: budget must be a positive number of MiB, got '%s'\n", argv[6 + a]);
      MPI_Finalize();
      return 2;
    }
    s.memory_budget = std::size_t(mib) << 20;
  }
  {
#if defined(KOKKOS_ENABLE_CUDA)
    MPI_Comm node;  // one GPU per rank: the node-local rank picks the device
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    int local = 0;
    MPI_Comm_rank(node, &local);
    MPI_Comm_free(&node);
    int gpus = 1;
    if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus < 1) gpus = 1;
    local %= gpus;
    std::string device = "--kokkos-device-id=" + std::to_string(local);
    char* args[] = {argv[0], device.data(), nullptr};
    int nargs = 2;
    Kokkos::ScopeGuard kokkos(nargs, args);
#else
    Kokkos::ScopeGuard kokkos(argc, argv);
#endif
    using Exec = Kokkos::DefaultExecutionSpace;
    Exec exec;
#if defined(TLSE_ENABLE_NCCL)
    if (s.comm == "nccl") {
      ncclUniqueId id;
      if (rank == 0) ncclGetUniqueId(&id);
      MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
      ncclComm_t nccl;
      ncclCommInitRank(&nccl, size, id, rank);
      status = dispatch(s, tlse::distributed::NcclCommunicator(exec, nccl));
      ncclCommDestroy(nccl);
    } else
#endif
      status = dispatch(s, tlse::distributed::MpiCommunicator<Exec>(exec, MPI_COMM_WORLD, s.comm == "mpi-gpu-aware"));
  }
  MPI_Finalize();
  return status;
}
