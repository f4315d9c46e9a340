// libFuzzer target of the C API (c_api/include/tlse.h). Each input becomes one to three calls of
// the tlse_* entry points: shapes (0, 1, tile edges, and sizes whose products overflow 32 or 64
// bits), dtypes, devices, streams, options (NaN, Inf, negative, overflowing and denormal values,
// ignore_index, shift, filter_eps, workspaces of every size), NULL, aliased and misaligned
// pointers, communicators with NULL or failing callbacks. After every call it checks:
//   1. the status is a tlse_status, and a failure has a message;
//   2. no byte outside the arrays was touched (guard bytes, poisoned for AddressSanitizer);
//   3. no input changed, and after a failure no output changed either;
//   4. what tlse.h and docs/errors.md call invalid fails; a valid call on exactly representable
//      data succeeds, and its results match a float64 reference (oracle.hpp).
// A violation prints the call and aborts, so libFuzzer keeps the input (scripts/fuzz.sh).
#include <fuzzer/FuzzedDataProvider.h>
#include <tlse.h>

#include <algorithm>
#include <cfloat>
#include <cstdio>
#include <limits>
#include <memory>
#include <string>

#include "buffers.hpp"
#include "oracle.hpp"

namespace fuzz {
namespace {

constexpr std::int64_t max_size = 2147483647;  // tlse.h: sizes are at most 2^31 - 1
constexpr std::size_t max_elements = 1 << 15;  // larger arrays are not allocated: such inputs are skipped

tlse_context* context() {
  static tlse_context* ctx = [] {
    tlse_context* c = nullptr;
    if (tlse_context_create(&c, -1) != TLSE_SUCCESS) std::fprintf(stderr, "%s\n", tlse_last_error()), std::abort();
    return c;
  }();
  return ctx;
}

/// The fuzzer's bytes as choices. Once the bytes run out every choice is its first (common) value.
class Input {
 public:
  Input(const std::uint8_t* data, std::size_t size) : p_(data, size) {}
  /// True once in `k` (for an exhausted input: never).
  bool one_in(int k) { return p_.ConsumeIntegralInRange<int>(1, k) == k; }
  int below(int n) { return p_.ConsumeIntegralInRange<int>(0, n - 1); }
  template <class T>
  T pick(std::initializer_list<T> values) {
    return values.begin()[p_.ConsumeIntegralInRange<std::size_t>(0, values.size() - 1)];
  }
  std::int64_t integer(std::int64_t lo, std::int64_t hi) { return p_.ConsumeIntegralInRange<std::int64_t>(lo, hi); }
  /// A size: mostly small, at times a tile edge, the 32-bit limit, or something no call accepts.
  std::int64_t size(std::int64_t small) {
    if (!one_in(10)) return integer(0, small);
    return pick<std::int64_t>({1, 31, 32, 33, 129, max_size, max_size + 1, std::int64_t(1) << 32,
                               (std::int64_t(1) << 32) + 1, std::int64_t(1) << 62, INT64_MAX, -1, INT64_MIN});
  }
  /// An option value: `usual` mostly, else an edge of double.
  double option(std::initializer_list<double> usual) {
    if (!one_in(6)) return pick(usual);
    return pick<double>(
        {0.0, -0.0, -1.0, NAN, INFINITY, -INFINITY, 1e-300, 5e-324, 1e-45, 1e30, 3.5e38, 1e39, DBL_MAX});
  }
  /// A value an array holds: k/8 with |k| <= 16 (exact in every dtype) or, in `special` arrays
  /// at times, one that is not.
  double value(bool special) {
    if (special && one_in(4))
      return pick<double>({NAN, INFINITY, -INFINITY, 1e30, -1e30, 65504.0, 1e-40, 3e38, 0.1, -0.0});
    return double(integer(-16, 16)) / 8;
  }

 private:
  FuzzedDataProvider p_;
};

[[noreturn]] void violated(const std::string& what, const std::string& call) {
  std::fprintf(stderr, "\nfuzz_c_api: %s\n  call: %s\n  last error: %s\n", what.c_str(), call.c_str(),
               tlse_last_error());
  std::abort();
}

Kind storage_kind(int dtype) {
  return dtype == TLSE_F64 ? Kind::f64 : dtype == TLSE_BF16 ? Kind::bf16 : dtype == TLSE_F16 ? Kind::f16 : Kind::f32;
}
Kind acc_kind(int dtype) { return dtype == TLSE_F64 ? Kind::f64 : Kind::f32; }
bool valid_dtype(int dtype) { return dtype >= TLSE_F32 && dtype <= TLSE_F16; }
bool valid_precision(int precision) { return precision == TLSE_PRECISION_EXACT || precision == TLSE_PRECISION_TF32; }
/// Rounding of a dtype's results (oracle.hpp).
Rounding rounding(int dtype) {
  const bool f64 = dtype == TLSE_F64;
  return {f64 ? 0x1p-53 : 0x1p-24,
          dtype == TLSE_BF16  ? 0x1p-8
          : dtype == TLSE_F16 ? 0x1p-11
                              : 0.0,
          f64                 ? 0x1p-1022
          : dtype == TLSE_F16 ? 0x1p-24
                              : 0x1p-126};
}
/// Whether an option value survives the conversion to the accumulator type (float, or double for f64).
bool fits_accumulator(double v, int dtype) {
  if (dtype == TLSE_F64) return std::isfinite(v);
  return std::isfinite(v) && std::fabs(v) <= FLT_MAX && (v == 0 || float(v) != 0);
}

/// One call being built: its arrays, what makes it invalid, and the checks after it.
class Call {
 public:
  Call(Input& in, const char* function) : in_(in), log_(function) {}

  /// Adds a reason the call must fail.
  void invalid(const std::string& why) { invalid_ += why + "; ", log_ += " [" + why + "]"; }
  bool is_invalid() const { return !invalid_.empty(); }
  void note(const std::string& s) { log_ += " " + s; }
  const std::string& log() const { return log_; }

  /// An array argument of `count` elements (a count that is not a size or too large to allocate
  /// gets a stand-in of 0 elements: see skip()). `required` arrays
  /// must not be NULL when non-empty; the fuzzer may still pass NULL, another array (aliasing) or
  /// a misaligned pointer. Returns the array, or nullptr for NULL.
  Buffer* array(const char* name, Kind kind, std::int64_t count, bool output, bool required, bool special = false) {
    const bool backed = count >= 0 && std::size_t(count) <= max_elements;
    skip_ |= !backed;
    const int how = in_.one_in(12) ? in_.below(3) : 3;  // 0 NULL, 1 alias, 2 misaligned, 3 its own array
    const std::size_t elements = backed ? std::size_t(count) : 0;
    Arg a{name, kind, elements, output, nullptr, nullptr};
    if (how == 0 || (!required && in_.one_in(4))) {
      note(std::string(name) + "=NULL");
      if (required && count != 0) invalid(std::string(name) + " NULL");
      args_.push_back(a);
      return nullptr;
    }
    if (how == 1 && !args_.empty()) {
      // Another array stands in only where it is large enough (a caller must not make the
      // library read or write past an array), and for an input only one of the same kind.
      // Where either is written, the overlap makes the call invalid.
      const Arg other = args_[std::size_t(in_.below(int(args_.size())))];  // a copy: args_ grows below
      const bool written = output || other.output;
      if (other.buffer && other.buffer->bytes() >= elements * size_of(kind) && (written || other.kind == kind)) {
        note(std::string(name) + "=alias:" + other.name);
        a.buffer = other.buffer;
        a.pointer = other.pointer;
        args_.push_back(a);
        if (written && elements > 0) invalid(std::string(name) + " overlaps " + other.name);
        return a.buffer;
      }
    }
    const bool misaligned = how == 2 && elements > 0;
    owned_.push_back(std::make_unique<Buffer>(kind, elements, misaligned));
    a.buffer = owned_.back().get();
    a.pointer = a.buffer->data();
    if (misaligned) note(std::string(name) + "=misaligned"), invalid(std::string(name) + " misaligned");
    for (std::size_t i = 0; i < elements; ++i) a.buffer->set(i, output ? 0.75 : in_.value(special));
    args_.push_back(a);
    return a.buffer;
  }
  /// The pointer the call gets for argument `k` (in the order of array()).
  void* pointer(std::size_t k) const { return args_[k].pointer; }

