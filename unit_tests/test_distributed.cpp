// The distributed layer under mpirun -np 1..4: every rank generates the same global data from a
// shared seed, runs the single-process core call on all of it, runs the distributed call on its
// own share, and compares its share of the results.
//
// Tolerance: the core and the distributed results both lie within the core's error model of the
// exact (float64) values (test_support.hpp), so they differ by at most twice that model, plus
// what the distributed computation rounds in addition: each of the `size` online merges of a
// partial LSE adds 4u (|lse| + 1), and each partial gradient that is rounded to the output type
// before joining its (Acc) accumulator adds u_out times its magnitude (u_out * mag in total).
#include "distillation_reference.hpp"
#include "test_support.hpp"

#include <tlse/distributed.hpp>

#include <mpi.h>

#include <functional>
#include <numeric>

#if defined(TLSE_ENABLE_NCCL)
ncclComm_t tlse_test_nccl = nullptr;  // set up by main
#endif

namespace {
using namespace tlse::test;
using tlse::distributed::MpiCommunicator;

int world_rank() {
  int r;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int world_size() {
  int n;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

/// One seed for all ranks (rank 0's), reported on failure.
#define TLSE_SHARED_SEED(rng)                                                                                          \
  unsigned tlse_seed_ = ::tlse::test::test_seed();                                                                     \
  MPI_Bcast(&tlse_seed_, 1, MPI_UNSIGNED, 0, MPI_COMM_WORLD);                                                          \
  SCOPED_TRACE("seed " + std::to_string(tlse_seed_) + " (replay: TLSE_TEST_SEED=" + std::to_string(tlse_seed_) + ")"); \
  std::mt19937_64 rng(tlse_seed_)

/// Uneven shares of `total` rows: rank r gets weight (r % 3 + 1), and with `empty_rank` the
/// last rank of several gets none.
std::vector<std::int64_t> uneven_split(std::int64_t total, int n, bool empty_rank) {
  std::vector<std::int64_t> w(n), out(n);
  for (int r = 0; r < n; ++r) w[r] = (empty_rank && n > 1 && r == n - 1) ? 0 : r % 3 + 1;
  const std::int64_t sum = std::accumulate(w.begin(), w.end(), std::int64_t(0));
  std::int64_t given = 0;
  for (int r = 0; r < n; ++r) given += out[r] = total * w[r] / sum;
  for (int r = 0; given < total; r = (r + 1) % n)
    if (w[r]) ++out[r], ++given;
  return out;
}
std::int64_t offset_of(const std::vector<std::int64_t>& split, int rank) {
  return std::accumulate(split.begin(), split.begin() + rank, std::int64_t(0));
}

Matrix rows_of(const Matrix& m, std::int64_t first, std::int64_t count) {
  Matrix r(count, m.cols);
  std::copy(m.v.begin() + first * m.cols, m.v.begin() + (first + count) * m.cols, r.v.begin());
  return r;
}
std::vector<double> slice(const std::vector<double>& v, std::int64_t first, std::int64_t count,
                          std::int64_t width = 1) {
  return std::vector<double>(v.begin() + first * width, v.begin() + (first + count) * width);
}

/// A CallbackCommunicator's callbacks over MPI_COMM_WORLD (host memory), so that the callback
/// path is covered without Python. `fail_allreduce` makes the all-reduce report code 7.
struct MpiCallbacks {
  bool fail_allreduce = false;

  static MPI_Comm world() { return MPI_COMM_WORLD; }
  static int ring_start(void*, const void* send, void* recv, std::size_t bytes, void** handle) {
    const int n = world_size(), r = world_rank();
    auto* reqs = new MPI_Request[2];
    *handle = reqs;
    return MPI_Irecv(recv, int(bytes), MPI_BYTE, (r + n - 1) % n, 7, world(), &reqs[0]) |
           MPI_Isend(send, int(bytes), MPI_BYTE, (r + 1) % n, 7, world(), &reqs[1]);
  }
  static int ring_wait(void*, void* handle) {
    auto* reqs = static_cast<MPI_Request*>(handle);
    const int rc = MPI_Waitall(2, reqs, MPI_STATUSES_IGNORE);
    delete[] reqs;
    return rc;
  }
  static int allreduce(void* user, void* data, std::size_t count, int dtype, int op) {
    if (static_cast<MpiCallbacks*>(user)->fail_allreduce) return 7;
    const MPI_Datatype types[] = {MPI_FLOAT, MPI_DOUBLE, MPI_INT, MPI_INT64_T};
    return MPI_Allreduce(MPI_IN_PLACE, data, int(count), types[dtype],
                         op == tlse::distributed::callback_sum ? MPI_SUM : MPI_MAX, world());
  }
  static int allgather(void*, const void* send, void* recv, std::size_t bytes) {
    return MPI_Allgather(send, int(bytes), MPI_BYTE, recv, int(bytes), MPI_BYTE, world());
  }

  tlse::distributed::Callbacks callbacks() {
    tlse::distributed::Callbacks c;
    c.user = this;
    c.rank = world_rank(), c.size = world_size();
    c.ring_start = ring_start, c.ring_wait = ring_wait, c.allreduce = allreduce;
    c.allgather = c.allgather_host = allgather;
    return c;
  }
};

/// Calls f with every communicator this build has, over MPI_COMM_WORLD.
template <class Exec, class F>
void for_each_comm(const Exec& exec, const F& f) {
  {
    SCOPED_TRACE("MpiCommunicator");
    f(MpiCommunicator<Exec>(exec, MPI_COMM_WORLD));
  }
  if constexpr (Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename Exec::memory_space>::accessible) {
    SCOPED_TRACE("CallbackCommunicator over MPI");
    MpiCallbacks mpi;
    f(tlse::distributed::CallbackCommunicator<Exec>(exec, mpi.callbacks()));
  }
#if defined(TLSE_ENABLE_NCCL)
  if (std::is_same<Exec, Kokkos::Cuda>::value) {
    SCOPED_TRACE("NcclCommunicator");
    f(tlse::distributed::NcclCommunicator(exec, tlse_test_nccl));
  }
  if (const char* aware = std::getenv("TLSE_MPI_GPU_AWARE"); aware && std::string(aware) == "1") {
    SCOPED_TRACE("MpiCommunicator, GPU-aware");
    f(MpiCommunicator<Exec>(exec, MPI_COMM_WORLD, true));
  }
#endif
}

/// The message `call` throws as std::invalid_argument ("" when it does not throw), and whether
/// every rank got the same one.
std::pair<std::string, bool> collective_error(const std::function<void()>& call) {
  std::string msg;
  try {
    call();
  } catch (const std::invalid_argument& e) {
    msg = e.what();
  }
  const std::size_t h = std::hash<std::string>{}(msg);
  std::size_t lo = h, hi = h;
  MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_UNSIGNED_LONG, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_UNSIGNED_LONG, MPI_MAX, MPI_COMM_WORLD);
  return {msg, lo == hi};
}

template <class C>
struct Distributed : ::testing::Test {
  using T = typename C::Scalar;
  using Acc = typename C::Acc;
  typename C::Exec exec;
  const int rank = world_rank(), size = world_size();

  /// Contrastive forward + backward on `split` rows per rank.
  void contrastive(std::mt19937_64& rng, const std::vector<std::int64_t>& split, std::int64_t c,
                   tlse::ContrastiveOptions o, bool global_labels) {
    const std::int64_t B = std::accumulate(split.begin(), split.end(), std::int64_t(0));
    const std::int64_t b = split[rank], off = offset_of(split, rank);
    const Matrix I = random_matrix<T>(rng, B, c, 1.0, true), Tm = random_matrix<T>(rng, B, c, 1.0, true);
    std::vector<std::int64_t> labels;
    if (global_labels)
      for (std::int64_t i = 0; i < B; ++i) labels.push_back(std::int64_t(rng() % B));
    const double dloss = representable<Acc>(0.75);
    const auto ref = tlse::testing::contrastive_reference(I, Tm, labels, o, dloss);
    auto dl = vector_to_device<typename C::AccView>({dloss});

    // The single-process result on the whole batch.
    auto Ig = to_device<C>(I), Tg = to_device<C>(Tm);
    auto lab_g = index_to_device<typename C::IntView>(labels);
    typename C::AccView loss1("loss", 1), rl1("rl", B), cl1("cl", B), ds1("ds", 1);
    typename C::MatrixView dI1("dI", B, c), dT1("dT", B, c);
    tlse::contrastive_loss(exec, Ig, Tg, lab_g, loss1, rl1, cl1, o);
    tlse::contrastive_loss_backward(exec, Ig, Tg, lab_g, rl1, cl1, dl, dI1, dT1, ds1, o);

    auto Il = to_device<C>(rows_of(I, off, b)), Tl = to_device<C>(rows_of(Tm, off, b));
    std::vector<std::int64_t> my_labels;
    if (global_labels) my_labels.assign(labels.begin() + off, labels.begin() + off + b);
    auto lab = index_to_device<typename C::IntView>(my_labels);
    for_each_comm(exec, [&](const auto& comm) {
      typename C::AccView loss("loss", 1), rl("rl", b), cl("cl", b), ds("ds", 1);
      typename C::MatrixView dI("dI", b, c), dT("dT", b, c);
      tlse::distributed::contrastive_loss(comm, Il, Tl, lab, loss, rl, cl, o);
      tlse::distributed::contrastive_loss_backward(comm, Il, Tl, lab, rl, cl, dl, dI, dT, ds, o);

      Tolerance<T> tol(I, Tm, o.scale);
      const double lse_max = std::max(max_abs(ref.row_lse), max_abs(ref.col_lse));
      const double lse_tol = 2 * tol.lse(lse_max, B) + 4 * tol.u * size * (lse_max + 1);
      if (o.direction != tlse::Direction::text_to_image)
        expect_close("row_lse", to_host(rl), slice(to_host(rl1), off, b), [&](std::size_t) { return lse_tol; });
      if (o.direction != tlse::Direction::image_to_text)
        expect_close("col_lse", to_host(cl), slice(to_host(cl1), off, b), [&](std::size_t) { return lse_tol; });
      expect_close("loss", to_host(loss), to_host(loss1),
                   [&](std::size_t) { return 2 * lse_tol + 8 * tol.u * std::fabs(ref.loss); });
      auto grad_tol = [&](const Matrix& r, const Matrix& mag) {
        return [&, off](std::size_t k) {
          const std::size_t g = off * c + k;
          return 2 * tol.grad(r.v[g], mag.v[g], B) + 2 * tol.u_out * mag.v[g];
        };
      };
      expect_close("dI", to_host(dI), slice(to_host(dI1), off, b, c), grad_tol(ref.dI, ref.dA_mag));
      expect_close("dT", to_host(dT), slice(to_host(dT1), off, b, c), grad_tol(ref.dT, ref.dB_mag));
      expect_close("dscale", to_host(ds), to_host(ds1), [&](std::size_t) {
        return 2 * ((4 * tol.delta + 8 * tol.u * B) * ref.dscale_mag +
                    tol.delta / std::max(o.scale, 1e-30) * ref.G_abs_sum);
      });
    });
  }

  /// Vocabulary-parallel cross-entropy forward + backward, C split by `split` rows per rank.
  /// With `extras`: class weights (shards of one vector), a gradient reaching the LSE, and the
  /// predicted classes and accuracy.
  void cross_entropy(std::mt19937_64& rng, std::int64_t N, const std::vector<std::int64_t>& split, std::int64_t D,
                     tlse::CrossEntropyOptions o, bool with_bias, bool extras = false) {
    const std::int64_t V = std::accumulate(split.begin(), split.end(), std::int64_t(0));
    const std::int64_t vr = split[rank], voff = offset_of(split, rank);
    const Matrix E = random_matrix<T>(rng, N, D), W = random_matrix<T>(rng, V, D, 4.0 / std::sqrt(double(D)));
    std::vector<double> bias;
    if (with_bias)
      for (std::int64_t j = 0; j < V; ++j) bias.push_back(representable<T>(double(rng() % 100) / 50 - 1));
    std::vector<std::int64_t> targets(N);
    for (auto& t : targets) t = rng() % 5 == 0 ? o.ignore_index : std::int64_t(rng() % V);
    const bool none = o.reduction == tlse::Reduction::none;
    std::vector<double> dloss(none ? N : 1);
    for (auto& d : dloss) d = representable<Acc>(double(rng() % 100) / 50 - 0.9);
    tlse::testing::CrossEntropyReferenceExtras rx;
    if (extras) {
      for (std::int64_t j = 0; j < V; ++j)
        rx.class_weight.push_back(representable<Acc>(0.5 + double(rng() % 150) / 100));
      for (std::int64_t i = 0; i < N; ++i) rx.dlse.push_back(representable<Acc>(double(rng() % 200) / 100 - 1));
    }
    const auto ref = tlse::testing::cross_entropy_reference(E, W, bias, targets, o, dloss, rx);
    using Extras = tlse::CrossEntropyExtras<Acc, typename C::Mem>;
    using Predicted = Kokkos::View<std::int64_t*, typename C::Mem>;
    const auto weight = vector_to_device<typename C::AccView>(rx.class_weight);
    const auto dlse = vector_to_device<typename C::AccView>(rx.dlse);
    Predicted predicted1("predicted", extras ? N : 0);
    typename C::AccView accuracy1("accuracy", extras ? 1 : 0);
    Extras fx1, bx1;
    fx1.class_weight = bx1.class_weight = weight;
    fx1.predicted = predicted1, fx1.accuracy = accuracy1;
    bx1.dlse = dlse;

    auto Ed = to_device<C>(E);
    auto tg = index_to_device<typename C::IndexView>(targets);
    auto dl = vector_to_device<typename C::AccView>(dloss);
    auto Wg = to_device<C>(W);
    auto bg = vector_to_device<typename C::VectorView>(bias);
    typename C::AccView loss1("loss", none ? N : 1), lse1("lse", N);
    typename C::MatrixView dE1("dE", N, D), dC1("dC", V, D);
    typename C::VectorView db1("db", with_bias ? V : 0);
    tlse::cross_entropy(exec, Ed, Wg, bg, tg, loss1, lse1, Kokkos::View<int*, typename C::Mem>(), fx1, o);
    tlse::cross_entropy_backward(exec, Ed, Wg, bg, tg, lse1, Kokkos::View<int*, typename C::Mem>(), dl, dE1, dC1, db1,
                                 bx1, o);

    auto Wl = to_device<C>(rows_of(W, voff, vr));
    auto bl = vector_to_device<typename C::VectorView>(with_bias ? slice(bias, voff, vr) : std::vector<double>());
    const auto weight_shard =
        vector_to_device<typename C::AccView>(extras ? slice(rx.class_weight, voff, vr) : std::vector<double>());
    for_each_comm(exec, [&](const auto& comm) {
      typename C::AccView loss("loss", none ? N : 1), lse("lse", N);
      typename C::MatrixView dE("dE", N, D), dC("dC", vr, D);
      typename C::VectorView db("db", with_bias ? vr : 0);
      Predicted predicted("predicted", extras ? N : 0);
      typename C::AccView accuracy("accuracy", extras ? 1 : 0);
      Extras fx, bx;
      fx.class_weight = bx.class_weight = weight_shard;
      fx.predicted = predicted, fx.accuracy = accuracy;
      bx.dlse = dlse;
      tlse::distributed::cross_entropy(comm, Ed, Wl, bl, tg, loss, lse, fx, o);
      tlse::distributed::cross_entropy_backward(comm, Ed, Wl, bl, tg, lse, dl, dE, dC, db, bx, o);
      if (extras) {  // the classes predicted as on one device, but where a row's top two logits nearly tie
        const auto got = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), predicted);
        for (std::int64_t i = 0; i < N; ++i)
          if (ref.predicted[i] < 0 || ref.top_gap[i] > 1e-2) {
            EXPECT_EQ(got(i), ref.predicted[i]) << "row " << i;
          }
        EXPECT_NEAR(to_host(accuracy)[0], ref.accuracy, 2.0 / double(std::max<std::int64_t>(ref.active, 1)));
      }

      double bias_max = 0;
      for (double x : bias) bias_max = std::max(bias_max, std::fabs(x));
      Tolerance<T> tol(E, W, 1.0, bias_max + o.softcap);
      double lse_max = 0, g_max = 0;
      for (double x : ref.lse) lse_max = std::max(lse_max, std::fabs(x));
      for (double x : dloss) g_max = std::max(g_max, std::fabs(x) * (1 + 2 * o.z_loss * lse_max) * (extras ? 2 : 1));
      for (double x : rx.dlse) g_max = std::max(g_max, g_max + std::fabs(x));
      const double lse_tol = 2 * tol.lse(lse_max, V) + 4 * tol.u * size * (lse_max + 1);
      expect_close("lse", to_host(lse), to_host(lse1), [&](std::size_t) { return lse_tol; });
      const double row_tol = 2 * lse_tol * (1 + 2 * o.z_loss * lse_max) * (extras ? 4 : 1);
      expect_close("loss", to_host(loss), to_host(loss1), [&](std::size_t) {
        return none ? row_tol
                    : row_tol * (o.reduction == tlse::Reduction::sum ? double(std::max<std::int64_t>(ref.active, 1))
                                                                     : 1.0) +
                          8 * tol.u * std::fabs(ref.loss) * std::sqrt(double(N) + 1);
      });
      // Filtering skips different tiles in a shard than in the whole vocabulary: each side drops
      // at most eps |g_i| sum_j |C_jk| (resp. |E_ik|).
      const double eps = tlse::impl::resolved_filter_eps<T>(o);
      std::vector<double> colsum_C(D, 0.0), colsum_E(D, 0.0);
      for (std::int64_t j = 0; j < V; ++j)
        for (std::int64_t d = 0; d < D; ++d) colsum_C[d] += std::fabs(W(j, d));
      for (std::int64_t i = 0; i < N; ++i)
        for (std::int64_t d = 0; d < D; ++d) colsum_E[d] += std::fabs(E(i, d));
      expect_close("dE", to_host(dE), to_host(dE1), [&](std::size_t k) {
        return 2 * (tol.grad(ref.dE.v[k], ref.dA_mag.v[k], V, lse_tol) + eps * g_max * colsum_C[k % D]) +
               2 * tol.u_out * ref.dA_mag.v[k];
      });
      expect_close("dC", to_host(dC), slice(to_host(dC1), voff, vr, D), [&](std::size_t k) {
        const std::size_t gk = voff * D + k;
        return 2 * (tol.grad(ref.dC.v[gk], ref.dB_mag.v[gk], N, lse_tol) + eps * g_max * colsum_E[k % D]);
      });
      if (with_bias)
        expect_close("dbias", to_host(db), slice(to_host(db1), voff, vr), [&](std::size_t k) {
          return 2 * tol.grad(ref.dbias[voff + k], ref.dbias_mag[voff + k], N, lse_tol);
        });
    });
  }

