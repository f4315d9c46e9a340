#pragma once
/// \file contrastive_loss.hpp
/// Distributed CLIP contrastive loss (Inf-CL Algorithms 1 and 3, improved): every rank holds
/// its image and text features I_r, T_r (b_r x c, b_r may differ by rank); text blocks travel
/// around a ring of the ranks while each rank computes its rows against the visiting block
/// with the tiled kernels of the core.
///
/// - Forward: one ring for both directions. The visiting block carries its column-LSE and
///   positive-logit accumulators, which arrive home complete after `size` hops.
/// - Backward: the text blocks travel again, with their column LSEs and their gradient
///   accumulators (in the accumulator type), which arrive home complete; dI stays local; dscale
///   is reduced across ranks.
/// - Positives are global indices: the positive of image i may live on any rank.
/// - Double buffering: the next block is received while the current one is computed on; only
///   the small accumulators travel after the compute of a step (and are waited for only at the
///   end of the next step's compute).
#include <tlse/contrastive_loss.hpp>
#include <tlse/distributed/impl/agreement.hpp>
#include <tlse/distributed/impl/ring.hpp>

#include <type_traits>

namespace tlse::distributed {

namespace impl {

/// The metadata every rank contributes, in this order.
enum ContrastiveField { f_rows, f_cols, f_scalar, f_has_labels, f_direction, f_scale, f_precision, contrastive_fields };

/// An optional output whose presence decides a collective step (a ring, an all-reduce): every
/// rank must ask for it or none. `wanted` may be Agreement::any_value (a rank without rows).
struct CollectiveOutput {
  const char* argument;
  std::int64_t wanted;
};

/// What the ranks agreed on: the row layout, and for each CollectiveOutput whether it is wanted.
struct ContrastiveAgreement {
  RowLayout layout;
  std::vector<bool> wanted;
};

/// Checks the arguments on every rank, agrees on the shapes and on `outputs`.
/// `local_checks` covers the call-specific outputs.
template <class Comm, class IV, class TV, class LabelV, class Checks>
ContrastiveAgreement agree_contrastive(const Comm& comm, const tlse::impl::ArgumentChecker& check, const IV& I,
                                       const TV& Tx, const LabelV& labels, const ContrastiveOptions& o,
                                       const std::vector<CollectiveOutput>& outputs, const Checks& local_checks) {
  using T = tlse::impl::scalar_of<IV>;
  const auto& exec = comm.exec();
  std::vector<std::int64_t> meta = {std::int64_t(I.extent(0)), std::int64_t(I.extent(1)), scalar_code<T>(),
                                    // a rank without rows cannot tell whether labels are given
                                    I.extent(0) == 0 ? Agreement::any_value : labels.extent(0) > 0,
                                    std::int64_t(o.direction), double_bits(o.scale), std::int64_t(o.precision)};
  for (const auto& out : outputs) meta.push_back(out.wanted);
  Agreement shapes(comm, check.function(), meta, [&] {
    tlse::impl::check_operands(check, "I", I, "T", Tx);
    if (I.extent(0) != Tx.extent(0))
      check.fail("T", "has " + std::to_string(Tx.extent(0)) + " rows but 'I' has " + std::to_string(I.extent(0)) +
                          "; a rank's image and text blocks must match");
    check.finite_nonnegative<accumulator_t<T>>("scale", o.scale);
    tlse::impl::check_finite(exec, check, "I", I, o.non_finite);
    tlse::impl::check_finite(exec, check, "T", Tx, o.non_finite);
    check.optional("labels", labels, I.extent(0), "this rank's batch (rows of 'I')");
    local_checks();
  });
  shapes.require_same(f_cols, "I", "columns (features)");
  shapes.require_same(f_scalar, "I", "scalar type", scalar_code_name);
  shapes.require_same(f_has_labels, "labels", "a non-empty flag (1: labels given, 0: empty)");
  shapes.require_same(f_direction, "opts.direction", "value");
  shapes.require_same(f_scale, "opts.scale", "bit pattern");
  shapes.require_same(f_precision, "opts.precision", "value (0: exact, 1: tf32)");
  for (std::size_t k = 0; k < outputs.size(); ++k)
    shapes.require_same(contrastive_fields + int(k), outputs[k].argument, "a non-empty flag (1: wanted, 0: empty)");
  ContrastiveAgreement agreed{RowLayout(comm.rank(), comm.size(), [&](int r) { return shapes.value(r, f_rows); }), {}};
  const RowLayout& layout = agreed.layout;
  for (std::size_t k = 0; k < outputs.size(); ++k) {
    bool wanted = false;
    for (int r = 0; r < comm.size(); ++r) wanted |= shapes.value(r, contrastive_fields + int(k)) == 1;
    agreed.wanted.push_back(wanted);
  }
  // Positives are global indices: checked once the global batch is known, agreed again.
  Agreement positives(comm, check.function(), {}, [&] {
    tlse::impl::check_indices(exec, check, "labels", labels, 0, std::int64_t(labels.extent(0)), layout.total, 0, false);
  });
  return agreed;
}

template <class Comm, class T, class Acc>
struct ContrastiveRing {
  using Exec = typename Comm::execution_space;
  using Mem = typename Exec::memory_space;
  template <class U>
  using Vec = Kokkos::View<U*, Mem>;
  template <class U>
  using Mat = Kokkos::View<U**, Kokkos::LayoutRight, Mem>;
  using ConstMat = Kokkos::View<const T**, Kokkos::LayoutRight, Mem, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

