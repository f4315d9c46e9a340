#pragma once
// Epilogue of the gradient panel: each recomputed tile of logits becomes dL/dz from the saved
// LSEs (the row side's softmax terms and, for the contrastive loss, the column side's), and
// G = scale * dL/dx is stored in the input type for the two products that follow (fp16 times a
// power of two, g_factor, since entries like p / N fall below its range; for TF32 as
// float rounded to TF32, and also transposed, G^T, since wgmma reads TF32 operands K-major only and
// the two products take G with K along the columns and along the rows). From the same
// values: per row the sum of dL/dz * dot (dscale; the quad merges it when the row tile is done),
// per column the sum of dL/dz over the tile's rows (dbias; one slot per tile), and the tile's
// fate under gradient filtering: a tile whose softmax entries are all below filter_eps and that
// holds no target is marked 0 in tile_mask and not stored (the products skip it).
#include "fragment_reductions.cuh"
#include "staged_store.cuh"

namespace tlse::hopper {

template <class T>
struct GradientParams {
  DeviceSide rows, cols;
  DeviceLogitModel<T> logit;
  DeviceTerms row_terms, col_terms;
  float filter_eps;
  int64_t col_begin, col_end;
  T* G;   // G[row * ldg + col - col_begin], or nullptr
  T* GT;  // G^T: GT[(col - col_begin) * ldgt + row], or nullptr (TF32 only)
  CUtensorMap g_map, gt_map;  // their tensor maps (StagedStore::describe), where they are set
  const float* g_factor;      // G and G^T are stored times *g_factor (fp16's power of two), or nullptr: 1
  uint8_t* tile_mask;
  int64_t mask_ld;
  float* row_dot_sums;
  float* col_sums;
};

/// The gradient panel's kernel variants, a set of flags (template arguments of run_gradient and
/// GradientEpilogue, joined by |). Without Simple some tile may need the general logit model (see
/// LseForwardEpilogue); with it the kernel has only the simple loops, the last column tile masking
/// what lies past the panel.
/// Filter (taken into account with Simple): gradient filtering is on; off (the contrastive
/// loss never filters), the simple loops track no softmax maximum or target hit: 11% fewer
/// instructions in the bf16 kernel (SASS), and a shorter contrastive fwd+bwd
/// (docs/notes/2026-11-26.md, "Sweeps without filter tracking").
/// Capped (with Simple): the row side alone under a softcap, x = capped(scale * dot) (its own
/// kernel: as a branch of the kernel without it, it made that one spill 28 bytes and the
/// cross-entropy fwd+bwd slower; docs/notes/2026-11-26.md, "The softcap on the simple loops").
/// Diagonal (with Simple, without Filter): the model is simple but for the excluded diagonal (the
/// self-similarity form); the simple loops zero each row's entry on it: through the general kernel
/// the form's gradient panels took much longer. A second copy of the loops for the tiles the
/// diagonal meets was slower and kept 360 bytes of stack against 64 (docs/notes/2026-11-28.md,
/// "The self-similarity form's gradient tiles off the general kernel").
enum class GradientVariant : unsigned {
  General = 0,         // no flag: the general logit model where a tile needs it, no filtering
  Simple = 1u << 0,    // no general logit model
  Filter = 1u << 1,    // gradient filtering
  Capped = 1u << 2,    // the row side alone under a softcap
  Diagonal = 1u << 3,  // simple but for the excluded diagonal
};
constexpr GradientVariant operator|(GradientVariant a, GradientVariant b) {
  return GradientVariant(unsigned(a) | unsigned(b));
}
constexpr bool has(GradientVariant set, GradientVariant flag) { return (unsigned(set) & unsigned(flag)) != 0; }

template <class T, GradientVariant Variant>
struct GradientEpilogue {
  static constexpr bool General = !has(Variant, GradientVariant::Simple);
  static constexpr bool Filter = has(Variant, GradientVariant::Filter);
  static constexpr bool Capped = has(Variant, GradientVariant::Capped);
  static constexpr bool Diagonal = has(Variant, GradientVariant::Diagonal);
  static_assert(!Diagonal || (!General && !Filter && !Capped), "Diagonal is a variant of the simple kernel");
  using Params = GradientParams<T>;
  struct SharedStorage {
    TermsAt other[2][TILE_N];  // the column side's terms, a slot per tile's parity
    // The tile's ModelColumns (General) are read while its dL/dz are computed, col_sum after:
    // they share the bytes (shared memory has no room for both; tile() orders them by barriers).
    union {
      float col_sum[8][TILE_N];
      ModelColumn model_columns[TILE_N];
    };
    int flags[2][8];
    StagedStore::Storage staged;  // G's and G^T's boxes on their way out
  };
  static constexpr int ROWS = Fragment::ROWS;
  // A warp's rows of a tile, a box's lines: G's box takes a row per line, G^T's a column per line.
  static constexpr int LINES = StagedStore::LINES;
  static_assert(LINES == 16, "a consumer warp holds 16 rows of a tile (wgmma m64, 4 warps)");

