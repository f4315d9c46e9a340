// tlse: runs a TiledLSE loss on random inputs, times it against the materialized baseline,
// and with --check verifies it against the float64 reference. See `tlse --help`.
#include "cli.hpp"
#include "jobs.hpp"
#include "usable_device.hpp"

#include <Kokkos_Core.hpp>

#include <cstdio>
#include <exception>
#include <new>
#include <string>

namespace {

template <class T>
int run(const tlse::app::Options& o) {
  return o.job == tlse::app::Job::contrastive ? tlse::app::run_contrastive<T>(o) : tlse::app::run_cross_entropy<T>(o);
}

}  // namespace

int main(int argc, char* argv[]) {
  using namespace tlse::app;
  Options o;
  try {
    o = parse_command_line(argc, argv);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "tlse: %s (see tlse --help)\n", e.what());
    return 2;
  }
  if (o.help) {
    std::fputs(usage(), stdout);
    return 0;
  }
  if (const std::string problem = usable_device_problem(); !problem.empty()) {
    std::fprintf(stderr, "tlse: error: %s\n", problem.c_str());
    return 1;
  }
  Kokkos::ScopeGuard kokkos(argc, argv);
  try {
    switch (o.dtype) {
      case DType::f32: return run<float>(o);
      case DType::f64: return run<double>(o);
      case DType::bf16: return run<tlse::bfloat16>(o);
      case DType::f16: return run<tlse::float16>(o);
    }
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr,
                 "tlse: error: out of memory. The inputs are generated as float64 host matrices, the baseline "
                 "adds a rows x cols matrix (--no-baseline skips it) and --check a few more float64 ones.\n");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tlse: error: %s\n", e.what());
  }
  return 1;
}
