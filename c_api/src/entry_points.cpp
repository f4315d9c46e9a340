// The extern "C" entry points: check what C can get wrong (NULL pointers, negative sizes, enum
// values, a pointer on the wrong device), convert the options, pick the execution space
// instance and the dtype, and turn every exception into a status and a thread-local message.
#include "arguments.hpp"

#include <tlse/distributed/impl/agreement.hpp>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <set>
#include <string>
#include <vector>

#if defined(KOKKOS_ENABLE_CUDA)
#include <cuda_runtime_api.h>
#endif

struct tlse_context {
  int cuda_device = -1;
#if defined(KOKKOS_ENABLE_CUDA)
  std::map<void*, Kokkos::Cuda> streams;  // a Kokkos::Cuda instance allocates: one per stream, reused
#endif
};

namespace {

using tlse::capi::Error;

thread_local std::string last_error;

// Every call holds this lock from its first check to its return, so calls from several threads
// run one at a time: Kokkos (3.4) does not support launching work on one execution space from
// several threads at once, its Serial and OpenMP spaces keep process-wide scratch, and its CUDA
// launches share one constant-memory staging buffer. It also orders calls with context creation
// and destruction. It guards the three below.
std::mutex kokkos_lock;
std::set<tlse_context*, std::less<>> live_contexts;  // created and not yet destroyed
bool initialized_here = false;
bool finalized_here = false;  // by the last tlse_context_destroy, or at exit

template <class F>
tlse_status guarded(const char* function, F&& f) noexcept {
  try {
    try {
      f();
      return TLSE_SUCCESS;
    } catch (const Error& e) {
      last_error = e.what();
      return e.status;
    } catch (const std::invalid_argument& e) {
      last_error = e.what();
      return TLSE_ERROR_INVALID_ARGUMENT;
    } catch (const std::bad_alloc& e) {
      last_error = std::string(function) + ": out of memory (" + e.what() + ")";
      return TLSE_ERROR_OUT_OF_MEMORY;
    } catch (const std::exception& e) {
      last_error = std::string(function) + ": " + e.what();
      return TLSE_ERROR_RUNTIME;
    } catch (...) {
      last_error = std::string(function) + ": unknown exception";
      return TLSE_ERROR_RUNTIME;
    }
  } catch (...) {  // building the message itself failed
    return TLSE_ERROR_OUT_OF_MEMORY;
  }
}

[[noreturn]] void invalid(const char* function, const std::string& argument, const std::string& message) {
  throw Error(TLSE_ERROR_INVALID_ARGUMENT, std::string(function) + ": argument '" + argument + "' " + message);
}

/// A call's hold on kokkos_lock, taken before anything else, with its context checked: a
/// destroyed context is an error instead of a use after free.
class CallLock {
 public:
  CallLock(const char* function, const tlse_context* context) : guard_(kokkos_lock) {
    if (!context) invalid(function, "context", "is NULL; create one with tlse_context_create");
    if (!live_contexts.count(context))
      invalid(function, "context",
              "is not a live context: it was destroyed by tlse_context_destroy, or never made by tlse_context_create");
    if (finalized_here)  // only a context still alive at exit gets here: see finalize_at_exit
      throw Error(TLSE_ERROR_RUNTIME, std::string(function) +
                                          ": the program is exiting and this library has finalized Kokkos; no "
                                          "call runs after that (destroy the context before exit instead)");
  }

 private:
  std::lock_guard<std::mutex> guard_;
};

/// Kokkos 3.x's OpenMP backend launches parallel work only from the thread that initialized Kokkos,
/// outside a parallel region; launched from elsewhere, a reduction throws inside Kokkos where the
/// exception cannot be caught, and the process aborts. Kokkos 4's takes any thread, and from
/// inside a parallel region runs the work on the calling thread alone; the library refuses calls
/// from inside a parallel region on both (kokkos_compat.hpp). Such a call fails here.
void check_host_thread(const char* function) {
  if (tlse::impl::host_space_accepts_work()) return;
  throw Error(TLSE_ERROR_UNSUPPORTED, std::string(function) +
                                          ": argument 'device' is TLSE_DEVICE_HOST but this thread cannot launch work "
                                          "on Kokkos' host execution space (" +
                                          Kokkos::DefaultHostExecutionSpace::name() +
                                          "): " + tlse::impl::host_space_work_rule());
}

/// The largest size (n, v, d, b, c): the kernels index rows, classes and features with 32-bit
/// ints. It also keeps every element count (a product of two sizes) within int64_t.
constexpr std::int64_t max_size = 2147483647;

void check_size(const char* function, const char* name, std::int64_t value) {
  if (value < 0) invalid(function, name, "must be >= 0, got " + std::to_string(value));
  if (value > max_size)
    invalid(function, name, "is " + std::to_string(value) + ", more than " + std::to_string(max_size) +
                                " (2^31 - 1): TiledLSE indexes rows, classes and features with 32-bit integers");
}

/// Whether `p` may be read by kernels on `device`: in a CUDA build the runtime knows where every
/// pointer lives, so a host pointer given for CUDA (or the reverse) fails here instead of
/// faulting in a kernel.
void check_pointer(const char* function, const tlse_context* context, const char* name, const void* p,
                   tlse_device device) {
#if defined(KOKKOS_ENABLE_CUDA)
  if (!p) return;
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
    cudaGetLastError();  // clear this (non-sticky) error so that no later CUDA call reports it
    attr.type = cudaMemoryTypeUnregistered;
  }
  const bool on_device = attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged;
  if (device == TLSE_DEVICE_CUDA && !on_device)
    invalid(function, name, "is host memory but device is TLSE_DEVICE_CUDA");
  if (device == TLSE_DEVICE_CUDA && attr.type == cudaMemoryTypeDevice && attr.device != context->cuda_device)
    invalid(function, name, "lives on CUDA device " + std::to_string(attr.device) + " but the context runs on device " +
                                std::to_string(context->cuda_device));
  if (device == TLSE_DEVICE_HOST && attr.type == cudaMemoryTypeDevice)
    invalid(function, name, "is CUDA device memory but device is TLSE_DEVICE_HOST");
#else
  (void)function, (void)context, (void)name, (void)p, (void)device;
#endif
}

/// Bytes of one element of a call's dtype (`value`) and of its accumulator type (`acc`).
struct ElementBytes {
  std::size_t value, acc;
};

ElementBytes element_bytes(const char* function, tlse_dtype dtype) {
  switch (dtype) {
    case TLSE_F32: return {4, 4};
    case TLSE_F64: return {8, 8};
    case TLSE_BF16:
    case TLSE_F16: return {2, 4};
  }
  invalid(function, "dtype",
          "is " + std::to_string(int(dtype)) + ", not one of TLSE_F32, TLSE_F64, TLSE_BF16, TLSE_F16");
}

std::string address(std::uintptr_t p) {
  char text[24];
  std::snprintf(text, sizeof text, "0x%llx", static_cast<unsigned long long>(p));
  return text;
}

/// The caller's arrays of one call, checked as they are added (NULL where required, alignment,
/// device, the end of the address space), then against each other by disjoint(): an array the
/// call writes must not share a byte with any other array, or the call would read what it is
/// writing, or write one result over another.
class CallerArrays {
 public:
  CallerArrays(const char* function, const tlse_context* context, tlse_device device)
      : function_(function), context_(context), device_(device) {}