  const Params& p;
  SharedStorage& s;
  int ct;
  int parity = 0;  // alternates s.other's slots and the flag words between tiles
  float row_dot[ROWS];
  TermsAt next_other;  // column ct's softmax terms for the tile whose products run
  ModelColumn next_column;  // column ct's for the tile whose products run, General only

  __device__ GradientEpilogue(const Params& params, SharedStorage& storage, int consumer_thread)
      : p(params), s(storage), ct(consumer_thread) {}

  __device__ static bool keep(const Params&, int, int) { return true; }

  __device__ void begin_row(const Fragment&, const WorkUnit&, int) {
#pragma unroll
    for (int r = 0; r < ROWS; ++r) row_dot[r] = 0.f;
  }

  /// Before tile (m, n)'s products: the column side's terms of column ct, and its general model
  /// where the tile needs it (their loads' latency hides behind the products).
  __device__ void prefetch(const WorkUnit&, int m, int n) {
    next_other = TermsAt{};
    const int64_t col = p.col_begin + int64_t(n) * TILE_N + ct;
    if (p.col_terms.active() && col < p.col_end) next_other.load(p.col_terms, p.cols.id(col));
    if constexpr (General)
      if (general(int64_t(m) * TILE_M, col - ct)) next_column = p.logit.column(p.cols, col, p.col_end);
  }

  /// Whether the tile at (row0, col0) takes the general loop (in a kernel that has one).
  __device__ __forceinline__ bool general(int64_t row0, int64_t col0) const {
    return !(p.logit.simple_tile(row0, TILE_M, col0, TILE_N) && col0 + TILE_N <= p.col_end);
  }

  template <class Acc>
  __device__ __forceinline__ void tile(Acc& acc, const Fragment& c, const WorkUnit&, int m, int n) {
    const int64_t row0 = int64_t(m) * TILE_M, col0 = p.col_begin + int64_t(n) * TILE_N;
    const bool other_on = p.col_terms.active();
    const float eps = p.tile_mask ? p.filter_eps : 0.f;
    // s.other's slot of this tile's parity was last read two tiles ago, before every thread
    // reached the previous tile's barrier; s.col_sum is read until the end of the previous tile,
    // so one barrier serves both. The model's columns share col_sum's bytes: put after every
    // thread is done with the previous tile's, read after the barrier.
    const bool general_tile = General && general(row0, col0);
    if (general_tile) {
      consumer_sync();
      s.model_columns[ct] = next_column;
    }
    if (other_on) {
      s.other[parity][ct] = next_other;
      consumer_sync();
    } else if (p.col_sums || general_tile) {
      consumer_sync();
    }
    const bool inside = col0 + TILE_N <= p.col_end;
    bool significant;
    if constexpr (General) {
      if (general_tile)
        significant = dlogits(acc, c, row0, s.model_columns, eps);
      else
        significant = simple_sides<false>(acc, c, row0, col0, eps);
    } else {
      significant = inside ? simple_sides<false>(acc, c, row0, col0, eps) : simple_sides<true>(acc, c, row0, col0, eps);
    }
    if (p.col_sums) {
      if (general_tile) consumer_sync();  // every thread is done with the model's columns
      column_sums(acc, c, m, col0);
    }
    bool keep = true;
    if (p.tile_mask) {
      keep = consumers_any(significant, s.flags[parity], ct);
      if (ct == 0) p.tile_mask[int64_t(m) * p.mask_ld + n] = keep;
    }
    if (p.G && keep) store(acc, c, m, n);
    if constexpr (std::is_same_v<T, float>)  // only TF32 needs G^T
      if (p.GT && keep) store_transposed(acc, c, m, n);
    parity ^= 1;
  }