  /// Vocabulary-parallel distillation forward + backward, both heads' classifiers split by `split`
  /// rows per rank, against the single-device call on the whole vocabulary.
  void distillation(std::mt19937_64& rng, std::int64_t N, const std::vector<std::int64_t>& split, std::int64_t Ds,
                    std::int64_t Dt, tlse::DistillationOptions o, bool with_targets, bool teacher_grads) {
    const std::int64_t V = std::accumulate(split.begin(), split.end(), std::int64_t(0));
    const std::int64_t vr = split[rank], voff = offset_of(split, rank);
    const Matrix Hs = random_matrix<T>(rng, N, Ds), Ws = random_matrix<T>(rng, V, Ds, 3.0 / std::sqrt(double(Ds)));
    const Matrix Ht = random_matrix<T>(rng, N, Dt), Wt = random_matrix<T>(rng, V, Dt, 3.0 / std::sqrt(double(Dt)));
    std::vector<std::int64_t> targets;
    if (with_targets)
      for (std::int64_t i = 0; i < N; ++i) targets.push_back(rng() % 5 == 0 ? o.ignore_index : std::int64_t(rng() % V));
    const bool none = o.reduction == tlse::Reduction::none;
    std::vector<double> dloss(none ? N : 1);
    for (auto& d : dloss) d = representable<Acc>(double(rng() % 100) / 50 - 0.9);
    const auto ref = distillation_reference(Hs, Ws, Ht, Wt, targets, o, dloss);
    using Stats = Kokkos::View<Acc**, Kokkos::LayoutRight, typename C::Mem>;

    auto Hsd = to_device<C>(Hs), Htd = to_device<C>(Ht);
    auto tg = index_to_device<typename C::IndexView>(targets);
    auto dl = vector_to_device<typename C::AccView>(dloss);
    typename C::AccView loss1("loss", none ? N : 1);
    Stats stats1("row_stats", N, tlse::distillation_row_stats);
    typename C::MatrixView dHs1("dHs", N, Ds), dWs1("dWs", V, Ds), dHt1("dHt", N, Dt), dWt1("dWt", V, Dt);
    auto Wsg = to_device<C>(Ws), Wtg = to_device<C>(Wt);
    tlse::distillation_loss(exec, Hsd, Wsg, Htd, Wtg, tg, loss1, stats1, o);
    tlse::distillation_loss_backward(exec, Hsd, Wsg, Htd, Wtg, tg, stats1, dl, dHs1, dWs1, dHt1, dWt1, o);

    auto Wsl = to_device<C>(rows_of(Ws, voff, vr)), Wtl = to_device<C>(rows_of(Wt, voff, vr));
    for_each_comm(exec, [&](const auto& comm) {
      typename C::AccView loss("loss", none ? N : 1);
      Stats stats("row_stats", N, tlse::distillation_row_stats);
      typename C::MatrixView dHs("dHs", N, Ds), dWs("dWs", vr, Ds);
      typename C::MatrixView dHt("dHt", teacher_grads ? N : 0, Dt), dWt("dWt", teacher_grads ? vr : 0, Dt);
      tlse::distributed::distillation_loss(comm, Hsd, Wsl, Htd, Wtl, tg, loss, stats, o);
      tlse::distributed::distillation_loss_backward(comm, Hsd, Wsl, Htd, Wtl, tg, stats, dl, dHs, dWs, dHt, dWt, o);

      // Both results within the model of test_distillation.cpp; the shards' LSE merges add 4 u
      // (|lse| + 1) each.
      const double s = std::max(1.0 / o.temperature, o.alpha > 0 ? 1.0 : 0.0);
      Tolerance<T> tol_s(Hs, Ws, s), tol_t(Ht, Wt, 1.0 / o.temperature);
      Tolerance<T> tol = tol_s.delta > tol_t.delta ? tol_s : tol_t;
      const double lse_error = tol.lse(ref.lse_max, V) + 4 * tol.u * size * (ref.lse_max + 1);
      const double per_term = 4 * tol.delta + 8 * (tol.u + tol.U_REF) * std::sqrt(double(V) + 1) + 2 * lse_error;
      if (none)
        expect_close("loss", to_host(loss), to_host(loss1),
                     [&](std::size_t i) { return 2 * per_term * ref.row_mag[i] + 1e-30; });
      else
        expect_close("loss", to_host(loss), to_host(loss1), [&](std::size_t) {
          return 2 * per_term * ref.loss_mag + 8 * tol.u * std::fabs(ref.loss) * std::sqrt(double(N) + 1) + 1e-30;
        });
      const auto rows = [&](const Matrix& r, const Matrix& mag, std::int64_t n) {
        return [&, n](std::size_t k) { return 2 * tol.grad(r.v[k], mag.v[k], n, 2 * lse_error) + 1e-30; };
      };
      const auto shard = [&](const Matrix& r, const Matrix& mag, std::int64_t D) {
        return [&, D](std::size_t k) {
          const std::size_t gk = voff * D + k;
          return 2 * tol.grad(r.v[gk], mag.v[gk], N, 2 * lse_error) + 1e-30;
        };
      };
      expect_close("dHs", to_host(dHs), to_host(dHs1), rows(ref.dHs, ref.dHs_mag, V));
      expect_close("dWs", to_host(dWs), slice(to_host(dWs1), voff, vr, Ds), shard(ref.dWs, ref.dWs_mag, Ds));
      if (teacher_grads) {
        expect_close("dHt", to_host(dHt), to_host(dHt1), rows(ref.dHt, ref.dHt_mag, V));
        expect_close("dWt", to_host(dWt), slice(to_host(dWt1), voff, vr, Dt), shard(ref.dWt, ref.dWt_mag, Dt));
      }
    });
  }
};
TYPED_TEST_SUITE(Distributed, TLSE_TEST_CONFIGS, ConfigName);