  /// `count` elements of `element` bytes that the call reads; `required`: NULL only if count is 0.
  void input(const char* name, const void* p, std::int64_t count, std::size_t element, bool required = false) {
    add(name, p, count, element, required, false);
  }
  /// As input(), for an array the call writes.
  void output(const char* name, const void* p, std::int64_t count, std::size_t element, bool required = false) {
    add(name, p, count, element, required, true);
  }
  /// The caller's workspace (written; any alignment).
  void workspace(const void* p, std::size_t bytes) {
    check_pointer(function_, context_, "workspace", p, device_);
    range("workspace", p, bytes, true);
  }
  /// Throws naming the first two arrays that overlap where one of them is written.
  void disjoint() const {
    for (std::size_t i = 0; i < ranges_.size(); ++i)
      for (std::size_t j = 0; j < i; ++j) {
        const Range &a = ranges_[i], &b = ranges_[j];
        if ((a.written || b.written) && a.begin < b.end && b.begin < a.end)
          invalid(function_, a.name,
                  "overlaps argument '" + std::string(b.name) + "' (bytes [" + address(a.begin) + ", " +
                      address(a.end) + ") and [" + address(b.begin) + ", " + address(b.end) +
                      ")); an array the call writes must not share memory with another argument");
      }
  }

 private:
  struct Range {
    const char* name;
    std::uintptr_t begin, end;
    bool written;
  };
  void add(const char* name, const void* p, std::int64_t count, std::size_t element, bool required, bool written) {
    if (!p && required && count > 0) invalid(function_, name, "is NULL but has " + std::to_string(count) + " elements");
    if (!p || count == 0) return;
    const auto at = reinterpret_cast<std::uintptr_t>(p);
    if (at % element != 0)
      invalid(function_, name, "is at address " + address(at) + ", not a multiple of " + std::to_string(element) +
                                   " bytes (the size of its elements)");
    check_pointer(function_, context_, name, p, device_);
    std::size_t bytes = 0;
    if (__builtin_mul_overflow(std::size_t(count), element, &bytes))
      invalid(function_, name, "has " + std::to_string(count) + " elements of " + std::to_string(element) +
                                   " bytes, more than the address space holds");
    range(name, p, bytes, written);
  }
  void range(const char* name, const void* p, std::size_t bytes, bool written) {
    if (!p || bytes == 0) return;
    const auto begin = reinterpret_cast<std::uintptr_t>(p);
    std::uintptr_t end = 0;
    if (__builtin_add_overflow(begin, bytes, &end))
      invalid(function_, name, "spans " + std::to_string(bytes) + " bytes from address " + address(begin) +
                                   ", past the end of the address space");
    ranges_.push_back({name, begin, end, written});
  }

  const char* function_;
  const tlse_context* context_;
  tlse_device device_;
  std::vector<Range> ranges_;
};

/// Builds the launch for `device` and `stream`; kokkos_lock must be held.
tlse::capi::Launch launch_for(const char* function, tlse_context* context, tlse_device device, void* stream) {
  tlse::capi::Launch l;
  if (device != TLSE_DEVICE_HOST && device != TLSE_DEVICE_CUDA)
    invalid(function, "device",
            "is " + std::to_string(int(device)) + ", not TLSE_DEVICE_HOST (0) or TLSE_DEVICE_CUDA (1)");
  l.device = device;
  if (device == TLSE_DEVICE_HOST) check_host_thread(function);
  if (device == TLSE_DEVICE_CUDA) {
#if defined(KOKKOS_ENABLE_CUDA)
    // Kokkos 3.4 launches on the calling thread's current device, whatever device its stream
    // belongs to: from a thread set to another GPU the kernels would fail or read another GPU's
    // memory.
    int current = -1;
    if (cudaGetDevice(&current) == cudaSuccess && current != context->cuda_device)
      invalid(function, "device",
              "is TLSE_DEVICE_CUDA but this thread's current CUDA device is " + std::to_string(current) +
                  " and the context runs on device " + std::to_string(context->cuda_device) + "; call cudaSetDevice(" +
                  std::to_string(context->cuda_device) + ") on this thread first");
    auto it = context->streams.find(stream);
    if (it == context->streams.end())
      it = context->streams.emplace(stream, Kokkos::Cuda(static_cast<cudaStream_t>(stream))).first;
    l.cuda = it->second;
#else
    (void)context, (void)stream;
    throw Error(TLSE_ERROR_UNSUPPORTED,
                std::string(function) +
                    ": argument 'device' is TLSE_DEVICE_CUDA but this TiledLSE library was built without CUDA");
#endif
  }
  return l;
}

/// Runs `f(T{})` with the storage type of `dtype`.
template <class F>
void by_dtype(const char* function, tlse_dtype dtype, F&& f) {
  switch (dtype) {
    case TLSE_F32: return f(float{});
    case TLSE_F64: return f(double{});
    case TLSE_BF16: return f(tlse::bfloat16{});
    case TLSE_F16: return f(tlse::float16{});
  }
  invalid(function, "dtype",
          "is " + std::to_string(int(dtype)) + ", not one of TLSE_F32, TLSE_F64, TLSE_BF16, TLSE_F16");
}

tlse::Precision precision_of(const char* function, std::int32_t precision) {
  if (precision != TLSE_PRECISION_EXACT && precision != TLSE_PRECISION_TF32)
    invalid(function, "options.precision",
            "is " + std::to_string(precision) + ", not a tlse_precision (TLSE_PRECISION_EXACT or TLSE_PRECISION_TF32)");
  return precision == TLSE_PRECISION_TF32 ? tlse::Precision::tf32 : tlse::Precision::exact;
}

tlse::Reduction reduction_of(const char* function, std::int32_t reduction) {
  if (reduction < TLSE_REDUCTION_NONE || reduction > TLSE_REDUCTION_MEAN)
    invalid(function, "options.reduction", "is " + std::to_string(reduction) + ", not a tlse_reduction");
  return reduction == TLSE_REDUCTION_NONE  ? tlse::Reduction::none
         : reduction == TLSE_REDUCTION_SUM ? tlse::Reduction::sum
                                           : tlse::Reduction::mean;
}

tlse::CrossEntropyOptions convert(const char* function, const tlse_cross_entropy_options* given) {
  tlse_cross_entropy_options o;
  tlse_cross_entropy_options_default(&o);
  if (given) o = *given;
  tlse::CrossEntropyOptions r;
  r.ignore_index = o.ignore_index;
  r.reduction = reduction_of(function, o.reduction);
  r.shift = o.shift;
  r.softcap = o.softcap;
  r.z_loss = o.z_loss;
  r.filter_eps = o.filter_eps == TLSE_FILTER_EPS_AUTO ? tlse::filter_eps_auto : o.filter_eps;
  r.accumulate = o.accumulate != 0;
  r.non_finite = o.detect_non_finite ? tlse::NonFinite::detect : tlse::NonFinite::propagate;
  r.precision = precision_of(function, o.precision);
  r.workspace = {o.workspace, o.workspace_bytes};
  r.memory_budget = o.memory_budget ? std::size_t(o.memory_budget) : tlse::memory_budget_default;
  r.label_smoothing = o.label_smoothing;
  return r;
}

tlse::ContrastiveOptions convert(const char* function, const tlse_contrastive_options* given) {
  tlse_contrastive_options o;
  tlse_contrastive_options_default(&o);
  if (given) o = *given;
  if (o.direction < TLSE_DIRECTION_SYMMETRIC || o.direction > TLSE_DIRECTION_TEXT_TO_IMAGE)
    invalid(function, "options.direction", "is " + std::to_string(o.direction) + ", not a tlse_direction");
  tlse::ContrastiveOptions r;
  r.scale = o.scale;
  r.direction = o.direction == TLSE_DIRECTION_SYMMETRIC       ? tlse::Direction::symmetric
                : o.direction == TLSE_DIRECTION_IMAGE_TO_TEXT ? tlse::Direction::image_to_text
                                                              : tlse::Direction::text_to_image;
  r.accumulate = o.accumulate != 0;
  r.non_finite = o.detect_non_finite ? tlse::NonFinite::detect : tlse::NonFinite::propagate;
  r.precision = precision_of(function, o.precision);
  r.workspace = {o.workspace, o.workspace_bytes};
  r.memory_budget = o.memory_budget ? std::size_t(o.memory_budget) : tlse::memory_budget_default;
  return r;
}