  /// simple_dlogits for the sides that are on (at least one; under a softcap the row side alone).
  template <bool Edge, class Acc>
  __device__ __forceinline__ bool simple_sides(Acc& acc, const Fragment& c, int64_t row0, int64_t col0, float eps) {
    const bool own_on = p.row_terms.active(), other_on = p.col_terms.active();
    if constexpr (Capped) {
      return simple_dlogits<true, false, Edge>(acc, c, row0, col0, eps);
    } else {
      if (own_on && other_on) return simple_dlogits<true, true, Edge>(acc, c, row0, col0, eps);
      if (own_on) return simple_dlogits<true, false, Edge>(acc, c, row0, col0, eps);
      return simple_dlogits<false, true, Edge>(acc, c, row0, col0, eps);
    }
  }

  /// dlogits for a tile whose columns all take the simple model (x = scale * dot) and with the
  /// sides' terms fixed at compile time: no test per entry but the target's (measured: half the
  /// instructions of the general loop). Column by column, so that both rows of the thread take
  /// the column's terms from one shared load; a row that takes no part is computed with the
  /// others, left out of the filter's note, and zeroed after. Edge: the panel ends inside the
  /// tile, the entries past it get 0. Capped: x = capped(scale * dot), dL/dz times dx/dz. With
  /// Diagonal, each row's entry in the column its id excludes gets 0 (ids are positions where the
  /// model is simple): one loop for every tile, the test per entry never true off the diagonal.
  template <bool Own, bool Other, bool Edge, class Acc>
  __device__ __forceinline__ bool simple_dlogits(Acc& acc, const Fragment& c, int64_t row0, int64_t col0, float eps) {
    static_assert(!Capped || (Own && !Other), "a softcap takes the row side alone");
    const float scale2 = p.logit.scale * LOG2E;
    float pmax = 0.f;
    bool hit = false;
    bool row_ok[ROWS];
    int32_t rid[ROWS], target_at[ROWS];
    TermsAt own[ROWS];
    [[maybe_unused]] int32_t excluded_at[ROWS];
    [[maybe_unused]] const bool diagonal = Diagonal && p.logit.meets_diagonal(row0, TILE_M, col0, TILE_N);
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      const int64_t row = row0 + c.row(r);
      row_ok[r] = p.rows.output(row) >= 0;
      rid[r] = row_ok[r] ? int32_t(p.rows.id(row)) : 0;
      if (Own && row_ok[r]) own[r].load(p.row_terms, rid[r]);
      // The row's target as an offset from the thread's first column: compared with each
      // column's offset, a constant once the loop is unrolled.
      target_at[r] = own[r].target - int32_t(col0 + c.col(0));  // ids and counts < 2^31
      // The excluded column likewise, where the diagonal meets the tile (the offset is small
      // there); elsewhere an offset no column has.
      if constexpr (Diagonal)
        excluded_at[r] = diagonal ? int32_t(row + p.logit.diagonal_offset - (col0 + c.col(0))) : INT32_MIN;
      if (Own && Filter)
        hit |= row_ok[r] && own[r].target >= col0 && own[r].target < (Edge ? p.col_end : col0 + TILE_N);
    }
#pragma unroll
    for (int j = 0; j < Fragment::COLS; ++j) {
      const int jc = c.col(j);
      if constexpr (Edge)
        if (col0 + jc >= p.col_end) {
#pragma unroll
          for (int r = 0; r < ROWS; ++r) Fragment::at(acc, r, j) = 0.f;
          continue;
        }
      TermsAt other;
      if constexpr (Other) other = s.other[parity][jc];
#pragma unroll
      for (int r = 0; r < ROWS; ++r) {
        float& v = Fragment::at(acc, r, j);
        const float dot = v;
        float dz = 0.f;
        if constexpr (Own) {
          // Under a softcap the entry's logit x = capped(scale * dot) and dL/dz takes dx/dz.
          const float x = Capped ? p.logit.capped(dot * p.logit.scale) : 0.f;
          const float e = Capped ? own[r].softmax(x, LOG2E) : own[r].softmax(dot, scale2);
          const bool is_target = target_at[r] == jc - c.col(0);
          dz = Capped ? own[r].term(e, is_target) * p.logit.dx_dz(x) : own[r].term(e, is_target);
          // With the targets met, the tile survives gradient filtering when !(pmax < eps) (as
          // TermsAt::share decides entry by entry; a NaN wins).
          if constexpr (Filter)
            if (row_ok[r]) pmax = nan_max(pmax, e);
        }
        if constexpr (Other) {
          const float e = other.softmax(dot, scale2);
          const bool is_target = other.target == rid[r];
          const float t = other.term(e, is_target);
          dz = Own ? dz + t : t;
          if constexpr (Filter)
            if (row_ok[r]) hit |= is_target, pmax = nan_max(pmax, e);
        }
        if constexpr (Diagonal)
          if (excluded_at[r] == jc - c.col(0)) dz = 0.f;  // its exponential may be inf: dropped, not scaled
        row_dot[r] += dz * dot;
        v = dz;
      }
    }
#pragma unroll
    for (int r = 0; r < ROWS; ++r)
      if (!row_ok[r]) {
        row_dot[r] = 0.f;
#pragma unroll
        for (int j = 0; j < Fragment::COLS; ++j) Fragment::at(acc, r, j) = 0.f;
      }
    return !(pmax < eps) || hit;
  }

