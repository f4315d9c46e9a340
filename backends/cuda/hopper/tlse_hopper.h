/* tlse_hopper.h: the C entry points of TiledLSE's Hopper (sm_90a) kernels.
 *
 * libtiledlse_hopper is compiled by a CUDA >= 12.4 compiler for compute_90a, links cudart
 * statically and exports only the functions below, so a program built with another CUDA (the
 * Kokkos side, CUDA 11.8 here) calls it with its own stream and device pointers: both runtimes
 * share the device's primary context. Three kernel families, one mainloop (TMA loads through an
 * mbarrier pipeline, one producer warp, two consumer warpgroups issuing wgmma) with three
 * epilogues:
 *   - tlse_hop_lse_forward: online LSE states of the rows and, from the same tiles, of the
 *     columns (contrastive) and the column logit sums (vocabulary sorting);
 *   - tlse_hop_gradient: a panel of G = scale * dL/dx (the backward's recomputed tiles), with the
 *     row sums (dscale), column sums (dbias) and the per-tile filtering mask;
 *   - tlse_hop_product: out (+)= A x B for the backward's two products (bf16 and fp16: either
 *     operand may be stored transposed; TF32: both K-major, since wgmma reads TF32 K-major only),
 *     skipping the K steps that gradient filtering removed.
 * Every call is deterministic (no atomics; fixed-order reductions) and only enqueues work on the
 * given stream. Each returns 0 or a TLSE_HOP_E* code; tlse_hop_error_string names the problem.
 *
 * Operands are row-major with a leading dimension, 16-byte aligned, in the element type `dtype`
 * (TLSE_HOP_TF32: float data read as TF32). Positions index the operand rows as stored; an
 * optional `index` maps a position to the id the logit model and the softmax terms use. */
#ifndef TLSE_HOPPER_H
#define TLSE_HOPPER_H

#include <stddef.h>
#include <stdint.h>

/* Exported from the library; everything else in it is hidden (tlse_hopper.map). */
#if defined(__GNUC__)
#define TLSE_HOP_API __attribute__((visibility("default")))
#else
#define TLSE_HOP_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

enum tlse_hop_dtype { TLSE_HOP_BF16 = 1, TLSE_HOP_FP16 = 2, TLSE_HOP_TF32 = 3 };

enum tlse_hop_status {
  TLSE_HOP_OK = 0,
  TLSE_HOP_E_DEVICE = 1,   /* no device, or not compute capability 9.0 */
  TLSE_HOP_E_ARGUMENT = 2, /* a shape, alignment, dtype or pointer the kernels cannot take */
  TLSE_HOP_E_LAUNCH = 3    /* a CUDA error at configuration or launch */
};

/** One side of the implicit matrix: `count` rows of `depth` elements, row p at data + p * ld.
 * A row has an id (index) and, on the rows side, a position its outputs take (position); outputs
 * by position have `positions` entries per split. */
typedef struct {
  const void* data;        /**< row 0 */
  int64_t ld;              /**< elements from a row to the next */
  int64_t count;           /**< rows */
  const int32_t* index;    /**< row -> id (the logit model's, the softmax terms', the gradient rows'), or NULL (the
                                identity) */
  const int32_t* position; /**< rows side only: row -> output position (row LSE partials, dscale sums), -1 for a
                                row that takes no part (an ignored token), or NULL (the identity) */
  int64_t positions;       /**< output entries per split (0: count) */
} tlse_hop_side;

/** x = softcap(scale * dot + bias[col id]), or -inf where masked: col id >= valid_cols, or
 * row id + diagonal_offset == col id when exclude_diagonal. */
typedef struct {
  float scale;              /**< multiplies the dot product */
  const void* col_bias;     /**< by column id, in the input type (float for TLSE_HOP_TF32), or NULL */
  float softcap;            /**< 0: none */
  int32_t exclude_diagonal; /**< 1: row id + diagonal_offset == col id is masked */
  int64_t diagonal_offset;  /**< see exclude_diagonal */
  int64_t valid_cols;       /**< col id >= valid_cols is masked; INT64_MAX: every column */
} tlse_hop_logit_model;

/** The rows' partial LSE states of the forward sweep: [column split][rows positions], each the
 * split's over its columns (rows without a position unwritten). */
typedef struct {
  float* max; /**< the split's max of each row */
  float* sum; /**< sum of exp(x - max) */
} tlse_hop_row_partials;

/** The rows' argmax of the forward sweep (rows alone, no exponentials kept): [column split][rows
 * positions], as tlse_hop_row_partials. */