  const Comm& comm;
  const RowLayout& L;
  ConstMat I, Tx;  // this rank's blocks
  Acc scale;
  tlse::impl::DirectionWeights w;
  Precision precision;
  Vec<int> positives;  // size x max_rows: every rank's positives (global), padded with -1
  RingStatistics* stats;

  template <class LabelV>
  ContrastiveRing(const Comm& c, const RowLayout& layout, const T* I_, const T* T_, index_t cols, double s, Direction d,
                  Precision prec, const LabelV& labels, RingStatistics* st)
      : comm(c),
        L(layout),
        I(I_, layout.rows[layout.rank], cols),
        Tx(T_, layout.rows[layout.rank], cols),
        scale(Acc(s)),
        w(d),
        precision(prec),
        stats(st) {
    positives = Vec<int>("tlse::all_positives", L.max_rows * L.size);
    comm.allgather(own_positives(labels), positives);
  }

  /// This rank's positives as global indices (labels, or the diagonal), padded to max_rows.
  template <class LabelV>
  Vec<int> own_positives(const LabelV& labels) const {
    const index_t b = L.rows[L.rank], off = L.offset[L.rank];
    Vec<int> mine("tlse::positives", L.max_rows);
    const auto* l = labels.extent(0) ? labels.data() : nullptr;
    Kokkos::parallel_for(
        "tlse::ring_positives", Kokkos::RangePolicy<Exec>(comm.exec(), 0, L.max_rows), KOKKOS_LAMBDA(index_t i) {
          mine(i) = i >= b ? -1 : l ? int(l[i]) : int(off + i);
        });
    return mine;
  }

  index_t rows() const { return L.rows[L.rank]; }

  /// This rank's rows against `ncols` columns at `cols`.
  tlse::impl::TileProblem<T, Acc> problem(const T* cols, index_t ncols) const {
    tlse::impl::TileProblem<T, Acc> p;
    p.rows = {I.data(), nullptr, rows()};
    p.cols = {cols, nullptr, ncols};
    p.depth = index_t(I.extent(1));
    p.logit.scale = scale;
    p.tf32 = precision == Precision::tf32;
    return p;
  }

  /// This rank's text block in a ring buffer of max_rows rows (blocks must have one shape).
  std::pair<Mat<T>, Mat<T>> text_buffers() const {
    Mat<T> a("tlse::ring_text0", L.max_rows, I.extent(1)), b("tlse::ring_text1", L.max_rows, I.extent(1));
    Kokkos::deep_copy(comm.exec(), Kokkos::subview(a, std::make_pair(index_t(0), rows()), Kokkos::ALL), Tx);
    return {a, b};
  }

