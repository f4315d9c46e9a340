#!/usr/bin/env bash
# CI's robustness step (docs/errors.md, "What was tried"): a host build of the C API, the unit
# tests and the C API's fuzz target with Debian's clang under AddressSanitizer and
# UndefinedBehaviorSanitizer, in build-sanitize/; then its tests, and the fuzz target on its seed
# corpus for TLSE_FUZZ_SECONDS (default 60; scripts/fuzz.sh). Any sanitizer report fails the step
# (-fno-sanitize-recover=all; ASan stops at its first report).
#
# The tests are a representative subset: every unit test of the host suite and of the C API, on
# Kokkos::OpenMP only (Serial runs the same generic kernels; leaving it out halves the build), but
# those whose shapes are sized for the GPU's planners and that run, on the host (which ignores
# the memory budget), the generic kernels the smaller tests run, slowly under the sanitizers
# (docs/notes/2026-11-27.md, "The sanitizer step's longest tests"):
# CrossEntropy.WideVocabularyManyTilesPerTeam, both BackwardInTwoPassesUnderASmallBudget (ignored
# rows, filtered tiles, the bias and the self-similarity form are each in a smaller test), all but
# the bf16 variant of CrossEntropy.TrainingStepInChunksOfRows and
# CrossEntropy.TrainingStepKeepsAPartOfTheColumns (the bf16 one keeps the training step's entry
# under the sanitizers), the Tf32Precision tests (on the host Precision::tf32 runs the exact float
# paths the other f32 tests run); and test_scalar_types (clang 14 has no _Float16), the MPI tests
# (OpenMPI is not built for the sanitizers) and the Python tests (Python is not either).
#
#   scripts/sanitize.sh                       build, test, fuzz 60 s
#   TLSE_FUZZ_SECONDS=0 scripts/sanitize.sh   build and test only
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
kokkos=$("$root/scripts/bootstrap.sh" | tail -n 1)  # installs clang and its sanitizer and fuzzer runtimes
build=$root/build-sanitize
# -O1 keeps the build short and the reports exact; line tables are enough for symbolized stacks.
config=(-G Ninja -DCMAKE_CXX_COMPILER=clang++-14 -DCMAKE_BUILD_TYPE=Debug
        -DCMAKE_CXX_FLAGS_DEBUG="-O1 -gline-tables-only"
        -DCMAKE_CXX_FLAGS="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
        -DKokkos_ROOT="$kokkos" -DCMAKE_PREFIX_PATH="$kokkos" -DTiledLSE_ENABLE_FUZZING=ON
        -DTiledLSE_ENABLE_MPI=OFF -DTiledLSE_ENABLE_PYTHON=OFF -DTiledLSE_ENABLE_APPS=OFF
        -DTiledLSE_ENABLE_PERF_TESTS=OFF -DTiledLSE_TEST_OPENMP_ONLY=ON)
# A build configured otherwise (another compiler or Kokkos) is not reconfigured in place: CMake
# would drop the cache and these settings with it.
[ "$(cat "$build/.config" 2>/dev/null || echo "${config[*]}")" = "${config[*]}" ] || rm -rf "$build"
mkdir -p "$build" && echo "${config[*]}" >"$build/.config"
export ASAN_SYMBOLIZER_PATH=/usr/lib/llvm-14/bin/llvm-symbolizer  # Debian has no plain llvm-symbolizer on PATH

start=$SECONDS
cmake -S "$root" -B "$build" "${config[@]}" >/dev/null
cmake --build "$build" --parallel "$(nproc)"
echo "[sanitize] built in $((SECONDS - start)) s" >&2

start=$SECONDS
export ASAN_OPTIONS=detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=1
export UBSAN_OPTIONS=print_stacktrace=1
# Tests run side by side: idle OpenMP threads sleep (scripts/test.sh says why). Not the fuzzing,
# one process alone, whose calls wait less on threads that spin (docs/notes/2026-11-28.md, "Test
# and build times on CI's two cores").
(cd "$build" && OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive} OMP_PROC_BIND=false ctest --output-on-failure --parallel "$(nproc)" --timeout 600 \
  -E 'WideVocabularyManyTilesPerTeam|BackwardInTwoPassesUnderASmallBudget|(TrainingStepInChunksOfRows|TrainingStepKeepsAPartOfTheColumns)<[A-Za-z]+/OpenMP_f(16|32|64)|Tf32Precision|install_consumer|spack_recipe')
echo "[sanitize] tests ran in $((SECONDS - start)) s" >&2

seconds=${TLSE_FUZZ_SECONDS:-60}
[ "$seconds" -gt 0 ] && exec "$root/scripts/fuzz.sh" "$seconds"
exit 0