tlse::ContrastiveOptions contrastive_options(double scale, tlse::Direction d = tlse::Direction::symmetric) {
  tlse::ContrastiveOptions o;
  o.scale = scale;
  o.direction = d;
  return o;
}

TYPED_TEST(Distributed, ContrastiveUnevenRanks) {
  TLSE_SHARED_SEED(rng);
  this->contrastive(rng, uneven_split(71, this->size, false), 37, contrastive_options(1 / 0.07), false);
}

TYPED_TEST(Distributed, ContrastiveGlobalPositivesAndAnEmptyRank) {
  TLSE_SHARED_SEED(rng);
  this->contrastive(rng, uneven_split(53, this->size, true), 19, contrastive_options(10.0), true);
}

TYPED_TEST(Distributed, ContrastiveOneDirection) {
  TLSE_SHARED_SEED(rng);
  this->contrastive(rng, uneven_split(40, this->size, false), 24,
                    contrastive_options(5.0, tlse::Direction::image_to_text), true);
  this->contrastive(rng, uneven_split(40, this->size, false), 24,
                    contrastive_options(5.0, tlse::Direction::text_to_image), true);
}

// Depths the Hopper kernels take (multiples of 8), under the default budget (on Hopper GPUs
// the fused backward per step) and under one that holds no more than the smallest plan (there its
// two passes); elsewhere the budget changes nothing.
TYPED_TEST(Distributed, ContrastiveStepsWithinTheMemoryBudget) {
  TLSE_SHARED_SEED(rng);
  for (std::size_t budget : {tlse::memory_budget_default, std::size_t(1)}) {
    SCOPED_TRACE("memory_budget " + std::to_string(budget));
    auto o = contrastive_options(1 / 0.07);
    o.memory_budget = budget;
    this->contrastive(rng, uneven_split(301, this->size, false), 64, o, false);
  }
}