tlse::DistillationOptions convert(const char* function, const tlse_distillation_options* given) {
  tlse_distillation_options o;
  tlse_distillation_options_default(&o);
  if (given) o = *given;
  if (o.divergence < TLSE_DIVERGENCE_FORWARD_KL || o.divergence > TLSE_DIVERGENCE_JSD)
    invalid(
        function, "options.divergence",
        "is " + std::to_string(o.divergence) +
            ", not a tlse_divergence (TLSE_DIVERGENCE_FORWARD_KL, TLSE_DIVERGENCE_REVERSE_KL or TLSE_DIVERGENCE_JSD)");
  tlse::DistillationOptions r;
  r.divergence = o.divergence == TLSE_DIVERGENCE_FORWARD_KL   ? tlse::Divergence::forward_kl
                 : o.divergence == TLSE_DIVERGENCE_REVERSE_KL ? tlse::Divergence::reverse_kl
                                                              : tlse::Divergence::jsd;
  r.reduction = reduction_of(function, o.reduction);
  r.beta = o.beta;
  r.temperature = o.temperature;
  r.alpha = o.alpha;
  r.ignore_index = o.ignore_index;
  r.shift = o.shift;
  r.accumulate = o.accumulate != 0;
  r.non_finite = o.detect_non_finite ? tlse::NonFinite::detect : tlse::NonFinite::propagate;
  r.workspace = {o.workspace, o.workspace_bytes};
  r.memory_budget = o.memory_budget ? std::size_t(o.memory_budget) : tlse::memory_budget_default;
  return r;
}

/// A CUDA build initializes Kokkos::Cuda, which on a machine without a usable GPU throws a
/// multi-line error from deep inside its setup (and may leave Kokkos half initialized): ask the
/// CUDA runtime first, and fail with one line that says what to do instead.
void require_cuda_device(const char* function, int cuda_device) {
#if defined(KOKKOS_ENABLE_CUDA)
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) cudaGetLastError();  // leave no error behind for a later CUDA call
  if (status != cudaSuccess || count == 0)
    throw Error(TLSE_ERROR_UNSUPPORTED,
                std::string(function) + ": this TiledLSE library was built for CUDA but finds no usable GPU (" +
                    (status != cudaSuccess ? std::string(cudaGetErrorName(status)) + ": " + cudaGetErrorString(status)
                                           : std::string("0 devices")) +
                    "); on a machine without a GPU use a host build of the library");
  if (cuda_device >= count)
    invalid(function, "cuda_device", "is " + std::to_string(cuda_device) + " but this machine has " +
                                         std::to_string(count) + " CUDA device(s)");
#else
  (void)function, (void)cuda_device;
#endif
}

/// Registered (std::atexit) when this library initializes Kokkos. A program that keeps its
/// context to the end without destroying it would otherwise exit with Kokkos initialized, and
/// Kokkos::Cuda's internal singleton then prints "Failed to call Kokkos::Cuda::finalize()" from
/// its destructor. Handlers run in reverse order of registration, so this runs before the
/// teardown of Kokkos' statics and of the CUDA runtime, both set up by the initialization it
/// follows. The contexts stay live: a later tlse_context_destroy (say from a static object's
/// destructor) still succeeds, and any other call on them fails with a message.
void finalize_at_exit() {
  std::lock_guard<std::mutex> guard(kokkos_lock);
  if (finalized_here || !Kokkos::is_initialized()) return;
#if defined(KOKKOS_ENABLE_CUDA)
  for (tlse_context* c : live_contexts) c->streams.clear();  // Kokkos::Cuda instances go before Kokkos
#endif
  Kokkos::finalize();
  finalized_here = true;
}

int kokkos_cuda_device() {
#if defined(KOKKOS_ENABLE_CUDA)
  return Kokkos::Cuda().cuda_device();
#else
  return -1;
#endif
}

/// The sizes and options every cross-entropy entry point takes, checked.
tlse::capi::CrossEntropyArgs cross_entropy_args(const char* fn, int64_t n, int64_t v, int64_t d,
                                                const tlse_cross_entropy_options* options) {
  check_size(fn, "n", n), check_size(fn, "v", v), check_size(fn, "d", d);
  tlse::capi::CrossEntropyArgs a;
  a.n = n, a.v = v, a.d = d;
  a.options = convert(fn, options);
  return a;
}

/// The inputs forward and backward share (E, C, bias, targets), checked and recorded in `a`.
void cross_entropy_inputs(CallerArrays& arrays, ElementBytes e, tlse::capi::CrossEntropyArgs& a, const void* E,
                          const void* C, const void* bias, const int64_t* targets) {
  arrays.input("E", E, a.n * a.d, e.value, true);
  arrays.input("C", C, a.v * a.d, e.value, true);
  arrays.input("bias", bias, a.v, e.value);
  arrays.input("targets", targets, a.n, sizeof(int64_t), true);
  arrays.workspace(a.options.workspace.data, a.options.workspace.bytes);
  a.E = E, a.C = C, a.bias = bias, a.targets = targets;
}

/// The extras of a cross-entropy call, checked and recorded in `a` (NULL: none; the C++ layer
/// checks which call takes which).
void cross_entropy_extras(CallerArrays& arrays, ElementBytes e, tlse::capi::CrossEntropyArgs& a,
                          const tlse_cross_entropy_extras* extras) {
  if (!extras) return;
  arrays.input("extras->class_weight", extras->class_weight, a.v, e.acc);
  arrays.input("extras->dlse", extras->dlse, a.n, e.acc);
  arrays.output("extras->predicted", extras->predicted, a.n, sizeof(int64_t));
  arrays.output("extras->accuracy", extras->accuracy, 1, e.acc);
  a.class_weight = extras->class_weight, a.dlse = extras->dlse;
  a.predicted = extras->predicted, a.accuracy = extras->accuracy;
}

/// dloss and the gradient outputs the backward and the step share, checked and recorded in `a`.
void cross_entropy_gradients(CallerArrays& arrays, ElementBytes e, tlse::capi::CrossEntropyArgs& a, const void* dloss,
                             void* dE, void* dC, void* dbias) {
  arrays.input("dloss", dloss, a.loss_size(), e.acc, true);
  arrays.output("dE", dE, a.n * a.d, e.value);
  arrays.output("dC", dC, a.v * a.d, e.value);
  arrays.output("dbias", dbias, a.v, e.value);
  a.dloss = dloss, a.dE = dE, a.dC = dC, a.dbias = dbias;
}

/// The sizes and options every contrastive entry point takes, checked.
tlse::capi::ContrastiveArgs contrastive_args(const char* fn, int64_t b, int64_t c,
                                             const tlse_contrastive_options* options) {
  check_size(fn, "b", b), check_size(fn, "c", c);
  tlse::capi::ContrastiveArgs a;
  a.b = b, a.c = c;
  a.options = convert(fn, options);
  return a;
}

/// The inputs forward and backward share (I, T, labels), checked and recorded in `a`.
void contrastive_inputs(CallerArrays& arrays, ElementBytes e, tlse::capi::ContrastiveArgs& a, const void* I,
                        const void* T, const int64_t* labels) {
  arrays.input("I", I, a.b * a.c, e.value, true);
  arrays.input("T", T, a.b * a.c, e.value, true);
  arrays.input("labels", labels, a.b, sizeof(int64_t));
  arrays.workspace(a.options.workspace.data, a.options.workspace.bytes);
  a.I = I, a.T = T, a.labels = labels;
}