  /// Forward: row LSE, column LSE (of this rank's texts) and the loss (the same on every rank).
  void forward(Acc* loss, Acc* row_lse_out, Acc* col_lse_out) const {
    const Exec& exec = comm.exec();
    const index_t b = rows(), m = L.max_rows, off_r = L.offset[L.rank];
    const bool col = w.col != 0;
    auto text = text_buffers();
    Mat<T> blocks[2] = {text.first, text.second};
    // A visiting block's accumulators: [LSE of its columns so far | their positive logits].
    Vec<Acc> acc[2] = {Vec<Acc>("tlse::ring_acc0", col ? 2 * m : 0), Vec<Acc>("tlse::ring_acc1", col ? 2 * m : 0)};
    Vec<Acc> row_lse("tlse::row_lse", b), row_pos("tlse::row_pos", b), row_part("tlse::row_part", b),
        row_pair("tlse::row_pair", b), col_part("tlse::col_part", m), col_pair("tlse::col_pair", m);
    Vec<Acc> partials("tlse::partials",
                      tlse::impl::forward_partials_size(tlse::impl::ForwardGrid::plan(exec, b, m), b, m, col, false));
    {
      Acc* a = acc[0].data();
      Acc* rl = row_lse.data();
      Kokkos::parallel_for(
          "tlse::ring_init", Kokkos::RangePolicy<Exec>(exec, 0, m), KOKKOS_LAMBDA(index_t i) {
            if (col) a[i] = -tlse::impl::infinity<Acc>();
            if (i < b) rl[i] = -tlse::impl::infinity<Acc>();
          });
    }
    const int* mine = positives.data() + L.rank * m;
    typename Comm::Request early, late;
    for (int k = 0; k < L.size; ++k) {
      const int cur = k % 2, nxt = 1 - cur, s = L.block_at(k);
      const index_t bs = L.rows[s], off_s = L.offset[s];
      const int* theirs = positives.data() + s * m;
      if (k + 1 < L.size) early = ring_step(comm, blocks[cur], blocks[nxt], stats);
      const auto prob = problem(blocks[cur].data(), bs);
      tlse::impl::lse_forward(exec, prob, tlse::impl::ForwardGrid::plan(exec, b, bs), partials.data(), row_part.data(),
                              col ? col_part.data() : nullptr, (Acc*)nullptr);
      // Positive logits whose two sides meet here: x(i, l_i) for the local images whose positive
      // text visits now, x(l_j, j) for the visiting texts whose positive image is local.
      // Indices outside the block are clamped and their results discarded by the merge below.
      if (b > 0 && bs > 0) {
        tlse::impl::pair_logits(
            exec, prob, b, KOKKOS_LAMBDA(index_t i) { return i; },
            KOKKOS_LAMBDA(index_t i) {
              const index_t l = mine[i] - off_s;
              return l >= 0 && l < bs ? l : index_t(0);
            },
            row_pair.data());
        if (col)
          tlse::impl::pair_logits(
              exec, prob, bs,
              KOKKOS_LAMBDA(index_t j) {
                const index_t l = theirs[j] - off_r;
                return l >= 0 && l < b ? l : index_t(0);
              },
              KOKKOS_LAMBDA(index_t j) { return j; }, col_pair.data());
      }
      {
        Acc *rl = row_lse.data(), *rp = row_pos.data();
        const Acc *part = row_part.data(), *pair = row_pair.data();
        Kokkos::parallel_for(
            "tlse::ring_merge_rows", Kokkos::RangePolicy<Exec>(exec, 0, b), KOKKOS_LAMBDA(index_t i) {
              rl[i] = log_add(rl[i], part[i]);
              const index_t l = mine[i] - off_s;
              if (l >= 0 && l < bs) rp[i] = pair[i];
            });
      }
      if (col) {
        if (k > 0) timed_wait(exec, late, stats);  // this block's accumulators, sent after the previous step
        Acc* a = acc[cur].data();
        const Acc *part = col_part.data(), *pair = col_pair.data();
        Kokkos::parallel_for(
            "tlse::ring_merge_cols", Kokkos::RangePolicy<Exec>(exec, 0, bs), KOKKOS_LAMBDA(index_t j) {
              a[j] = log_add(a[j], part[j]);
              const index_t l = theirs[j] - off_r;
              if (l >= 0 && l < b) a[m + j] = pair[j];
            });
        late = ring_step(comm, acc[cur], acc[nxt], stats);
      }
      if (k + 1 < L.size) timed_wait(exec, early, stats);
      if (stats) ++stats->steps;
    }
    if (col) timed_wait(exec, late, stats);  // this rank's own accumulators, home after `size` hops
    const Acc* home = acc[L.size % 2].data();
    // loss = (1/B) sum over all ranks of w_row (row_lse_i - x(i, l_i)) + w_col (col_lse_i - x(l_i, i)).
    Vec<Acc> terms("tlse::terms", b), total("tlse::total", 1), scratch("tlse::scratch", 1);
    {
      const Acc wr = Acc(w.row), wc = Acc(w.col);
      const Acc *rl = row_lse.data(), *rp = row_pos.data();
      Acc* t = terms.data();
      Kokkos::parallel_for(
          "tlse::ring_terms", Kokkos::RangePolicy<Exec>(exec, 0, b), KOKKOS_LAMBDA(index_t i) {
            Acc v = wr == Acc(0) ? Acc(0) : wr * (rl[i] - rp[i]);
            if (col && wc != Acc(0)) v += wc * (home[i] - home[m + i]);
            t[i] = v;
          });
    }
    tlse::impl::weighted_sum(exec, terms.data(), b, Acc(1), total.data(), false, scratch.data());
    comm.allreduce(total, ReduceOp::sum);
    const Acc inv = L.total > 0 ? Acc(1) / Acc(L.total) : Acc(0);
    const Acc *rl = row_lse.data(), *tot = total.data();
    Kokkos::parallel_for(
        "tlse::ring_outputs", Kokkos::RangePolicy<Exec>(exec, 0, b > 0 ? b : 1), KOKKOS_LAMBDA(index_t i) {
          if (i == 0) loss[0] = tot[0] * inv;
          if (i < b && row_lse_out) row_lse_out[i] = rl[i];
          if (i < b && col_lse_out) col_lse_out[i] = home[i];
        });
    exec.fence();  // the ring buffers die here
  }

