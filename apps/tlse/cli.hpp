#pragma once
// The command line of `tlse`: a subcommand, its sizes and a few flags. Parsing does not touch
// Kokkos, so --help and usage errors answer before Kokkos starts; --kokkos-* arguments are
// skipped here and left to Kokkos::initialize.
#include <tlse/options.hpp>

#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

namespace tlse::app {

enum class Job { contrastive, cross_entropy };
enum class DType { f32, f64, bf16, f16 };
enum class Inputs { random, lm };  // tlse_bench/random_inputs.hpp, tlse_bench/lm_inputs.hpp

struct Options {
  Job job = Job::contrastive;
  std::int64_t batch = 0, tokens = 0, dim = 0, vocab = 0;
  DType dtype = DType::f32;
  bool tf32 = false;  // --precision tf32
  std::size_t memory_budget = memory_budget_default;  // --memory-budget MiB
  Inputs inputs = Inputs::random;                     // --inputs (cross-entropy)
  double filter_eps = filter_eps_auto;                // --filter (cross-entropy)
  bool sort_vocabulary = false;                       // --sort-vocab (cross-entropy)
  bool statistics_only = false;                       // --statistics-only (cross-entropy)
  bool filter_study = false;                          // --filter-study (cross-entropy)
  bool check_sampled = false;                         // --check-sampled (cross-entropy)
  bool training_step = false;                         // --training-step (cross-entropy)
  double softcap = 0;                                 // --softcap (cross-entropy); 0: off
  bool bias = false;                                  // --bias (cross-entropy)
  double ignore_fraction = 0;                         // --ignore-fraction (cross-entropy)
  double scale = 1 / 0.07;  // CLIP's initial temperature
  bool self_similarity = false;  // --self-similarity (contrastive)
  int iterations = 3;
  std::uint64_t seed = 42;
  bool check = false;
  bool baseline = true;
  bool help = false;
};

/// A mistake on the command line; main prints it with a pointer to --help and exits with 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

inline const char* usage() {
  return R"(tlse: log-sum-exp losses without the logit matrix (TiledLSE), timed against the
materialized baseline (KokkosBlas::gemm + softmax over the full matrix).

usage:
  tlse contrastive  --batch B --dim C [--scale S] [--self-similarity] [common options]
  tlse cross-entropy --tokens N --dim D --vocab V [cross-entropy options] [common options]
  tlse --help

  contrastive     symmetric CLIP loss over B image/text pairs of C features (L2-normalized
                  random rows, diagonal positives), logits scale * I T^T; --scale defaults to
                  1/0.07 = 14.2857. With --self-similarity, the NT-Xent (SimCLR) form instead:
                  one matrix Z of B rows (B even: two views of B/2 samples, row i's positive
                  is row i + B/2 mod B), logits scale * Z Z^T without the diagonal, gradient dZ
                  (tlse::self_contrastive_loss); the same B x B logits as the paired form.
  cross-entropy   mean cross-entropy of N tokens over a vocabulary of V classes, on random or
                  trained-LM-like inputs (--inputs). Prints what gradient filtering can skip on
                  them, measured in float64 on 256 sampled rows (tlse_bench/softmax_statistics.hpp):
                  mean loss, softmax entries per row at or above the filter threshold, and the
                  fraction of 128x128 (mma.sync) and 128x256 (Hopper) backward tiles whose entries
                  are all below it and that hold no target, with and without vocabulary sorting.

cross-entropy options:
  --inputs random|lm         random (default; the worst case for filtering): E (N x D) ~ N(0,1),
                             C (V x D) ~ N(0,1) * 4/sqrt(D) (logit std ~4), uniform targets.
                             lm: shaped like a trained LM's output layer (tlse_bench/lm_inputs.hpp):
                             Zipf(1.1) targets, token ids a random permutation of frequency ranks,
                             a log-frequency bias folded into C (E's last feature is 1), 32
                             plausible tokens per row; mean loss ~2.8 nats, ~50 entries per row
                             >= 2^-12 at D = 4096, V = 128256 (needs D >= 2; meant for D >= 1024)
  --filter auto|off|EPS      gradient filtering threshold (CrossEntropyOptions::filter_eps): auto
                             (default) eps(dtype)/32, off (0: exact gradients), or a number in [0, 1]
  --sort-vocab               the forward returns the vocabulary sorted by column logit sum and the
                             backward visits classes in that order (vocab_order)
  --statistics-only          print the inputs' statistics and stop (no timing)
  --filter-study             time TiledLSE three times on the same inputs: filtering off, at the
                             threshold of --filter (default auto), and at it with the vocabulary
                             sorted; prints the backward times (fwd+bwd - forward) and the share
                             of skippable tiles of each (the statistics above)
  --training-step            also time the step as one call, cross_entropy_with_gradients (its
                             fwd+bwd column; forward alone as usual): on Hopper GPUs the forward's
                             logits become the gradient when --memory-budget holds a chunk of them
  --softcap S                logits become S tanh(x / S) (Gemma 2; CrossEntropyOptions::softcap), in
                             TiledLSE, the baseline, the input statistics and --check (not with
                             --check-sampled); on Hopper GPUs the training step then turns its
                             kept exponentials into G in a pass of its own (docs/performance.md)
  --bias                     add a fixed per-class bias b_j ~ N(0,1), drawn after the inputs (which
                             stay those of the seed), passed as the calls' bias argument: logits
                             C E_i + b (before a softcap), in TiledLSE, the baseline, the input
                             statistics and --check (not with --check-sampled). No dbias is asked
                             for, so the training step still fuses; on Hopper GPUs a bias takes the
                             general logit model's kernels (docs/performance.md)
  --ignore-fraction F        set the targets of a share F in [0, 1) of the rows (spread evenly) to
                             ignore_index (-100): rows of a padded or prompt-masked batch, which add
                             0; the mean is over the others. In TiledLSE, the baseline, the input
                             statistics and --check (not with --check-sampled)
  --check-sampled            compare dE on 256 sampled rows and dC on 256 sampled classes (the 128
                             likeliest by column logit sum and 128 spread over the ids) with float64
                             gradients from exact float64 LSEs of every row (KokkosBlas::gemm on the
                             run's device, N V D multiply-adds): what --check does, at sizes whose
                             full reference would take hours; reports the error filtering adds

common options:
  --dtype f32|f64|bf16|f16   input and gradient type (default f32); kernels accumulate in
                             float, or in double for f64
  --iterations K             timed repetitions, median reported, after 1 warm-up (default 3)
  --seed S                   seed of the random inputs (default 42)
  --no-baseline              skip the materialized baseline
  --check                    compare loss and gradients (of TiledLSE and of the baseline) with
                             the float64 reference, which materializes everything and costs
                             O(rows x cols x dim) serial work; exit 1 on a mismatch
  --memory-budget MiB        workspace the calls may use (default 256); each picks the fastest
                             algorithm that fits (docs/options.md)
  --precision exact|tf32     f32 only: tf32 lets the CUDA tensor cores multiply in TF32
                             (tlse::Precision::tf32; default exact)
  --kokkos-...               passed to Kokkos (e.g. --kokkos-threads=2)

--check tolerances: loss error <= tol_loss * (1 + |loss|), gradient error
max|g - g_ref| <= tol_grad * max|g_ref|; the reference is fed the inputs after rounding to dtype.
  f64    tol_loss 1e-9, tol_grad 1e-9: double accumulation errs ~1e-14; anything near 1e-9
         means a float got in.
  f32    tol_loss 1e-5, tol_grad 1e-4: float sums of C- or D-long dot products and of
         B- or V-long exponential sums err ~1e-6 to 1e-5 relative.
  bf16   tol_loss 1e-5, tol_grad 2^-7: the loss is accumulated in float from exact inputs, as
         for f32; gradients are rounded to 8 significant bits (error <= 2^-8 of each element),
         the other half of the budget is float accumulation and gradient filtering.
  f16    tol_loss 1e-5, tol_grad 2^-10: as bf16 with 11 significant bits.
  tf32   tol_loss 2^-9, tol_grad 2^-7: operands rounded to 11 significant bits, so logits err
         ~2^-10 relative to scale |a| |b| (randomly signed over the depth); gradients as bf16.

Times are fenced wall-clock medians. Extra memory is what a call allocates beyond its inputs,
outputs and gradients: TiledLSE's workspace and saved LSEs (plus per-team scratch of a fixed
tile size), the baseline's logit matrix, LSEs and float copies of 16-bit data.
)";
}

namespace detail {

inline std::int64_t positive_integer(const std::string& flag, const std::string& text) {
  std::int64_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size())
    throw UsageError(flag + " expects a positive integer, got '" + text + "'");
  if (v <= 0) throw UsageError(flag + " must be positive, got '" + text + "'");
  return v;
}

inline std::uint64_t unsigned_integer(const std::string& flag, const std::string& text) {
  std::uint64_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size())
    throw UsageError(flag + " expects a non-negative integer, got '" + text + "'");
  return v;
}

