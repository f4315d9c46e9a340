#include <Kokkos_Core.hpp>
#include <gtest/gtest.h>

#include <cstdlib>

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  // Listing the tests (ctest's discovery at build time) needs no device: a CUDA build must
  // list them on a machine without a GPU.
  if (::testing::GTEST_FLAG(list_tests)) return RUN_ALL_TESTS();
  // Thread binding does not matter for correctness; this only quiets Kokkos' OpenMP advice,
  // also when ctest lists the tests.
  setenv("OMP_PROC_BIND", "false", 0);
  Kokkos::ScopeGuard kokkos(argc, argv);
  return RUN_ALL_TESTS();
}
