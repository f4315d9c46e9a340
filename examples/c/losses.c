/* The C API from C99: cut cross-entropy and the CLIP contrastive loss, forward and backward, on
 * host memory, checked against plain loops; then a bad target, which fails with a message and
 * leaves the output untouched. */
#include <tlse.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#define CHECK(call)                                                             \
  do {                                                                          \
    if ((call) != TLSE_SUCCESS) {                                               \
      fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, tlse_last_error());   \
      return 1;                                                                 \
    }                                                                           \
  } while (0)

enum { N = 50, V = 300, D = 16, B = 40 };

/* log sum_j exp(x_j) of n values, stably. */
static double lse(const double* x, int n) {
  double m = -INFINITY, s = 0;
  for (int j = 0; j < n; ++j) m = x[j] > m ? x[j] : m;
  for (int j = 0; j < n; ++j) s += exp(x[j] - m);
  return m + log(s);
}

static int cross_entropy(tlse_context* ctx) {
  static float E[N * D], C[V * D], dE[N * D], dC[V * D];
  static int64_t targets[N];
  static double logits[V];
  for (int i = 0; i < N * D; ++i) E[i] = (float)sin(0.37 * i);
  for (int i = 0; i < V * D; ++i) C[i] = (float)cos(0.11 * i);
  for (int i = 0; i < N; ++i) targets[i] = i % 5 == 4 ? -100 : (13 * i) % V; /* every 5th row ignored */

  tlse_cross_entropy_options opts;
  tlse_cross_entropy_options_default(&opts);
  opts.softcap = 20.0;
  float loss = 0, row_lse[N], dloss = 1.0f;
  int32_t order[V];
  CHECK(tlse_cross_entropy_forward(ctx, TLSE_DEVICE_HOST, NULL, TLSE_F32, N, V, D, E, C, NULL, targets, &loss,
                                   row_lse, order, NULL, &opts));
  CHECK(tlse_cross_entropy_backward(ctx, TLSE_DEVICE_HOST, NULL, TLSE_F32, N, V, D, E, C, NULL, targets, row_lse,
                                    order, &dloss, dE, dC, NULL, NULL, &opts));

  double expected = 0;
  int rows = 0;
  for (int i = 0; i < N; ++i) {
    if (targets[i] == -100) continue;
    for (int j = 0; j < V; ++j) {
      double x = 0;
      for (int k = 0; k < D; ++k) x += (double)E[i * D + k] * C[j * D + k];
      logits[j] = opts.softcap * tanh(x / opts.softcap);
    }
    expected += lse(logits, V) - logits[targets[i]];
    ++rows;
  }
  expected /= rows;
  printf("cross-entropy: TiledLSE %.6f, loops %.6f\n", loss, expected);
  if (fabs(loss - expected) > 1e-4 * (1 + fabs(expected))) return 1;

  /* Bad input: a target outside [0, V). The call fails before writing anything. */
  targets[7] = V;
  float untouched = -1.0f;
  tlse_status s = tlse_cross_entropy_forward(ctx, TLSE_DEVICE_HOST, NULL, TLSE_F32, N, V, D, E, C, NULL, targets,
                                             &untouched, NULL, NULL, NULL, NULL);
  printf("bad target: status %d, \"%s\"\n", (int)s, tlse_last_error());
  return s == TLSE_ERROR_INVALID_ARGUMENT && untouched == -1.0f ? 0 : 1;
}

static int contrastive(tlse_context* ctx) {
  static double I[B * D], T[B * D], dI[B * D], dT[B * D], x[B * B], column[B];
  for (int i = 0; i < B * D; ++i) I[i] = 0.3 * sin(0.7 * i), T[i] = 0.3 * cos(0.5 * i);

  tlse_contrastive_options opts;
  tlse_contrastive_options_default(&opts);
  opts.scale = 14.3;
  /* A caller-provided workspace: no allocation inside the calls. */
  CHECK(tlse_contrastive_workspace_bytes(ctx, TLSE_DEVICE_HOST, NULL, TLSE_F64, B, D, &opts, &opts.workspace_bytes));
  opts.workspace = malloc(opts.workspace_bytes);
  double loss = 0, row_lse[B], col_lse[B], dloss = 1.0, dscale = 0;
  CHECK(tlse_contrastive_forward(ctx, TLSE_DEVICE_HOST, NULL, TLSE_F64, B, D, I, T, NULL, &loss, row_lse, col_lse,
                                 &opts));
  CHECK(tlse_contrastive_backward(ctx, TLSE_DEVICE_HOST, NULL, TLSE_F64, B, D, I, T, NULL, row_lse, col_lse, &dloss,
                                  dI, dT, &dscale, NULL, &opts));
  free(opts.workspace);

  for (int i = 0; i < B; ++i)
    for (int j = 0; j < B; ++j) {
      double s = 0;
      for (int k = 0; k < D; ++k) s += I[i * D + k] * T[j * D + k];
      x[i * B + j] = opts.scale * s;
    }
  double expected = 0;
  for (int i = 0; i < B; ++i) {
    for (int j = 0; j < B; ++j) column[j] = x[j * B + i];
    expected += 0.5 * ((lse(x + i * B, B) - x[i * B + i]) + (lse(column, B) - x[i * B + i])) / B;
  }
  printf("contrastive: TiledLSE %.12f, loops %.12f, dL/dscale %.6f\n", loss, expected, dscale);
  return fabs(loss - expected) <= 1e-10 * (1 + fabs(expected)) ? 0 : 1;
}

int main(void) {
  tlse_context* ctx = NULL;
  CHECK(tlse_context_create(&ctx, -1));
  printf("TiledLSE %s\n", tlse_version());
  int failed = cross_entropy(ctx) || contrastive(ctx);
  CHECK(tlse_context_destroy(ctx));
  return failed;
}