/// The sizes and options every self-similarity contrastive entry point takes, checked.
tlse::capi::SelfContrastiveArgs self_contrastive_args(const char* fn, int64_t n, int64_t c,
                                                      const tlse_contrastive_options* options) {
  check_size(fn, "n", n), check_size(fn, "c", c);
  if (n % 2 != 0)
    invalid(fn, "n",
            "is " + std::to_string(n) + "; Z holds two views of each sample (rows i and i + n/2): n must be even");
  if (options && options->direction != TLSE_DIRECTION_SYMMETRIC)
    invalid(fn, "options.direction",
            "is " + std::to_string(options->direction) +
                "; the self-similarity form has one direction (every row against all the others): leave it "
                "TLSE_DIRECTION_SYMMETRIC");
  tlse::capi::SelfContrastiveArgs a;
  a.n = n, a.c = c;
  a.options = convert(fn, options);
  return a;
}

/// The input forward and backward share (Z), checked and recorded in `a`, and the workspace.
void self_contrastive_inputs(CallerArrays& arrays, ElementBytes e, tlse::capi::SelfContrastiveArgs& a, const void* Z) {
  arrays.input("Z", Z, a.n * a.c, e.value, true);
  arrays.workspace(a.options.workspace.data, a.options.workspace.bytes);
  a.Z = Z;
}

/// The sizes and options every distillation entry point takes, checked.
tlse::capi::DistillationArgs distillation_args(const char* fn, int64_t n, int64_t v, int64_t d_s, int64_t d_t,
                                               const tlse_distillation_options* options) {
  check_size(fn, "n", n), check_size(fn, "v", v), check_size(fn, "d_s", d_s), check_size(fn, "d_t", d_t);
  tlse::capi::DistillationArgs a;
  a.n = n, a.v = v, a.d_s = d_s, a.d_t = d_t;
  a.options = convert(fn, options);
  return a;
}

/// The inputs forward and backward share (Hs, Ws, Ht, Wt, targets), checked and recorded in `a`.
void distillation_inputs(CallerArrays& arrays, ElementBytes e, tlse::capi::DistillationArgs& a, const void* Hs,
                         const void* Ws, const void* Ht, const void* Wt, const int64_t* targets) {
  arrays.input("Hs", Hs, a.n * a.d_s, e.value, true);
  arrays.input("Ws", Ws, a.v * a.d_s, e.value, true);
  arrays.input("Ht", Ht, a.n * a.d_t, e.value, true);
  arrays.input("Wt", Wt, a.v * a.d_t, e.value, true);
  arrays.input("targets", targets, a.n, sizeof(int64_t));
  arrays.workspace(a.options.workspace.data, a.options.workspace.bytes);
  a.Hs = Hs, a.Ws = Ws, a.Ht = Ht, a.Wt = Wt, a.targets = targets;
}

/// dloss and the gradient outputs the backward and the step share, checked and recorded in `a`.
void distillation_gradients(CallerArrays& arrays, ElementBytes e, tlse::capi::DistillationArgs& a, const void* dloss,
                            void* dHs, void* dWs, void* dHt, void* dWt) {
  arrays.input("dloss", dloss, a.loss_size(), e.acc, true);
  arrays.output("dHs", dHs, a.n * a.d_s, e.value);
  arrays.output("dWs", dWs, a.v * a.d_s, e.value);
  arrays.output("dHt", dHt, a.n * a.d_t, e.value);
  arrays.output("dWt", dWt, a.v * a.d_t, e.value);
  a.dloss = dloss, a.dHs = dHs, a.dWs = dWs, a.dHt = dHt, a.dWt = dWt;
}

/// The caller's communicator as the C++ layer's callbacks (the same fields), checked.
tlse::distributed::Callbacks callbacks_of(const char* fn, const tlse_communicator* comm) {
  if (!comm) invalid(fn, "comm", "is NULL");
  tlse::distributed::Callbacks cb;
  cb.user = comm->user, cb.rank = comm->rank, cb.size = comm->size;
  cb.ring_start = comm->ring_start, cb.ring_wait = comm->ring_wait, cb.allreduce = comm->allreduce;
  cb.allgather = comm->allgather, cb.allgather_host = comm->allgather_host;
  try {  // checks the callbacks and rank/size
    tlse::distributed::CallbackCommunicator<Kokkos::DefaultHostExecutionSpace> check(
        Kokkos::DefaultHostExecutionSpace(), cb);
  } catch (const std::invalid_argument& e) {
    invalid(fn, "comm", std::string("is unusable: ") + e.what());
  }
  return cb;
}

/// The C layer's checks of a distributed call (`checks`), run on every rank before an agreement:
/// a rank whose checks fail still takes part in it, so every rank fails with that rank's message
/// instead of waiting for it in a collective. The context (Kokkos) must exist already.
template <class Checks>
void agree(const char* fn, const tlse::distributed::Callbacks& cb, const Checks& checks) {
  const tlse::distributed::CallbackCommunicator<Kokkos::DefaultHostExecutionSpace> comm(
      Kokkos::DefaultHostExecutionSpace(), cb);
  tlse::distributed::impl::Agreement(comm, fn, {}, checks);
}

/// The shape of every computing entry point: the context locked, the C layer's checks
/// (`make_args`, which returns the checked arguments), the launch for `device` and `stream`, then
/// `run(dtype tag, launch, args)`; any exception becomes the returned status.
template <class MakeArgs, class Run>
tlse_status entry_point(const char* fn, tlse_context* context, tlse_device device, void* stream, tlse_dtype dtype,
                        const MakeArgs& make_args, const Run& run) noexcept {
  return guarded(fn, [&] {
    const CallLock lock(fn, context);
    const auto a = make_args();
    const auto launch = launch_for(fn, context, device, stream);
    by_dtype(fn, dtype, [&](auto tag) { run(tag, launch, a); });
  });
}

/// entry_point() for a distributed call: the checks and the dtype are agreed on by every rank
/// before `run(dtype tag, launch, callbacks, args)`.
template <class MakeArgs, class Run>
tlse_status distributed_entry_point(const char* fn, tlse_context* context, const tlse_communicator* comm,
                                    tlse_device device, void* stream, tlse_dtype dtype, const MakeArgs& make_args,
                                    const Run& run) noexcept {
  return guarded(fn, [&] {
    const CallLock lock(fn, context);
    const auto cb = callbacks_of(fn, comm);
    decltype(make_args()) a;
    tlse::capi::Launch launch;
    agree(fn, cb, [&] {
      a = make_args();
      by_dtype(fn, dtype, [](auto) {});
      launch = launch_for(fn, context, device, stream);
    });
    by_dtype(fn, dtype, [&](auto tag) { run(tag, launch, cb, a); });
  });
}

/// The checked arguments of a cross-entropy forward, single-device or distributed (no vocab_order).
tlse::capi::CrossEntropyArgs cross_entropy_forward_args(const char* fn, const tlse_context* context,
                                                        tlse_device device, tlse_dtype dtype, int64_t n, int64_t v,
                                                        int64_t d, const void* E, const void* C, const void* bias,
                                                        const int64_t* targets, void* loss, void* lse,
                                                        int32_t* vocab_order, const tlse_cross_entropy_extras* extras,
                                                        const tlse_cross_entropy_options* options) {
  auto a = cross_entropy_args(fn, n, v, d, options);
  const ElementBytes e = element_bytes(fn, dtype);
  CallerArrays arrays(fn, context, device);
  cross_entropy_inputs(arrays, e, a, E, C, bias, targets);
  arrays.output("loss", loss, a.loss_size(), e.acc, true);
  arrays.output("lse", lse, n, e.acc);
  arrays.output("vocab_order", vocab_order, v, sizeof(int32_t));
  cross_entropy_extras(arrays, e, a, extras);
  arrays.disjoint();
  a.loss = loss, a.lse_out = lse, a.order_out = vocab_order;
  return a;
}

