/* TiledLSE C API (C99). Log-sum-exp losses over implicit matrices: the CLIP contrastive loss,
 * cut cross-entropy and distillation's divergences between a teacher's and a student's softmax,
 * forward and backward, on raw pointers with explicit shapes.
 *
 * Conventions (docs/c_api.md has the full reference):
 * - Every function returns a tlse_status; on failure tlse_last_error() gives a message naming
 *   the argument and the values, and nothing has been written to the caller's outputs.
 * - Matrices are row-major and contiguous. Matrix operands and their gradients have the call's
 *   tlse_dtype; losses, LSEs, dloss and dscale are `float`, or `double` when the dtype is
 *   TLSE_F64 (the accumulator type). Targets and labels are int64_t; vocab_order is int32_t.
 * - Pointers are used in place (no copies) and must be accessible from `device`: host memory
 *   for TLSE_DEVICE_HOST, CUDA device memory of the context's device for TLSE_DEVICE_CUDA.
 *   Optional arguments are NULL. A NULL output gradient is not computed. Each array is aligned to
 *   the size of its elements, and an array a call writes shares no byte with any other argument
 *   (the workspace included).
 * - Sizes (n, v, d, d_s, d_t, b, c) are at most 2^31 - 1: rows, classes and features are indexed with
 *   32-bit integers.
 * - On CUDA, work is enqueued on `stream` (a cudaStream_t; NULL: the legacy default stream) and
 *   a call may return before it finishes; synchronize the stream before reading the outputs.
 */
#ifndef TLSE_H
#define TLSE_H

#include <stddef.h>
#include <stdint.h>

/* The shared library exports only what this header declares (everything else is hidden). */
#if defined(__GNUC__)
#define TLSE_API __attribute__((visibility("default")))
#else
#define TLSE_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* In C++ the enums are based on int: any int that a C, Fortran or ctypes caller passes is then a
 * value of the parameter's type, which the library reports as a bad argument (an out-of-range
 * value of an enum without a fixed type is undefined behaviour in C++). */
#ifdef __cplusplus
#define TLSE_INT_ENUM : int
#else
#define TLSE_INT_ENUM
#endif

typedef enum tlse_status TLSE_INT_ENUM {
  TLSE_SUCCESS = 0,
  TLSE_ERROR_INVALID_ARGUMENT = 1, /* a bad shape, pointer, option, target, label ... */
  TLSE_ERROR_UNSUPPORTED = 2,      /* e.g. TLSE_DEVICE_CUDA in a library built without CUDA, or a
                                      CUDA build of the library on a machine with no usable GPU */
  TLSE_ERROR_OUT_OF_MEMORY = 3,    /* the internal workspace could not be allocated */
  TLSE_ERROR_RUNTIME = 4           /* anything else (Kokkos, CUDA); see tlse_last_error() */
} tlse_status;

typedef enum tlse_dtype TLSE_INT_ENUM { TLSE_F32 = 0, TLSE_F64 = 1, TLSE_BF16 = 2, TLSE_F16 = 3 } tlse_dtype;
typedef enum tlse_device TLSE_INT_ENUM { TLSE_DEVICE_HOST = 0, TLSE_DEVICE_CUDA = 1 } tlse_device;
typedef enum tlse_reduction TLSE_INT_ENUM {
  TLSE_REDUCTION_NONE = 0,
  TLSE_REDUCTION_SUM = 1,
  TLSE_REDUCTION_MEAN = 2
} tlse_reduction;
typedef enum tlse_direction TLSE_INT_ENUM {
  TLSE_DIRECTION_SYMMETRIC = 0,     /* (image-to-text + text-to-image) / 2, as CLIP */
  TLSE_DIRECTION_IMAGE_TO_TEXT = 1,
  TLSE_DIRECTION_TEXT_TO_IMAGE = 2
} tlse_direction;

/* Arithmetic of the matrix products for TLSE_F32 inputs (options.precision). EXACT: float
 * products on every backend. TF32: where the GPU has TF32 tensor cores (sm_80 and newer), both
 * operands rounded to TF32 (11 significant bits) and accumulated in float, several times faster;
 * a logit's error grows from about 2^-24 to 2^-10 of sqrt(depth) scale |a| |b| (docs/options.md).
 * The host ignores it; so do the other dtypes (bf16 and fp16 run on tensor cores anyway). */