typedef struct {
  float* best;       /**< the split's largest logit of each row, with best_col; NULL: no argmax */
  int32_t* best_col; /**< its column (the lowest of equal ones), INT32_MAX where every logit of the split is -inf */
} tlse_hop_row_argmax;

/** The columns' partials of the forward sweep: [row group][cols.count], each group owning its
 * column slots. */
typedef struct {
  float* max;       /**< the group's max of each column; NULL: no column LSE */
  float* sum;       /**< sum of exp(x - max) */
  float* logit_sum; /**< the group's sum of each column's logits; NULL: no column logit sums */
} tlse_hop_col_partials;

/** The forward's kept exponentials (optional, bf16 or fp16 inputs without column outputs): the
 * training step keeps the tiles' exponentials for its gradient instead of recomputing the tiles. A
 * part of a row is its columns j of column tile n (TLSE_HOP_TILE_N columns) with (j mod 8) / 2 ==
 * q < 4 (a consumer thread's), m the largest of its logits. Each part is under a shift s (shift),
 * and each of its logits x is kept as exp(x - s) in the input type (data). Where every part of a
 * row is under the row's r (row_shift), the row's softmax is exp(r - lse) times its exponentials,
 * and the products can take them as they are (row_scale) instead of a pass over them. TMA stores
 * them (alignments: data, ld, tail). */
typedef struct {
  void* data;             /**< in the input type (bf16, fp16), 16-byte aligned; NULL: none kept. Logit x of a kept
                               column as exp(x - s) at data[row * ld + col] (row < rows.count, col < kept;
                               rows.position NULL), or in panels (panel). bf16 at most e^SPAN
                               (TLSE_HOP_ROW_SHIFT_SPAN), in its normal range down to s - 87 (2^-8 relative; below,
                               0); fp16 2^-11 relative down to 2^-14, below that fp16's subnormal steps of 2^-24
                               (2^-39 of the part's largest) */
  int64_t ld;             /**< elements from a row of data to the next (a multiple of 8). TMA writes a row's last
                               16-byte chunk whole: up to 7 values past kept, within ld, are not to be read */
  float* shift;           /**< with data: the part's shift s at [row * 4 * ceil(kept / TLSE_HOP_TILE_N) + 4 n + q],
                               -inf where every logit of the part is masked. bf16: the row's r when m <= r +
                               TLSE_HOP_ROW_SHIFT_SPAN, else m itself. fp16: s = k ln 2 with k = ceil(m log2 e) -
                               TLSE_HOP_FP16_HEADROOM, an integer, so that a part's values lie in fp16's range up
                               to 2^HEADROOM (its largest above half that) and parts differ by powers of two */
  const float* row_shift; /**< with bf16 data, or NULL (always for fp16): r by row, NULL or r = +inf: none. r should
                               be a logit of the row (the training step's target logit): what lies 87 below it is
                               lost to the row's exponentials and its LSE state */
  int64_t cols;           /**< the columns below it are kept (`kept` above), the other tiles only fold into the row
                               states; 0: every column; else a multiple of TLSE_HOP_TILE_N, at most cols.count */
  int64_t panel;          /**< 0: the kept columns in one matrix; else P (a multiple of TLSE_HOP_TILE_N) columns per
                               panel: column col of panel k = col / P at data[k * panel_stride + row * ld + col -
                               k P] */
  int64_t panel_stride;   /**< with panel: elements from a panel to the next (a multiple of 8, at least rows.count *
                               ld) */
  void* tail;             /**< with panel: the panels from t = tail_panel on, one after another (16-byte aligned):
                               panel k >= t at tail[(k - t) * rows.count * ld + row * ld + col - k P] (the training
                               step keeps panels in its caller's gradient storage and, past it, in its workspace);
                               NULL: none */
  int64_t tail_panel;     /**< with tail: the first panel there (t) */
} tlse_hop_kept_exponentials;

/** The forward sweep: partial LSE states by position, in the layout of the Kokkos-side merge: the
 * rows' per column split, the columns' (and the column logit sums) per row group; optionally the
 * rows' argmax per split, or the kept exponentials. */
typedef struct {
  int32_t dtype;                      /**< TLSE_HOP_BF16, TLSE_HOP_FP16 or TLSE_HOP_TF32 */
  tlse_hop_side rows;                 /**< the rows of the implicit matrix */
  tlse_hop_side cols;                 /**< its columns */
  int64_t depth;                      /**< elements of a row of either side */
  tlse_hop_logit_model logit;         /**< the logit of each entry */
  tlse_hop_row_partials row_partials; /**< the rows' LSE states per column split (both required) */
  tlse_hop_row_argmax argmax;         /**< the rows' largest logit and its column per column split, or NULLs */
  tlse_hop_col_partials col_partials; /**< the columns' LSE states and logit sums per row group, or NULLs */
  tlse_hop_kept_exponentials kept;    /**< the exponentials kept for the training step; data NULL: none */
  int64_t max_col_splits;             /**< at most this many column splits */
  int64_t max_row_groups;             /**< at most this many row groups */
  int64_t col_splits;                 /**< out: the column splits the call used */
  int64_t row_groups;                 /**< out: the row groups the call used */
} tlse_hop_forward_args;