/// A number as --help and the header print it (%g).
inline std::string number_text(double v) {
  char s[32];
  std::snprintf(s, sizeof s, "%g", v);
  return s;
}

inline double positive_number(const std::string& flag, const std::string& text) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || !std::isfinite(v))
    throw UsageError(flag + " expects a finite number, got '" + text + "'");
  if (!(v > 0)) throw UsageError(flag + " must be positive, got '" + text + "'");
  return v;
}

inline double fraction_below_one(const std::string& flag, const std::string& text) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || !(v >= 0 && v < 1))
    throw UsageError(flag + " expects a number in [0, 1), got '" + text + "'");
  return v;
}

inline double filter_eps(const std::string& flag, const std::string& text) {
  if (text == "auto") return filter_eps_auto;
  if (text == "off") return 0;
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || !(v >= 0 && v <= 1))
    throw UsageError(flag + " expects auto, off or a number in [0, 1], got '" + text + "'");
  return v;
}

inline DType dtype(const std::string& flag, const std::string& text) {
  if (text == "f32") return DType::f32;
  if (text == "f64") return DType::f64;
  if (text == "bf16") return DType::bf16;
  if (text == "f16") return DType::f16;
  throw UsageError(flag + " expects one of f32, f64, bf16, f16, got '" + text + "'");
}

}  // namespace detail