typedef enum tlse_precision TLSE_INT_ENUM { TLSE_PRECISION_EXACT = 0, TLSE_PRECISION_TF32 = 1 } tlse_precision;

/* filter_eps value meaning "the default of the dtype" (eps(dtype) / 32, as CCE). */
#define TLSE_FILTER_EPS_AUTO (-1.0)

/** Options of the cross-entropy calls. Start from tlse_cross_entropy_options_default(). Fields are
 * fixed-width integers and doubles so that the struct maps 1:1 to ctypes and Fortran bind(c). */
typedef struct tlse_cross_entropy_options {
  int64_t ignore_index; /**< rows whose target equals it add nothing to the loss and get zero gradient; not a valid
                           class; default -100 */
  int32_t reduction;         /**< tlse_reduction; default TLSE_REDUCTION_MEAN */
  int32_t accumulate;        /**< backward: 1 adds into dE, dC, dbias instead of overwriting; default 0 */
  int64_t shift;             /**< row i is scored against targets[i + shift]; last `shift` rows ignored; default 0 */
  double softcap;            /**< logits become softcap * tanh(logit / softcap); 0 (default): off */
  double z_loss;             /**< adds z_loss * lse_i^2 to each row's loss; default 0 */
  double filter_eps;         /**< backward gradient filter; TLSE_FILTER_EPS_AUTO (default), 0: exact */
  int32_t detect_non_finite; /**< 1: scan inputs for NaN/Inf first and fail naming them; default 0 */
  int32_t precision;         /**< tlse_precision; default TLSE_PRECISION_EXACT */
  void* workspace;           /**< NULL (default): allocated and freed by each call; else see *_workspace_bytes */
  size_t workspace_bytes;    /**< bytes at workspace (with a workspace) */
  uint64_t memory_budget;    /**< bytes of workspace a call may use (it picks the fastest algorithm that fits);
                                0 (default): 256 MiB. docs/options.md */
  double label_smoothing;    /**< F.cross_entropy's label_smoothing, in [0, 1]: the target distribution puts
                                1 - label_smoothing on the target and label_smoothing / v on every class (times
                                the class weights when given); default 0 */
} tlse_cross_entropy_options;

/** Optional arrays of the cross-entropy calls; any member may be NULL, and a NULL pointer to the
 * struct means none. Each is on `device`, of the acc type unless said; a call given one it does not
 * take fails. docs/c_api.md. */
typedef struct tlse_cross_entropy_extras {
  const void* class_weight; /**< v (this rank's v for a vocabulary shard): F.cross_entropy's `weight`, each class's
                               weight, finite and >= 0; a row's loss is multiplied by its target's weight and `mean`
                               divides by the scored rows' total weight. Every call; give the forward's to the
                               backward */
  const void* dlse;         /**< n: the gradient reaching the forward's lse output (a loss built from the returned
                               LSE, e.g. a z-loss); backward and step only */
  int64_t* predicted;       /**< n: each scored row's argmax class (ties: the lowest id), -1 for rows not scored;
                               forward and step only */
  void* accuracy;           /**< 1: the fraction of scored rows whose argmax is their target; forward and step only */
} tlse_cross_entropy_extras;

/** Options of the contrastive calls. Start from tlse_contrastive_options_default(); the fields
 * shared with tlse_cross_entropy_options mean the same there. */
typedef struct tlse_contrastive_options {
  double scale;              /**< logit scale (1 / temperature), finite and >= 0; default 1 */
  int32_t direction;         /**< tlse_direction; default TLSE_DIRECTION_SYMMETRIC */
  int32_t accumulate;        /**< backward: 1 adds into dI, dT, dscale; default 0 */
  int32_t detect_non_finite; /**< 1: scan inputs for NaN/Inf first and fail naming them; default 0 */
  int32_t precision;         /**< tlse_precision; default TLSE_PRECISION_EXACT */
  void* workspace;           /**< NULL (default): allocated and freed by each call; else see *_workspace_bytes */
  size_t workspace_bytes;    /**< bytes at workspace (with a workspace) */
  uint64_t memory_budget;    /**< as tlse_cross_entropy_options.memory_budget */
} tlse_contrastive_options;