  /// Lends a workspace of a size near `need` (0: unknown) with probability 1/3; sets `bytes`.
  void* workspace(std::size_t need, std::size_t& bytes) {
    bytes = 0;
    if (!in_.one_in(3)) return nullptr;
    const int how = in_.below(4);
    bytes = how == 0   ? need
            : how == 1 ? (need ? need - 1 : 0)
            : how == 2 ? need + 100
                       : std::size_t(in_.integer(0, 4096));
    if (bytes > (1u << 22)) bytes = 0;
    workspaces_.push_back(std::make_unique<Buffer>(Kind::u8, bytes));
    note("workspace=" + std::to_string(bytes) + "/" + std::to_string(need));
    ws_short_ = need > 0 && bytes < need;
    return workspaces_.back()->data();
  }
  bool workspace_short() const { return ws_short_; }
  /// A size the C API rejects first, before it looks at any array.
  void invalid_size(const std::string& why) { invalid(why), bad_size_ = true; }
  /// Whether some array was too large to allocate: the call is not run, unless a size is out of
  /// range (then it must fail before reading the 0-element stand-in it gets).
  bool skip() const { return skip_ && !bad_size_; }

  /// Saves every array before the call.
  void before() {
    for (auto& b : owned_) b->save();
  }
  /// After a later call that only read this call's arrays (a backward reading the forward's):
  /// nothing of them changed, around them neither.
  void read_only_since_before(const std::string& during) const {
    for (auto& b : owned_)
      if (b->changed() || !b->guards_intact()) violated("an array of the forward changed during " + during, log_);
  }
  /// Checks 1-4 on the call's status; `consistent`: a valid call must succeed.
  void after(tlse_status status, bool consistent = true) {
    if (status < TLSE_SUCCESS || status > TLSE_ERROR_RUNTIME) violated("status " + std::to_string(status), log_);
    if (status != TLSE_SUCCESS && std::string(tlse_last_error()).find("tlse") == std::string::npos)
      violated("a failure without a message naming the call", log_);
    for (auto& b : owned_)
      if (!b->guards_intact()) violated("a guard byte next to an array was written", log_);
    for (auto& w : workspaces_)
      if (!w->guards_intact()) violated("a guard byte next to the workspace was written", log_);
    for (const Arg& a : args_) {
      if (!a.buffer || !a.buffer->changed()) continue;
      if (!a.output) violated(std::string("input '") + a.name + "' changed", log_);
      if (status != TLSE_SUCCESS && !outputs_may_change_on_failure_)
        violated(std::string("output '") + a.name + "' changed although the call failed", log_);
    }
    if (is_invalid() && status == TLSE_SUCCESS) violated("an invalid call succeeded (" + invalid_ + ")", log_);
    if (consistent && !is_invalid() && !ws_short_ && status != TLSE_SUCCESS) violated("a valid call failed", log_);
  }
  /// A failing communicator callback may stop a distributed call after it wrote some outputs.
  void outputs_may_change_on_failure() { outputs_may_change_on_failure_ = true; }

  /// Compares `got` (the library's array) with `want`; `what` names it.
  void expect(const char* what, const Buffer* got, const Expected& want) const {
    if (!got) return;
    for (std::size_t i = 0; i < want.value.size(); ++i) {
      const double g = got->get(i), w = want.value[i];
      // Logits beyond the accumulator's range (e.g. scale 1e308 in double) make the reference
      // inf or NaN as well: IEEE propagation, documented, not compared.
      if (!std::isfinite(w) || !std::isfinite(want.tolerance[i])) continue;
      if (std::fabs(g - w) <= want.tolerance[i]) continue;
      // A result beyond the output type's range may round to infinity (e.g. a gradient of 1e30 in fp16).
      const double reach = g > 0 ? w + want.tolerance[i] : -(w - want.tolerance[i]);  // towards g's sign
      if (std::isinf(g) && reach > max_finite(got->kind())) continue;
      char text[160];
      std::snprintf(text, sizeof text, "%s[%zu] = %.17g, the reference %.17g +- %.3g", what, i, g, w,
                    want.tolerance[i]);
      violated(text, log_);
    }
  }