/** One position's share of dL/dx (by id): g * exp(x - lse) - (other id == target ? w : 0).
 * g == NULL: the side contributes nothing. */
typedef struct {
  const float* lse;      /**< by position: the LSE of the position's softmax */
  const float* g;        /**< by position: the weight of its softmax in the loss; NULL: the side adds nothing */
  const int32_t* target; /**< by position: the id of its target on the other side */
  const float* w;        /**< by position: the target's weight */
} tlse_hop_terms;

/** Gradient panel: columns [col_begin, col_end) of the cols side against every row. Writes
 * scale * dL/dx (the rows' and the columns' tlse_hop_terms) in the input type (TF32: float rounded
 * to TF32) as G and/or (TF32) its transpose GT, tiles left unwritten where filtered (tile_mask),
 * and the row and column sums. TMA stores G and GT (ldg, ldgt). */
typedef struct {
  int32_t dtype;              /**< TLSE_HOP_BF16, TLSE_HOP_FP16 (with g_factor) or TLSE_HOP_TF32 */
  tlse_hop_side rows;         /**< the rows of the implicit matrix */
  tlse_hop_side cols;         /**< its columns */
  int64_t depth;              /**< elements of a row of either side */
  tlse_hop_logit_model logit; /**< the logit of each entry */
  tlse_hop_terms row_terms;   /**< the rows' softmax terms */
  tlse_hop_terms col_terms;   /**< the columns' softmax terms */
  float filter_eps;           /**< 0: no filtering, tile_mask may be NULL */
  int64_t col_begin;          /**< the panel's first column */
  int64_t col_end;            /**< one past its last */
  void* G;                    /**< G[row * ldg + col - col_begin] = scale * dL/dx (times *g_factor where given);
                                   NULL: no gradient rows wanted (only the sums) */
  int64_t ldg;                /**< elements from a row of G to the next. TMA writes a line's last 16-byte chunk
                                   whole: the elements past the panel width up to the next 16 bytes, within ldg, get
                                   zeros */
  void* GT;                   /**< GT[(col - col_begin) * ldgt + row]: the same values transposed; NULL: no transpose
                                   wanted (TLSE_HOP_TF32 only: 16-bit products read G transposed) */
  int64_t ldgt;               /**< elements from a row of GT to the next; the elements past the rows up to the next 16
                                   bytes, within ldgt, get zeros (as for ldg) */
  const float* g_factor;      /**< device float G and GT are stored times (not the sums), or NULL: 1. fp16
                                   needs one (entries like p / N fall below its range): a power of two
                                   that puts the largest |G| near 2^14, undone by the products' out_factor */
  uint8_t* tile_mask;         /**< [row tile][panel column tile]: 0 where every softmax entry of the 128 x 256 tile is
                                   below filter_eps and it holds no target (its G and GT left unwritten), 1 otherwise */
  float* row_dot_sums;        /**< [split y][rows positions]: sum over the split's columns of dL/dz * dot; or NULL */
  float* col_sums;            /**< [row tile][col_end - col_begin]: sum over the tile's rows of dL/dz; or NULL */
  int64_t max_col_splits;     /**< at most this many column splits */
  int64_t col_splits;         /**< out: the column splits the call used */
} tlse_hop_gradient_args;

/** out = A (M x K) times B (K x N), fp32 accumulation, into one of out_f32 and out. bf16 and fp16
 * take b_transposed = 1 and either A, or neither transposed; TF32 takes neither transposed (K-major
 * operands). N is even but for out_f32 written (not accumulated) in one K split with ldo > N, where
 * an odd N's column N (within ldo) gets a 0. K is split
 * into at most max_k_splits fixed-order pieces when the output has too few tiles to fill the
 * device; the pieces' fp32 partials go to `workspace`. */