/* The divergence of the distillation calls (options.divergence), between the teacher's softmax
 * p_t and the student's p_s over the same vocabulary (docs/c_api.md). */
typedef enum tlse_divergence TLSE_INT_ENUM {
  TLSE_DIVERGENCE_FORWARD_KL = 0, /* KL(p_t || p_s) = sum_j p_t,j (log p_t,j - log p_s,j) */
  TLSE_DIVERGENCE_REVERSE_KL = 1, /* KL(p_s || p_t) */
  TLSE_DIVERGENCE_JSD = 2         /* beta KL(p_t || m) + (1 - beta) KL(p_s || m), m = beta p_t + (1 - beta) p_s */
} tlse_divergence;

/* Values per row that tlse_distillation_loss saves for its backward (row_stats: n x this, acc type). */
#define TLSE_DISTILLATION_ROW_STATS 5

/** Options of the distillation calls. Start from tlse_distillation_options_default(); the fields
 * shared with tlse_cross_entropy_options mean the same there. */
typedef struct tlse_distillation_options {
  int32_t divergence;        /**< tlse_divergence; default TLSE_DIVERGENCE_FORWARD_KL */
  int32_t reduction;         /**< tlse_reduction; default TLSE_REDUCTION_MEAN (over the scored rows) */
  double beta;               /**< TLSE_DIVERGENCE_JSD's mixing weight of the teacher, in [0, 1] (0 and 1: the forward
                                and the reverse KL); default 0.5 */
  double temperature;        /**< both logits are divided by it, finite and > 0; the divergence is not multiplied
                                by temperature^2; default 1 */
  double alpha;              /**< weight of the student's hard-label cross-entropy (on its logits at temperature 1)
                                in [0, 1]: row loss = alpha CE + (1 - alpha) divergence; > 0 needs targets; default 0 */
  int64_t ignore_index;      /**< rows whose target equals it are not scored; default -100 */
  int64_t shift;             /**< row i is scored against targets[i + shift]; last `shift` rows not scored; default 0 */
  int32_t accumulate;        /**< backward: 1 adds into dHs, dWs, dHt, dWt instead of overwriting; default 0 */
  int32_t detect_non_finite; /**< 1: scan inputs for NaN/Inf first and fail naming them; default 0 */
  void* workspace;           /**< NULL (default): allocated and freed by each call; else see *_workspace_bytes */
  size_t workspace_bytes;    /**< bytes at workspace (with a workspace) */
  uint64_t memory_budget;    /**< as tlse_cross_entropy_options.memory_budget; 0 (default): 256 MiB */
} tlse_distillation_options;

typedef struct tlse_context tlse_context;

/* ---- Library and context ---------------------------------------------------------------- */

/* "major.minor.patch" of the library. */
TLSE_API const char* tlse_version(void);

/* 1 when the library was built for `device`, else 0. */
TLSE_API int tlse_device_available(tlse_device device);

/* Message of the last failing call on this thread ("" if none). Valid until the next call. */
TLSE_API const char* tlse_last_error(void);

/* Creates a context. Initializes Kokkos if it is not initialized yet (then on CUDA device
 * `cuda_device`; -1: Kokkos' default, device 0), else uses the running Kokkos. Any thread may
 * call any function: calls run one at a time (one lock per process). Host calls (TLSE_DEVICE_HOST)
 * with an OpenMP Kokkos must come from outside any OpenMP parallel region, and with Kokkos 3.x also
 * from the thread that initialized Kokkos (Kokkos 4 takes host work from any thread); a call that
 * cannot run fails with TLSE_ERROR_UNSUPPORTED. CUDA calls must come from a thread whose current
 * device is the context's. A destroyed context is an error. */
TLSE_API tlse_status tlse_context_create(tlse_context** context, int cuda_device);