/// The checked arguments of a cross-entropy backward, single-device or distributed (no vocab_order).
tlse::capi::CrossEntropyArgs cross_entropy_backward_args(const char* fn, const tlse_context* context,
                                                         tlse_device device, tlse_dtype dtype, int64_t n, int64_t v,
                                                         int64_t d, const void* E, const void* C, const void* bias,
                                                         const int64_t* targets, const void* lse,
                                                         const int32_t* vocab_order, const void* dloss, void* dE,
                                                         void* dC, void* dbias, const tlse_cross_entropy_extras* extras,
                                                         const tlse_cross_entropy_options* options) {
  auto a = cross_entropy_args(fn, n, v, d, options);
  const ElementBytes e = element_bytes(fn, dtype);
  CallerArrays arrays(fn, context, device);
  cross_entropy_inputs(arrays, e, a, E, C, bias, targets);
  arrays.input("lse", lse, n, e.acc, true);
  arrays.input("vocab_order", vocab_order, v, sizeof(int32_t));
  cross_entropy_gradients(arrays, e, a, dloss, dE, dC, dbias);
  cross_entropy_extras(arrays, e, a, extras);
  arrays.disjoint();
  a.lse = lse, a.order = vocab_order;
  return a;
}

/// The checked arguments of tlse_cross_entropy_with_gradients: the forward's loss and the
/// backward's dloss and gradients.
tlse::capi::CrossEntropyArgs cross_entropy_with_gradients_args(const char* fn, const tlse_context* context,
                                                               tlse_device device, tlse_dtype dtype, int64_t n,
                                                               int64_t v, int64_t d, const void* E, const void* C,
                                                               const void* bias, const int64_t* targets,
                                                               const void* dloss, void* loss, void* dE, void* dC,
                                                               void* dbias, const tlse_cross_entropy_extras* extras,
                                                               const tlse_cross_entropy_options* options) {
  auto a = cross_entropy_args(fn, n, v, d, options);
  const ElementBytes e = element_bytes(fn, dtype);
  CallerArrays arrays(fn, context, device);
  cross_entropy_inputs(arrays, e, a, E, C, bias, targets);
  arrays.output("loss", loss, a.loss_size(), e.acc, true);
  cross_entropy_gradients(arrays, e, a, dloss, dE, dC, dbias);
  cross_entropy_extras(arrays, e, a, extras);
  arrays.disjoint();
  a.loss = loss;
  return a;
}

/// The checked arguments of a contrastive forward, single-device or distributed.
tlse::capi::ContrastiveArgs contrastive_forward_args(const char* fn, const tlse_context* context, tlse_device device,
                                                     tlse_dtype dtype, int64_t b, int64_t c, const void* I,
                                                     const void* T, const int64_t* labels, void* loss, void* row_lse,
                                                     void* col_lse, const tlse_contrastive_options* options) {
  auto a = contrastive_args(fn, b, c, options);
  const ElementBytes e = element_bytes(fn, dtype);
  CallerArrays arrays(fn, context, device);
  contrastive_inputs(arrays, e, a, I, T, labels);
  arrays.output("loss", loss, 1, e.acc, true);
  arrays.output("row_lse", row_lse, b, e.acc);
  arrays.output("col_lse", col_lse, b, e.acc);
  arrays.disjoint();
  a.loss = loss, a.row_lse_out = row_lse, a.col_lse_out = col_lse;
  return a;
}

/// The checked arguments of a contrastive backward, single-device or distributed.
tlse::capi::ContrastiveArgs contrastive_backward_args(const char* fn, const tlse_context* context, tlse_device device,
                                                      tlse_dtype dtype, int64_t b, int64_t c, const void* I,
                                                      const void* T, const int64_t* labels, const void* row_lse,
                                                      const void* col_lse, const void* dloss, void* dI, void* dT,
                                                      void* dscale, const tlse_contrastive_extras* extras,
                                                      const tlse_contrastive_options* options) {
  auto a = contrastive_args(fn, b, c, options);
  const ElementBytes e = element_bytes(fn, dtype);
  CallerArrays arrays(fn, context, device);
  contrastive_inputs(arrays, e, a, I, T, labels);
  arrays.input("row_lse", row_lse, b, e.acc);
  arrays.input("col_lse", col_lse, b, e.acc);
  arrays.input("dloss", dloss, 1, e.acc, true);
  arrays.output("dI", dI, b * c, e.value);
  arrays.output("dT", dT, b * c, e.value);
  arrays.output("dscale", dscale, 1, e.acc);
  if (extras) {
    arrays.input("extras->d_row_lse", extras->d_row_lse, b, e.acc);
    arrays.input("extras->d_col_lse", extras->d_col_lse, b, e.acc);
    a.d_row_lse = extras->d_row_lse, a.d_col_lse = extras->d_col_lse;
  }
  arrays.disjoint();
  a.row_lse = row_lse, a.col_lse = col_lse, a.dloss = dloss;
  a.dI = dI, a.dT = dT, a.dscale = dscale;
  return a;
}

/// The checked arguments of a self-similarity contrastive forward.
tlse::capi::SelfContrastiveArgs self_contrastive_forward_args(const char* fn, const tlse_context* context,
                                                              tlse_device device, tlse_dtype dtype, int64_t n,
                                                              int64_t c, const void* Z, void* loss, void* lse,
                                                              const tlse_contrastive_options* options) {
  auto a = self_contrastive_args(fn, n, c, options);
  const ElementBytes e = element_bytes(fn, dtype);
  CallerArrays arrays(fn, context, device);
  self_contrastive_inputs(arrays, e, a, Z);
  arrays.output("loss", loss, 1, e.acc, true);
  arrays.output("lse", lse, n, e.acc);
  arrays.disjoint();
  a.loss = loss, a.lse_out = lse;
  return a;
}

/// The checked arguments of a self-similarity contrastive backward.
tlse::capi::SelfContrastiveArgs self_contrastive_backward_args(const char* fn, const tlse_context* context,
                                                               tlse_device device, tlse_dtype dtype, int64_t n,
                                                               int64_t c, const void* Z, const void* lse,
                                                               const void* dloss, void* dZ, void* dscale,
                                                               const tlse_contrastive_options* options) {
  auto a = self_contrastive_args(fn, n, c, options);
  const ElementBytes e = element_bytes(fn, dtype);
  CallerArrays arrays(fn, context, device);
  self_contrastive_inputs(arrays, e, a, Z);
  arrays.input("lse", lse, n, e.acc, true);
  arrays.input("dloss", dloss, 1, e.acc, true);
  arrays.output("dZ", dZ, n * c, e.value);
  arrays.output("dscale", dscale, 1, e.acc);
  arrays.disjoint();
  a.lse = lse, a.dloss = dloss, a.dZ = dZ, a.dscale = dscale;
  return a;
}

/// The checked arguments of a distillation forward.
tlse::capi::DistillationArgs distillation_forward_args(const char* fn, const tlse_context* context, tlse_device device,
                                                       tlse_dtype dtype, int64_t n, int64_t v, int64_t d_s, int64_t d_t,
                                                       const void* Hs, const void* Ws, const void* Ht, const void* Wt,
                                                       const int64_t* targets, void* loss, void* row_stats,
                                                       const tlse_distillation_options* options) {
  auto a = distillation_args(fn, n, v, d_s, d_t, options);
  const ElementBytes e = element_bytes(fn, dtype);
  CallerArrays arrays(fn, context, device);
  distillation_inputs(arrays, e, a, Hs, Ws, Ht, Wt, targets);
  arrays.output("loss", loss, a.loss_size(), e.acc, true);
  arrays.output("row_stats", row_stats, n * TLSE_DISTILLATION_ROW_STATS, e.acc, true);
  arrays.disjoint();
  a.loss = loss, a.row_stats_out = row_stats;
  return a;
}