  /// acc: dot products -> dL/dz under the general logit model (bias, softcap, masks, column ids),
  /// the tile's columns staged in cols; a row or column that takes no part gets 0. Column by
  /// column, both rows of the thread from one shared load. Returns whether any entry survives
  /// gradient filtering.
  template <class Acc>
  __device__ __forceinline__ bool dlogits(Acc& acc, const Fragment& c, int64_t row0, const ModelColumn* cols,
                                          float eps) {
    const bool other_on = p.col_terms.active(), own_on = p.row_terms.active();
    bool significant = false;
    bool row_ok[ROWS];
    int32_t rid[ROWS], excluded[ROWS];
    TermsAt own[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      const int64_t row = row0 + c.row(r);
      row_ok[r] = p.rows.output(row) >= 0;
      rid[r] = row_ok[r] ? int32_t(p.rows.id(row)) : 0;
      excluded[r] = row_ok[r] ? p.logit.excluded_id(rid[r]) : -2;
      if (row_ok[r] && own_on) own[r].load(p.row_terms, rid[r]);
    }
#pragma unroll
    for (int j = 0; j < Fragment::COLS; ++j) {
      const int jc = c.col(j);
      const ModelColumn col = cols[jc];
      TermsAt other;
      if (other_on) other = s.other[parity][jc];
#pragma unroll
      for (int r = 0; r < ROWS; ++r) {
        float& v = Fragment::at(acc, r, j);
        const float dot = v;
        float dz = 0.f;
        if (row_ok[r]) {
          const float x = p.logit.at(dot, col, excluded[r]);
          if (x != NEG_INF) {
            float share = own_on ? own[r].share(x, col.id, eps, significant) : 0.f;
            if (other_on) share += other.share(x, rid[r], eps, significant);
            dz = share * p.logit.dx_dz(x);
          }
          row_dot[r] += dz * dot;  // past the panel's end dot is 0 (TMA fills it with zeros)
        }
        v = dz;
      }
    }
    return significant;
  }