/* Destroys a context. When the last context goes and this library initialized Kokkos, Kokkos
 * is finalized; Kokkos cannot be initialized again in the same process, so keep one context for
 * the life of the program. A Kokkos the host initialized is never finalized here. A program may
 * also exit with its context alive: a Kokkos this library initialized is then finalized at exit
 * (atexit), after which destroying the context still succeeds and other calls fail. */
TLSE_API tlse_status tlse_context_destroy(tlse_context* context);

/* The CUDA device the context's kernels run on, or -1 in a library without CUDA. */
TLSE_API tlse_status tlse_context_cuda_device(const tlse_context* context, int* cuda_device);

TLSE_API void tlse_cross_entropy_options_default(tlse_cross_entropy_options* options);
TLSE_API void tlse_contrastive_options_default(tlse_contrastive_options* options);
TLSE_API void tlse_distillation_options_default(tlse_distillation_options* options);

/* ---- Cut cross-entropy: loss_i = lse_i(C E_i + bias) - (C E_i + bias)_{targets[i+shift]} ---- */

/* Bytes of device memory a caller-provided workspace needs for the forward, the backward and
 * tlse_cross_entropy_with_gradients. */
TLSE_API tlse_status tlse_cross_entropy_workspace_bytes(tlse_context* context, tlse_device device, void* stream,
                                                        tlse_dtype dtype, int64_t n, int64_t v, int64_t d,
                                                        const tlse_cross_entropy_options* options, size_t* bytes);

/* Sets *fused to 1 when tlse_cross_entropy_with_gradients will run the step fused for these
 * sizes and options (a Hopper GPU, bf16 or fp16, want_dbias 0, and an options.memory_budget that
 * holds the logits of a chunk of rows: 3 matrix products instead of 4; or, with accumulate 0, one
 * that holds the backward's buffers: the logits of a part of the classes kept in dC's storage
 * and, as far as the budget allows, in the workspace), else to 0 (it runs the forward and the
 * backward; always on TLSE_DEVICE_HOST). In the second case the call still runs the pair where dE
 * or dC is NULL. want_dbias: nonzero when the call will get a dbias.
 * Lets a caller compute the gradients with the loss only where that pays. */
TLSE_API tlse_status tlse_cross_entropy_step_fused(tlse_context* context, tlse_device device, void* stream,
                                                   tlse_dtype dtype, int64_t n, int64_t v, int64_t d,
                                                   const tlse_cross_entropy_options* options, int want_dbias,
                                                   int* fused);

/* E: n x d, C: v x d (dtype); bias: v (dtype) or NULL; targets: n (int64).
 * Outputs: loss: n (TLSE_REDUCTION_NONE) or 1 (acc type); lse: n or NULL (acc type; the backward
 * needs it); vocab_order: v or NULL (int32; lets the backward skip unlikely classes).
 * extras: NULL, or class_weight, predicted and accuracy (tlse_cross_entropy_extras).
 * options: NULL for the defaults. */
TLSE_API tlse_status tlse_cross_entropy_forward(tlse_context* context, tlse_device device, void* stream,
                                                tlse_dtype dtype, int64_t n, int64_t v, int64_t d, const void* E,
                                                const void* C, const void* bias, const int64_t* targets, void* loss,
                                                void* lse, int32_t* vocab_order,
                                                const tlse_cross_entropy_extras* extras,
                                                const tlse_cross_entropy_options* options);

/* Takes the forward's inputs, its lse and (optional) vocab_order, and dloss shaped like the
 * forward's loss. Writes dE (n x d), dC (v x d), dbias (v); any may be NULL (not computed).
 * extras: NULL, or the forward's class_weight and dlse (tlse_cross_entropy_extras). */
TLSE_API tlse_status tlse_cross_entropy_backward(tlse_context* context, tlse_device device, void* stream,
                                                 tlse_dtype dtype, int64_t n, int64_t v, int64_t d, const void* E,
                                                 const void* C, const void* bias, const int64_t* targets,
                                                 const void* lse, const int32_t* vocab_order, const void* dloss,
                                                 void* dE, void* dC, void* dbias,
                                                 const tlse_cross_entropy_extras* extras,
                                                 const tlse_cross_entropy_options* options);