// A budget that holds the Hopper backward of a step only with K blocks (bf16, 64 features: the
// two passes of 1501 rows against as many columns in blocks of 256 rows and of 256 columns; on
// two ranks the larger rank's 1001 rows in blocks of 512): each step's dT share is summed over
// the blocks in fp32 before it joins the travelling accumulator. Elsewhere the budget changes
// nothing.
TYPED_TEST(Distributed, ContrastiveStepsInKBlocksUnderASmallBudget) {
  if (tlse::impl::is_host_space<typename TypeParam::Exec>())
    GTEST_SKIP() << "the host's backward plans no budget: the other cases cover its ring";
  TLSE_SHARED_SEED(rng);
  auto o = contrastive_options(1 / 0.07);
  o.memory_budget = std::size_t(512) << 10;
  this->contrastive(rng, uneven_split(1501, this->size, false), 64, o, true);
}

TYPED_TEST(Distributed, CrossEntropyShardsWithinTheMemoryBudget) {
  TLSE_SHARED_SEED(rng);
  tlse::CrossEntropyOptions o;
  o.filter_eps = 0;
  for (std::size_t budget : {tlse::memory_budget_default, std::size_t(1)}) {
    SCOPED_TRACE("memory_budget " + std::to_string(budget));
    o.memory_budget = budget;
    this->cross_entropy(rng, 150, uneven_split(1003, this->size, false), 40, o, true);
  }
}