  template <class Acc>
  __device__ void column_sums(const Acc& acc, const Fragment& c, int m, int64_t col0) {
    const int warp = ct >> 5, lane = ct & 31, first = scatter_first_column(lane);
    float part[8];
    column_lanes_scatter([&](int j) { return Fragment::at(acc, 0, j) + Fragment::at(acc, 1, j); }, add, lane, part);
#pragma unroll
    for (int k = 0; k < 8; ++k) s.col_sum[warp][c.col(first + k)] = part[k];
    consumer_sync();
    const int64_t col = col0 + ct;
    if (col < p.col_end) {
      float t = 0.f;
#pragma unroll
      for (int q = 0; q < CONSUMER_THREADS / 32; ++q) t += s.col_sum[q][ct];
      p.col_sums[int64_t(m) * (p.col_end - p.col_begin) + col - p.col_begin] = t;
    }
  }

  /// What dL/dz is multiplied by as it is stored: the logit scale (G = dL/dx), times fp16's factor
  /// (the sums above take dL/dz unscaled).
  __device__ __forceinline__ float stored_scale() const {
    return p.g_factor ? p.logit.scale * *p.g_factor : p.logit.scale;
  }

  /// G = scale * dL/dz in the input type, through StagedStore, a row per line.
  template <class Acc>
  __device__ void store(const Acc& acc, const Fragment& c, int m, int n) {
    const float scale = stored_scale();
    StagedStore::put_rows<T>(s.staged, ct >> 5, ct & 31, p.g_map, m, n, c, [&](int r, int j) {
      const float v = Fragment::at(acc, r, j) * scale;
      if constexpr (std::is_same_v<T, float>)
        return stored(v);  // TF32
      else
        return v;  // put_rows rounds it to T
    });
  }

  /// G^T (float) through StagedStore: box k of the warp holds tile columns [16 k, 16 k + 16), a
  /// column per line of its 16 rows (fragment columns 4k to 4k + 3 of the thread).
  template <class Acc>
  __device__ void store_transposed(const Acc& acc, const Fragment& c, int m, int n) {
    const float scale = stored_scale();
    const int warp = ct >> 5, lane = ct & 31;
#pragma unroll
    for (int k = 0; k < TILE_N / LINES; ++k) {
      const auto fill = [&](uint32_t box) {
#pragma unroll
        for (int r = 0; r < ROWS; ++r)
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const float v = stored(Fragment::at(acc, r, 4 * k + i) * scale);
            const int line = c.col_base + 8 * (i >> 1) + (i & 1);
            StagedStore::store4(box + StagedStore::offset(line, ((lane >> 2) + 8 * r) * 4), __float_as_uint(v));
          }
      };
      StagedStore::put(s.staged, warp, lane, k & 1, p.gt_map, m * TILE_M + LINES * warp, n * TILE_N + LINES * k, 0,
                       fill);
    }
  }

  /// A value of G as the products read it: the input type, or for TF32 float rounded to nearest
  /// TF32 (wgmma would otherwise drop the low 13 bits, a bias of up to 2^-10).
  __device__ __forceinline__ static T stored(float v) {
    if constexpr (std::is_same_v<T, float>) {
      uint32_t bits;
      asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(bits) : "f"(v));
      return __uint_as_float(bits);
    } else {
      return T(v);
    }
  }

  __device__ void end_row(const Fragment& c, const WorkUnit& w, int m) {
    if (!p.row_dot_sums) return;
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      const float v = quad_sum(row_dot[r]);
      const int64_t pos = p.rows.output(int64_t(m) * TILE_M + c.row(r));
      if ((ct & 3) == 0 && pos >= 0) p.row_dot_sums[int64_t(w.n_unit) * p.rows.positions + pos] = v;
    }
  }
};

}  // namespace tlse::hopper
