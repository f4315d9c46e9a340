// Checks the three kernel families of libtiledlse_hopper directly, against a float64 reference
// that materializes the matrix: shapes that are not multiples of any tile, fresh random inputs per
// run, extreme logits. The argument checks run anywhere; the kernels need an sm_90 GPU (exit 77:
// not run, without one). The library's users (the Kokkos::Cuda specializations) are checked by
// the whole unit suite on top of this.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "tlse_hopper.h"

namespace {

int failures = 0;
/// Fresh inputs per run; TLSE_TEST_SEED replays a run's (main prints the seed).
const unsigned seed = std::getenv("TLSE_TEST_SEED") ? unsigned(std::strtoul(std::getenv("TLSE_TEST_SEED"), nullptr, 10))
                                                    : std::random_device{}();
std::mt19937_64 rng(seed);

#define CUDA_OK(x)                                                                         \
  do {                                                                                     \
    cudaError_t e_ = (x);                                                                  \
    if (e_ != cudaSuccess) {                                                               \
      std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
      std::exit(1);                                                                        \
    }                                                                                      \
  } while (0)

void expect(bool ok, const std::string& what) {
  std::printf("  %-72s %s\n", what.c_str(), ok ? "ok" : "FAILED");
  if (!ok) ++failures;
}

/// Host copy of an operand in the input type, and its values as the tensor cores see them.
struct Operand {
  int dtype;
  int64_t rows, depth;
  std::vector<unsigned char> bytes;
  std::vector<double> value;
  int elem() const { return dtype == TLSE_HOP_TF32 ? 4 : 2; }
  void fill(double stddev) {
    std::normal_distribution<double> n(0.0, stddev);
    bytes.assign(size_t(rows * depth * elem()), 0);
    value.resize(size_t(rows * depth));
    for (int64_t i = 0; i < rows * depth; ++i) {
      const float v = float(n(rng));
      if (dtype == TLSE_HOP_BF16) {
        const __nv_bfloat16 b = __float2bfloat16(v);
        std::memcpy(&bytes[i * 2], &b, 2);
        value[i] = double(__bfloat162float(b));
      } else if (dtype == TLSE_HOP_FP16) {
        const __half h = __float2half(v);
        std::memcpy(&bytes[i * 2], &h, 2);
        value[i] = double(__half2float(h));
      } else {
        std::memcpy(&bytes[i * 4], &v, 4);
        value[i] = double(v);
      }
    }
  }
  /// TF32 data made exact in TF32 (the low 13 bits cleared, rounding to nearest), so that a
  /// reference from `value` is the product the tensor cores compute.
  void round_to_tf32() {
    for (int64_t i = 0; i < rows * depth; ++i) {
      uint32_t bits;
      std::memcpy(&bits, &bytes[i * 4], 4);
      bits = (bits + 0x1000u) & ~0x1fffu;
      float v;
      std::memcpy(&v, &bits, 4);
      std::memcpy(&bytes[i * 4], &bits, 4);
      value[i] = double(v);
    }
  }
};

std::vector<double> logits(const Operand& A, const Operand& B, double scale) {
  std::vector<double> x(size_t(A.rows * B.rows));
  for (int64_t i = 0; i < A.rows; ++i)
    for (int64_t j = 0; j < B.rows; ++j) {
      double d = 0;
      for (int64_t k = 0; k < A.depth; ++k) d += A.value[i * A.depth + k] * B.value[j * B.depth + k];
      x[i * B.rows + j] = scale * d;
    }
  return x;
}

template <class T>
std::vector<T> download(const T* d, size_t n) {
  std::vector<T> h(n);
  CUDA_OK(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
  return h;
}

/// The device memory of one check, freed when the check returns, on its failure paths too.
class DeviceBuffers {
 public:
  DeviceBuffers() = default;
  DeviceBuffers(const DeviceBuffers&) = delete;
  DeviceBuffers& operator=(const DeviceBuffers&) = delete;
  ~DeviceBuffers() {
    for (void* d : owned_) cudaFree(d);
  }
  /// n uninitialized values of T (nullptr for none).
  template <class T>
  T* allocate(size_t n) {
    if (n == 0) return nullptr;
    void* d = nullptr;
    CUDA_OK(cudaMalloc(&d, n * sizeof(T)));
    owned_.push_back(d);
    return static_cast<T*>(d);
  }
  /// n values of T whose every byte is `byte`.
  template <class T>
  T* filled(size_t n, unsigned char byte) {
    T* d = allocate<T>(n);
    CUDA_OK(cudaMemset(d, byte, n * sizeof(T)));
    return d;
  }
  /// A device copy of v.
  template <class T>
  T* upload(const std::vector<T>& v) {
    T* d = allocate<T>(v.size());
    CUDA_OK(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
    return d;
  }
  /// An operand's values in its input type.
  void* upload(const Operand& op) { return upload(op.bytes); }

 private:
  std::vector<void*> owned_;
};

/// The products' row scales: uniform in [-2, 2], every seventh 0 (an exact zero however large
/// the row's sums).
std::vector<float> random_row_scales(int64_t M) {
  std::vector<float> row_scale(static_cast<size_t>(M));
  std::uniform_real_distribution<float> factor(-2.f, 2.f);
  for (int64_t m = 0; m < M; ++m) row_scale[size_t(m)] = m % 7 == 3 ? 0.f : factor(rng);
  return row_scale;
}

/// The value of one element in the input type of `dtype`, stored at `at` (TF32: a float).
double element_value(int dtype, const unsigned char* at) {
  if (dtype == TLSE_HOP_TF32) {
    float f;
    std::memcpy(&f, at, sizeof f);
    return f;
  }
  if (dtype == TLSE_HOP_FP16) {
    __half h;
    std::memcpy(&h, at, sizeof h);
    return double(__half2float(h));
  }
  __nv_bfloat16 b;
  std::memcpy(&b, at, sizeof b);
  return double(__bfloat162float(b));
}

/// n elements of the input type of `dtype` from the device, as values.
std::vector<double> download_values(int dtype, const void* d, size_t n) {
  const size_t elem = dtype == TLSE_HOP_TF32 ? 4 : 2;
  const auto bytes = download(static_cast<const unsigned char*>(d), n * elem);
  std::vector<double> h(n);
  for (size_t i = 0; i < n; ++i) h[i] = element_value(dtype, &bytes[i * elem]);
  return h;
}

double merge_lse(const std::vector<float>& max, const std::vector<float>& sum, int64_t parts, int64_t n, int64_t i) {
  double m = -INFINITY;
  for (int64_t p = 0; p < parts; ++p) m = std::max(m, double(max[p * n + i]));
  double s = 0;
  for (int64_t p = 0; p < parts; ++p)
    if (max[p * n + i] != -INFINITY) s += double(sum[p * n + i]) * std::exp(double(max[p * n + i]) - m);
  return m + std::log(s);
}

/// The LSE of n logits of x from x[first], `stride` apart (a row: 1, a column: the row length).
double lse_along(const std::vector<double>& x, int64_t first, int64_t stride, int64_t n) {
  double m = -INFINITY, s = 0;
  for (int64_t k = 0; k < n; ++k) m = std::max(m, x[size_t(first + k * stride)]);
  for (int64_t k = 0; k < n; ++k) s += std::exp(x[size_t(first + k * stride)] - m);
  return m + std::log(s);
}

/// sum_k |a_ik b_jk| over the depth D of row i of A and row j of B: the scale of the fp32
/// rounding of their dot product.
double abs_dot(const Operand& A, int64_t i, const Operand& B, int64_t j, int64_t D) {
  double s = 0;
  for (int64_t k = 0; k < D; ++k) s += std::fabs(A.value[i * D + k] * B.value[j * D + k]);
  return s;
}

/// The arguments every sweep check shares (Args: tlse_hop_forward_args or tlse_hop_gradient_args):
/// operands R x D and C x D (leading dimension D), x = scale * dot for every column; the rest is the
/// caller's to set.
template <class Args>
Args sweep_args(int dtype, const void* a, const void* b, int64_t R, int64_t C, int64_t D, double scale) {
  Args f{};
  f.dtype = dtype;
  f.rows = {a, D, R, nullptr};
  f.cols = {b, D, C, nullptr};
  f.depth = D;
  f.logit.scale = float(scale);
  f.logit.valid_cols = INT64_MAX;
  return f;
}

/// The rows-only forward's schedule the library takes now (tlse_hopper.h), for a check's name.
std::string forward_schedule() {
  const char* forced = std::getenv("TLSE_HOP_FORWARD");
  return forced && *forced ? std::string(" (TLSE_HOP_FORWARD=") + forced + ")" : std::string();
}

/// Forward: row LSE, column LSE and column logit sums against the reference. The tolerance is the
/// logits' float accumulation error (depth * 2^-24 * scale * sum |a||b|, bounded generously) plus
/// TF32's operand rounding (2^-10 relative per operand) where it applies. valid < C masks the
/// columns from valid on (they take no part), which runs the kernel with the general logit model;
/// without it every column is x = scale * dot and the kernel has only the simple one. Without
/// the logit sums (sums false: the contrastive loss's forward) that kernel takes one exponential
/// per entry for both sides in the tiles whose logits lie within 64 of each other. diagonal:
/// entry (i, i + diagonal) is masked (the self-similarity form's mask, diagonal 0), the general
/// model in the tiles it meets and the simple one elsewhere, in the same kernel. columns false:
/// the row LSE alone (the cross-entropy forward), under a softcap when softcap > 0 (x = softcap
/// tanh(scale dot / softcap)).
constexpr int64_t NO_DIAGONAL = INT64_MIN;
void check_forward(int dtype, int64_t R, int64_t C, int64_t D, double scale, double stddev, int64_t valid = INT64_MAX,
                   bool sums = true, int64_t diagonal = NO_DIAGONAL, bool columns = true, double softcap = 0) {
  Operand A{dtype, R, D}, B{dtype, C, D};
  A.fill(stddev), B.fill(stddev);
  std::vector<double> x = logits(A, B, scale);
  for (double& v : x)
    if (softcap > 0) v = softcap * std::tanh(v / softcap);
  for (int64_t i = 0; diagonal != NO_DIAGONAL && i < R; ++i)
    if (i + diagonal >= 0 && i + diagonal < C) x[i * C + i + diagonal] = -INFINITY;
  const auto magnitude = [](double v) { return std::isfinite(v) ? std::fabs(v) : 0.0; };
  DeviceBuffers mem;
  void *dA = mem.upload(A), *dB = mem.upload(B);
  const int64_t max_splits = 8, max_groups = 4;
  const size_t n_parts = size_t(2 * max_splits * R + 3 * max_groups * C);
  float* parts = mem.allocate<float>(n_parts);
  auto a = sweep_args<tlse_hop_forward_args>(dtype, dA, dB, R, C, D, scale);
  a.row_partials.max = parts, a.row_partials.sum = parts + max_splits * R;
  if (columns) {
    a.col_partials.max = parts + 2 * max_splits * R, a.col_partials.sum = a.col_partials.max + max_groups * C,
    a.col_partials.logit_sum = sums ? a.col_partials.sum + max_groups * C : nullptr;
  }
  a.max_col_splits = max_splits, a.max_row_groups = max_groups;
  a.logit.valid_cols = valid;
  a.logit.softcap = float(softcap);
  if (diagonal != NO_DIAGONAL) a.logit.exclude_diagonal = 1, a.logit.diagonal_offset = diagonal;
  const int rc = tlse_hop_lse_forward(&a, nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  const std::string outputs = !columns ? " rows only" + forward_schedule() : sums ? "" : " no sums";
  const std::string name = "forward dtype " + std::to_string(dtype) + " " + std::to_string(R) + "x" +
                           std::to_string(C) + "x" + std::to_string(D) + " scale " + std::to_string(scale) +
                           (valid < C ? " valid " + std::to_string(valid) : "") + outputs +
                           (softcap > 0 ? " softcap " + std::to_string(softcap) : "") +
                           (diagonal != NO_DIAGONAL ? " diagonal " + std::to_string(diagonal) + " masked" : "");
  const int64_t V = std::min(C, valid);
  if (rc != 0) {
    expect(false, name + ": " + tlse_hop_error_string());
    return;
  }
  const auto h = download(parts, n_parts);
  const std::vector<float> row_max(h.begin(), h.begin() + a.col_splits * R),
      row_sum(h.begin() + max_splits * R, h.begin() + max_splits * R + a.col_splits * R);
  const float* cm = h.data() + 2 * max_splits * R;
  const std::vector<float> col_max(cm, cm + a.row_groups * C),
      col_sum(cm + max_groups * C, cm + max_groups * C + a.row_groups * C);
  const double u = dtype == TLSE_HOP_TF32 ? std::ldexp(1.0, -9) : std::ldexp(1.0, -20);
  double worst_row = 0, worst_col = 0, worst_sum = 0;
  for (int64_t i = 0; i < R; ++i) {
    double amax = 0;
    for (int64_t j = 0; j < V; ++j) amax = std::max(amax, magnitude(x[i * C + j]));
    const double ref = lse_along(x, i * C, 1, V), got = merge_lse(row_max, row_sum, a.col_splits, R, i);
    worst_row = std::max(worst_row, std::fabs(got - ref) / (u * (amax + 1) * std::sqrt(double(D)) + 1e-5));
  }
  for (int64_t j = 0; columns && j < V; ++j) {  // a masked column has no LSE of its own to check
    double amax = 0, total = 0;
    for (int64_t i = 0; i < R; ++i)  // the logit sums leave masked entries out
      amax = std::max(amax, magnitude(x[i * C + j])), total += x[i * C + j] != -INFINITY ? x[i * C + j] : 0.0;
    const double ref = lse_along(x, j, C, R), got = merge_lse(col_max, col_sum, a.row_groups, C, j);
    worst_col = std::max(worst_col, std::fabs(got - ref) / (u * (amax + 1) * std::sqrt(double(D)) + 1e-5));
    if (!sums) continue;
    double got_total = 0;
    for (int64_t g = 0; g < a.row_groups; ++g) got_total += h[2 * max_splits * R + 2 * max_groups * C + g * C + j];
    worst_sum =
        std::max(worst_sum, std::fabs(got_total - total) / (u * (amax + 1) * std::sqrt(double(D)) * R + 1e-4 * R));
  }
  // Which way the contrastive tiles (128 x 256) went: spread beyond 64, two exponentials.
  int64_t tiles = 0, wide = 0;
  for (int64_t i0 = 0; columns && !sums && i0 < R; i0 += 128)
    for (int64_t j0 = 0; j0 < V; j0 += 256, ++tiles) {
      double lo = INFINITY, hi = -INFINITY;
      for (int64_t i = i0; i < std::min(i0 + 128, R); ++i)
        for (int64_t j = j0; j < std::min(j0 + 256, V); ++j)
          lo = std::min(lo, x[i * C + j]), hi = std::max(hi, x[i * C + j]);
      wide += hi - lo > 64;
    }
  char buf[200];
  std::snprintf(buf, sizeof buf, ": splits %ld groups %ld, error/tolerance row %.3f col %.3f sums %.3f%s",
                long(a.col_splits), long(a.row_groups), worst_row, worst_col, worst_sum,
                sums || !columns
                    ? ""
                    : (", tiles spread beyond 64: " + std::to_string(wide) + "/" + std::to_string(tiles)).c_str());
  expect(worst_row <= 1 && worst_col <= 1 && worst_sum <= 1, name + buf);
}

/// The forward keeping its exponentials (bf16 or fp16 inputs, the training step's rows-only
/// sweep). Each part of a row (column tile and quad lane q: the columns j with (j mod 8) / 2 == q)
/// is under a shift s. bf16: the row's shift r where its max m is at most r +
/// TLSE_HOP_ROW_SHIFT_SPAN, else m (either way at the reference's m within the float accumulation
/// bound of check_forward: near the line, either is right). Row shifts, when given (shifted, bf16
/// only), cycle through a logit of the row (the training step's target logit), the row's max - 100
/// (its upper parts take their own max, the lower ones r) and -inf (every part its own max).
/// fp16: s = k ln 2, k an integer with m log2 e - k in (HEADROOM - 1, HEADROOM] (within that
/// bound). Each stored e against exp(x - s) at the reference x and the kernel's s: the type's
/// relative rounding (2^-8, 2^-11), the dot product's error on the exponent (expm1 of the bound),
/// ex2's 2^-21, and the type's absolute floor (bf16: its smallest normal, below which ex2 flushes;
/// fp16: half its subnormal step). The row LSEs against the reference as in check_forward. Nothing
/// written past the rows (a sentinel row follows), past each row's last 16 bytes (kept.ld pads
/// each row: TMA writes a row's last 16-byte chunk whole, as tlse_hopper.h says) or past the
/// shifts. keep_cols > 0: only the columns below it are kept (kept.cols), the LSEs over every
/// column; panel > 0: in panels of that many columns (kept.panel), a gap of 24 values between
/// them; tail_panel >= 0: the panels from it on in the tail (kept.tail), 40 values past the
/// others' end, packed.
void check_kept_exponentials(int dtype, int64_t R, int64_t C, int64_t D, double scale, bool shifted,
                             int64_t keep_cols = 0, int64_t panel = 0, int64_t tail_panel = -1) {
  const bool fp16 = dtype == TLSE_HOP_FP16;
  const int64_t K = keep_cols > 0 ? keep_cols : C;                    // the kept columns
  const int64_t P = panel > 0 ? panel : K, layers = (K + P - 1) / P;  // columns per panel, panels
  const int64_t first_layers = tail_panel >= 0 ? tail_panel : layers;
  Operand A{dtype, R, D}, B{dtype, C, D};
  A.fill(0.5), B.fill(0.5);
  const std::vector<double> x = logits(A, B, scale);
  DeviceBuffers mem;
  void *dA = mem.upload(A), *dB = mem.upload(B);
  const int64_t ld = (P + 7) / 8 * 8 + 8, max_splits = 8, ldm = 4 * ((K + TLSE_HOP_TILE_N - 1) / TLSE_HOP_TILE_N);
  const int64_t stride = R * ld + (panel > 0 ? 24 : 0);  // from a panel to the next
  const int64_t tail_at = first_layers * stride + 40;    // where the tail's panels begin (16-byte aligned)
  const auto layer_at = [&](int64_t layer) {
    return layer < first_layers ? layer * stride : tail_at + (layer - first_layers) * R * ld;
  };
  const uint16_t sentinel = 0x7fc1;  // a NaN the kernel does not produce
  const float max_sentinel = 12345.f;
  const std::vector<uint16_t> init(size_t(layer_at(layers) + ld), sentinel);  // a sentinel row past the end
  const std::vector<float> init_max(size_t((R + 1) * ldm), max_sentinel);
  std::vector<float> row_shift(size_t(R), -INFINITY);
  std::uniform_int_distribution<int64_t> column(0, C - 1);
  for (int64_t i = 0; shifted && i < R; ++i) {
    double row_max = -INFINITY;
    for (int64_t j = 0; j < C; ++j) row_max = std::max(row_max, x[i * C + j]);
    if (i % 3 == 0) row_shift[i] = float(x[i * C + column(rng)]);
    if (i % 3 == 1) row_shift[i] = float(row_max - 100);
  }
  uint16_t* kept = mem.upload(init);
  float *shift = mem.upload(init_max), *d_row_shift = mem.upload(row_shift);
  float* parts = mem.allocate<float>(size_t(2 * max_splits * R));
  auto a = sweep_args<tlse_hop_forward_args>(dtype, dA, dB, R, C, D, scale);
  a.row_partials.max = parts, a.row_partials.sum = parts + max_splits * R;
  a.kept.data = kept, a.kept.ld = ld, a.kept.shift = shift;
  a.kept.row_shift = shifted ? d_row_shift : nullptr;
  a.kept.cols = keep_cols;
  a.kept.panel = panel, a.kept.panel_stride = panel > 0 ? stride : 0;
  if (tail_panel >= 0) a.kept.tail = kept + tail_at, a.kept.tail_panel = tail_panel;
  a.max_col_splits = max_splits, a.max_row_groups = 1;
  const int rc = tlse_hop_lse_forward(&a, nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  const std::string name = std::string(fp16 ? "fp16" : "bf16") + " kept exponentials " + std::to_string(R) + "x" +
                           std::to_string(C) + "x" + std::to_string(D) + (shifted ? ", row shifts" : "") +
                           (keep_cols > 0 ? ", columns below " + std::to_string(keep_cols) + " kept" : "") +
                           (panel > 0 ? " in panels of " + std::to_string(panel) : "") +
                           (tail_panel >= 0 ? ", from panel " + std::to_string(tail_panel) + " in the tail" : "") +
                           forward_schedule();
  if (rc != 0) {
    expect(false, name + ": " + tlse_hop_error_string());
  } else {
    const auto h = download(kept, init.size());
    const auto hm = download(shift, init_max.size());
    const auto hp = download(parts, size_t(2 * max_splits * R));
    const std::vector<float> row_max(hp.begin(), hp.begin() + a.col_splits * R),
        row_sum(hp.begin() + max_splits * R, hp.begin() + max_splits * R + a.col_splits * R);
    const auto x_tol = [&](int64_t i, int64_t j) {
      return std::ldexp(1.0, -20) * std::sqrt(double(D)) * std::fabs(scale) * abs_dot(A, i, B, j, D) + 1e-30;
    };
    const double span = TLSE_HOP_ROW_SHIFT_SPAN;
    double worst_shift = 0, worst_e = 0, worst_lse = 0;
    int64_t outside = 0, under_row_shift = 0, under_own_max = 0;
    for (int64_t k = 0; k < ldm; ++k) outside += hm[size_t(R * ldm + k)] != max_sentinel;
    const auto slot = [](int64_t j) { return 4 * (j / TLSE_HOP_TILE_N) + j % 8 / 2; };
    for (int64_t i = 0; i < R; ++i) {
      for (int64_t k = 0; k < ldm; ++k) {
        double ref = -INFINITY, tol = 0;
        for (int64_t j = k / 4 * TLSE_HOP_TILE_N; j < std::min(K, (k / 4 + 1) * TLSE_HOP_TILE_N); ++j)
          if (slot(j) == k) ref = std::max(ref, x[i * C + j]), tol = std::max(tol, x_tol(i, j));
        const double got = hm[size_t(i * ldm + k)], r = row_shift[size_t(i)];
        double err;
        if (ref == -INFINITY) {
          err = got == -INFINITY ? 0.0 : INFINITY;
        } else if (fp16) {
          const double k = got / std::log(2.0), above = (ref - got) / std::log(2.0), slack = tol / std::log(2.0);
          const double headroom = TLSE_HOP_FP16_HEADROOM;
          err = std::fabs(k - std::nearbyint(k)) > 1e-3 ? INFINITY
                : above > headroom                      ? (above - headroom) / slack
                : above <= headroom - 1                 ? (headroom - 1 - above) / slack
                                                        : 0.0;
          ++under_own_max;
        } else if (got == r && ref <= r + span + tol) {
          err = 0, ++under_row_shift;
        } else {
          err = ref >= r + span - tol ? std::fabs(got - ref) / tol : INFINITY;
          ++under_own_max;
        }
        worst_shift = std::max(worst_shift, err);
      }
      double amax = 0;
      for (int64_t j = 0; j < C; ++j) amax = std::max(amax, std::fabs(x[i * C + j]));
      worst_lse =
          std::max(worst_lse, std::fabs(merge_lse(row_max, row_sum, a.col_splits, R, i) - lse_along(x, i * C, 1, C)) /
                                  (std::ldexp(1.0, -20) * (amax + 1) * std::sqrt(double(D)) + 1e-5));
    }
    std::vector<bool> inside(h.size(), false);  // where the kernel may write: each row's values and last chunk
    for (int64_t layer = 0; layer < layers; ++layer)
      for (int64_t i = 0; i < R; ++i)
        for (int64_t jl = 0; jl < (P + 7) / 8 * 8 && layer * P + jl < (K + 7) / 8 * 8; ++jl) {
          const int64_t q = layer_at(layer) + i * ld + jl, j = layer * P + jl;
          inside[size_t(q)] = true;
          if (j >= K) continue;  // the row's last 16-byte chunk: written whole, values not to be read
          const double s = hm[size_t(i * ldm + slot(j))];
          const double ref = std::exp(x[i * C + j] - s);
          const double tol = ref * (std::ldexp(1.0, fp16 ? -11 : -8) + std::expm1(x_tol(i, j)) + std::ldexp(1.0, -21)) +
                             (fp16 ? 0x1p-25 : 0x1p-126);
          const double e = element_value(dtype, reinterpret_cast<const unsigned char*>(&h[size_t(q)]));
          worst_e = std::isnan(e) ? INFINITY : std::max(worst_e, std::fabs(e - ref) / tol);
        }
    for (size_t q = 0; q < h.size(); ++q) outside += !inside[q] && h[q] != sentinel;
    char buf[240];
    std::snprintf(buf, sizeof buf,
                  ": parts under the row's shift %ld, their own max %ld; error/tolerance shift %.3f, e %.3f, lse "
                  "%.3f, %ld values written outside",
                  long(under_row_shift), long(under_own_max), worst_shift, worst_e, worst_lse, long(outside));
    expect(worst_shift <= 1 && worst_e <= 1 && worst_lse <= 1 && outside == 0 && (!shifted || under_row_shift > 0),
           name + buf);
  }
}

/// Backward, bf16: a gradient panel (row terms of a cross-entropy: lse, g, target, w), then
/// dA = G B_panel (fp32 out) and dB_panel = G^T A (bf16 out through an index), against the
/// reference computed from the exact dL/dx. G is rounded to bf16 (2^-9 relative), which bounds
/// the products' error by 2^-8 sum |G||B| per element.
/// Rows [first, first + n) of an operand transposed: depth rows of n elements, leading dimension
/// ld (TF32's products read every operand K-major).
std::vector<unsigned char> transposed(const Operand& op, int64_t first, int64_t n, int64_t ld) {
  const int e = op.elem();
  std::vector<unsigned char> t(size_t(op.depth * ld * e), 0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t k = 0; k < op.depth; ++k)
      std::memcpy(&t[size_t((k * ld + i) * e)], &op.bytes[size_t(((first + i) * op.depth + k) * e)], size_t(e));
  return t;
}

/// The logit model as check_backward applies it. general: column position j has id C - 1 - j (a
/// reversed index), a bias by id in the input type, ids from C - 45 on masked, the diagonal
/// (column id = row id + 5) masked, a softcap of 20. diagonal: x = dot but for that diagonal,
/// masked (the self-similarity form's model: the simple one in the tiles the diagonal does not
/// meet). simple: x = dot (scale 1).
enum class Model { simple, general, diagonal };
struct GeneralModel {
  static constexpr int64_t MASKED_IDS = 45, DIAGONAL_OFFSET = 5;
  static constexpr double SOFTCAP = 20;
  Model kind;
  int64_t C;
  Operand bias;  // C x 1, by id
  GeneralModel(Model k, int dtype, int64_t cols) : kind(k), C(cols), bias{dtype, cols, 1} {
    if (kind == Model::general) bias.fill(1.0);
  }
  int64_t id(int64_t j) const { return kind == Model::general ? C - 1 - j : j; }
  int64_t valid() const { return kind == Model::general ? C - MASKED_IDS : C; }
  bool on() const { return kind != Model::simple; }  // any mask
  bool masked(int64_t i, int64_t j) const { return on() && (id(j) >= valid() || id(j) == i + DIAGONAL_OFFSET); }
  double logit(double dot, int64_t i, int64_t j) const {
    if (masked(i, j)) return -INFINITY;
    if (kind != Model::general) return dot;
    return SOFTCAP * std::tanh((dot + bias.value[size_t(id(j))]) / SOFTCAP);
  }
  double dx_dz(double x) const { return kind == Model::general ? 1 - (x / SOFTCAP) * (x / SOFTCAP) : 1.0; }
  /// A target id for row i that the model does not mask.
  int32_t target(int64_t i) const {
    for (;;) {
      const int64_t c = int64_t(rng() % uint64_t(valid()));
      if (!on() || c != i + DIAGONAL_OFFSET) return int32_t(c);
    }
  }
};

/// Backward: the gradient panel (G, and G^T for TF32), its sums and mask, then the two products
/// as the backward runs them: bf16 and fp16 read G transposed and the inputs as stored, TF32 reads
/// G^T and transposed copies of the inputs (made exact in TF32, so that the reference multiplies
/// what the tensor cores do). fp16 stores G times a power of two that puts the bound of |G| at
/// 2^14 (g_factor) and the products undo it (out_factor), as the library does. The tolerance
/// counts G's rounding (bf16 2^-9, fp16 2^-11, TF32 2^-11) and the fp32 sums, as u times the sum
/// of |terms|. both: the columns' softmax terms too (the contrastive loss).
/// model: the rows' terms under that logit model (GeneralModel; the general one's columns the
/// kernel reads per tile from shared memory that it shares with the column sums).
void check_backward(int dtype, int64_t R, int64_t C, int64_t D, int64_t col_begin, int64_t col_end, double filter_eps,
                    bool both = false, Model kind = Model::simple) {
  const bool tf32 = dtype == TLSE_HOP_TF32, fp16 = dtype == TLSE_HOP_FP16;
  const int elem = tf32 ? 4 : 2;
  Operand A{dtype, R, D}, B{dtype, C, D};
  A.fill(1.0), B.fill(4.0 / std::sqrt(double(D)));
  if (tf32) A.round_to_tf32(), B.round_to_tf32();
  const double scale = 1.0;
  const GeneralModel model(both ? Model::simple : kind, dtype, C);
  const std::vector<double> dots = logits(A, B, scale);
  std::vector<double> x(dots.size());
  for (int64_t i = 0; i < R; ++i)
    for (int64_t j = 0; j < C; ++j) x[i * C + j] = model.logit(dots[i * C + j], i, j);
  std::vector<float> lse(R), g(R), w(R);
  std::vector<int32_t> target(R);
  for (int64_t i = 0; i < R; ++i) {
    lse[i] = float(lse_along(x, i * C, 1, C));
    g[i] = w[i] = 1.0f / float(R);
    target[i] = model.target(i);
  }
  std::vector<float> col_lse(C), col_g(C, 1.0f / float(C));
  std::vector<int32_t> col_target(C);
  for (int64_t j = 0; both && j < C; ++j) {
    col_lse[j] = float(lse_along(x, j, C, R));
    col_target[j] = int32_t(rng() % uint64_t(R));
  }
  const int64_t W = col_end - col_begin, ldg = (W + 7) / 8 * 8;
  // dz for the panel, from the float LSEs the kernel sees.
  std::vector<double> dz(size_t(R * W));
  for (int64_t i = 0; i < R; ++i)
    for (int64_t j = col_begin; j < col_end; ++j) {
      double& d = dz[i * W + j - col_begin];
      if (model.masked(i, j)) {
        d = 0;
        continue;
      }
      d = g[i] * std::exp(x[i * C + j] - double(lse[i])) - (target[i] == model.id(j) ? w[i] : 0.0);
      if (both) d += col_g[j] * std::exp(x[i * C + j] - double(col_lse[j])) - (col_target[j] == i ? col_g[j] : 0.f);
      d *= model.dx_dz(x[i * C + j]);
    }

  DeviceBuffers mem;
  void *dA = mem.upload(A), *dB = mem.upload(B);
  float *d_lse = mem.upload(lse), *d_g = mem.upload(g), *d_w = mem.upload(w);
  int32_t* d_target = mem.upload(target);
  float *d_col_lse = mem.upload(col_lse), *d_col_g = mem.upload(col_g);
  int32_t* d_col_target = mem.upload(col_target);
  std::vector<int32_t> ids(static_cast<size_t>(C));
  for (int64_t j = 0; j < C; ++j) ids[size_t(j)] = int32_t(model.id(j));
  int32_t* d_ids = mem.upload(ids);
  void* d_bias = model.kind == Model::general ? mem.upload(model.bias) : nullptr;
  // fp16: G's factor and its inverse, from the largest |G| the terms allow (|dx/dz| <= 1).
  double g_bound = 0;
  for (int64_t i = 0; i < R; ++i) g_bound = std::max(g_bound, double(std::fabs(g[i]) + std::fabs(w[i])));
  if (both) g_bound += 2.0 / double(C);
  int g_exp = 0;
  std::frexp(g_bound * std::fabs(scale), &g_exp);
  const double factor = fp16 ? std::ldexp(1.0, 14 - g_exp) : 1.0;
  float* d_factor = mem.upload(std::vector<float>{float(factor), float(1.0 / factor)});
  const int64_t ldgt = (R + 7) / 8 * 8;
  void* G = mem.filled<unsigned char>(size_t(R * ldg * elem), 0);
  void* GT = tf32 ? mem.filled<unsigned char>(size_t(W * ldgt * elem), 0) : nullptr;
  const int64_t row_tiles = (R + TLSE_HOP_TILE_M - 1) / TLSE_HOP_TILE_M,
                col_tiles = (W + TLSE_HOP_TILE_N - 1) / TLSE_HOP_TILE_N;
  uint8_t* mask = mem.allocate<uint8_t>(size_t(row_tiles * col_tiles));
  float* row_dot = mem.allocate<float>(size_t(16 * R));
  float* col_sums = mem.allocate<float>(size_t(row_tiles * W));
  auto a = sweep_args<tlse_hop_gradient_args>(dtype, dA, dB, R, C, D, scale);
  a.row_terms = {d_lse, d_g, d_target, d_w};
  if (both) a.col_terms = {d_col_lse, d_col_g, d_col_target, d_col_g};
  if (model.kind == Model::general) {
    a.cols.index = d_ids;
    a.logit.col_bias = d_bias;
    a.logit.softcap = float(GeneralModel::SOFTCAP);
    a.logit.valid_cols = model.valid();
  }
  if (model.on()) a.logit.exclude_diagonal = 1, a.logit.diagonal_offset = GeneralModel::DIAGONAL_OFFSET;
  a.filter_eps = float(filter_eps);
  a.col_begin = col_begin, a.col_end = col_end;
  a.G = G, a.ldg = ldg, a.tile_mask = mask;
  a.GT = GT, a.ldgt = ldgt;
  a.row_dot_sums = row_dot, a.col_sums = col_sums;
  a.max_col_splits = 16;
  a.g_factor = fp16 ? d_factor : nullptr;
  const char* type = tf32 ? "tf32 " : fp16 ? "fp16 " : "bf16 ";
  const std::string name = type + std::string("backward ") + std::to_string(R) + "x" + std::to_string(C) + "x" +
                           std::to_string(D) + " panel [" + std::to_string(col_begin) + "," + std::to_string(col_end) +
                           ") eps " + std::to_string(filter_eps) + (both ? " both sides" : "") +
                           (model.kind == Model::general    ? " general model"
                            : model.kind == Model::diagonal ? " diagonal masked"
                                                            : "");
  int rc = tlse_hop_gradient(&a, nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  if (rc != 0) {
    expect(false, name + ": gradient: " + tlse_hop_error_string());
    return;
  }
  // Row sums of dz * dot and column sums of dz.
  const auto h_row = download(row_dot, size_t(a.col_splits * R));
  const auto h_col = download(col_sums, size_t(row_tiles * W));
  const auto h_mask = download(mask, size_t(row_tiles * col_tiles));
  // The row sums take sum_j dz(x_j) x_j at the kernel's x_j = x_j + e_j, whose fp32 accumulation
  // error |e_j| is up to depth 2^-24 scale sum_k |a_k b_k| (as in check_forward): to first order
  // the sum moves by sum_j e_j (dz_j + x_j p_j), p_j = d dz_j / d x_j the softmax terms (the LSEs
  // are inputs). A small |dz x| does not bound that where a dot product cancels or |x_j| is large:
  // counted beside the sum's own rounding (1e-4 of sum |dz x|).
  double worst_rowsum = 0, worst_colsum = 0;
  for (int64_t i = 0; i < R; ++i) {
    double ref = 0, bound = 0, sums = 0, got = 0;
    for (int64_t j = 0; j < W; ++j) {
      const double d = dz[i * W + j], xv = x[i * C + col_begin + j], dot = dots[i * C + col_begin + j];
      double p = g[i] * std::exp(xv - double(lse[i]));
      if (both) p += col_g[col_begin + j] * std::exp(xv - double(col_lse[col_begin + j]));
      ref += d * dot, bound += std::fabs(d * dot);
      sums += (std::fabs(d) + p * std::fabs(dot)) * abs_dot(A, i, B, col_begin + j, D);
    }
    for (int64_t s = 0; s < a.col_splits; ++s) got += h_row[s * R + i];
    const double tol = 1e-4 * bound + double(D) * std::ldexp(std::fabs(scale), -24) * sums + 1e-7;
    worst_rowsum = std::max(worst_rowsum, std::fabs(got - ref) / tol);
  }
  for (int64_t j = 0; j < W; ++j) {
    double ref = 0, bound = 0, got = 0;
    for (int64_t i = 0; i < R; ++i) ref += dz[i * W + j], bound += std::fabs(dz[i * W + j]);
    for (int64_t t = 0; t < row_tiles; ++t) got += h_col[t * W + j];
    worst_colsum = std::max(worst_colsum, std::fabs(got - ref) / (1e-4 * bound + 1e-7));
  }
  int64_t kept = 0;
  for (auto v : h_mask) kept += v != 0;
  // G (and G^T) element by element: each value rounded once to the stored type (unit roundoff
  // bf16 2^-8, fp16 and TF32 2^-11; bounded here by twice that, for the logits' fp32 sums and
  // ex2.approx; fp16's subnormals, values below 2^-14 / factor, lose at most 2^-25 / factor, under
  // the 1e-7 floor), zero in the tiles gradient filtering dropped, and nothing written past the
  // panel's columns or the rows (the buffers' padding stays zero). fp16's values are divided by the
  // factor.
  double worst_g = 0;
  int64_t outside = 0;
  {
    const double ug = std::ldexp(1.0, tf32 || fp16 ? -10 : -7);
    const auto values = [&](void* d, size_t n) {
      std::vector<double> h = download_values(dtype, d, n);
      for (double& v : h) v /= factor;  // a power of two (1 but for fp16): exact
      return h;
    };
    const auto check = [&](double got, int64_t i, int64_t j) {
      const bool stored = filter_eps <= 0 || h_mask[(i / TLSE_HOP_TILE_M) * col_tiles + j / TLSE_HOP_TILE_N] != 0;
      const double ref = stored ? dz[i * W + j] * scale : 0.0;
      const double target_term = target[i] == model.id(col_begin + j) ? double(w[i]) : 0.0;
      worst_g = std::max(worst_g, std::fabs(got - ref) / (ug * (std::fabs(ref) + target_term) + 1e-7));
    };
    const auto hG = values(G, size_t(R * ldg));
    for (int64_t i = 0; i < R; ++i)
      for (int64_t j = 0; j < ldg; ++j)
        if (j < W)
          check(hG[i * ldg + j], i, j);
        else
          outside += hG[i * ldg + j] != 0;
    if (tf32) {
      const auto hGT = values(GT, size_t(W * ldgt));
      for (int64_t j = 0; j < W; ++j)
        for (int64_t i = 0; i < ldgt; ++i)
          if (i < R)
            check(hGT[j * ldgt + i], i, j);
          else
            outside += hGT[j * ldgt + i] != 0;
    }
  }
  // Products. dA (R x D fp32) = G B_panel; dB (W x D bf16, rows through a reversed index) = G^T A.
  float* dA_out = mem.allocate<float>(size_t(R * D));
  void* dB_out = mem.allocate<unsigned char>(size_t(W * D * elem));
  std::vector<int32_t> order(W);
  for (int64_t j = 0; j < W; ++j) order[j] = int32_t(W - 1 - j);
  int32_t* d_order = mem.upload(order);
  const size_t ws =
      std::max(tlse_hop_product_workspace(dtype, R, D, W, 32, 0), tlse_hop_product_workspace(dtype, W, D, R, 32, 0));
  void* workspace = mem.allocate<unsigned char>(ws);
  tlse_hop_product_args p{};
  p.dtype = dtype;
  const int64_t ldbt = (W + 7) / 8 * 8;
  void* Bt = tf32 ? mem.upload(transposed(B, col_begin, W, ldbt)) : nullptr;
  void* At = tf32 ? mem.upload(transposed(A, 0, R, ldgt)) : nullptr;
  p.a = G, p.lda = ldg, p.a_transposed = 0;
  if (tf32)
    p.b = Bt, p.ldb = ldbt, p.b_transposed = 0;
  else
    p.b = static_cast<char*>(dB) + col_begin * D * 2, p.ldb = D, p.b_transposed = 1;
  p.M = R, p.N = D, p.K = W;
  p.mask = filter_eps > 0 ? mask : nullptr, p.mask_ld = col_tiles, p.mask_of_a_transposed = 0;
  p.out_f32 = dA_out, p.ldo = D;
  p.workspace = workspace, p.workspace_bytes = ws, p.max_k_splits = 32;
  p.out_factor = fp16 ? d_factor + 1 : nullptr;
  rc = tlse_hop_product(&p, nullptr);
  const int64_t splits_a = p.k_splits;
  if (rc == 0) {
    if (tf32)
      p.a = GT, p.lda = ldgt, p.b = At, p.ldb = ldgt;
    else
      p.a_transposed = 1, p.b = dA, p.ldb = D;
    p.M = W, p.N = D, p.K = R;
    p.mask_of_a_transposed = 1;
    p.out_f32 = nullptr, p.out = dB_out, p.out_index = d_order;
    rc = tlse_hop_product(&p, nullptr);
  }
  const int64_t splits_b = p.k_splits;
  // dB again in place, complete (no index, K not split): the tile leaves through TMA, which must
  // clip it at W rows and D columns of a wider, taller output (a padded row, a row past the end).
  const int64_t ld_plain = D + 8, plain_bytes = (W + 1) * ld_plain * elem;
  void* dB_plain = mem.filled<unsigned char>(size_t(plain_bytes), 0x7f);
  if (rc == 0) {
    p.out = dB_plain, p.out_index = nullptr, p.ldo = ld_plain, p.max_k_splits = 1;
    rc = tlse_hop_product(&p, nullptr);
  }
  CUDA_OK(cudaDeviceSynchronize());
  if (rc != 0) {
    expect(false, name + ": product: " + tlse_hop_error_string());
    return;
  }
  const auto h_dA = download(dA_out, size_t(R * D));
  const std::vector<double> h_dB = download_values(dtype, dB_out, size_t(W * D));
  // The plain output, and whether anything landed outside its W x D values.
  std::vector<unsigned char> plain(static_cast<size_t>(plain_bytes));
  CUDA_OK(cudaMemcpy(plain.data(), dB_plain, plain.size(), cudaMemcpyDeviceToHost));
  int64_t plain_outside = 0;
  for (int64_t b = 0; b < plain_bytes; ++b) {
    const int64_t row = b / (ld_plain * elem), col = b % (ld_plain * elem) / elem;
    if ((row >= W || col >= D) && plain[size_t(b)] != 0x7f) ++plain_outside;
  }
  std::vector<double> h_dB_plain(size_t(W * D));
  for (int64_t j = 0; j < W; ++j)
    for (int64_t k = 0; k < D; ++k)
      h_dB_plain[size_t(j * D + k)] = element_value(dtype, &plain[size_t((j * ld_plain + k) * elem)]);
  double worst_dA = 0, worst_dB = 0, worst_dB_plain = 0;
  const double u = std::ldexp(1.0, tf32 ? -9 : fp16 ? -10 : -8);
  for (int64_t i = 0; i < R; ++i)
    for (int64_t k = 0; k < D; ++k) {
      double ref = 0, bound = 0;
      for (int64_t j = 0; j < W; ++j) {
        const double t = dz[i * W + j] * scale * B.value[(col_begin + j) * D + k];
        ref += t, bound += std::fabs(t);
      }
      worst_dA = std::max(worst_dA, std::fabs(double(h_dA[i * D + k]) - ref) / (u * bound + 1e-6));
    }
  for (int64_t j = 0; j < W; ++j)
    for (int64_t k = 0; k < D; ++k) {
      double ref = 0, bound = 0;
      for (int64_t i = 0; i < R; ++i) {
        const double t = dz[i * W + j] * scale * A.value[i * D + k];
        ref += t, bound += std::fabs(t);
      }
      const double tol = u * bound + u * std::fabs(ref) + 1e-6;
      worst_dB = std::max(worst_dB, std::fabs(h_dB[order[j] * D + k] - ref) / tol);
      worst_dB_plain = std::max(worst_dB_plain, std::fabs(h_dB_plain[j * D + k] - ref) / tol);
    }
  char buf[400];
  std::snprintf(buf, sizeof buf,
                ": tiles kept %ld/%ld, k splits %ld/%ld, err/tol G %.3f rowsum %.3f colsum %.3f dA %.3f dB %.3f "
                "(in place, TMA %.3f), %ld written outside (TMA %ld)",
                long(kept), long(row_tiles * col_tiles), long(splits_a), long(splits_b), worst_g, worst_rowsum,
                worst_colsum, worst_dA, worst_dB, worst_dB_plain, long(outside), long(plain_outside));
  expect(worst_g <= 1 && outside == 0 && worst_rowsum <= 1 && worst_colsum <= 1 && worst_dA <= 1 && worst_dB <= 1 &&
             worst_dB_plain <= 1 && plain_outside == 0,
         name + buf);
}

/// Entry (m, n) of the product A B (A: M x K, B: K x N, their rows as Operand stores them) in
/// double, and the sum of its terms' magnitudes, which the fp32 products' tolerances scale with.
struct ProductEntry {
  double value = 0, bound = 0;
};
ProductEntry product_entry(const Operand& A, const Operand& B, int64_t m, int64_t n) {
  ProductEntry e;
  for (int64_t k = 0; k < A.depth; ++k) {
    const double t = A.value[size_t(m * A.depth + k)] * B.value[size_t(k * B.depth + n)];
    e.value += t, e.bound += std::fabs(t);
  }
  return e;
}

/// A product into fp32 K-split partials (out_f32, K split), then into a complete bf16 output in a
/// padded row (ldo, the padding filled with a sentinel and left alone) under a row scale
/// (random_row_scales). Rows of N = 130 values are not whole 16-byte chunks, so that the tile
/// leaves from the registers; N = 128 goes through the staged stores. The fp32 sums' tolerance is
/// 2^-16 sum |a b| per element, bf16 output adds its rounding, 2^-8 |value|. The default M x N
/// has few tiles, so the fp32 product splits K; a large one (no split) gives each CTA several
/// tiles, each cluster several pairs of them (TileConfig), and every row_step-th row is checked
/// there.
void check_product_stores(int64_t N, int64_t ld, int64_t M = 200, int64_t K = 3000, bool splits_k = true,
                          int64_t row_step = 1) {
  Operand A{TLSE_HOP_BF16, M, K}, B{TLSE_HOP_BF16, K, ld};  // B(k, n) = B row k, column n
  A.fill(1.0), B.fill(1.0);
  DeviceBuffers mem;
  void *dA = mem.upload(A), *dB = mem.upload(B);
  float* out_f32 = mem.allocate<float>(size_t(M * ld));
  __nv_bfloat16* out = mem.filled<__nv_bfloat16>(size_t(M * ld), 0x7f);
  const size_t ws = tlse_hop_product_workspace(TLSE_HOP_BF16, M, N, K, 8, 0);
  void* workspace = mem.allocate<unsigned char>(ws);
  tlse_hop_product_args p{};
  p.dtype = TLSE_HOP_BF16;
  p.a = dA, p.lda = K, p.b = dB, p.ldb = ld, p.b_transposed = 1;
  p.M = M, p.N = N, p.K = K;
  p.out_f32 = out_f32, p.ldo = ld;
  p.workspace = workspace, p.workspace_bytes = ws, p.max_k_splits = 8;
  int rc = tlse_hop_product(&p, nullptr);
  const int64_t splits = p.k_splits;
  const std::vector<float> row_scale = random_row_scales(M);
  float* d_row_scale = mem.upload(row_scale);
  if (rc == 0) {
    p.out_f32 = nullptr, p.out = out, p.max_k_splits = 1, p.row_scale = d_row_scale;
    rc = tlse_hop_product(&p, nullptr);
  }
  CUDA_OK(cudaDeviceSynchronize());
  if (rc != 0) {
    expect(false, std::string("product stores: ") + tlse_hop_error_string());
    return;
  }
  const auto f = download(out_f32, size_t(M * ld));
  const auto b = download(out, size_t(M * ld));
  double worst_f32 = 0, worst_bf16 = 0;
  int64_t outside = 0;
  for (int64_t m = 0; m < M; m += row_step) {
    for (int64_t n = N; n < ld; ++n) {
      uint16_t bits;
      std::memcpy(&bits, &b[size_t(m * ld + n)], 2);
      if (bits != 0x7f7f) ++outside;
    }
    for (int64_t n = 0; n < N; ++n) {
      const auto [ref, bound] = product_entry(A, B, m, n);
      const double tol = std::ldexp(bound, -16) + 1e-6;
      worst_f32 = std::max(worst_f32, std::fabs(f[size_t(m * ld + n)] - ref) / tol);
      const double c = row_scale[size_t(m)], got = double(__bfloat162float(b[size_t(m * ld + n)]));
      worst_bf16 = std::max(
          worst_bf16, c == 0 ? (got == 0 ? 0.0 : INFINITY)
                             : std::fabs(got - c * ref) / (std::fabs(c) * (tol + std::ldexp(std::fabs(ref), -8))));
    }
  }
  char buf[200];
  std::snprintf(buf, sizeof buf,
                "product %ldx%ldx%ld, rows of %ld values: k splits %ld, err/tol fp32 %.3f bf16 row-scaled %.3f, %ld "
                "written in the padding",
                long(M), long(N), long(K), long(N), long(splits), worst_f32, worst_bf16, long(outside));
  expect((splits > 1) == splits_k && worst_f32 <= 1 && worst_bf16 <= 1 && outside == 0, buf);
}

/// A product whose A lies in panels of P columns (a_panel: the training step's kept exponentials,
/// one product over all of them), each row of a panel padded to lda and the panels a gap apart,
/// padding and gaps holding NaN that no load may touch, under a row scale (random_row_scales), into
/// fp32 written or added into (accumulate: random values there before). Few output tiles (the
/// default N) split K, across panels; M x N = 2000 x 1024 gives each CTA several tiles (every
/// row_step-th row checked). Tolerance as check_product_stores' fp32: 2^-16 sum |a b|, plus the
/// addition's rounding of the old value.
void check_panel_product(int dtype, int64_t M, int64_t N, int64_t P, int64_t panels, bool accumulate,
                         int64_t row_step = 1) {
  const int64_t K = P * panels, lda = P + 8, stride = M * lda + 24;
  Operand A{dtype, M, K}, B{dtype, K, N};  // A as one matrix first; B(k, n) = B row k, column n
  A.fill(1.0), B.fill(1.0);
  const uint16_t nan_bits = dtype == TLSE_HOP_BF16 ? 0x7fc0 : 0x7e00;
  std::vector<uint16_t> stored(size_t(panels * stride), nan_bits);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k)
      std::memcpy(&stored[size_t((k / P) * stride + m * lda + k % P)], &A.bytes[size_t((m * K + k) * 2)], 2);
  std::vector<float> old(static_cast<size_t>(M * N), 1e30f);
  std::uniform_real_distribution<float> uniform(-2.f, 2.f);
  if (accumulate)
    for (float& v : old) v = uniform(rng);
  const std::vector<float> row_scale = random_row_scales(M);
  DeviceBuffers mem;
  void *dA = mem.upload(stored), *dB = mem.upload(B);
  float *out = mem.upload(old), *d_row_scale = mem.upload(row_scale);
  const size_t ws = tlse_hop_product_workspace(dtype, M, N, K, 8, 0);
  void* workspace = mem.allocate<unsigned char>(ws);
  tlse_hop_product_args p{};
  p.dtype = dtype;
  p.a = dA, p.lda = lda, p.a_panel = P, p.a_panel_stride = stride;
  p.b = dB, p.ldb = N, p.b_transposed = 1;
  p.M = M, p.N = N, p.K = K;
  p.row_scale = d_row_scale;
  p.out_f32 = out, p.ldo = N, p.accumulate = accumulate;
  p.workspace = workspace, p.workspace_bytes = ws, p.max_k_splits = 8;
  const int rc = tlse_hop_product(&p, nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  if (rc != 0) {
    expect(false, std::string("panel product: ") + tlse_hop_error_string());
    return;
  }
  const auto got = download(out, old.size());
  double worst = 0;
  for (int64_t m = 0; m < M; m += row_step)
    for (int64_t n = 0; n < N; ++n) {
      const auto [ref, bound] = product_entry(A, B, m, n);
      const double c = row_scale[size_t(m)], before = accumulate ? old[size_t(m * N + n)] : 0.0;
      const double tol = std::fabs(c) * (std::ldexp(bound, -16) + 1e-6) + std::ldexp(std::fabs(before), -23) + 1e-30;
      worst = std::max(worst, std::fabs(got[size_t(m * N + n)] - (before + c * ref)) / tol);
    }
  char buf[200];
  std::snprintf(buf, sizeof buf, "%s product, A in %ld panels of %ld: %ldx%ldx%ld%s, k splits %ld, err/tol %.3f",
                dtype == TLSE_HOP_BF16 ? "bf16" : "fp16", long(panels), long(P), long(M), long(N), long(K),
                accumulate ? " added" : "", long(p.k_splits), worst);
  expect(worst <= 1, buf);
}

/// The entry points refuse what the kernels cannot take, with a reason naming the argument,
/// before touching the device: checked everywhere, GPU or not (CI runs this part).
void check_arguments() {
  alignas(16) static unsigned char data[1 << 16];
  float part[64];
  const auto refused = [](int status, const char* needle, const std::string& what) {
    const std::string why = tlse_hop_error_string();
    expect(status == TLSE_HOP_E_ARGUMENT && why.find(needle) != std::string::npos,
           what + " -> \"" + why.substr(0, 60) + "\"");
  };
  const auto forward = [&] {
    auto a = sweep_args<tlse_hop_forward_args>(TLSE_HOP_BF16, data, data, 100, 300, 64, 1.0);
    a.row_partials.max = a.row_partials.sum = part;
    a.max_col_splits = a.max_row_groups = 4;
    return a;
  };
  refused(tlse_hop_lse_forward(nullptr, nullptr), "args is NULL", "forward: no arguments");
  auto a = forward();
  a.dtype = 7;
  refused(tlse_hop_lse_forward(&a, nullptr), "dtype 7", "forward: unknown dtype");
  a = forward();
  a.rows.data = data + 2;
  refused(tlse_hop_lse_forward(&a, nullptr), "rows is not 16-byte aligned", "forward: misaligned rows");
  a = forward();
  a.cols.ld = 60;
  refused(tlse_hop_lse_forward(&a, nullptr), "cols has leading dimension 60", "forward: ld below the depth");
  a = forward();
  a.rows.count = 0;
  refused(tlse_hop_lse_forward(&a, nullptr), "rows has 0 rows", "forward: no rows");
  a = forward();
  a.col_partials.max = part;
  refused(tlse_hop_lse_forward(&a, nullptr), "col_partials.max and col_partials.sum go together",
          "forward: col_partials.max alone");
  a = forward();
  a.kept.data = part, a.kept.ld = 302, a.kept.shift = part;
  refused(tlse_hop_lse_forward(&a, nullptr), "a multiple of 8, got 302", "forward: exponentials, kept.ld 302");
  a.kept.ld = 304, a.kept.shift = nullptr;
  refused(tlse_hop_lse_forward(&a, nullptr), "kept.shift, which is NULL", "forward: exponentials without their shifts");
  a.kept.shift = part, a.kept.cols = 100;
  refused(tlse_hop_lse_forward(&a, nullptr), "kept.cols must be 0 or a multiple of 256", "forward: kept.cols 100");
  a.kept.cols = 0, a.kept.panel = 256, a.kept.panel_stride = 304;
  refused(tlse_hop_lse_forward(&a, nullptr), "kept.panel_stride must be a multiple of 8 of at least",
          "forward: panels closer than their rows");
  a.kept.panel_stride = 100 * 304, a.kept.tail = data, a.kept.tail_panel = 2;
  refused(tlse_hop_lse_forward(&a, nullptr),
          "kept.tail takes panels (kept.panel > 0), 16-byte aligned, from kept.tail_panel in [0, 2), got 2",
          "forward: a tail past the last panel");
  a.kept.tail_panel = 1, a.kept.tail = data + 8;
  refused(tlse_hop_lse_forward(&a, nullptr), "16-byte aligned", "forward: a misaligned tail");
  a.kept.tail = nullptr, a.kept.panel = 0;
  a.rows.position = reinterpret_cast<const int32_t*>(data);
  refused(tlse_hop_lse_forward(&a, nullptr), "rows.position must be NULL", "forward: exponentials by position");
  a.rows.position = nullptr, a.dtype = TLSE_HOP_TF32;
  refused(tlse_hop_lse_forward(&a, nullptr), "kept for bf16 and fp16 inputs", "forward: TF32 exponentials");
  a.dtype = TLSE_HOP_FP16, a.kept.row_shift = part;
  refused(tlse_hop_lse_forward(&a, nullptr), "kept.row_shift must be NULL", "forward: fp16 under row shifts");
  a = forward();
  const int planned = tlse_hop_lse_forward_plan(&a);
  expect(planned == TLSE_HOP_OK && a.col_splits >= 1 && a.col_splits <= 4 && a.row_groups == 1,
         "forward plan: " + std::to_string(a.col_splits) + " splits, " + std::to_string(a.row_groups) + " row groups");

  tlse_hop_gradient_args g{};
  g.dtype = 7;
  refused(tlse_hop_gradient(&g, nullptr), "dtype 7", "gradient: unknown dtype");
  g.dtype = TLSE_HOP_BF16;
  g.rows = {data, 64, 100, nullptr, nullptr, 0};
  g.cols = {data, 64, 300, nullptr, nullptr, 0};
  g.depth = 64;
  g.col_begin = 256, g.col_end = 400;
  refused(tlse_hop_gradient(&g, nullptr), "panel [256, 400)", "gradient: panel past the columns");
  g.col_end = 300, g.filter_eps = 0.01f;
  refused(tlse_hop_gradient(&g, nullptr), "filtering needs tile_mask", "gradient: filtering without a mask");
  g.filter_eps = 0.f, g.GT = data, g.ldgt = 104;
  refused(tlse_hop_gradient(&g, nullptr), "GT is written for TLSE_HOP_TF32 only", "gradient: bf16 G^T");
  g.dtype = TLSE_HOP_TF32, g.ldgt = 100;
  refused(tlse_hop_gradient(&g, nullptr), "ldgt >= the rows, a multiple of 8", "gradient: TF32 G^T, ldgt 100");

  tlse_hop_product_args p{};
  p.dtype = 7;
  refused(tlse_hop_product(&p, nullptr), "dtype 7", "product: unknown dtype");
  p.dtype = TLSE_HOP_TF32, p.a_transposed = 1;
  refused(tlse_hop_product(&p, nullptr), "TF32 operands must be K-major", "product: TF32 read transposed");
  p.dtype = TLSE_HOP_BF16, p.a_transposed = 0;
  p.a = data, p.lda = 64, p.b = data, p.ldb = 64, p.b_transposed = 1;
  p.M = 100, p.N = 64, p.K = 64, p.ldo = 64, p.max_k_splits = 1;
  refused(tlse_hop_product(&p, nullptr), "exactly one of out_f32 and out", "product: no output");
  p.out_f32 = part, p.N = 63, p.ldb = 64, p.accumulate = 1;
  refused(tlse_hop_product(&p, nullptr), "N and ldo must be even", "product: odd N accumulated");
  p.accumulate = 0, p.ldo = 63;
  refused(tlse_hop_product(&p, nullptr), "N and ldo must be even", "product: odd ldo");
  p.ldo = 64, p.b_transposed = 0, p.a_transposed = 1;
  refused(tlse_hop_product(&p, nullptr), "16-bit B stored K-major (N x K rows) takes A as stored", "product: A^T B^T");
  p.b_transposed = 1, p.a_transposed = 0;
  p.N = 64, p.K = 512, p.a_panel = 256, p.a_panel_stride = 100 * 256, p.a_transposed = 1;
  refused(tlse_hop_product(&p, nullptr), "A in panels takes bf16 or fp16 A as stored", "product: panels of A^T");
  p.a_transposed = 0, p.a_panel = 192;
  refused(tlse_hop_product(&p, nullptr), "a multiple of 64 that divides K, a_panel_stride a positive multiple of 8",
          "product: panels that do not divide K");
  p.a_panel = 256, p.a_panel_stride = 100 * 256 + 4;
  refused(tlse_hop_product(&p, nullptr), "a_panel_stride 25604", "product: panels 8 bytes out of line");
  p.a_panel = 0, p.a_panel_stride = 0;
  expect(tlse_hop_product_workspace(7, 100, 64, 64, 4, 0) == 0 &&
             std::string(tlse_hop_error_string()).find("dtype 7") != std::string::npos,
         "product workspace: unknown dtype -> 0 and a reason");
  expect(tlse_hop_device_supported(-1) == 0, "device -1 is not supported");
}

}  // namespace

int main() {
  std::printf("seed %u (replay: TLSE_TEST_SEED=%u)\n", seed, seed);
  std::printf("arguments (no device needed):\n");
  check_arguments();
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || !tlse_hop_device_supported(device)) {
    std::printf("no sm_90 device: the kernels were not run%s\n", failures ? "; argument checks FAILED" : "");
    return failures ? 1 : 77;
  }
  std::printf("forward (row LSE, column LSE, column logit sums):\n");
  for (int dtype : {TLSE_HOP_BF16, TLSE_HOP_FP16, TLSE_HOP_TF32}) {
    check_forward(dtype, 300, 700, 200, 1.0, 0.3);
    check_forward(dtype, 1000, 1500, 72, 3.0, 1.0);
    check_forward(dtype, 300, 700, 200, 1.0, 0.3, INT64_MAX, false);  // one exponential per entry
  }
  // Tiles whose logits spread beyond 64 take two exponentials per entry: all, then some.
  check_forward(TLSE_HOP_BF16, 1000, 1500, 72, 3.0, 1.0, INT64_MAX, false);
  check_forward(TLSE_HOP_BF16, 1000, 1500, 72, 0.85, 1.0, INT64_MAX, false);
  check_forward(TLSE_HOP_BF16, 129, 300, 64, 4000.0, 1.0, INT64_MAX, false);
  check_forward(TLSE_HOP_BF16, 257, 513, 520, 1.0, 0.2);
  check_forward(TLSE_HOP_BF16, 129, 300, 64, 4000.0, 1.0);  // logits of several thousand
  check_forward(TLSE_HOP_BF16, 300, 700, 200, 1.0, 0.3, 650);  // the general logit model
  check_forward(TLSE_HOP_TF32, 257, 1001, 72, 2.0, 1.0, 1000);
  // The self-similarity form's mask: its tiles off the diagonal keep the simple model.
  check_forward(TLSE_HOP_BF16, 1000, 1500, 72, 3.0, 1.0, INT64_MAX, false, 0);
  check_forward(TLSE_HOP_BF16, 1000, 1500, 72, 3.0, 1.0, INT64_MAX, true, 300);
  check_forward(TLSE_HOP_TF32, 700, 700, 72, 2.0, 1.0, INT64_MAX, false, -5);
  // The row LSE alone (the cross-entropy forward), one row tile to several a CTA, under a softcap;
  // then the forward keeping its exponentials. Both in clusters of two CTAs, where the second CTA
  // of a pair may lie past the last row tile (100, 129, 257, 300, 1000 rows), and one CTA a tile
  // row (TLSE_HOP_FORWARD=single).
  for (const char* schedule : {"", "single"}) {
    setenv("TLSE_HOP_FORWARD", schedule, 1);
    constexpr bool with_sums = false, with_columns = false;
    for (int dtype : {TLSE_HOP_BF16, TLSE_HOP_FP16}) {
      check_forward(dtype, 300, 700, 200, 1.0, 0.3, INT64_MAX, with_sums, NO_DIAGONAL, with_columns);
      check_forward(dtype, 1000, 1500, 72, 3.0, 1.0, INT64_MAX, with_sums, NO_DIAGONAL, with_columns);
      check_forward(dtype, 100, 3000, 136, 1.0, 1.0, INT64_MAX, with_sums, NO_DIAGONAL, with_columns);
      check_forward(dtype, 2000, 4100, 64, 2.0, 1.0, INT64_MAX, with_sums, NO_DIAGONAL, with_columns);
    }
    check_forward(TLSE_HOP_BF16, 257, 513, 520, 8.0, 0.2, INT64_MAX, with_sums, NO_DIAGONAL, with_columns, 5.0);
    check_forward(TLSE_HOP_BF16, 129, 300, 64, 4000.0, 1.0, INT64_MAX, with_sums, NO_DIAGONAL, with_columns);
    for (int dtype : {TLSE_HOP_BF16, TLSE_HOP_FP16})
      for (bool shifted : {false, true}) {
        if (shifted && dtype == TLSE_HOP_FP16) continue;  // fp16 takes no row shifts
        check_kept_exponentials(dtype, 300, 1001, 200, 1.0, shifted);
        check_kept_exponentials(dtype, 129, 2050, 72, 30.0, shifted);
        check_kept_exponentials(dtype, 300, 1001, 200, 1.0, shifted, 512);           // a prefix of the columns
        check_kept_exponentials(dtype, 300, 1500, 200, 1.0, shifted, 1280, 512);     // in panels, the last one partial
        check_kept_exponentials(dtype, 300, 1800, 200, 1.0, shifted, 1536, 256, 2);  // panels 2-5 in the tail
      }
  }
  unsetenv("TLSE_HOP_FORWARD");
  std::printf("backward (gradient panel, products):\n");
  for (int dtype : {TLSE_HOP_BF16, TLSE_HOP_FP16, TLSE_HOP_TF32}) {
    check_backward(dtype, 300, 1000, 200, 0, 1000, 0.0);
    check_backward(dtype, 700, 1500, 136, 256, 1300, 0.0);
    check_backward(dtype, 1100, 2000, 64, 512, 2000, 1.0 / 4096);
    check_backward(dtype, 300, 1000, 200, 0, 1000, 0.0, true);
    check_backward(dtype, 1100, 2000, 64, 512, 2000, 1.0 / 4096, true);
    check_backward(dtype, 300, 1000, 200, 0, 1000, 0.0, false, Model::general);
    check_backward(dtype, 700, 1500, 136, 256, 1300, 1.0 / 4096, false, Model::general);
    check_backward(dtype, 700, 1500, 136, 256, 1300, 0.0, false, Model::diagonal);
    check_backward(dtype, 700, 1500, 136, 256, 600, 0.0, false, Model::diagonal);  // its end tile meets the diagonal
    check_backward(dtype, 1100, 2000, 64, 512, 2000, 1.0 / 4096, false, Model::diagonal);
  }
  check_product_stores(130, 136);  // from the registers
  check_product_stores(128, 136);  // staged
  check_product_stores(2000, 2008, 4000, 712, false, 7);  // several tiles a CTA (its pair), 12 K steps each
  check_panel_product(TLSE_HOP_BF16, 300, 136, 256, 5, false);
  check_panel_product(TLSE_HOP_FP16, 300, 200, 512, 3, true);
  check_panel_product(TLSE_HOP_BF16, 2000, 1024, 512, 3, true, 7);
  std::printf("%s\n", failures ? "FAILED" : "all passed");
  return failures ? 1 : 0;
}