TYPED_TEST(Distributed, CrossEntropyVocabularyShards) {
  TLSE_SHARED_SEED(rng);
  tlse::CrossEntropyOptions o;
  o.filter_eps = 0;
  this->cross_entropy(rng, 45, uneven_split(101, this->size, false), 21, o, false);
  o.reduction = tlse::Reduction::none;
  o.softcap = 15;
  o.shift = 1;
  this->cross_entropy(rng, 33, uneven_split(77, this->size, true), 16, o, true);
}

TYPED_TEST(Distributed, CrossEntropyClassWeightsSmoothingArgmaxAndDlse) {
  TLSE_SHARED_SEED(rng);
  tlse::CrossEntropyOptions o;
  o.filter_eps = 0;
  o.label_smoothing = 0.1;
  o.ignore_index = -1;
  for (auto reduction : {tlse::Reduction::mean, tlse::Reduction::none}) {
    o.reduction = reduction;
    this->cross_entropy(rng, 45, uneven_split(101, this->size, false), 24, o, true, true);
  }
  o.softcap = 15;  // the smoothing term in the tiles; an empty rank
  this->cross_entropy(rng, 33, uneven_split(77, this->size, true), 16, o, false, true);
}

TYPED_TEST(Distributed, CrossEntropySumFilteredZLoss) {
  TLSE_SHARED_SEED(rng);
  tlse::CrossEntropyOptions o;  // filter_eps auto
  o.reduction = tlse::Reduction::sum;
  o.z_loss = 1e-3;
  o.ignore_index = -1;
  this->cross_entropy(rng, 50, uneven_split(131, this->size, false), 29, o, true);
}

