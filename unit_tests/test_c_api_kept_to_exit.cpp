// A program that keeps its context to the end and never destroys it (docs/c_api.md asks for one
// context for the life of the program): the library finalizes the Kokkos it initialized at exit.
// Before, a CUDA build ended such a program with "Kokkos::Cuda ERROR: Failed to call
// Kokkos::Cuda::finalize()" from Kokkos' own static destructor. A static object constructed
// before the context is destroyed after that: a call on the context then fails with a message,
// destroying it still succeeds, and a new context cannot be made. Kokkos' message comes from a
// destructor after the program's last word, so the test runs itself as a child process
// (`--child`) and reads what it printed.
#include <tlse.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#if defined(TLSE_TEST_CUDA)
#include <cuda_runtime_api.h>
#endif

namespace {

tlse_context* context = nullptr;

struct AfterExitHandlers {
  ~AfterExitHandlers() {
    if (!context) return;  // the parent process
    int device = 0;
    const tlse_status call = tlse_context_cuda_device(context, &device);
    std::printf("call after exit: status %d, \"%s\"\n", int(call), tlse_last_error());
    const tlse_status destroyed = tlse_context_destroy(context);
    std::printf("destroy after exit: status %d\n", int(destroyed));
    tlse_context* another = nullptr;
    const tlse_status created = tlse_context_create(&another, -1);
    std::printf("create after exit: status %d, \"%s\"\n", int(created), tlse_last_error());
    if (call == TLSE_ERROR_RUNTIME && destroyed == TLSE_SUCCESS && created == TLSE_ERROR_RUNTIME && !another)
      std::printf("kept to exit: ok\n");
  }
} after_exit_handlers;  // constructed before main, so destroyed after the library's exit handler

/// One small cross-entropy forward, so that Kokkos has run work (on CUDA, through a stream the
/// context keeps a Kokkos::Cuda instance for).
bool forward(tlse_device device, void* stream) {
  constexpr std::int64_t n = 5, v = 7, d = 3;
  std::vector<double> E(n * d, 0.25), C(v * d, -0.5), loss(1), lse(n);
  std::vector<std::int64_t> targets(n, 2);
  tlse_cross_entropy_options options;
  tlse_cross_entropy_options_default(&options);
  void *e = E.data(), *c = C.data(), *l = loss.data(), *s = lse.data(), *t = targets.data();
#if defined(TLSE_TEST_CUDA)
  if (device == TLSE_DEVICE_CUDA) {
    for (void** p : {&e, &c, &l, &s, &t}) cudaMalloc(p, 256);
    cudaMemcpy(e, E.data(), n * d * sizeof(double), cudaMemcpyHostToDevice);
    cudaMemcpy(c, C.data(), v * d * sizeof(double), cudaMemcpyHostToDevice);
    cudaMemcpy(t, targets.data(), n * sizeof(std::int64_t), cudaMemcpyHostToDevice);
  }
#endif
  const tlse_status status =
      tlse_cross_entropy_forward(context, device, stream, TLSE_F64, n, v, d, e, c, nullptr,
                                 static_cast<const std::int64_t*>(t), l, s, nullptr, nullptr, &options);
  if (status != TLSE_SUCCESS) std::printf("forward: %s\n", tlse_last_error());
#if defined(TLSE_TEST_CUDA)
  if (device == TLSE_DEVICE_CUDA) {
    cudaStreamSynchronize(static_cast<cudaStream_t>(stream));
    for (void* p : {e, c, l, s, t}) cudaFree(p);  // the context alone stays: compute-sanitizer sees no leak
  }
#endif
  return status == TLSE_SUCCESS;
}

}  // namespace

/// The program that keeps its context to exit.
int child() {
  (void)&after_exit_handlers;  // used through its destructor only (nvcc would call it unreferenced)
  if (tlse_context_create(&context, -1) != TLSE_SUCCESS) {
    std::printf("create: %s\n", tlse_last_error());
    return 1;
  }
  if (!forward(TLSE_DEVICE_HOST, nullptr)) return 1;
#if defined(TLSE_TEST_CUDA)
  cudaStream_t stream;
  cudaStreamCreate(&stream);
  if (!forward(TLSE_DEVICE_CUDA, stream)) return 1;
#endif
  std::printf("exiting with the context alive\n");
  return 0;  // the context, and the stream its Kokkos::Cuda instance runs on, are left to the end
}

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "--child") return child();
  std::FILE* run = popen(("'" + std::string(argv[0]) + "' --child 2>&1").c_str(), "r");
  if (!run) return 1;
  std::string output;
  char buffer[256];
  while (std::fgets(buffer, sizeof buffer, run)) output += buffer;
  const int status = pclose(run);
  std::printf("%s", output.c_str());
  const bool complained = output.find("Failed to call") != std::string::npos;  // Kokkos::Cuda's message
  const bool checked = output.find("kept to exit: ok") != std::string::npos;
  if (status != 0 || complained || !checked) {
    std::printf("FAILED: exit status %d%s%s\n", status, complained ? ", Kokkos was not finalized" : "",
                checked ? "" : ", the calls after exit did not do what they should");
    return 1;
  }
  std::printf("passed\n");
  return 0;
}