/// Parses argv (without --kokkos-* arguments); throws UsageError naming the flag and value.
inline Options parse_command_line(int argc, const char* const* argv) {
  std::vector<std::string> args;
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]).rfind("--kokkos-", 0) != 0) args.emplace_back(argv[i]);
  Options o;
  if (args.empty()) throw UsageError("missing the subcommand (contrastive or cross-entropy)");
  if (args[0] == "--help" || args[0] == "-h") {
    o.help = true;
    return o;
  }
  if (args[0] == "contrastive")
    o.job = Job::contrastive;
  else if (args[0] == "cross-entropy")
    o.job = Job::cross_entropy;
  else
    throw UsageError("unknown subcommand '" + args[0] + "'; expected contrastive or cross-entropy");
  const bool contrastive = o.job == Job::contrastive;

  for (std::size_t k = 1; k < args.size(); ++k) {
    std::string flag = args[k], value;
    const bool inline_value = flag.rfind("--", 0) == 0 && flag.find('=') != std::string::npos;
    if (inline_value) {  // --flag=value
      value = flag.substr(flag.find('=') + 1);
      flag = flag.substr(0, flag.find('='));
    }
    const auto next = [&]() -> const std::string& {
      if (inline_value) return value;
      if (k + 1 >= args.size() || args[k + 1].rfind("--", 0) == 0) throw UsageError(flag + " needs a value");
      return args[++k];
    };
    const auto no_value = [&]() {
      if (inline_value) throw UsageError(flag + " takes no value, got '" + value + "'");
    };
    if (flag == "--help" || flag == "-h") {
      no_value();
      o.help = true;
    } else if (flag == "--check") {
      no_value();
      o.check = true;
    } else if (flag == "--no-baseline") {
      no_value();
      o.baseline = false;
    } else if (flag == "--dtype") {
      o.dtype = detail::dtype(flag, next());
    } else if (flag == "--precision") {
      const std::string& p = next();
      if (p != "exact" && p != "tf32") throw UsageError(flag + " expects exact or tf32, got '" + p + "'");
      o.tf32 = p == "tf32";
    } else if (flag == "--memory-budget") {
      const std::int64_t mib = detail::positive_integer(flag, next());
      if (mib > (std::int64_t(1) << 30))
        throw UsageError(flag + " is in MiB and at most 2^30, got '" + std::to_string(mib) + "'");
      o.memory_budget = std::size_t(mib) << 20;
    } else if (flag == "--iterations") {
      const std::int64_t k_it = detail::positive_integer(flag, next());
      if (k_it > 1000000) throw UsageError(flag + " must be at most 1000000, got '" + std::to_string(k_it) + "'");
      o.iterations = int(k_it);
    } else if (flag == "--seed") {
      o.seed = detail::unsigned_integer(flag, next());
    } else if (flag == "--dim") {
      o.dim = detail::positive_integer(flag, next());
    } else if (contrastive && flag == "--batch") {
      o.batch = detail::positive_integer(flag, next());
    } else if (contrastive && flag == "--scale") {
      o.scale = detail::positive_number(flag, next());
    } else if (contrastive && flag == "--self-similarity") {
      no_value();
      o.self_similarity = true;
    } else if (!contrastive && flag == "--tokens") {
      o.tokens = detail::positive_integer(flag, next());
    } else if (!contrastive && flag == "--vocab") {
      o.vocab = detail::positive_integer(flag, next());
    } else if (!contrastive && flag == "--inputs") {
      const std::string& v = next();
      if (v != "random" && v != "lm") throw UsageError(flag + " expects random or lm, got '" + v + "'");
      o.inputs = v == "lm" ? Inputs::lm : Inputs::random;
    } else if (!contrastive && flag == "--filter") {
      o.filter_eps = detail::filter_eps(flag, next());
    } else if (!contrastive && flag == "--sort-vocab") {
      no_value();
      o.sort_vocabulary = true;
    } else if (!contrastive && flag == "--statistics-only") {
      no_value();
      o.statistics_only = true;
    } else if (!contrastive && flag == "--filter-study") {
      no_value();
      o.filter_study = true;
    } else if (!contrastive && flag == "--training-step") {
      no_value();
      o.training_step = true;
    } else if (!contrastive && flag == "--softcap") {
      o.softcap = detail::positive_number(flag, next());
    } else if (!contrastive && flag == "--bias") {
      no_value();
      o.bias = true;
    } else if (!contrastive && flag == "--ignore-fraction") {
      o.ignore_fraction = detail::fraction_below_one(flag, next());
    } else if (!contrastive && flag == "--check-sampled") {
      no_value();
      o.check_sampled = true;
    } else {
      throw UsageError("unknown option '" + args[k] + "' for " + args[0]);
    }
  }
  if (o.help) return o;
  const auto require = [&](std::int64_t v, const char* flag) {
    if (v == 0) throw UsageError(args[0] + " needs " + flag);
  };
  if (contrastive) {
    require(o.batch, "--batch");
    if (o.self_similarity && o.batch % 2 != 0)
      throw UsageError("--self-similarity needs an even --batch (two views of each sample), got '" +
                       std::to_string(o.batch) + "'");
  } else {
    require(o.tokens, "--tokens");
    require(o.vocab, "--vocab");
  }
  require(o.dim, "--dim");
  if (o.filter_study && o.filter_eps == 0)
    throw UsageError("--filter-study compares filtering with --filter off; give it a threshold");
  if (o.inputs == Inputs::lm && o.dim < 2)
    throw UsageError("--inputs lm needs --dim >= 2 (one feature carries the bias)");
  if (o.tf32 && o.dtype != DType::f32) throw UsageError("--precision tf32 applies to --dtype f32 only");
  if (o.softcap > 0 && o.check_sampled)
    throw UsageError("--check-sampled has no softcap (tlse_bench/sampled_reference.hpp); drop --softcap " +
                     detail::number_text(o.softcap) + " or --check-sampled");
  if (o.bias && o.check_sampled)
    throw UsageError("--check-sampled has no bias (tlse_bench/sampled_reference.hpp); drop --bias or --check-sampled");
  if (o.ignore_fraction > 0 && o.check_sampled)
    throw UsageError("--check-sampled scores every row (tlse_bench/sampled_reference.hpp); drop --ignore-fraction " +
                     detail::number_text(o.ignore_fraction) + " or --check-sampled");
  return o;
}

}  // namespace tlse::app