// Plain checks that need no dtype sweep, on the default execution space.
using Default = Kokkos::DefaultExecutionSpace;
using DefaultConfig = Config<Default, float>;

TYPED_TEST(Distributed, DistillationVocabularyShards) {
  TLSE_SHARED_SEED(rng);
  for (auto d : {tlse::Divergence::forward_kl, tlse::Divergence::reverse_kl, tlse::Divergence::jsd}) {
    tlse::DistillationOptions o;
    o.divergence = d;
    o.beta = 0.3;
    o.temperature = 2.0;
    o.alpha = 0.5;
    o.shift = 1;
    this->distillation(rng, 45, uneven_split(77, this->size, false), 19, 33, o, true, true);
  }
}

TYPED_TEST(Distributed, DistillationKlsInPanels) {
  TLSE_SHARED_SEED(rng);
  // The KLs with depths that the GPU's tile-pair kernels take (multiples of 8) and a budget that
  // holds panels of 256 columns of 45 rows there (hopper/distillation.hpp): on the GPU the
  // single-device call the shards are checked against runs those panels, two of them.
  for (auto d : {tlse::Divergence::forward_kl, tlse::Divergence::reverse_kl}) {
    tlse::DistillationOptions o;
    o.divergence = d;
    o.temperature = 2.0;
    o.alpha = 0.5;
    o.shift = 1;
    o.memory_budget = 8 * 45 * 256 + 4 * 45 * (24 + 40) + 1536;
    this->distillation(rng, 45, uneven_split(301, this->size, false), 24, 40, o, true, true);
    o.temperature = 1.0;
    this->distillation(rng, 45, uneven_split(301, this->size, true), 24, 40, o, true, false);
  }
}

TYPED_TEST(Distributed, DistillationEmptyRankNoTargetsFrozenTeacher) {
  TLSE_SHARED_SEED(rng);
  tlse::DistillationOptions o;
  o.divergence = tlse::Divergence::jsd;
  o.reduction = tlse::Reduction::none;
  o.temperature = 0.5;
  this->distillation(rng, 33, uneven_split(70, this->size, true), 16, 8, o, false, false);
  o.reduction = tlse::Reduction::sum;
  o.accumulate = true;  // onto zeros: the same values
  this->distillation(rng, 33, uneven_split(70, this->size, true), 16, 8, o, true, true);
}

TEST(DistributedErrors, DistillationVocabularySplitsMustMatch) {
  using C = DefaultConfig;
  Default exec;
  MpiCommunicator<Default> comm(exec, MPI_COMM_WORLD);
  C::MatrixView Hs("Hs", 4, 3), Ws("Ws", 5, 3), Ht("Ht", 4, 2), Wt("Wt", comm.rank() == 0 ? 6 : 5, 2);
  C::AccView loss("loss", 1);
  Kokkos::View<C::Acc**, Kokkos::LayoutRight, C::Mem> stats("stats", 4, tlse::distillation_row_stats);
  const auto [msg, same] = collective_error(
      [&] { tlse::distributed::distillation_loss(comm, Hs, Ws, Ht, Wt, C::IndexView(), loss, stats); });
  EXPECT_TRUE(same) << msg;
  EXPECT_NE(msg.find("'Wt'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("on rank 0"), std::string::npos) << msg;
}

TEST(DistributedRing, StepSendsToTheNextRank) {
  Default exec;
  MpiCommunicator<Default> comm(exec, MPI_COMM_WORLD);
  Kokkos::View<int*, Default::memory_space> send("send", 5), recv("recv", 5);
  const int r = comm.rank(), n = comm.size();
  Kokkos::deep_copy(send, r);
  auto request = comm.ring_step(send, recv);
  request.wait();
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), recv);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(h(i), (r + n - 1) % n);
}