/* A training step in one call: the forward's loss and the backward's gradients for `dloss`, as
 * tlse_cross_entropy_forward then tlse_cross_entropy_backward would give them (up to rounding),
 * with the same checks. dloss (input) and loss (output) are shaped like the forward's loss; dE,
 * dC, dbias as for the backward (any may be NULL). No lse or vocab_order: the call keeps what
 * it needs. On Hopper GPUs (bf16, dbias NULL), when options.memory_budget holds the logits of
 * a chunk of rows, the forward's logits become the gradient: 3 matrix products instead of 4, and
 * no gradient filtering (as filter_eps = 0). Under a smaller budget that holds the backward's
 * buffers (the default 256 MiB at the usual LM sizes), with accumulate 0 and dE and dC given
 * (ignored rows or not), the logits of the first part of the classes are kept in dC's own storage and
 * the rows times the gradient's row factors in dE's, both overwritten with the gradients before
 * the call returns: those classes take 3 products. Otherwise (and with extras->predicted or
 * accuracy, or label smoothing under a softcap) it runs the two calls, the backward without
 * vocabulary sorting (docs/c_api.md). extras: NULL, or any of its members. */
TLSE_API tlse_status tlse_cross_entropy_with_gradients(tlse_context* context, tlse_device device, void* stream,
                                                       tlse_dtype dtype, int64_t n, int64_t v, int64_t d,
                                                       const void* E, const void* C, const void* bias,
                                                       const int64_t* targets, const void* dloss, void* loss,
                                                       void* dE, void* dC, void* dbias,
                                                       const tlse_cross_entropy_extras* extras,
                                                       const tlse_cross_entropy_options* options);

/* ---- Contrastive (CLIP InfoNCE) loss: x_ij = scale * I_i . T_j ------------------------------ */

TLSE_API tlse_status tlse_contrastive_workspace_bytes(tlse_context* context, tlse_device device, void* stream,
                                                      tlse_dtype dtype, int64_t b, int64_t c,
                                                      const tlse_contrastive_options* options, size_t* bytes);

/* I, T: b x c (dtype); labels: b (int64) or NULL (the positive of image i is text labels[i], of
 * text j image labels[j]; default i <-> i). Outputs (acc type): loss: 1; row_lse, col_lse: b or
 * NULL (the backward needs them; col_lse only when the direction includes text-to-image). */
TLSE_API tlse_status tlse_contrastive_forward(tlse_context* context, tlse_device device, void* stream,
                                              tlse_dtype dtype, int64_t b, int64_t c, const void* I, const void* T,
                                              const int64_t* labels, void* loss, void* row_lse, void* col_lse,
                                              const tlse_contrastive_options* options);

/** The gradients reaching the LSEs tlse_contrastive_forward returned, for a loss built from
 * them (acc type, b each, on `device`); either may be NULL, and a NULL pointer to the struct means
 * none. */
typedef struct tlse_contrastive_extras {
  const void* d_row_lse; /**< b: dL/d row_lse */
  const void* d_col_lse; /**< b: dL/d col_lse (the direction must include text-to-image) */
} tlse_contrastive_extras;

/* dloss: 1 (acc type). Writes dI, dT (b x c, dtype) and dscale (1, acc type: dL/dscale); any may
 * be NULL. extras: NULL, or the gradients reaching the returned LSEs. */
TLSE_API tlse_status tlse_contrastive_backward(tlse_context* context, tlse_device device, void* stream,
                                               tlse_dtype dtype, int64_t b, int64_t c, const void* I, const void* T,
                                               const int64_t* labels, const void* row_lse, const void* col_lse,
                                               const void* dloss, void* dI, void* dT, void* dscale,
                                               const tlse_contrastive_extras* extras,
                                               const tlse_contrastive_options* options);

/* ---- Self-similarity contrastive loss (SimCLR's NT-Xent): x_ij = scale * Z_i . Z_j, j != i ---- */

/* Z: n x c (dtype), n even: rows i and i + n/2 are two views of one sample, each the other's
 * positive; a row's logit with itself is left out. loss (1, acc type) = mean over the n rows of
 * lse_i - x_{i,(i + n/2) mod n}; lse: n (acc type) or NULL (the backward needs it). The options
 * are the contrastive ones; `direction` must stay TLSE_DIRECTION_SYMMETRIC (every row is an
 * anchor already). */