 private:
  struct Arg {
    const char* name;
    Kind kind;
    std::size_t elements;
    bool output;
    Buffer* buffer;
    void* pointer;
  };
  Input& in_;
  std::string log_, invalid_;
  std::vector<std::unique_ptr<Buffer>> owned_, workspaces_;
  std::vector<Arg> args_;
  bool skip_ = false, bad_size_ = false, ws_short_ = false, outputs_may_change_on_failure_ = false;
};

/// Reads an array (or nothing, for NULL) as a float64 matrix. An argument aliasing a smaller array
/// of another type (an invalid call, whose results are not compared) is read as far as it goes.
Mat matrix(const Buffer* b, std::int64_t rows, std::int64_t cols) {
  Mat m(rows, cols);
  if (b)
    for (std::size_t i = 0; i < std::min(m.v.size(), b->count()); ++i) m.v[i] = b->get(i);
  return m;
}
std::vector<double> values(const Buffer* b, std::int64_t count) {
  return b ? matrix(b, 1, count).v : std::vector<double>();
}
/// Whether the `count` elements an argument spans are finite. An argument may alias a larger array
/// (call.array): the library reads only its own `count` elements, and so does this check.
bool all_finite(const Buffer* b, std::int64_t count) {
  if (!b) return true;
  for (std::size_t i = 0; i < std::min(std::size_t(std::max<std::int64_t>(count, 0)), b->count()); ++i)
    if (!std::isfinite(b->get(i))) return false;
  return true;
}

/// The dtype, device and stream of a call: mostly valid, at times not.
struct Target {
  int dtype, device;
  void* stream;
};
Target target(Input& in, Call& call) {
  Target t{in.pick<int>({TLSE_F32, TLSE_F64, TLSE_BF16, TLSE_F16}), TLSE_DEVICE_HOST, nullptr};
  if (in.one_in(16)) t.dtype = in.pick<int>({4, -1, 1 << 30});
  if (in.one_in(16)) t.device = in.pick<int>({TLSE_DEVICE_CUDA, 2, -1});
  if (in.one_in(8)) t.stream = reinterpret_cast<void*>(std::uintptr_t(0x1234));  // host calls ignore it
  call.note("dtype=" + std::to_string(t.dtype) + " device=" + std::to_string(t.device));
  if (!valid_dtype(t.dtype)) call.invalid("dtype");
  if (t.device != TLSE_DEVICE_HOST) call.invalid("device");  // CUDA: this is a host build
  return t;
}
/// The element count of a rows x cols matrix, or -1 when a size is not one (the call must fail).
std::int64_t elements(std::int64_t rows, std::int64_t cols) {
  const auto valid = [](std::int64_t s) { return s >= 0 && s <= max_size; };
  return valid(rows) && valid(cols) ? rows * cols : -1;
}

void sizes(Call& call, std::initializer_list<std::pair<const char*, std::int64_t>> named) {
  for (const auto& s : named) {
    call.note(std::string(s.first) + "=" + std::to_string(s.second));
    if (s.second < 0 || s.second > max_size) call.invalid_size(std::string(s.first) + " out of range");
  }
}

// ---- Cross-entropy ---------------------------------------------------------------------------

tlse_cross_entropy_options cross_entropy_options(Input& in, Call& call, int dtype, std::int64_t n, std::int64_t v) {
  tlse_cross_entropy_options o;
  tlse_cross_entropy_options_default(&o);
  // Sizes may be any int64: neighbours are taken without overflow.
  const std::int64_t v_less = v > INT64_MIN ? v - 1 : v, n_less = n > INT64_MIN ? n - 1 : n;
  const std::int64_t n_more = n < INT64_MAX ? n + 1 : n;
  if (in.one_in(3)) o.ignore_index = in.pick<std::int64_t>({-1, 0, v_less, v, INT64_MIN, INT64_MAX});
  o.reduction = in.one_in(16) ? in.pick<int>({3, -1}) : in.below(3);
  o.accumulate = in.pick<int>({0, 1, 7});
  o.shift = in.one_in(3) ? in.pick<std::int64_t>({1, n_less, n, n_more, INT64_MAX, -1}) : 0;
  o.softcap = in.option({0.0, 0.5, 5.0, 30.0});
  o.z_loss = in.option({0.0, 1e-4, 0.1});
  o.filter_eps = in.one_in(2) ? 0.0 : in.option({TLSE_FILTER_EPS_AUTO, 1e-3, 1.0});
  o.detect_non_finite = in.one_in(4);
  if (in.one_in(32)) o.precision = in.pick<int>({TLSE_PRECISION_TF32, 2, -1});
  call.note("ignore=" + std::to_string(o.ignore_index) + " red=" + std::to_string(o.reduction) +
            " shift=" + std::to_string(o.shift) + " softcap=" + std::to_string(o.softcap) +
            " z=" + std::to_string(o.z_loss) + " eps=" + std::to_string(o.filter_eps) +
            " detect=" + std::to_string(o.detect_non_finite) + " acc=" + std::to_string(o.accumulate));
  if (!valid_precision(o.precision)) call.invalid("precision");
  if (o.reduction < 0 || o.reduction > 2) call.invalid("reduction");
  if (o.shift < 0) call.invalid("shift");
  if (!(o.softcap >= 0) || !fits_accumulator(o.softcap, dtype)) call.invalid("softcap");
  if (!(o.z_loss >= 0) || !std::isfinite(o.z_loss) || (dtype != TLSE_F64 && o.z_loss > FLT_MAX)) call.invalid("z_loss");
  if (o.filter_eps != TLSE_FILTER_EPS_AUTO && !(o.filter_eps >= 0 && o.filter_eps <= 1)) call.invalid("filter_eps");
  if (o.ignore_index >= 0 && o.ignore_index < v) call.invalid("ignore_index a class");
  // Label smoothing's values are the unit tests' (the oracle knows none); here only bad ones.
  if (in.one_in(32)) {
    o.label_smoothing = in.pick<double>({-0.5, 1.5, std::numeric_limits<double>::quiet_NaN()});
    call.note("label_smoothing=" + std::to_string(o.label_smoothing));
    call.invalid("label_smoothing");
  }
  return o;
}

/// Targets: mostly classes or ignore_index, at times anything; invalid when a scored one is neither.
void fill_targets(Input& in, Call& call, Buffer* t, const tlse_cross_entropy_options& o, std::int64_t v) {
  if (!t) return;
  for (std::size_t i = 0; i < t->count(); ++i) {
    std::int64_t value = v > 0 ? in.integer(0, v - 1) : o.ignore_index;
    if (in.one_in(8)) value = o.ignore_index;
    if (in.one_in(40)) value = in.pick<std::int64_t>({-1, v, -100, INT64_MIN, INT64_MAX, std::int64_t(1) << 31});
    t->set_int(i, value);
  }
  for (std::size_t i = 0; i < t->count(); ++i) {
    const std::int64_t value = t->get_int(i);
    if (o.shift >= 0 && std::int64_t(i) >= o.shift && value != o.ignore_index && (value < 0 || value >= v))
      return call.invalid("target out of range");
  }
}

std::size_t cross_entropy_workspace_need(const Target& t, std::int64_t n, std::int64_t v, std::int64_t d,
                                         const tlse_cross_entropy_options& o) {
  std::size_t need = 0;
  tlse_cross_entropy_options plain = o;
  plain.workspace = nullptr, plain.workspace_bytes = 0;
  if (tlse_cross_entropy_workspace_bytes(context(), tlse_device(t.device), t.stream, tlse_dtype(t.dtype), n, v, d,
                                         &plain, &need) != TLSE_SUCCESS)
    return 0;
  return need;
}

void fuzz_cross_entropy_workspace_bytes(Input& in) {
  Call call(in, "tlse_cross_entropy_workspace_bytes");
  const Target t = target(in, call);
  const std::int64_t n = in.size(64), v = in.size(300), d = in.size(64);
  sizes(call, {{"n", n}, {"v", v}, {"d", d}});
  tlse_cross_entropy_options o;
  tlse_cross_entropy_options_default(&o);
  o.reduction = in.one_in(16) ? 5 : in.below(3);
  o.precision = in.one_in(32) ? 5 : TLSE_PRECISION_EXACT;
  const bool use_options = !in.one_in(4);  // else NULL: the defaults
  if (use_options && (o.reduction > 2 || o.precision == 5)) call.invalid("options");
  std::size_t bytes = 0;
  const bool null_bytes = in.one_in(16);
  if (null_bytes) call.invalid("bytes NULL");
  call.before();
  const tlse_status s =
      tlse_cross_entropy_workspace_bytes(context(), tlse_device(t.device), t.stream, tlse_dtype(t.dtype), n, v, d,
                                         use_options ? &o : nullptr, null_bytes ? nullptr : &bytes);
  call.after(s);
  if (s == TLSE_SUCCESS && bytes == 0) violated("a workspace of 0 bytes", call.log());
}

/// After a successful forward (`forward`), tlse_cross_entropy_with_gradients on its inputs and
/// options: its own arrays (dloss, loss, gradients) may be NULL, aliased or misaligned; the
/// results are checked against the float64 reference.
void fuzz_training_step(Input& in, Call& forward, const Target& t, std::int64_t n, std::int64_t v, std::int64_t d,
                        tlse_cross_entropy_options o, bool use_options, const Mat& Em, const Mat& Cm,
                        const std::vector<double>& bv, const std::vector<std::int64_t>& tv) {
  Call step(in, "tlse_cross_entropy_with_gradients");
  step.note(forward.log());
  const Kind T = storage_kind(t.dtype), A = acc_kind(t.dtype);
  const std::int64_t loss_count = o.reduction == TLSE_REDUCTION_NONE ? n : 1;
  Buffer* dloss = step.array("dloss", A, loss_count, false, true);
  Buffer* loss = step.array("loss", A, loss_count, true, true);
  Buffer* dE = step.array("dE", T, n * d, true, false);
  Buffer* dC = step.array("dC", T, v * d, true, false);
  Buffer* dbias = step.array("dbias", T, v, true, false);
  const bool accumulate = o.accumulate != 0;
  const std::vector<double> dl = dloss ? values(dloss, loss_count) : std::vector<double>(std::size_t(loss_count), 0.0);
  const auto x = cross_entropy_expected(Em, Cm, bv, tv, o.ignore_index, o.reduction, o.shift, o.softcap, o.z_loss, dl,
                                        accumulate ? matrix(dE, n, d) : Mat(), accumulate ? matrix(dC, v, d) : Mat(),
                                        accumulate ? values(dbias, v) : std::vector<double>(), rounding(t.dtype));
  if (use_options) o.workspace = step.workspace(cross_entropy_workspace_need(t, n, v, d, o), o.workspace_bytes);
  forward.before();
  step.before();
  const tlse_status s = tlse_cross_entropy_with_gradients(
      context(), tlse_device(t.device), t.stream, tlse_dtype(t.dtype), n, v, d, forward.pointer(0), forward.pointer(1),
      forward.pointer(2), static_cast<const std::int64_t*>(forward.pointer(3)), step.pointer(0), step.pointer(1),
      step.pointer(2), step.pointer(3), step.pointer(4), nullptr, use_options ? &o : nullptr);
  step.after(s);
  forward.read_only_since_before("the training step");
  if (s != TLSE_SUCCESS) return;
  step.expect("loss", loss, x.loss);
  if (o.filter_eps != 0) return;  // filtered gradients are checked by the unit tests
  step.expect("dE", dE, x.dE);
  step.expect("dC", dC, x.dC);
  step.expect("dbias", dbias, x.dbias);
}

/// Cross-entropy forward, then (pair) the backward from its lse and vocab_order, then the training
/// step in one call on the same inputs: arrays may be NULL, aliased or misaligned in the forward,
/// the backward and the step get their own.
void fuzz_cross_entropy(Input& in, bool backward_alone) {
  Call call(in, backward_alone ? "tlse_cross_entropy_backward" : "tlse_cross_entropy_forward");
  const Target t = target(in, call);
  const bool wide = in.one_in(8);
  // Small shapes keep executions cheap; `wide` ones and size() cross the host's 32-wide tiles.
  const std::int64_t n = in.size(wide ? 40 : 16), v = in.size(wide ? 130 : 24), d = in.size(wide ? 4 : 16);
  sizes(call, {{"n", n}, {"v", v}, {"d", d}});
  const bool use_options = !in.one_in(8);  // else NULL: the defaults
  tlse_cross_entropy_options o;
  if (use_options)
    o = cross_entropy_options(in, call, t.dtype, n, v);
  else
    tlse_cross_entropy_options_default(&o);
  const Kind T = storage_kind(t.dtype), A = acc_kind(t.dtype);
  const bool special = in.one_in(4);
  const std::int64_t nd = elements(n, d), vd = elements(v, d);
  const std::int64_t loss_count = o.reduction == TLSE_REDUCTION_NONE ? n : 1;
  Buffer* E = call.array("E", T, nd, false, true, special);
  Buffer* C = call.array("C", T, vd, false, true, special);
  Buffer* bias = call.array("bias", T, v, false, false, special);
  Buffer* targets = call.array("targets", Kind::i64, n, false, true);
  fill_targets(in, call, targets, o, v);
  if (o.detect_non_finite && (!all_finite(E, nd) || !all_finite(C, vd) || !all_finite(bias, v)))
    call.invalid("non-finite input");
  const bool clean = !special;
  if (backward_alone) {
    call.array("lse", A, n, false, true, true);
    Buffer* order = call.array("vocab_order", Kind::i32, v, false, false);
    if (order) {
      // A shuffled permutation, as the forward writes it, or entries drawn one by one (out of range
      // now and then, and then mostly not a permutation).
      const bool shuffled = !in.one_in(4);
      std::vector<bool> seen(order->count(), false);  // v itself may be any size here
      for (std::size_t j = 0; j < order->count(); ++j) order->set_int(j, std::int64_t(j));
      for (std::size_t j = shuffled ? order->count() : 0; j > 1; --j) {
        const std::size_t k = std::size_t(in.integer(0, std::int64_t(j) - 1));
        const std::int64_t a = order->get_int(j - 1);
        order->set_int(j - 1, order->get_int(k));
        order->set_int(k, a);
      }
      for (std::size_t j = 0; j < order->count(); ++j) {
        if (!shuffled)
          order->set_int(j, in.one_in(20) ? in.pick<std::int64_t>({-1, v, INT32_MIN}) : in.integer(0, v - 1));
        const std::int64_t c = order->get_int(j);
        if (c < 0 || c >= v)
          call.invalid("vocab_order out of range");
        else if (std::size_t(c) >= seen.size() || seen[std::size_t(c)])
          call.invalid("vocab_order not a permutation");
        else
          seen[std::size_t(c)] = true;
      }
    }
    Buffer* dloss = call.array("dloss", A, loss_count, false, true, special);
    if (o.detect_non_finite && !all_finite(dloss, loss_count)) call.invalid("non-finite dloss");
    call.array("dE", T, nd, true, false);
    call.array("dC", T, vd, true, false);
    call.array("dbias", T, v, true, false);
    const std::size_t need = call.is_invalid() ? 0 : cross_entropy_workspace_need(t, n, v, d, o);
    if (use_options) o.workspace = call.workspace(need, o.workspace_bytes);
    if (call.skip()) return;
    call.before();
    const tlse_status s = tlse_cross_entropy_backward(
        context(), tlse_device(t.device), t.stream, tlse_dtype(t.dtype), n, v, d, call.pointer(0), call.pointer(1),
        call.pointer(2), static_cast<const std::int64_t*>(call.pointer(3)), call.pointer(4),
        static_cast<const std::int32_t*>(call.pointer(5)), call.pointer(6), call.pointer(7), call.pointer(8),
        call.pointer(9), nullptr, use_options ? &o : nullptr);
    call.after(s);
    return;
  }
  Buffer* loss = call.array("loss", A, loss_count, true, true);
  Buffer* lse = call.array("lse", A, n, true, false);
  Buffer* order = call.array("vocab_order", Kind::i32, v, true, false);
  const std::size_t need = call.is_invalid() ? 0 : cross_entropy_workspace_need(t, n, v, d, o);
  if (use_options) o.workspace = call.workspace(need, o.workspace_bytes);
  if (call.skip()) return;
  call.before();
  const tlse_status s = tlse_cross_entropy_forward(
      context(), tlse_device(t.device), t.stream, tlse_dtype(t.dtype), n, v, d, call.pointer(0), call.pointer(1),
      call.pointer(2), static_cast<const std::int64_t*>(call.pointer(3)), call.pointer(4), call.pointer(5),
      static_cast<std::int32_t*>(call.pointer(6)), nullptr, use_options ? &o : nullptr);
  call.after(s);
  if (s != TLSE_SUCCESS || !clean) return;

  const Mat Em = matrix(E, n, d), Cm = matrix(C, v, d);
  std::vector<std::int64_t> tv(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) tv[std::size_t(i)] = targets->get_int(std::size_t(i));
  const std::vector<double> bv = values(bias, v);
  // The backward's dloss and, with accumulate, the gradients' previous values.
  Call back(in, "tlse_cross_entropy_backward");
  back.note(call.log());
  Buffer* dloss = back.array("dloss", A, loss_count, false, true);
  const bool accumulate = o.accumulate != 0;
  Buffer* dE = back.array("dE", T, n * d, true, false);
  Buffer* dC = back.array("dC", T, v * d, true, false);
  Buffer* dbias = back.array("dbias", T, v, true, false);
  const std::vector<double> dl = dloss ? values(dloss, loss_count) : std::vector<double>(std::size_t(loss_count), 0.0);
  const auto x = cross_entropy_expected(Em, Cm, bv, tv, o.ignore_index, o.reduction, o.shift, o.softcap, o.z_loss, dl,
                                        accumulate ? matrix(dE, n, d) : Mat(), accumulate ? matrix(dC, v, d) : Mat(),
                                        accumulate ? values(dbias, v) : std::vector<double>(), rounding(t.dtype));
  call.expect("loss", loss, x.loss);
  call.expect("lse", lse, x.lse);
  if (order) {
    std::vector<bool> seen(std::size_t(v), false);
    for (std::int64_t j = 0; j < v; ++j) {
      const std::int64_t c = order->get_int(std::size_t(j));
      if (c < 0 || c >= v || seen[std::size_t(c)]) violated("vocab_order is not a permutation", call.log());
      seen[std::size_t(c)] = true;
    }
  }
  if (lse) {  // the backward needs the forward's lse
    if (use_options) o.workspace = back.workspace(cross_entropy_workspace_need(t, n, v, d, o), o.workspace_bytes);
    call.before();
    back.before();
    const tlse_status sb = tlse_cross_entropy_backward(
        context(), tlse_device(t.device), t.stream, tlse_dtype(t.dtype), n, v, d, call.pointer(0), call.pointer(1),
        call.pointer(2), static_cast<const std::int64_t*>(call.pointer(3)), call.pointer(5),
        static_cast<const std::int32_t*>(call.pointer(6)), back.pointer(0), back.pointer(1), back.pointer(2),
        back.pointer(3), nullptr, use_options ? &o : nullptr);
    back.after(sb);
    call.read_only_since_before("the backward");
    if (sb == TLSE_SUCCESS && o.filter_eps == 0) {  // filtered gradients are checked by the unit tests
      back.expect("dE", dE, x.dE);
      back.expect("dC", dC, x.dC);
      back.expect("dbias", dbias, x.dbias);
    }
  }
  // Last, so that the inputs found before it was added still make the same calls up to here.
  fuzz_training_step(in, call, t, n, v, d, o, use_options, Em, Cm, bv, tv);
}

// ---- Contrastive -----------------------------------------------------------------------------

tlse_contrastive_options contrastive_options(Input& in, Call& call, int dtype) {
  tlse_contrastive_options o;
  tlse_contrastive_options_default(&o);
  o.scale = in.option({1.0, 2.5, 14.3, 100.0, 1e4});
  o.direction = in.one_in(16) ? in.pick<int>({3, -1}) : in.below(3);
  o.accumulate = in.pick<int>({0, 1, -3});
  o.detect_non_finite = in.one_in(4);
  if (in.one_in(32)) o.precision = in.pick<int>({TLSE_PRECISION_TF32, -1, 7});
  call.note("scale=" + std::to_string(o.scale) + " dir=" + std::to_string(o.direction) +
            " acc=" + std::to_string(o.accumulate) + " detect=" + std::to_string(o.detect_non_finite));
  if (!valid_precision(o.precision)) call.invalid("precision");
  if (o.direction < 0 || o.direction > 2) call.invalid("direction");
  if (!(o.scale >= 0) || !std::isfinite(o.scale) || (dtype != TLSE_F64 && o.scale > FLT_MAX)) call.invalid("scale");
  return o;
}

void fill_labels(Input& in, Call& call, Buffer* labels, std::int64_t bound) {
  if (!labels) return;
  for (std::size_t i = 0; i < labels->count(); ++i) {
    std::int64_t value = in.integer(0, bound > 0 ? bound - 1 : 0);
    if (in.one_in(40)) value = in.pick<std::int64_t>({-1, bound, INT64_MIN, std::int64_t(1) << 31});
    labels->set_int(i, value);
    if (value < 0 || value >= bound) call.invalid("label out of range");
  }
}

/// The workspace a contrastive call of b rows needs (0 when the query fails), asked of `query`:
/// tlse_contrastive_workspace_bytes, or the self-similarity form's.
using ContrastiveWorkspaceQuery = decltype(&tlse_contrastive_workspace_bytes);
std::size_t contrastive_workspace_need(const Target& t, std::int64_t b, std::int64_t c, tlse_contrastive_options o,
                                       ContrastiveWorkspaceQuery query = tlse_contrastive_workspace_bytes) {
  std::size_t need = 0;
  o.workspace = nullptr, o.workspace_bytes = 0;
  if (query(context(), tlse_device(t.device), t.stream, tlse_dtype(t.dtype), b, c, &o, &need) != TLSE_SUCCESS) return 0;
  return need;
}

/// A contrastive call's options, and whether it passes them: mostly drawn (contrastive_options),
/// at times NULL (the defaults).
tlse_contrastive_options contrastive_options_or_null(Input& in, Call& call, int dtype, bool& use_options) {
  use_options = !in.one_in(8);
  tlse_contrastive_options o;
  if (use_options)
    o = contrastive_options(in, call, dtype);
  else
    tlse_contrastive_options_default(&o);
  return o;
}

void fuzz_contrastive_workspace_bytes(Input& in) {
  Call call(in, "tlse_contrastive_workspace_bytes");
  const Target t = target(in, call);
  const std::int64_t b = in.size(200), c = in.size(64);
  sizes(call, {{"b", b}, {"c", c}});
  tlse_contrastive_options o;
  tlse_contrastive_options_default(&o);
  o.direction = in.one_in(16) ? 9 : in.below(3);
  o.precision = in.one_in(32) ? 5 : TLSE_PRECISION_EXACT;
  const bool use_options = !in.one_in(4);  // else NULL: the defaults
  if (use_options && (o.direction > 2 || o.precision == 5)) call.invalid("options");
  std::size_t bytes = 0;
  const bool null_bytes = in.one_in(16);
  if (null_bytes) call.invalid("bytes NULL");
  call.before();
  const tlse_status s =
      tlse_contrastive_workspace_bytes(context(), tlse_device(t.device), t.stream, tlse_dtype(t.dtype), b, c,
                                       use_options ? &o : nullptr, null_bytes ? nullptr : &bytes);
  call.after(s);
  if (s == TLSE_SUCCESS && bytes == 0) violated("a workspace of 0 bytes", call.log());
}

/// Contrastive forward then its backward (as fuzz_cross_entropy), or the backward alone on
/// arbitrary saved LSEs.
void fuzz_contrastive(Input& in, bool backward_alone) {
  Call call(in, backward_alone ? "tlse_contrastive_backward" : "tlse_contrastive_forward");
  const Target t = target(in, call);
  const std::int64_t b = in.size(in.one_in(8) ? 70 : 24), c = in.size(16);
  sizes(call, {{"b", b}, {"c", c}});
  bool use_options;
  tlse_contrastive_options o = contrastive_options_or_null(in, call, t.dtype, use_options);
  const Kind T = storage_kind(t.dtype), A = acc_kind(t.dtype);
  const bool special = in.one_in(4);
  const std::int64_t bc = elements(b, c);
  Buffer* I = call.array("I", T, bc, false, true, special);
  Buffer* Tx = call.array("T", T, bc, false, true, special);
  Buffer* labels = call.array("labels", Kind::i64, b, false, false);
  fill_labels(in, call, labels, b);
  if (o.detect_non_finite && (!all_finite(I, bc) || !all_finite(Tx, bc))) call.invalid("non-finite input");
  if (backward_alone) {
    Buffer* row_lse = call.array("row_lse", A, b, false, false, true);
    Buffer* col_lse = call.array("col_lse", A, b, false, false, true);
    if (b > 0 && ((o.direction != 2 && !row_lse) || (o.direction != 1 && !col_lse))) call.invalid("lse missing");
    Buffer* dloss = call.array("dloss", A, 1, false, true, special);
    if (o.detect_non_finite && !all_finite(dloss, 1)) call.invalid("non-finite dloss");
    call.array("dI", T, bc, true, false);
    call.array("dT", T, bc, true, false);
    call.array("dscale", A, 1, true, false);
    if (use_options)
      o.workspace = call.workspace(call.is_invalid() ? 0 : contrastive_workspace_need(t, b, c, o), o.workspace_bytes);
    if (call.skip()) return;
    call.before();
    const tlse_status s = tlse_contrastive_backward(
        context(), tlse_device(t.device), t.stream, tlse_dtype(t.dtype), b, c, call.pointer(0), call.pointer(1),
        static_cast<const std::int64_t*>(call.pointer(2)), call.pointer(3), call.pointer(4), call.pointer(5),
        call.pointer(6), call.pointer(7), call.pointer(8), nullptr, use_options ? &o : nullptr);
    call.after(s);
    return;
  }
  Buffer* loss = call.array("loss", A, 1, true, true);
  Buffer* row_lse = call.array("row_lse", A, b, true, false);
  Buffer* col_lse = call.array("col_lse", A, b, true, false);
  if (use_options)
    o.workspace = call.workspace(call.is_invalid() ? 0 : contrastive_workspace_need(t, b, c, o), o.workspace_bytes);
  if (call.skip()) return;
  call.before();
  const tlse_status s =
      tlse_contrastive_forward(context(), tlse_device(t.device), t.stream, tlse_dtype(t.dtype), b, c, call.pointer(0),
                               call.pointer(1), static_cast<const std::int64_t*>(call.pointer(2)), call.pointer(3),
                               call.pointer(4), call.pointer(5), use_options ? &o : nullptr);
  call.after(s);
  if (s != TLSE_SUCCESS || special) return;

  const Mat Im = matrix(I, b, c), Tm = matrix(Tx, b, c);
  std::vector<std::int64_t> lv;
  for (std::int64_t i = 0; labels && i < b; ++i) lv.push_back(labels->get_int(std::size_t(i)));
  Call back(in, "tlse_contrastive_backward");
  back.note(call.log());
  Buffer* dloss = back.array("dloss", A, 1, false, true);
  const bool accumulate = o.accumulate != 0;
  Buffer* dI = back.array("dI", T, bc, true, false);
  Buffer* dT = back.array("dT", T, bc, true, false);
  Buffer* dscale = back.array("dscale", A, 1, true, false);
  const auto x = contrastive_expected(Im, Tm, lv, o.scale, o.direction, dloss ? dloss->get(0) : 0.0,
                                      accumulate ? matrix(dI, b, c) : Mat(), accumulate ? matrix(dT, b, c) : Mat(),
                                      accumulate && dscale ? dscale->get(0) : 0.0, rounding(t.dtype));
  call.expect("loss", loss, x.loss);
  call.expect("row_lse", row_lse, x.row_lse);
  if (o.direction != 1) call.expect("col_lse", col_lse, x.col_lse);
  if (b > 0 && ((o.direction != 2 && !row_lse) || (o.direction != 1 && !col_lse))) return;  // the backward needs them
  if (use_options) o.workspace = back.workspace(contrastive_workspace_need(t, b, c, o), o.workspace_bytes);
  call.before();
  back.before();
  const tlse_status sb = tlse_contrastive_backward(
      context(), tlse_device(t.device), t.stream, tlse_dtype(t.dtype), b, c, call.pointer(0), call.pointer(1),
      static_cast<const std::int64_t*>(call.pointer(2)), call.pointer(4), call.pointer(5), back.pointer(0),
      back.pointer(1), back.pointer(2), back.pointer(3), nullptr, use_options ? &o : nullptr);
  back.after(sb);
  call.read_only_since_before("the backward");
  if (sb != TLSE_SUCCESS) return;
  back.expect("dI", dI, x.dI);
  back.expect("dT", dT, x.dT);
  back.expect("dscale", dscale, x.dscale);
}

/// The self-similarity form: forward then backward on Z (n x c), against the paired oracle with
/// I = T = Z, the row direction, positives (i + n/2) mod n and the diagonal left out (dZ = dI + dT).
void fuzz_self_contrastive(Input& in) {
  Call call(in, "tlse_self_contrastive_forward");
  const Target t = target(in, call);
  const std::int64_t n = in.size(48), c = in.size(16);
  sizes(call, {{"n", n}, {"c", c}});
  if (n >= 0 && n <= max_size && n % 2) call.invalid_size("odd n");
  bool use_options;
  tlse_contrastive_options o = contrastive_options_or_null(in, call, t.dtype, use_options);
  if (o.direction != TLSE_DIRECTION_SYMMETRIC) call.invalid("direction not symmetric");
  const Kind T = storage_kind(t.dtype), A = acc_kind(t.dtype);
  const bool special = in.one_in(4);
  const std::int64_t nc = elements(n, c);
  Buffer* Z = call.array("Z", T, nc, false, true, special);
  if (o.detect_non_finite && !all_finite(Z, nc)) call.invalid("non-finite input");
  Buffer* loss = call.array("loss", A, 1, true, true);
  Buffer* lse = call.array("lse", A, n, true, false);
  const auto need = [&] { return contrastive_workspace_need(t, n, c, o, tlse_self_contrastive_workspace_bytes); };
  if (use_options) o.workspace = call.workspace(call.is_invalid() ? 0 : need(), o.workspace_bytes);
  if (call.skip()) return;
  call.before();
  const tlse_status s =
      tlse_self_contrastive_forward(context(), tlse_device(t.device), t.stream, tlse_dtype(t.dtype), n, c,
                                    call.pointer(0), call.pointer(1), call.pointer(2), use_options ? &o : nullptr);
  call.after(s);
  if (s != TLSE_SUCCESS || special) return;

  const Mat Zm = matrix(Z, n, c);
  std::vector<std::int64_t> positives;
  for (std::int64_t i = 0; i < n; ++i) positives.push_back((i + n / 2) % n);
  Call back(in, "tlse_self_contrastive_backward");
  back.note(call.log());
  Buffer* dloss = back.array("dloss", A, 1, false, true);
  Buffer* dZ = back.array("dZ", T, nc, true, false);
  Buffer* dscale = back.array("dscale", A, 1, true, false);
  const bool accumulate = o.accumulate != 0;
  const auto x = contrastive_expected(Zm, Zm, positives, o.scale, TLSE_DIRECTION_IMAGE_TO_TEXT,
                                      dloss ? dloss->get(0) : 0.0, accumulate ? matrix(dZ, n, c) : Mat(), Mat(),
                                      accumulate && dscale ? dscale->get(0) : 0.0, rounding(t.dtype), true);
  call.expect("loss", loss, x.loss);
  call.expect("lse", lse, x.row_lse);
  if (n > 0 && !lse) return;  // the backward needs it
  if (use_options) o.workspace = back.workspace(need(), o.workspace_bytes);
  call.before();
  back.before();
  const tlse_status sb = tlse_self_contrastive_backward(context(), tlse_device(t.device), t.stream, tlse_dtype(t.dtype),
                                                        n, c, call.pointer(0), call.pointer(2), back.pointer(0),
                                                        back.pointer(1), back.pointer(2), use_options ? &o : nullptr);
  back.after(sb);
  call.read_only_since_before("the backward");
  if (sb != TLSE_SUCCESS) return;
  Expected dZ_expected = x.dI;  // dZ = dI + dT, with dT's bound added
  for (std::size_t k = 0; k < dZ_expected.value.size(); ++k)
    dZ_expected.value[k] += x.dT.value[k], dZ_expected.tolerance[k] += x.dT.tolerance[k];
  back.expect("dZ", dZ, dZ_expected);
  back.expect("dscale", dscale, x.dscale);
}

// ---- Distributed calls, over a world whose every rank holds this rank's data -----------------

/// A communicator of `size` ranks that all hold the same data: a ring step receives what it
/// sends, an all-gather repeats this rank's part, a sum multiplies by `size`. Consistent for one
/// rank (results checked); for more, a stress of the ring code with well-formed traffic. Callback
/// number `fail_at` (counting from 0) returns an error.
struct MirrorWorld {
  int size = 1, calls = 0, fail_at = -1;
  bool fail() { return calls++ == fail_at; }
  static MirrorWorld& of(void* user) { return *static_cast<MirrorWorld*>(user); }
  static int ring_start(void* user, const void* send, void* recv, std::size_t bytes, void** handle) {
    if (of(user).fail()) return 3;
    std::memmove(recv, send, bytes);
    *handle = user;
    return 0;
  }
  static int ring_wait(void* user, void*) { return of(user).fail() ? 4 : 0; }
  static int allreduce(void* user, void* data, std::size_t count, int dtype, int op) {
    MirrorWorld& w = of(user);
    if (w.fail()) return 5;
    if (op == TLSE_COMM_MAX) return 0;
    for (std::size_t i = 0; i < count; ++i) {
      if (dtype == TLSE_COMM_F32)
        static_cast<float*>(data)[i] *= float(w.size);
      else if (dtype == TLSE_COMM_F64)
        static_cast<double*>(data)[i] *= double(w.size);
      else if (dtype == TLSE_COMM_I32)
        static_cast<std::int32_t*>(data)[i] *= w.size;
      else if (dtype == TLSE_COMM_I64)
        static_cast<std::int64_t*>(data)[i] *= w.size;
      else
        return 6;
    }
    return 0;
  }
  static int allgather(void* user, const void* send, void* recv, std::size_t bytes) {
    MirrorWorld& w = of(user);
    if (w.fail()) return 7;
    for (int r = 0; r < w.size; ++r) std::memcpy(static_cast<char*>(recv) + std::size_t(r) * bytes, send, bytes);
    return 0;
  }
};

/// The communicator of a distributed call: mostly a mirror world of 1 to 3 ranks, at times NULL,
/// with a NULL callback, a rank outside [0, size), or a callback that fails.
const tlse_communicator* communicator(Input& in, Call& call, MirrorWorld& world, tlse_communicator& comm) {
  world.size = in.pick<int>({1, 2, 3});
  comm = tlse_communicator{&world,
                           int(in.integer(0, world.size - 1)),
                           world.size,
                           MirrorWorld::ring_start,
                           MirrorWorld::ring_wait,
                           MirrorWorld::allreduce,
                           MirrorWorld::allgather,
                           MirrorWorld::allgather};
  call.note("ranks=" + std::to_string(world.size) + " rank=" + std::to_string(comm.rank));
  if (in.one_in(20)) return call.invalid("comm NULL"), nullptr;
  if (in.one_in(20)) call.invalid("comm unusable"), comm.allreduce = nullptr;
  if (in.one_in(20)) call.invalid("comm unusable"), comm.size = in.pick<int>({0, -1});
  if (in.one_in(20)) call.invalid("comm unusable"), comm.rank = in.pick<int>({-1, world.size});
  if (in.one_in(6)) {
    world.fail_at = int(in.integer(0, 12));
    call.note("fail_at=" + std::to_string(world.fail_at));
    call.outputs_may_change_on_failure();
  }
  return &comm;
}

void fuzz_distributed(Input& in, int which) {
  static const char* names[] = {"tlse_cross_entropy_forward_distributed", "tlse_cross_entropy_backward_distributed",
                                "tlse_contrastive_forward_distributed", "tlse_contrastive_backward_distributed"};
  Call call(in, names[which]);
  MirrorWorld world;
  tlse_communicator comm_storage;
  const tlse_communicator* comm = communicator(in, call, world, comm_storage);
  const Target t = target(in, call);
  const Kind T = storage_kind(t.dtype), A = acc_kind(t.dtype);
  const bool special = in.one_in(4);
  tlse_status s;
  if (which < 2) {
    const std::int64_t n = in.size(12), v = in.size(16), d = in.size(8);
    sizes(call, {{"n", n}, {"v", v}, {"d", d}});
    const std::int64_t global_v = elements(v, world.size);  // the classes of every shard (-1: v is no size)
    tlse_cross_entropy_options o = cross_entropy_options(in, call, t.dtype, n, global_v);
    const std::int64_t nd = elements(n, d), vd = elements(v, d);
    const std::int64_t loss_count = o.reduction == TLSE_REDUCTION_NONE ? n : 1;
    Buffer* E = call.array("E", T, nd, false, true, special);
    Buffer* C = call.array("C", T, vd, false, true, special);
    Buffer* bias = call.array("bias", T, v, false, false, special);
    Buffer* targets = call.array("targets", Kind::i64, n, false, true);
    fill_targets(in, call, targets, o, global_v);
    if (o.detect_non_finite && (!all_finite(E, nd) || !all_finite(C, vd) || !all_finite(bias, v)))
      call.invalid("non-finite input");
    if (call.skip()) return;
    if (which == 0) {
      call.array("loss", A, loss_count, true, true);
      call.array("lse", A, n, true, false);
      call.before();
      s = tlse_cross_entropy_forward_distributed(context(), comm, tlse_device(t.device), t.stream, tlse_dtype(t.dtype),
                                                 n, v, d, call.pointer(0), call.pointer(1), call.pointer(2),
                                                 static_cast<const std::int64_t*>(call.pointer(3)), call.pointer(4),
                                                 call.pointer(5), nullptr, &o);
    } else {
      call.array("lse", A, n, false, true, true);
      Buffer* dloss = call.array("dloss", A, loss_count, false, true, special);
      if (o.detect_non_finite && !all_finite(dloss, loss_count)) call.invalid("non-finite dloss");
      call.array("dE", T, nd, true, false);
      call.array("dC", T, vd, true, false);
      call.array("dbias", T, v, true, false);
      call.before();
      s = tlse_cross_entropy_backward_distributed(
          context(), comm, tlse_device(t.device), t.stream, tlse_dtype(t.dtype), n, v, d, call.pointer(0),
          call.pointer(1), call.pointer(2), static_cast<const std::int64_t*>(call.pointer(3)), call.pointer(4),
          call.pointer(5), call.pointer(6), call.pointer(7), call.pointer(8), nullptr, &o);
    }
  } else {
    const std::int64_t b = in.size(16), c = in.size(8);
    sizes(call, {{"b", b}, {"c", c}});
    tlse_contrastive_options o = contrastive_options(in, call, t.dtype);
    const std::int64_t bc = elements(b, c);
    Buffer* I = call.array("I", T, bc, false, true, special);
    Buffer* Tx = call.array("T", T, bc, false, true, special);
    Buffer* labels = call.array("labels", Kind::i64, b, false, false);
    fill_labels(in, call, labels, elements(b, world.size));  // global indices
    if (o.detect_non_finite && (!all_finite(I, bc) || !all_finite(Tx, bc))) call.invalid("non-finite input");
    if (call.skip()) return;
    if (which == 2) {
      call.array("loss", A, 1, true, true);
      call.array("row_lse", A, b, true, false);
      call.array("col_lse", A, b, true, false);
      call.before();
      s = tlse_contrastive_forward_distributed(
          context(), comm, tlse_device(t.device), t.stream, tlse_dtype(t.dtype), b, c, call.pointer(0), call.pointer(1),
          static_cast<const std::int64_t*>(call.pointer(2)), call.pointer(3), call.pointer(4), call.pointer(5), &o);
    } else {
      Buffer* row_lse = call.array("row_lse", A, b, false, false, true);
      Buffer* col_lse = call.array("col_lse", A, b, false, false, true);
      if (b > 0 && ((o.direction != 2 && !row_lse) || (o.direction != 1 && !col_lse))) call.invalid("lse missing");
      Buffer* dloss = call.array("dloss", A, 1, false, true, special);
      if (o.detect_non_finite && !all_finite(dloss, 1)) call.invalid("non-finite dloss");
      call.array("dI", T, bc, true, false);
      call.array("dT", T, bc, true, false);
      call.array("dscale", A, 1, true, false);
      call.before();
      s = tlse_contrastive_backward_distributed(
          context(), comm, tlse_device(t.device), t.stream, tlse_dtype(t.dtype), b, c, call.pointer(0), call.pointer(1),
          static_cast<const std::int64_t*>(call.pointer(2)), call.pointer(3), call.pointer(4), call.pointer(5),
          call.pointer(6), call.pointer(7), call.pointer(8), &o);
    }
  }
  // A failing callback must fail the call; a world of several ranks may reject what one rank
  // accepts (e.g. a rank's share of a batch), so only one rank's valid calls must succeed.
  if (world.fail_at >= 0 && world.fail_at < world.calls && s == TLSE_SUCCESS)
    violated("a call succeeded although a callback failed", call.log());
  call.after(s, world.size == 1 && world.fail_at < 0);
}

// ---- Context, options and the small calls ----------------------------------------------------

void fuzz_small_calls(Input& in) {
  const std::string version = tlse_version();
  if (version.empty()) violated("empty version", "tlse_version");
  const int device = in.pick<int>({TLSE_DEVICE_HOST, TLSE_DEVICE_CUDA, -1, 7});
  if (tlse_device_available(tlse_device(device)) != (device == TLSE_DEVICE_HOST))
    violated("tlse_device_available(" + std::to_string(device) + ")", "host build");
  tlse_cross_entropy_options_default(nullptr);
  tlse_contrastive_options_default(nullptr);
  int cuda_device = 5;
  if (tlse_context_cuda_device(context(), &cuda_device) != TLSE_SUCCESS || cuda_device != -1)
    violated("tlse_context_cuda_device", "host build");
  if (tlse_context_cuda_device(context(), nullptr) != TLSE_ERROR_INVALID_ARGUMENT ||
      tlse_context_cuda_device(nullptr, &cuda_device) != TLSE_ERROR_INVALID_ARGUMENT)
    violated("tlse_context_cuda_device accepted NULL", "");
  if (tlse_context_create(nullptr, -1) != TLSE_ERROR_INVALID_ARGUMENT) violated("tlse_context_create(NULL)", "");
  if (tlse_context_destroy(nullptr) != TLSE_SUCCESS) violated("tlse_context_destroy(NULL)", "");
  // A second context, used, destroyed, then used again: the last must fail.
  tlse_context* extra = nullptr;
  if (tlse_context_create(&extra, int(in.integer(-3, 3))) != TLSE_SUCCESS) violated("tlse_context_create", "");
  std::size_t bytes = 0;
  if (tlse_contrastive_workspace_bytes(extra, TLSE_DEVICE_HOST, nullptr, TLSE_F32, 4, 4, nullptr, &bytes) !=
      TLSE_SUCCESS)
    violated("a call on a second context", tlse_last_error());
  if (tlse_context_destroy(extra) != TLSE_SUCCESS) violated("tlse_context_destroy", "");
  if (in.one_in(2)) {
    if (tlse_contrastive_workspace_bytes(extra, TLSE_DEVICE_HOST, nullptr, TLSE_F32, 4, 4, nullptr, &bytes) !=
        TLSE_ERROR_INVALID_ARGUMENT)
      violated("a call on a destroyed context did not fail", "");
  } else if (tlse_context_destroy(extra) != TLSE_ERROR_INVALID_ARGUMENT) {
    violated("a second tlse_context_destroy did not fail", "");
  }
  int not_a_context = 0;
  if (tlse_context_destroy(reinterpret_cast<tlse_context*>(&not_a_context)) != TLSE_ERROR_INVALID_ARGUMENT)
    violated("tlse_context_destroy of something else did not fail", "");
}

}  // namespace
}  // namespace fuzz

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  fuzz::Input in(data, size);
  switch (in.below(10)) {
    case 0:
      fuzz::fuzz_small_calls(in);
      break;
    case 1:
      fuzz::fuzz_cross_entropy_workspace_bytes(in);
      break;
    case 2:
      fuzz::fuzz_cross_entropy(in, false);
      break;
    case 3:
      fuzz::fuzz_cross_entropy(in, true);
      break;
    case 4:
      fuzz::fuzz_contrastive_workspace_bytes(in);
      break;
    case 5:
      fuzz::fuzz_contrastive(in, false);
      // Then, from the bytes left, the self-similarity form (added later: inputs found before it
      // still make the same calls up to here).
      fuzz::fuzz_self_contrastive(in);
      break;
    case 6:
      fuzz::fuzz_contrastive(in, true);
      break;
    default:
      fuzz::fuzz_distributed(in, in.below(4));
      break;
  }
  return 0;
}