  /// Backward: dI (local), dT (home after the ring, when `ring_dT`: every rank must agree),
  /// dscale (reduced; null on every rank or none). dI and dT may be null. A step is one backward
  /// request of the core (tlse::impl::lse_backward): on Hopper GPUs the fused backward, every tile
  /// recomputed once, or its two passes, whichever `budget` holds (as the core call; where the
  /// whole operands do not fit, their products take K blocks of the rows or columns).
  void backward(const Acc* row_lse, const Acc* col_lse, const Acc* dloss, T* dI, T* dT, bool ring_dT, Acc* dscale,
                bool accumulate, std::size_t budget) const {
    const Exec& exec = comm.exec();
    const index_t b = rows(), m = L.max_rows, c = index_t(I.extent(1)), off_r = L.offset[L.rank];
    const bool col = w.col != 0, row = w.row != 0, want_dT = ring_dT;
    auto text = text_buffers();
    Mat<T> blocks[2] = {text.first, text.second};
    Vec<Acc> lses[2] = {Vec<Acc>("tlse::ring_lse0", col ? m : 0), Vec<Acc>("tlse::ring_lse1", col ? m : 0)};
    Mat<Acc> grads[2] = {Mat<Acc>("tlse::ring_dT0", want_dT ? m : 0, c),
                         Mat<Acc>("tlse::ring_dT1", want_dT ? m : 0, c)};
    Mat<Acc> dI_acc("tlse::dI_acc", dI ? b : 0, c);
    // A step's gradients in the input type, before they join the accumulators: the visiting
    // block's dT only once its accumulator has arrived (the transfer overlaps the step).
    Mat<T> dI_step("tlse::ring_dI_step", dI ? b : 0, c), dT_step("tlse::ring_dT_step", want_dT ? m : 0, c);
    Vec<Acc> ds_acc("tlse::dscale_acc", b), ds_part("tlse::dscale_part", b), g_row("tlse::g_row", b),
        g_col("tlse::g_col", m);
    Vec<int> row_target("tlse::row_target", b), col_target("tlse::col_target", m);
    if (col)
      Kokkos::deep_copy(exec, Kokkos::subview(lses[0], std::make_pair(index_t(0), b)),
                        Kokkos::View<const Acc*, Mem, Kokkos::MemoryTraits<Kokkos::Unmanaged>>(col_lse, b));
    {
      const Acc wr = L.total ? Acc(w.row) / Acc(L.total) : Acc(0), wc = L.total ? Acc(w.col) / Acc(L.total) : Acc(0);
      Acc *gr = g_row.data(), *gc = g_col.data();
      Kokkos::parallel_for(
          "tlse::ring_coefficients", Kokkos::RangePolicy<Exec>(exec, 0, m), KOKKOS_LAMBDA(index_t i) {
            if (i < b) gr[i] = wr * dloss[0];
            gc[i] = wc * dloss[0];
          });
    }
    const int* mine = positives.data() + L.rank * m;
    // The scratch of a backend's backward against the largest visiting block (the Hopper
    // kernels' within the budget; none on the host).
    Vec<char> scratch("tlse::backward_scratch",
                      tlse::impl::backward_scratch_bytes<T>(exec, {b, m, c, precision, budget}));
    typename Comm::Request early_text, early_lse, late;
    for (int k = 0; k < L.size; ++k) {
      const int cur = k % 2, nxt = 1 - cur, s = L.block_at(k);
      const index_t bs = L.rows[s], off_s = L.offset[s];
      const int* theirs = positives.data() + s * m;
      if (k + 1 < L.size) {
        early_text = ring_step(comm, blocks[cur], blocks[nxt], stats);
        if (col) early_lse = ring_step(comm, lses[cur], lses[nxt], stats);
      }
      {  // positives as columns of the visiting block, and as rows of this rank
        int *rt = row_target.data(), *ct = col_target.data();
        Kokkos::parallel_for(
            "tlse::ring_targets", Kokkos::RangePolicy<Exec>(exec, 0, m), KOKKOS_LAMBDA(index_t i) {
              const index_t lr = i < b ? mine[i] - off_s : -1, lc = i < bs ? theirs[i] - off_r : -1;
              if (i < b) rt[i] = lr >= 0 && lr < bs ? int(lr) : -1;
              ct[i] = lc >= 0 && lc < b ? int(lc) : -1;
            });
      }
      // dI += G T_s and the dscale parts, and the visiting block's dT share: G^T I.
      tlse::impl::BackwardRequest<T, Acc> r{};
      r.prob = problem(blocks[cur].data(), bs);
      if (row) r.row_terms = {row_lse, g_row.data(), row_target.data(), g_row.data()};
      if (col) r.col_terms = {lses[cur].data(), g_col.data(), col_target.data(), g_col.data()};
      r.grad_rows = dI ? dI_step.data() : nullptr;
      r.grad_cols = want_dT ? dT_step.data() : nullptr;
      r.dscale_part = dscale ? ds_part.data() : nullptr;
      r.scratch = scratch.data();
      r.scratch_bytes = scratch.size();
      tlse::impl::lse_backward(exec, r);
      if (want_dT && k > 0) timed_wait(exec, late, stats);  // this block's accumulator, sent after the previous step
      if (want_dT) add_into(grads[cur].data(), dT_step.data(), bs * c);
      if (dscale) add_into(ds_acc.data(), ds_part.data(), b);
      if (dI) add_into(dI_acc.data(), dI_step.data(), b * c);
      if (want_dT) late = ring_step(comm, grads[cur], grads[nxt], stats);
      if (k + 1 < L.size) {
        timed_wait(exec, early_text, stats);
        if (col) timed_wait(exec, early_lse, stats);
      }
      if (stats) ++stats->steps;
    }
    if (want_dT) {
      timed_wait(exec, late, stats);
      if (dT) store(dT, grads[L.size % 2].data(), b * c, accumulate);
    }
    if (dI) store(dI, dI_acc.data(), b * c, accumulate);
    if (dscale) {
      Vec<Acc> total("tlse::total", 1), scratch("tlse::scratch", 1);
      tlse::impl::weighted_sum(exec, ds_acc.data(), b, Acc(1), total.data(), false, scratch.data());
      comm.allreduce(total, ReduceOp::sum);
      const Acc* tot = total.data();
      Kokkos::parallel_for(
          "tlse::ring_dscale", Kokkos::RangePolicy<Exec>(exec, 0, 1),
          KOKKOS_LAMBDA(int) { dscale[0] = (accumulate ? dscale[0] : Acc(0)) + tot[0]; });
    }
    exec.fence();  // the ring buffers die here
  }