TLSE_API tlse_status tlse_self_contrastive_workspace_bytes(tlse_context* context, tlse_device device, void* stream,
                                                           tlse_dtype dtype, int64_t n, int64_t c,
                                                           const tlse_contrastive_options* options, size_t* bytes);

TLSE_API tlse_status tlse_self_contrastive_forward(tlse_context* context, tlse_device device, void* stream,
                                                   tlse_dtype dtype, int64_t n, int64_t c, const void* Z, void* loss,
                                                   void* lse, const tlse_contrastive_options* options);

/* lse: the forward's; dloss: 1 (acc type). Writes dZ (n x c, dtype) and dscale (1, acc type:
 * dL/dscale); either may be NULL. */
TLSE_API tlse_status tlse_self_contrastive_backward(tlse_context* context, tlse_device device, void* stream,
                                                    tlse_dtype dtype, int64_t n, int64_t c, const void* Z,
                                                    const void* lse, const void* dloss, void* dZ, void* dscale,
                                                    const tlse_contrastive_options* options);

/* ---- Distillation: a divergence between a teacher's and a student's softmax over one vocabulary ----
 * Row i's logits are z_s = Hs_i Ws^T / temperature (student) and z_t = Ht_i Wt^T / temperature
 * (teacher); its loss is alpha CE_i + (1 - alpha) divergence(p_t, p_s), CE_i the student's
 * cross-entropy against targets[i + shift] on Hs_i Ws^T. Hs: n x d_s, Ws: v x d_s, Ht: n x d_t,
 * Wt: v x d_t (dtype; the hidden sizes may differ, the vocabulary is the same); targets: n
 * (int64) or NULL (every row scored; alpha must be 0). No logits are stored: the forward keeps
 * TLSE_DISTILLATION_ROW_STATS values per row for the backward, which recomputes the rest. */

/* Bytes of device memory a caller-provided workspace needs for the forward, the backward and
 * tlse_distillation_loss_with_gradients. */
TLSE_API tlse_status tlse_distillation_loss_workspace_bytes(tlse_context* context, tlse_device device, void* stream,
                                                            tlse_dtype dtype, int64_t n, int64_t v, int64_t d_s,
                                                            int64_t d_t, const tlse_distillation_options* options,
                                                            size_t* bytes);

/* Outputs: loss: n (TLSE_REDUCTION_NONE) or 1 (acc type); row_stats: n x TLSE_DISTILLATION_ROW_STATS
 * (acc type): what the backward needs, written by every forward. options: NULL for the defaults. */
TLSE_API tlse_status tlse_distillation_loss(tlse_context* context, tlse_device device, void* stream, tlse_dtype dtype,
                                            int64_t n, int64_t v, int64_t d_s, int64_t d_t, const void* Hs,
                                            const void* Ws, const void* Ht, const void* Wt, const int64_t* targets,
                                            void* loss, void* row_stats, const tlse_distillation_options* options);

/* Takes the forward's inputs and row_stats, and dloss shaped like the forward's loss. Writes dHs
 * (n x d_s), dWs (v x d_s), dHt (n x d_t), dWt (v x d_t); any may be NULL (not computed: a frozen
 * teacher passes NULL for dHt and dWt). */
TLSE_API tlse_status tlse_distillation_loss_backward(tlse_context* context, tlse_device device, void* stream,
                                                     tlse_dtype dtype, int64_t n, int64_t v, int64_t d_s, int64_t d_t,
                                                     const void* Hs, const void* Ws, const void* Ht, const void* Wt,
                                                     const int64_t* targets, const void* row_stats, const void* dloss,
                                                     void* dHs, void* dWs, void* dHt, void* dWt,
                                                     const tlse_distillation_options* options);

/* Sets *fused to 1 when tlse_distillation_loss_with_gradients will run the step fused for these
 * sizes and options (a Hopper GPU, bf16, d_s and d_t multiples of 8, the forward or the reverse
 * KL, and an options.memory_budget that holds the working panels and a panel of the teacher's
 * kept logits: one sweep of the forward, then the backward's reading those logits), else to 0 (it
 * runs the forward and the backward; always on TLSE_DEVICE_HOST). want_teacher_gradients: nonzero
 * when the call will get dHt. Lets a caller compute the gradients with the loss only where that
 * pays. */