typedef struct {
  int32_t dtype;                /**< TLSE_HOP_BF16, TLSE_HOP_FP16 or TLSE_HOP_TF32 */
  const void* a;                /**< operand A: A(m, k) is a[m * lda + k] (see a_transposed, a_panel) */
  int64_t lda;                  /**< elements from a row of `a` to the next, as stored */
  int32_t a_transposed;         /**< 1: A(m, k) is a[k * lda + m] */
  const void* b;                /**< operand B: B(k, n) is b[n * ldb + k] (see b_transposed) */
  int64_t ldb;                  /**< elements from a row of `b` to the next, as stored */
  int32_t b_transposed;         /**< 1: B(k, n) is b[k * ldb + n] */
  int64_t M;                    /**< rows of the output */
  int64_t N;                    /**< columns of the output */
  int64_t K;                    /**< the depth of the product */
  const uint8_t* mask;          /**< a gradient panel's tile_mask, or NULL. G is operand A: the K steps of a G tile the
                                     panel filtered are skipped */
  int64_t mask_ld;              /**< the mask's columns */
  int32_t mask_of_a_transposed; /**< 0: A is G as stored, mask[m / 128][k / 256]; 1: A is G transposed,
                                     mask[k / 128][m / 256] */
  const float* row_scale;       /**< M factors, or NULL: acc of row m is row_scale[m] * acc (0 where row_scale[m] ==
                                     0, whatever acc) */
  const float* out_factor;      /**< a device float every row's acc is also multiplied by, or NULL */
  float* out_f32;               /**< the output in fp32, or NULL: out_f32[m * ldo + n] = (accumulate ? out_f32[..] : 0)
                                     + acc */
  void* out;                    /**< the output in the input type, or NULL: row out_index[m] (or m),
                                     out[row * ldo + n] = T((accumulate ? out : 0) + acc) */
  const int32_t* out_index;     /**< out's row of product row m (out only), or NULL: m */
  int64_t ldo;                  /**< elements from an output row to the next */
  int32_t accumulate;           /**< 1: the product is added to the output */
  void* workspace;              /**< the K splits' partials (tlse_hop_product_workspace), or NULL */
  size_t workspace_bytes;       /**< bytes at workspace */
  int64_t max_k_splits;         /**< at most this many K splits */
  int64_t k_splits;             /**< out: the K splits the call used */
  int64_t a_panel;              /**< 0: A is one matrix; else P (bf16, fp16; A as stored, no mask; a multiple of 64, K
                                     a multiple of P): A's columns lie in panels of P, A(m, k) is
                                     a[(k / P) * a_panel_stride + m * lda + k % P] (the training step's kept
                                     exponentials, tlse_hop_kept_exponentials: one product over every panel instead of
                                     one per panel, each adding into the output) */
  int64_t a_panel_stride;       /**< with a_panel: elements from a panel of A to the next (a multiple of 8) */
} tlse_hop_product_args;

/** 1 when the library can run on `device` (compute capability 9.0 and a driver that loads its
 * sm_90a code), 0 otherwise. Cheap after the first call. */
TLSE_HOP_API int tlse_hop_device_supported(int device);

/** Fills col_splits and row_groups as tlse_hop_lse_forward will use them (nothing is launched),
 * so that the caller can place the partials; 0 or an error code. The row LSE alone of bf16 or
 * fp16 inputs under the simple logit model runs in clusters of two CTAs sharing their column
 * tiles, unless the environment variable TLSE_HOP_FORWARD is "single" (read at each call: plan
 * and run under the same value). */
TLSE_HOP_API int tlse_hop_lse_forward_plan(tlse_hop_forward_args* args);
TLSE_HOP_API int tlse_hop_lse_forward(tlse_hop_forward_args* args, void* cuda_stream);
TLSE_HOP_API int tlse_hop_gradient(tlse_hop_gradient_args* args, void* cuda_stream);
TLSE_HOP_API int tlse_hop_product(tlse_hop_product_args* args, void* cuda_stream);

/** Bytes of `workspace` tlse_hop_product needs for these sizes: 0 when K is not split, or for sizes below 1 or a
 * dtype that is not a TLSE_HOP_* type (tlse_hop_error_string then names it). */
TLSE_HOP_API size_t tlse_hop_product_workspace(int32_t dtype, int64_t M, int64_t N, int64_t K, int64_t max_k_splits,
                                               int device);

/** The reason for the last non-zero return of this thread's last call, or "". */
TLSE_HOP_API const char* tlse_hop_error_string(void);

/* Tile shapes, for the caller's workspace plans: the gradient panel's tiles and the products' K step. */
enum { TLSE_HOP_TILE_M = 128, TLSE_HOP_TILE_N = 256 };
/* How far above its row's shift a part of the kept bf16 exponentials may reach, and the log2 of
 * the largest value a part of fp16 ones takes (tlse_hop_kept_exponentials). */
enum { TLSE_HOP_ROW_SHIFT_SPAN = 64, TLSE_HOP_FP16_HEADROOM = 15 };

#ifdef __cplusplus
}
#endif
#endif /* TLSE_HOPPER_H */