TEST(DistributedRing, BackwardAccumulatesIntoItsOutputs) {
  Default exec;
  MpiCommunicator<Default> comm(exec, MPI_COMM_WORLD);
  TLSE_SHARED_SEED(rng);
  const std::int64_t b = 5 + comm.rank(), c = 7;
  auto I = to_device<DefaultConfig>(random_matrix<float>(rng, b, c, 1.0, true));
  auto T = to_device<DefaultConfig>(random_matrix<float>(rng, b, c, 1.0, true));
  DefaultConfig::AccView loss("loss", 1), rl("rl", b), cl("cl", b), ds("ds", 1), ds2("ds2", 1);
  DefaultConfig::MatrixView dI("dI", b, c), dT("dT", b, c), dI2("dI2", b, c), dT2("dT2", b, c);
  auto dl = vector_to_device<DefaultConfig::AccView>({1.0});
  tlse::ContrastiveOptions o;
  tlse::distributed::contrastive_loss(comm, I, T, DefaultConfig::IntView(), loss, rl, cl, o);
  tlse::distributed::contrastive_loss_backward(comm, I, T, DefaultConfig::IntView(), rl, cl, dl, dI, dT, ds, o);
  for (auto* v : {&dI2, &dT2}) Kokkos::deep_copy(*v, 1.0f);
  Kokkos::deep_copy(ds2, 1.0f);
  o.accumulate = true;
  tlse::distributed::contrastive_loss_backward(comm, I, T, DefaultConfig::IntView(), rl, cl, dl, dI2, dT2, ds2, o);
  const auto plus_one = [](std::vector<double> v) {
    for (double& x : v) x += 1;
    return v;
  };
  const auto tol = [](std::size_t) { return 1e-6; };
  expect_close("dI", to_host(dI2), plus_one(to_host(dI)), tol);
  expect_close("dT", to_host(dT2), plus_one(to_host(dT)), tol);
  expect_close("dscale", to_host(ds2), plus_one(to_host(ds)), tol);
}

TEST(DistributedErrors, AFailingCallbackThrowsNamingIt) {
  Kokkos::DefaultHostExecutionSpace exec;
  MpiCallbacks mpi;
  mpi.fail_allreduce = true;  // on every rank: the ranks fail together, none is left waiting
  tlse::distributed::CallbackCommunicator<Kokkos::DefaultHostExecutionSpace> comm(exec, mpi.callbacks());
  Kokkos::View<float**, Kokkos::LayoutRight, Kokkos::HostSpace> I("I", 3, 4), T("T", 3, 4);
  Kokkos::View<float*, Kokkos::HostSpace> loss("loss", 1), none;
  try {
    tlse::distributed::contrastive_loss(comm, I, T, Kokkos::View<int*, Kokkos::HostSpace>(), loss, none, none);
    ADD_FAILURE() << "no exception";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("allreduce callback failed (code 7)"), std::string::npos) << e.what();
  }
  tlse::distributed::Callbacks incomplete = mpi.callbacks();
  incomplete.ring_wait = nullptr;
  EXPECT_THROW((tlse::distributed::CallbackCommunicator<Kokkos::DefaultHostExecutionSpace>(exec, incomplete)),
               std::invalid_argument);
}

TEST(DistributedErrors, MismatchedFeatureCountsFailOnEveryRank) {
  Default exec;
  MpiCommunicator<Default> comm(exec, MPI_COMM_WORLD);
  const int last = comm.size() - 1;
  const std::int64_t c = comm.rank() == last && comm.size() > 1 ? 9 : 8;
  DefaultConfig::MatrixView I("I", 4, c), T("T", 4, c);
  DefaultConfig::AccView loss("loss", 1);
  const auto [msg, same] = collective_error([&] {
    tlse::distributed::contrastive_loss(comm, I, T, DefaultConfig::IntView(), loss, DefaultConfig::AccView(),
                                        DefaultConfig::AccView());
  });
  EXPECT_TRUE(same) << msg;
  if (comm.size() > 1)
    EXPECT_EQ(msg, "tlse::distributed::contrastive_loss: argument 'I' has columns (features) 9 on rank " +
                       std::to_string(last) + " but 8 on rank 0; every rank must pass the same");
  else
    EXPECT_EQ(msg, "");
}

TEST(DistributedErrors, MismatchedPrecisionFailsOnEveryRank) {
  Default exec;
  MpiCommunicator<Default> comm(exec, MPI_COMM_WORLD);
  if (comm.size() == 1) GTEST_SKIP() << "needs two ranks";
  DefaultConfig::MatrixView I("I", 4, 8), T("T", 4, 8);
  DefaultConfig::AccView loss("loss", 1);
  tlse::ContrastiveOptions o;
  if (comm.rank() == 1) o.precision = tlse::Precision::tf32;
  const auto [msg, same] = collective_error([&] {
    tlse::distributed::contrastive_loss(comm, I, T, DefaultConfig::IntView(), loss, DefaultConfig::AccView(),
                                        DefaultConfig::AccView(), o);
  });
  EXPECT_TRUE(same) << msg;
  EXPECT_EQ(msg, "tlse::distributed::contrastive_loss: argument 'opts.precision' has value (0: exact, 1: tf32) 1 on "
                 "rank 1 but 0 on rank 0; every rank must pass the same");
}