TLSE_API tlse_status tlse_distillation_step_fused(tlse_context* context, tlse_device device, void* stream,
                                                  tlse_dtype dtype, int64_t n, int64_t v, int64_t d_s, int64_t d_t,
                                                  const tlse_distillation_options* options, int want_teacher_gradients,
                                                  int* fused);

/* A training step in one call: the forward's loss and the backward's gradients for `dloss`, the
 * same as tlse_distillation_loss then tlse_distillation_loss_backward would give them (bitwise
 * where it runs them; up to rounding on the Hopper path, whose panels are narrower), with the
 * same checks. dloss (input) and loss (output) are shaped like the forward's loss (acc
 * type) and must not share memory; dHs, dWs, dHt, dWt as for the backward (any may be NULL). No
 * row_stats: the call keeps what it needs. On Hopper GPUs (bf16, the forward or the reverse KL)
 * the teacher's logits of the first panels of the vocabulary are kept between the forward's sweep
 * and the backward's, as far as options.memory_budget allows (with accumulate 0 also in dWs's
 * storage, before dWs is written), and not computed twice (tlse_distillation_step_fused says
 * beforehand); elsewhere it runs the two calls. */
TLSE_API tlse_status tlse_distillation_loss_with_gradients(tlse_context* context, tlse_device device, void* stream,
                                                           tlse_dtype dtype, int64_t n, int64_t v, int64_t d_s,
                                                           int64_t d_t, const void* Hs, const void* Ws, const void* Ht,
                                                           const void* Wt, const int64_t* targets, const void* dloss,
                                                           void* loss, void* dHs, void* dWs, void* dHt, void* dWt,
                                                           const tlse_distillation_options* options);

/* ---- Distributed calls: the caller's communicator, as callbacks --------------------------- */

/* Element types and reductions of tlse_communicator.allreduce. */
typedef enum tlse_comm_dtype TLSE_INT_ENUM {
  TLSE_COMM_F32 = 0,
  TLSE_COMM_F64 = 1,
  TLSE_COMM_I32 = 2,
  TLSE_COMM_I64 = 3
} tlse_comm_dtype;
typedef enum tlse_comm_op TLSE_INT_ENUM { TLSE_COMM_SUM = 0, TLSE_COMM_MAX = 1 } tlse_comm_op;

/** The caller's communication, for the *_distributed calls: any transport (MPI, NCCL, a framework's
 * process group) plugs in through these function pointers. Each returns 0 on success; nonzero
 * makes the call fail with TLSE_ERROR_RUNTIME naming the callback. `user` is passed back
 * unchanged. Buffers are memory of the call's `device` (device memory for TLSE_DEVICE_CUDA),
 * except allgather_host's (host memory); they are complete when handed over (the library waits
 * for its own work first), and received data must be readable by the library's next work on
 * `stream` when a callback returns (ring_wait: when that transfer is done). Every rank calls the
 * same callbacks in the same order with the same sizes. */
typedef struct tlse_communicator {
  void* user; /**< passed back to every callback unchanged */
  int rank;   /**< this process' rank, in [0, size) */
  int size;   /**< number of ranks */
  /** Starts sending `bytes` bytes at `send` to rank+1 and receiving as many from rank-1 into
   * `recv`; stores a handle for ring_wait in *handle. May return before the transfer is done. */
  int (*ring_start)(void* user, const void* send, void* recv, size_t bytes, void** handle);
  /** Waits for the transfer `handle` and releases it. Called exactly once per ring_start. */
  int (*ring_wait)(void* user, void* handle);
  /** In place: `data` (`count` elements of tlse_comm_dtype `dtype`) becomes the element-wise
   * tlse_comm_op `op` over the ranks. Blocking. */
  int (*allreduce)(void* user, void* data, size_t count, int dtype, int op);
  /** `recv` (size * bytes bytes) becomes every rank's `bytes` bytes at `send`, in rank order. Blocking. */
  int (*allgather)(void* user, const void* send, void* recv, size_t bytes);
  /** As allgather, on host memory (a few hundred bytes: the ranks agree on the arguments). */
  int (*allgather_host)(void* user, const void* send, void* recv, size_t bytes);
} tlse_communicator;