/// The checked arguments of a distillation backward.
tlse::capi::DistillationArgs distillation_backward_args(const char* fn, const tlse_context* context, tlse_device device,
                                                        tlse_dtype dtype, int64_t n, int64_t v, int64_t d_s,
                                                        int64_t d_t, const void* Hs, const void* Ws, const void* Ht,
                                                        const void* Wt, const int64_t* targets, const void* row_stats,
                                                        const void* dloss, void* dHs, void* dWs, void* dHt, void* dWt,
                                                        const tlse_distillation_options* options) {
  auto a = distillation_args(fn, n, v, d_s, d_t, options);
  const ElementBytes e = element_bytes(fn, dtype);
  CallerArrays arrays(fn, context, device);
  distillation_inputs(arrays, e, a, Hs, Ws, Ht, Wt, targets);
  arrays.input("row_stats", row_stats, n * TLSE_DISTILLATION_ROW_STATS, e.acc, true);
  distillation_gradients(arrays, e, a, dloss, dHs, dWs, dHt, dWt);
  arrays.disjoint();
  a.row_stats = row_stats;
  return a;
}

/// The checked arguments of tlse_distillation_loss_with_gradients: the forward's loss and the
/// backward's dloss and gradients.
tlse::capi::DistillationArgs distillation_with_gradients_args(const char* fn, const tlse_context* context,
                                                              tlse_device device, tlse_dtype dtype, int64_t n,
                                                              int64_t v, int64_t d_s, int64_t d_t, const void* Hs,
                                                              const void* Ws, const void* Ht, const void* Wt,
                                                              const int64_t* targets, const void* dloss, void* loss,
                                                              void* dHs, void* dWs, void* dHt, void* dWt,
                                                              const tlse_distillation_options* options) {
  auto a = distillation_args(fn, n, v, d_s, d_t, options);
  const ElementBytes e = element_bytes(fn, dtype);
  CallerArrays arrays(fn, context, device);
  distillation_inputs(arrays, e, a, Hs, Ws, Ht, Wt, targets);
  arrays.output("loss", loss, a.loss_size(), e.acc, true);
  distillation_gradients(arrays, e, a, dloss, dHs, dWs, dHt, dWt);
  arrays.disjoint();
  a.loss = loss;
  return a;
}

}  // namespace

static_assert(TLSE_DISTILLATION_ROW_STATS == tlse::distillation_row_stats,
              "tlse.h's TLSE_DISTILLATION_ROW_STATS is the C++ layer's distillation_row_stats");

static_assert(int(TLSE_COMM_F32) == tlse::distributed::callback_f32 &&
                  int(TLSE_COMM_F64) == tlse::distributed::callback_f64 &&
                  int(TLSE_COMM_I32) == tlse::distributed::callback_i32 &&
                  int(TLSE_COMM_I64) == tlse::distributed::callback_i64 &&
                  int(TLSE_COMM_SUM) == tlse::distributed::callback_sum &&
                  int(TLSE_COMM_MAX) == tlse::distributed::callback_max,
              "tlse.h's communicator codes are the C++ layer's");