  template <class U>
  void add_into(Acc* to, const U* from, index_t n) const {
    Kokkos::parallel_for(
        "tlse::ring_accumulate", Kokkos::RangePolicy<Exec>(comm.exec(), 0, n),
        KOKKOS_LAMBDA(index_t i) { to[i] += tlse::impl::to_acc<Acc>(from[i]); });
  }
  void store(T* out, const Acc* from, index_t n, bool accumulate) const {
    Kokkos::parallel_for(
        "tlse::ring_store", Kokkos::RangePolicy<Exec>(comm.exec(), 0, n), KOKKOS_LAMBDA(index_t i) {
          out[i] = tlse::impl::from_acc<T>((accumulate ? tlse::impl::to_acc<Acc>(out[i]) : Acc(0)) + from[i]);
        });
  }
};

}  // namespace impl

/// Forward of the contrastive loss over the global batch B = sum of every rank's b_r.
/// comm: MpiCommunicator or NcclCommunicator (its execution space runs the kernels).
/// I, T: this rank's (b_r x c) image and text features, rows [offset_r, offset_r + b_r) of the
/// global batch in rank order. labels: (b_r) global indices in [0, B), or empty on every rank
/// (the diagonal): the positive of image i is text labels[i], of text j image labels[j].
/// loss (1): the global loss, the same on every rank. row_lse, col_lse: (b_r) or empty; the
/// backward needs them. Collective: every rank of comm must call it. opts.workspace is not used
/// (the ring buffers are allocated per call). stats: optional ring statistics, added to.
template <class Comm, class IV, class TV, class LabelV, class LossV, class RowLseV, class ColLseV>
void contrastive_loss(const Comm& comm, const IV& I, const TV& Tx, const LabelV& labels, const LossV& loss,
                      const RowLseV& row_lse, const ColLseV& col_lse, const ContrastiveOptions& opts = {},
                      RingStatistics* stats = nullptr) {
  using Exec = typename Comm::execution_space;
  using T = tlse::impl::scalar_of<IV>;
  using Acc = accumulator_t<T>;
  tlse::impl::static_check_operands<Exec, IV, TV>();
  tlse::impl::static_check_index_vector<Exec, LabelV>();
  tlse::impl::static_check_acc_vector<Exec, T, LossV>();
  tlse::impl::static_check_acc_vector<Exec, T, RowLseV>();
  tlse::impl::static_check_acc_vector<Exec, T, ColLseV>();
  const tlse::impl::ArgumentChecker check("tlse::distributed::contrastive_loss");
  bool want_row = false, want_col = false;
  const auto agreed = impl::agree_contrastive(comm, check, I, Tx, labels, opts, {}, [&] {
    tlse::impl::check_scalar_output(check, "loss", loss, true);
    want_row = check.optional("row_lse", row_lse, I.extent(0), "this rank's batch");
    want_col = check.optional("col_lse", col_lse, I.extent(0), "this rank's batch");
  });
  Kokkos::Profiling::pushRegion("tlse::distributed::contrastive_loss");
  const impl::ContrastiveRing<Comm, T, Acc> ring(comm, agreed.layout, I.data(), Tx.data(), impl::index_t(I.extent(1)),
                                                 opts.scale, opts.direction, opts.precision, labels, stats);
  ring.forward(loss.data(), want_row ? row_lse.data() : nullptr,
               want_col && opts.direction != Direction::image_to_text ? col_lse.data() : nullptr);
  Kokkos::Profiling::popRegion();
}

/// Backward of the distributed forward: takes its inputs and LSEs (col_lse may be empty for
/// image_to_text, row_lse for text_to_image) and dloss (1, the gradient of the global loss, the
/// same on every rank). Writes this rank's dI, dT (b_r x c, or empty) and dscale (1, or empty),
/// the gradient of the global loss with respect to the logit scale, the same on every rank.
/// opts.memory_budget bounds each ring step's backward scratch on this rank (docs/distributed.md).
template <class Comm, class IV, class TV, class LabelV, class RowLseV, class ColLseV, class DLossV, class DIV,
          class DTV, class DScaleV>
void contrastive_loss_backward(const Comm& comm, const IV& I, const TV& Tx, const LabelV& labels,
                               const RowLseV& row_lse, const ColLseV& col_lse, const DLossV& dloss, const DIV& dI,
                               const DTV& dT, const DScaleV& dscale, const ContrastiveOptions& opts = {},
                               RingStatistics* stats = nullptr) {
  using Exec = typename Comm::execution_space;
  using T = tlse::impl::scalar_of<IV>;
  using Acc = accumulator_t<T>;
  tlse::impl::static_check_operands<Exec, IV, TV>();
  tlse::impl::static_check_index_vector<Exec, LabelV>();
  tlse::impl::static_check_acc_vector<Exec, T, RowLseV>();
  tlse::impl::static_check_acc_vector<Exec, T, ColLseV>();
  tlse::impl::static_check_acc_vector<Exec, T, DLossV>();
  tlse::impl::static_check_acc_vector<Exec, T, DScaleV>();
  tlse::impl::static_check_view<Exec, DIV, 2>();
  tlse::impl::static_check_view<Exec, DTV, 2>();
  static_assert(std::is_same<typename DIV::value_type, T>::value && std::is_same<typename DTV::value_type, T>::value,
                "tlse::distributed::contrastive_loss_backward: dI and dT are non-const views of the input scalar type");
  const tlse::impl::ArgumentChecker check("tlse::distributed::contrastive_loss_backward");
  const tlse::impl::DirectionWeights w(opts.direction);
  bool want_dI = false, want_dT = false;
  // dT travels around the ring and dscale is all-reduced: every rank asks for both or none. A
  // rank without rows passes empty views either way and follows the others.
  const std::int64_t any = impl::Agreement::any_value;
  const bool rows_here = I.extent(0) > 0;
  const std::vector<impl::CollectiveOutput> collective = {{"dT", rows_here ? dT.size() > 0 : any},
                                                          {"dscale", dscale.size() > 0}};
  const auto agreed = impl::agree_contrastive(comm, check, I, Tx, labels, opts, collective, [&] {
    const std::size_t b = I.extent(0);
    if (w.row != 0) {
      check.vector("row_lse", row_lse);
      check.extent("row_lse", row_lse.extent(0), b, "this rank's batch (the image-to-text direction)");
    }
    if (w.col != 0) {
      check.vector("col_lse", col_lse);
      check.extent("col_lse", col_lse.extent(0), b, "this rank's batch (the text-to-image direction)");
    }
    tlse::impl::check_scalar_output(check, "dloss", dloss, true);
    tlse::impl::check_scalar_output(check, "dscale", dscale, false);
    want_dI = check.optional_matrix("dI", dI, b, I.extent(1), "I");
    want_dT = check.optional_matrix("dT", dT, b, I.extent(1), "T");
    tlse::impl::check_finite(comm.exec(), check, "dloss", dloss, opts.non_finite);
  });
  Kokkos::Profiling::pushRegion("tlse::distributed::contrastive_loss_backward");
  const impl::ContrastiveRing<Comm, T, Acc> ring(comm, agreed.layout, I.data(), Tx.data(), impl::index_t(I.extent(1)),
                                                 opts.scale, opts.direction, opts.precision, labels, stats);
  ring.backward(row_lse.data(), col_lse.data(), dloss.data(), want_dI ? dI.data() : nullptr,
                want_dT ? dT.data() : nullptr, agreed.wanted[0], dscale.extent(0) ? dscale.data() : nullptr,
                opts.accumulate, opts.memory_budget);
  Kokkos::Profiling::popRegion();
}

}  // namespace tlse::distributed