/* The distributed calls are collective: every rank of `comm` makes the same call, in the same
 * order. Every rank checks its arguments, then the ranks agree before any data moves: if one
 * rank's arguments are bad, or the ranks disagree (feature count, dtype, options ...), every rank
 * returns TLSE_ERROR_INVALID_ARGUMENT with the same message, naming the argument and the rank.
 * Only a NULL `comm` or an unusable one (a NULL callback, rank outside [0, size)) fails alone.
 * options.workspace is not used (the ring buffers are allocated per call); options.memory_budget
 * bounds each rank's backward scratch, as in the single-device calls (it may differ by rank).
 * docs/distributed.md describes the algorithms. */

/* CLIP loss over the global batch B = sum of the ranks' b: this rank's I, T (b x c, b may differ
 * by rank and be 0) are rows [offset, offset + b) of it, in rank order. labels: b global indices
 * in [0, B), NULL on every rank for the diagonal. loss: the global loss, the same on every rank;
 * row_lse, col_lse: this rank's rows, or NULL (the backward needs them). */
TLSE_API tlse_status tlse_contrastive_forward_distributed(tlse_context* context, const tlse_communicator* comm,
                                                          tlse_device device, void* stream, tlse_dtype dtype,
                                                          int64_t b, int64_t c, const void* I, const void* T,
                                                          const int64_t* labels, void* loss, void* row_lse,
                                                          void* col_lse, const tlse_contrastive_options* options);

/* dloss: 1, the gradient of the global loss (the same on every rank). Writes this rank's dI, dT
 * and dscale (the global loss' gradient, the same on every rank). dT and dscale must be given on
 * every rank or on none (a rank with b = 0 follows the others for dT). */
TLSE_API tlse_status tlse_contrastive_backward_distributed(tlse_context* context, const tlse_communicator* comm,
                                                           tlse_device device, void* stream, tlse_dtype dtype,
                                                           int64_t b, int64_t c, const void* I, const void* T,
                                                           const int64_t* labels, const void* row_lse,
                                                           const void* col_lse, const void* dloss, void* dI,
                                                           void* dT, void* dscale,
                                                           const tlse_contrastive_options* options);

/* Vocabulary-parallel cross-entropy: E (n x d) and targets (n, global class ids or ignore_index)
 * are the same on every rank; C (v x d) and bias (v or NULL) are this rank's shard, classes
 * [sum of the previous ranks' v, + v) of the global vocabulary. loss and lse (the global ones)
 * come out the same on every rank. extras: class_weight is this rank's shard (v; on every rank or
 * none); predicted (global class ids) and accuracy come out the same on every rank (asked for on
 * every rank or none). */
TLSE_API tlse_status tlse_cross_entropy_forward_distributed(tlse_context* context, const tlse_communicator* comm,
                                                            tlse_device device, void* stream, tlse_dtype dtype,
                                                            int64_t n, int64_t v, int64_t d, const void* E,
                                                            const void* C, const void* bias, const int64_t* targets,
                                                            void* loss, void* lse,
                                                            const tlse_cross_entropy_extras* extras,
                                                            const tlse_cross_entropy_options* options);

/* Writes the full dE (the same on every rank; given on every rank or none) and this rank's dC,
 * dbias shards; any may be NULL. extras: the forward's class_weight shard, and dlse (n, the same
 * on every rank). */
TLSE_API tlse_status tlse_cross_entropy_backward_distributed(tlse_context* context, const tlse_communicator* comm,
                                                             tlse_device device, void* stream, tlse_dtype dtype,
                                                             int64_t n, int64_t v, int64_t d, const void* E,
                                                             const void* C, const void* bias, const int64_t* targets,
                                                             const void* lse, const void* dloss, void* dE, void* dC,
                                                             void* dbias, const tlse_cross_entropy_extras* extras,
                                                             const tlse_cross_entropy_options* options);

#ifdef __cplusplus
}
#endif

#endif /* TLSE_H */