extern "C" {

const char* tlse_version(void) { return TLSE_VERSION_STRING; }

int tlse_device_available(tlse_device device) {
#if defined(KOKKOS_ENABLE_CUDA)
  return device == TLSE_DEVICE_HOST || device == TLSE_DEVICE_CUDA;
#else
  return device == TLSE_DEVICE_HOST;
#endif
}

const char* tlse_last_error(void) { return last_error.c_str(); }

void tlse_cross_entropy_options_default(tlse_cross_entropy_options* o) {
  if (!o) return;
  *o = tlse_cross_entropy_options{};
  o->ignore_index = -100;
  o->reduction = TLSE_REDUCTION_MEAN;
  o->filter_eps = TLSE_FILTER_EPS_AUTO;
}

void tlse_contrastive_options_default(tlse_contrastive_options* o) {
  if (!o) return;
  *o = tlse_contrastive_options{};
  o->scale = 1.0;
  o->direction = TLSE_DIRECTION_SYMMETRIC;
}

void tlse_distillation_options_default(tlse_distillation_options* o) {
  if (!o) return;
  *o = tlse_distillation_options{};
  o->divergence = TLSE_DIVERGENCE_FORWARD_KL;
  o->reduction = TLSE_REDUCTION_MEAN;
  o->beta = 0.5;
  o->temperature = 1.0;
  o->ignore_index = -100;
}

tlse_status tlse_context_create(tlse_context** context, int cuda_device) {
  static const char* fn = "tlse_context_create";
  return guarded(fn, [&] {
    if (!context) invalid(fn, "context", "is NULL; pass the address of a tlse_context*");
    *context = nullptr;
    std::lock_guard<std::mutex> guard(kokkos_lock);
    if (finalized_here)
      throw Error(TLSE_ERROR_RUNTIME,
                  std::string(fn) +
                      ": Kokkos was finalized (when the last context was destroyed, or at exit) and "
                      "cannot be initialized again in this process; keep one context alive instead");
    if (!Kokkos::is_initialized()) {
      require_cuda_device(fn, cuda_device);
      tlse::impl::initialize_kokkos(cuda_device);
      initialized_here = true;
      std::atexit(finalize_at_exit);
    } else if (cuda_device >= 0 && kokkos_cuda_device() >= 0 && kokkos_cuda_device() != cuda_device) {
      invalid(fn, "cuda_device", "is " + std::to_string(cuda_device) + " but the running Kokkos uses CUDA device " +
                                     std::to_string(kokkos_cuda_device()));
    }
    auto c = std::make_unique<tlse_context>();
    c->cuda_device = kokkos_cuda_device();
    live_contexts.insert(c.get());
    *context = c.release();
  });
}

tlse_status tlse_context_destroy(tlse_context* context) {
  static const char* fn = "tlse_context_destroy";
  return guarded(fn, [&] {
    if (!context) return;
    std::lock_guard<std::mutex> guard(kokkos_lock);
    if (!live_contexts.erase(context))
      invalid(fn, "context", "is not a live context: it was destroyed already, or never made by tlse_context_create");
    delete context;  // its Kokkos::Cuda instances go before Kokkos itself
    if (live_contexts.empty() && initialized_here && !finalized_here) {
      Kokkos::finalize();
      finalized_here = true;
    }
  });
}

tlse_status tlse_context_cuda_device(const tlse_context* context, int* cuda_device) {
  static const char* fn = "tlse_context_cuda_device";
  return guarded(fn, [&] {
    const CallLock lock(fn, context);
    if (!cuda_device) invalid(fn, "cuda_device", "is NULL");
    *cuda_device = context->cuda_device;
  });
}

tlse_status tlse_cross_entropy_workspace_bytes(tlse_context* context, tlse_device device, void* stream,
                                               tlse_dtype dtype, int64_t n, int64_t v, int64_t d,
                                               const tlse_cross_entropy_options* options, size_t* bytes) {
  static const char* fn = "tlse_cross_entropy_workspace_bytes";
  return entry_point(
      fn, context, device, stream, dtype,
      [&] {
        if (!bytes) invalid(fn, "bytes", "is NULL");
        return cross_entropy_args(fn, n, v, d, options);
      },
      [&](auto tag, const auto& launch, const auto& a) {
        *bytes = tlse::capi::cross_entropy_workspace<decltype(tag)>(launch, a);
      });
}

tlse_status tlse_cross_entropy_step_fused(tlse_context* context, tlse_device device, void* stream, tlse_dtype dtype,
                                          int64_t n, int64_t v, int64_t d, const tlse_cross_entropy_options* options,
                                          int want_dbias, int* fused) {
  static const char* fn = "tlse_cross_entropy_step_fused";
  return entry_point(
      fn, context, device, stream, dtype,
      [&] {
        if (!fused) invalid(fn, "fused", "is NULL");
        return cross_entropy_args(fn, n, v, d, options);
      },
      [&](auto tag, const auto& launch, const auto& a) {
        *fused = tlse::capi::cross_entropy_step_fuses<decltype(tag)>(launch, a, want_dbias != 0) ? 1 : 0;
      });
}

tlse_status tlse_cross_entropy_forward(tlse_context* context, tlse_device device, void* stream, tlse_dtype dtype,
                                       int64_t n, int64_t v, int64_t d, const void* E, const void* C,
                                       const void* bias, const int64_t* targets, void* loss, void* lse,
                                       int32_t* vocab_order, const tlse_cross_entropy_extras* extras,
                                       const tlse_cross_entropy_options* options) {
  static const char* fn = "tlse_cross_entropy_forward";
  return entry_point(
      fn, context, device, stream, dtype,
      [&] {
        return cross_entropy_forward_args(fn, context, device, dtype, n, v, d, E, C, bias, targets, loss, lse,
                                          vocab_order, extras, options);
      },
      [&](auto tag, const auto& launch, const auto& a) {
        tlse::capi::cross_entropy_forward<decltype(tag)>(launch, a);
      });
}

tlse_status tlse_cross_entropy_backward(tlse_context* context, tlse_device device, void* stream, tlse_dtype dtype,
                                        int64_t n, int64_t v, int64_t d, const void* E, const void* C,
                                        const void* bias, const int64_t* targets, const void* lse,
                                        const int32_t* vocab_order, const void* dloss, void* dE, void* dC,
                                        void* dbias, const tlse_cross_entropy_extras* extras,
                                        const tlse_cross_entropy_options* options) {
  static const char* fn = "tlse_cross_entropy_backward";
  return entry_point(
      fn, context, device, stream, dtype,
      [&] {
        return cross_entropy_backward_args(fn, context, device, dtype, n, v, d, E, C, bias, targets, lse, vocab_order,
                                           dloss, dE, dC, dbias, extras, options);
      },
      [&](auto tag, const auto& launch, const auto& a) {
        tlse::capi::cross_entropy_backward<decltype(tag)>(launch, a);
      });
}

tlse_status tlse_cross_entropy_with_gradients(tlse_context* context, tlse_device device, void* stream,
                                              tlse_dtype dtype, int64_t n, int64_t v, int64_t d, const void* E,
                                              const void* C, const void* bias, const int64_t* targets,
                                              const void* dloss, void* loss, void* dE, void* dC, void* dbias,
                                              const tlse_cross_entropy_extras* extras,
                                              const tlse_cross_entropy_options* options) {
  static const char* fn = "tlse_cross_entropy_with_gradients";
  return entry_point(
      fn, context, device, stream, dtype,
      [&] {
        return cross_entropy_with_gradients_args(fn, context, device, dtype, n, v, d, E, C, bias, targets, dloss, loss,
                                                 dE, dC, dbias, extras, options);
      },
      [&](auto tag, const auto& launch, const auto& a) {
        tlse::capi::cross_entropy_with_gradients<decltype(tag)>(launch, a);
      });
}

tlse_status tlse_contrastive_workspace_bytes(tlse_context* context, tlse_device device, void* stream,
                                             tlse_dtype dtype, int64_t b, int64_t c,
                                             const tlse_contrastive_options* options, size_t* bytes) {
  static const char* fn = "tlse_contrastive_workspace_bytes";
  return entry_point(
      fn, context, device, stream, dtype,
      [&] {
        if (!bytes) invalid(fn, "bytes", "is NULL");
        return contrastive_args(fn, b, c, options);
      },
      [&](auto tag, const auto& launch, const auto& a) {
        *bytes = tlse::capi::contrastive_workspace<decltype(tag)>(launch, a);
      });
}

tlse_status tlse_contrastive_forward(tlse_context* context, tlse_device device, void* stream, tlse_dtype dtype,
                                     int64_t b, int64_t c, const void* I, const void* T, const int64_t* labels,
                                     void* loss, void* row_lse, void* col_lse,
                                     const tlse_contrastive_options* options) {
  static const char* fn = "tlse_contrastive_forward";
  return entry_point(
      fn, context, device, stream, dtype,
      [&] {
        return contrastive_forward_args(fn, context, device, dtype, b, c, I, T, labels, loss, row_lse, col_lse,
                                        options);
      },
      [&](auto tag, const auto& launch, const auto& a) { tlse::capi::contrastive_forward<decltype(tag)>(launch, a); });
}

tlse_status tlse_contrastive_backward(tlse_context* context, tlse_device device, void* stream, tlse_dtype dtype,
                                      int64_t b, int64_t c, const void* I, const void* T, const int64_t* labels,
                                      const void* row_lse, const void* col_lse, const void* dloss, void* dI,
                                      void* dT, void* dscale, const tlse_contrastive_extras* extras,
                                      const tlse_contrastive_options* options) {
  static const char* fn = "tlse_contrastive_backward";
  return entry_point(
      fn, context, device, stream, dtype,
      [&] {
        return contrastive_backward_args(fn, context, device, dtype, b, c, I, T, labels, row_lse, col_lse, dloss, dI,
                                         dT, dscale, extras, options);
      },
      [&](auto tag, const auto& launch, const auto& a) { tlse::capi::contrastive_backward<decltype(tag)>(launch, a); });
}

tlse_status tlse_self_contrastive_workspace_bytes(tlse_context* context, tlse_device device, void* stream,
                                                  tlse_dtype dtype, int64_t n, int64_t c,
                                                  const tlse_contrastive_options* options, size_t* bytes) {
  static const char* fn = "tlse_self_contrastive_workspace_bytes";
  return entry_point(
      fn, context, device, stream, dtype,
      [&] {
        if (!bytes) invalid(fn, "bytes", "is NULL");
        return self_contrastive_args(fn, n, c, options);
      },
      [&](auto tag, const auto& launch, const auto& a) {
        *bytes = tlse::capi::self_contrastive_workspace<decltype(tag)>(launch, a);
      });
}

tlse_status tlse_self_contrastive_forward(tlse_context* context, tlse_device device, void* stream, tlse_dtype dtype,
                                          int64_t n, int64_t c, const void* Z, void* loss, void* lse,
                                          const tlse_contrastive_options* options) {
  static const char* fn = "tlse_self_contrastive_forward";
  return entry_point(
      fn, context, device, stream, dtype,
      [&] { return self_contrastive_forward_args(fn, context, device, dtype, n, c, Z, loss, lse, options); },
      [&](auto tag, const auto& launch, const auto& a) {
        tlse::capi::self_contrastive_forward<decltype(tag)>(launch, a);
      });
}

tlse_status tlse_self_contrastive_backward(tlse_context* context, tlse_device device, void* stream, tlse_dtype dtype,
                                           int64_t n, int64_t c, const void* Z, const void* lse, const void* dloss,
                                           void* dZ, void* dscale, const tlse_contrastive_options* options) {
  static const char* fn = "tlse_self_contrastive_backward";
  return entry_point(
      fn, context, device, stream, dtype,
      [&] {
        return self_contrastive_backward_args(fn, context, device, dtype, n, c, Z, lse, dloss, dZ, dscale, options);
      },
      [&](auto tag, const auto& launch, const auto& a) {
        tlse::capi::self_contrastive_backward<decltype(tag)>(launch, a);
      });
}

tlse_status tlse_distillation_loss_workspace_bytes(tlse_context* context, tlse_device device, void* stream,
                                                   tlse_dtype dtype, int64_t n, int64_t v, int64_t d_s, int64_t d_t,
                                                   const tlse_distillation_options* options, size_t* bytes) {
  static const char* fn = "tlse_distillation_loss_workspace_bytes";
  return entry_point(
      fn, context, device, stream, dtype,
      [&] {
        if (!bytes) invalid(fn, "bytes", "is NULL");
        return distillation_args(fn, n, v, d_s, d_t, options);
      },
      [&](auto tag, const auto& launch, const auto& a) {
        *bytes = tlse::capi::distillation_workspace<decltype(tag)>(launch, a);
      });
}

tlse_status tlse_distillation_loss(tlse_context* context, tlse_device device, void* stream, tlse_dtype dtype, int64_t n,
                                   int64_t v, int64_t d_s, int64_t d_t, const void* Hs, const void* Ws, const void* Ht,
                                   const void* Wt, const int64_t* targets, void* loss, void* row_stats,
                                   const tlse_distillation_options* options) {
  static const char* fn = "tlse_distillation_loss";
  return entry_point(
      fn, context, device, stream, dtype,
      [&] {
        return distillation_forward_args(fn, context, device, dtype, n, v, d_s, d_t, Hs, Ws, Ht, Wt, targets, loss,
                                         row_stats, options);
      },
      [&](auto tag, const auto& launch, const auto& a) { tlse::capi::distillation_forward<decltype(tag)>(launch, a); });
}

tlse_status tlse_distillation_loss_backward(tlse_context* context, tlse_device device, void* stream, tlse_dtype dtype,
                                            int64_t n, int64_t v, int64_t d_s, int64_t d_t, const void* Hs,
                                            const void* Ws, const void* Ht, const void* Wt, const int64_t* targets,
                                            const void* row_stats, const void* dloss, void* dHs, void* dWs, void* dHt,
                                            void* dWt, const tlse_distillation_options* options) {
  static const char* fn = "tlse_distillation_loss_backward";
  return entry_point(
      fn, context, device, stream, dtype,
      [&] {
        return distillation_backward_args(fn, context, device, dtype, n, v, d_s, d_t, Hs, Ws, Ht, Wt, targets,
                                          row_stats, dloss, dHs, dWs, dHt, dWt, options);
      },
      [&](auto tag, const auto& launch, const auto& a) {
        tlse::capi::distillation_backward<decltype(tag)>(launch, a);
      });
}

tlse_status tlse_distillation_step_fused(tlse_context* context, tlse_device device, void* stream, tlse_dtype dtype,
                                         int64_t n, int64_t v, int64_t d_s, int64_t d_t,
                                         const tlse_distillation_options* options, int want_teacher_gradients,
                                         int* fused) {
  static const char* fn = "tlse_distillation_step_fused";
  return entry_point(
      fn, context, device, stream, dtype,
      [&] {
        if (!fused) invalid(fn, "fused", "is NULL");
        return distillation_args(fn, n, v, d_s, d_t, options);
      },
      [&](auto tag, const auto& launch, const auto& a) {
        *fused = tlse::capi::distillation_step_fuses<decltype(tag)>(launch, a, want_teacher_gradients != 0) ? 1 : 0;
      });
}

tlse_status tlse_distillation_loss_with_gradients(tlse_context* context, tlse_device device, void* stream,
                                                  tlse_dtype dtype, int64_t n, int64_t v, int64_t d_s, int64_t d_t,
                                                  const void* Hs, const void* Ws, const void* Ht, const void* Wt,
                                                  const int64_t* targets, const void* dloss, void* loss, void* dHs,
                                                  void* dWs, void* dHt, void* dWt,
                                                  const tlse_distillation_options* options) {
  static const char* fn = "tlse_distillation_loss_with_gradients";
  return entry_point(
      fn, context, device, stream, dtype,
      [&] {
        return distillation_with_gradients_args(fn, context, device, dtype, n, v, d_s, d_t, Hs, Ws, Ht, Wt, targets,
                                                dloss, loss, dHs, dWs, dHt, dWt, options);
      },
      [&](auto tag, const auto& launch, const auto& a) {
        tlse::capi::distillation_with_gradients<decltype(tag)>(launch, a);
      });
}

tlse_status tlse_cross_entropy_forward_distributed(tlse_context* context, const tlse_communicator* comm,
                                                   tlse_device device, void* stream, tlse_dtype dtype, int64_t n,
                                                   int64_t v, int64_t d, const void* E, const void* C,
                                                   const void* bias, const int64_t* targets, void* loss, void* lse,
                                                   const tlse_cross_entropy_extras* extras,
                                                   const tlse_cross_entropy_options* options) {
  static const char* fn = "tlse_cross_entropy_forward_distributed";
  return distributed_entry_point(
      fn, context, comm, device, stream, dtype,
      [&] {
        return cross_entropy_forward_args(fn, context, device, dtype, n, v, d, E, C, bias, targets, loss, lse, nullptr,
                                          extras, options);
      },
      [](auto tag, const auto& launch, const auto& cb, const auto& a) {
        tlse::capi::cross_entropy_forward_distributed<decltype(tag)>(launch, cb, a);
      });
}

tlse_status tlse_cross_entropy_backward_distributed(tlse_context* context, const tlse_communicator* comm,
                                                    tlse_device device, void* stream, tlse_dtype dtype, int64_t n,
                                                    int64_t v, int64_t d, const void* E, const void* C,
                                                    const void* bias, const int64_t* targets, const void* lse,
                                                    const void* dloss, void* dE, void* dC, void* dbias,
                                                    const tlse_cross_entropy_extras* extras,
                                                    const tlse_cross_entropy_options* options) {
  static const char* fn = "tlse_cross_entropy_backward_distributed";
  return distributed_entry_point(
      fn, context, comm, device, stream, dtype,
      [&] {
        return cross_entropy_backward_args(fn, context, device, dtype, n, v, d, E, C, bias, targets, lse, nullptr,
                                           dloss, dE, dC, dbias, extras, options);
      },
      [](auto tag, const auto& launch, const auto& cb, const auto& a) {
        tlse::capi::cross_entropy_backward_distributed<decltype(tag)>(launch, cb, a);
      });
}

tlse_status tlse_contrastive_forward_distributed(tlse_context* context, const tlse_communicator* comm,
                                                 tlse_device device, void* stream, tlse_dtype dtype, int64_t b,
                                                 int64_t c, const void* I, const void* T, const int64_t* labels,
                                                 void* loss, void* row_lse, void* col_lse,
                                                 const tlse_contrastive_options* options) {
  static const char* fn = "tlse_contrastive_forward_distributed";
  return distributed_entry_point(
      fn, context, comm, device, stream, dtype,
      [&] {
        return contrastive_forward_args(fn, context, device, dtype, b, c, I, T, labels, loss, row_lse, col_lse,
                                        options);
      },
      [](auto tag, const auto& launch, const auto& cb, const auto& a) {
        tlse::capi::contrastive_forward_distributed<decltype(tag)>(launch, cb, a);
      });
}

tlse_status tlse_contrastive_backward_distributed(tlse_context* context, const tlse_communicator* comm,
                                                  tlse_device device, void* stream, tlse_dtype dtype, int64_t b,
                                                  int64_t c, const void* I, const void* T, const int64_t* labels,
                                                  const void* row_lse, const void* col_lse, const void* dloss,
                                                  void* dI, void* dT, void* dscale,
                                                  const tlse_contrastive_options* options) {
  static const char* fn = "tlse_contrastive_backward_distributed";
  return distributed_entry_point(
      fn, context, comm, device, stream, dtype,
      [&] {
        return contrastive_backward_args(fn, context, device, dtype, b, c, I, T, labels, row_lse, col_lse, dloss, dI,
                                         dT, dscale, nullptr, options);
      },
      [](auto tag, const auto& launch, const auto& cb, const auto& a) {
        tlse::capi::contrastive_backward_distributed<decltype(tag)>(launch, cb, a);
      });
}

}  // extern "C"