TEST(DistributedErrors, MismatchedScalarTypesFailOnEveryRank) {
  Default exec;
  MpiCommunicator<Default> comm(exec, MPI_COMM_WORLD);
  if (comm.size() == 1) GTEST_SKIP() << "needs two ranks";
  std::string msg;
  bool same = false;
  if (comm.rank() == 1) {
    Config<Default, double>::MatrixView I("I", 4, 8), T("T", 4, 8);
    Config<Default, double>::AccView loss("loss", 1);
    std::tie(msg, same) = collective_error([&] {
      tlse::distributed::contrastive_loss(comm, I, T, DefaultConfig::IntView(), loss,
                                          Config<Default, double>::AccView(), Config<Default, double>::AccView());
    });
  } else {
    DefaultConfig::MatrixView I("I", 4, 8), T("T", 4, 8);
    DefaultConfig::AccView loss("loss", 1);
    std::tie(msg, same) = collective_error([&] {
      tlse::distributed::contrastive_loss(comm, I, T, DefaultConfig::IntView(), loss, DefaultConfig::AccView(),
                                          DefaultConfig::AccView());
    });
  }
  EXPECT_TRUE(same) << msg;
  EXPECT_EQ(msg,
            "tlse::distributed::contrastive_loss: argument 'I' has scalar type double on rank 1 but float on "
            "rank 0; every rank must pass the same");
}

TEST(DistributedErrors, ARankRejectingItsArgumentsStopsEveryRank) {
  Default exec;
  MpiCommunicator<Default> comm(exec, MPI_COMM_WORLD);
  const int last = comm.size() - 1;
  // The last rank passes a vocabulary shard with a bias of the wrong length.
  DefaultConfig::MatrixView E("E", 6, 4), C("C", 5, 4);
  DefaultConfig::VectorView bias("bias", comm.rank() == last ? 4 : 5);
  DefaultConfig::IndexView targets("targets", 6);
  DefaultConfig::AccView loss("loss", 1), lse("lse", 6);
  const auto [msg, same] =
      collective_error([&] { tlse::distributed::cross_entropy(comm, E, C, bias, targets, loss, lse); });
  EXPECT_TRUE(same) << msg;
  EXPECT_EQ(msg,
            "tlse::distributed::cross_entropy: argument 'bias' has extent 4 but this rank's shard of C needs 5 "
            "(on rank " +
                std::to_string(last) + "; no rank exchanged data)");
}

TEST(DistributedErrors, GlobalLabelsOutOfRange) {
  Default exec;
  MpiCommunicator<Default> comm(exec, MPI_COMM_WORLD);
  DefaultConfig::MatrixView I("I", 3, 4), T("T", 3, 4);
  DefaultConfig::AccView loss("loss", 1);
  Kokkos::View<int*, Default::memory_space> labels("labels", 3);
  Kokkos::deep_copy(labels, comm.rank() == 0 ? 3 * comm.size() : 0);  // B = 3 * size: one past the end on rank 0
  const auto [msg, same] = collective_error([&] {
    tlse::distributed::contrastive_loss(comm, I, T, labels, loss, DefaultConfig::AccView(), DefaultConfig::AccView());
  });
  EXPECT_TRUE(same) << msg;
  EXPECT_EQ(
      msg, "tlse::distributed::contrastive_loss: argument 'labels' has labels[0] = " + std::to_string(3 * comm.size()) +
               ", outside [0, " + std::to_string(3 * comm.size()) + ") (on rank 0; no rank exchanged data)");
}

struct RankFailurePrinter : ::testing::EmptyTestEventListener {
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (r.failed())
      std::fprintf(stderr, "[rank %d] %s:%d: failure\n%s\n", world_rank(), r.file_name() ? r.file_name() : "?",
                   r.line_number(), r.message());
  }
};

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (::testing::GTEST_FLAG(list_tests)) return RUN_ALL_TESTS();
  MPI_Init(&argc, &argv);
  setenv("OMP_PROC_BIND", "false", 0);
  int status = 0;
  {
#if defined(KOKKOS_ENABLE_CUDA)
    // One GPU per rank on a node: the node-local rank picks the device.
    MPI_Comm node;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    int local = 0;
    MPI_Comm_rank(node, &local);
    MPI_Comm_free(&node);
    std::string device = "--kokkos-device-id=" + std::to_string(local);
    std::vector<char*> args(argv, argv + argc);
    args.push_back(device.data());
    int nargs = int(args.size());
    Kokkos::ScopeGuard kokkos(nargs, args.data());
#else
    Kokkos::ScopeGuard kokkos(argc, argv);
#endif
#if defined(TLSE_ENABLE_NCCL)
    ncclUniqueId id;
    if (world_rank() == 0) ncclGetUniqueId(&id);
    MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
    if (ncclCommInitRank(&tlse_test_nccl, world_size(), id, world_rank()) != ncclSuccess) {
      std::fprintf(stderr, "ncclCommInitRank failed\n");
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
#endif
    // Only rank 0 prints the progress; every other rank prints its failures, tagged.
    if (world_rank() != 0) {
      auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
      delete listeners.Release(listeners.default_result_printer());
      listeners.Append(new RankFailurePrinter);
    }
    status = RUN_ALL_TESTS();
#if defined(TLSE_ENABLE_NCCL)
    ncclCommDestroy(tlse_test_nccl);
#endif
  }
  MPI_Allreduce(MPI_IN_PLACE, &status, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return status;
}
