# TiledLSE_ENABLE_HOPPER: builds libtiledlse_hopper (backends/cuda/hopper, its own CMake project)
# with a CUDA >= 12.4 compiler and links it into TiledLSE::TiledLSE, whose Kokkos::Cuda
# specializations then call it on sm_90 devices (TLSE_HAVE_HOPPER). The Kokkos side may use an
# older CUDA: the library links cudart statically and exports only C functions.
#   TiledLSE_HOPPER_CUDA_COMPILER  nvcc >= 12.4 (default: CMAKE_CUDA_COMPILER, or nvcc on PATH)
#   CUTLASS_INCLUDE_DIR            the folder holding cute/tensor.hpp (CUTLASS >= 3.5)
#   TiledLSE_HOPPER_HOST_COMPILER  host compiler for that nvcc (default: g++)
#   TiledLSE_HOPPER_STRICT         fail the build where ptxas serializes wgmma (default OFF: a warning)
include(ExternalProject)
set(TiledLSE_HOPPER_CUDA_COMPILER "${CMAKE_CUDA_COMPILER}" CACHE FILEPATH "CUDA >= 12.4 compiler of the Hopper kernels")
if(NOT TiledLSE_HOPPER_CUDA_COMPILER)
  find_program(TiledLSE_HOPPER_NVCC nvcc)
  set(TiledLSE_HOPPER_CUDA_COMPILER "${TiledLSE_HOPPER_NVCC}" CACHE FILEPATH "" FORCE)
endif()
set(TiledLSE_HOPPER_HOST_COMPILER "g++" CACHE STRING "host compiler of the Hopper kernels' nvcc")
option(TiledLSE_HOPPER_STRICT "Fail the build where ptxas serializes wgmma (OFF: a warning)" OFF)
find_path(CUTLASS_INCLUDE_DIR cute/tensor.hpp DOC "CUTLASS/CuTe headers (include/ of CUTLASS >= 3.5)")
if(NOT TiledLSE_HOPPER_CUDA_COMPILER OR NOT CUTLASS_INCLUDE_DIR)
  message(FATAL_ERROR "TiledLSE_ENABLE_HOPPER needs TiledLSE_HOPPER_CUDA_COMPILER (nvcc >= 12.4) and "
                      "CUTLASS_INCLUDE_DIR (cute/tensor.hpp); scripts/build_cuda.sh sets both from "
                      "scripts/hopper_toolchain.sh")
endif()

set(hopper_dir ${CMAKE_BINARY_DIR}/hopper)
set(hopper_library ${hopper_dir}/libtiledlse_hopper.so)
ExternalProject_Add(tiledlse_hopper_build
  SOURCE_DIR ${PROJECT_SOURCE_DIR}/backends/cuda/hopper
  BINARY_DIR ${hopper_dir}
  CMAKE_ARGS -DCMAKE_CUDA_COMPILER=${TiledLSE_HOPPER_CUDA_COMPILER}
             -DCMAKE_CUDA_HOST_COMPILER=${TiledLSE_HOPPER_HOST_COMPILER}
             -DCMAKE_CXX_COMPILER=${TiledLSE_HOPPER_HOST_COMPILER}
             -DCUTLASS_INCLUDE_DIR=${CUTLASS_INCLUDE_DIR} -DCMAKE_BUILD_TYPE=Release
             -DTiledLSE_HOPPER_TESTS=${TiledLSE_ENABLE_TESTS} -DTiledLSE_HOPPER_STRICT=${TiledLSE_HOPPER_STRICT}
  CMAKE_GENERATOR ${CMAKE_GENERATOR}
  BUILD_ALWAYS ON  # the sources are part of this tree: let the inner build decide what is stale
  INSTALL_COMMAND ""
  BUILD_BYPRODUCTS ${hopper_library})

add_library(tiledlse_hopper SHARED IMPORTED GLOBAL)
set_target_properties(tiledlse_hopper PROPERTIES IMPORTED_LOCATION ${hopper_library}
  IMPORTED_SONAME libtiledlse_hopper.so INTERFACE_INCLUDE_DIRECTORIES ${PROJECT_SOURCE_DIR}/backends/cuda/hopper)
add_dependencies(tiledlse_hopper tiledlse_hopper_build)

target_compile_definitions(tiledlse INTERFACE TLSE_HAVE_HOPPER)
target_include_directories(tiledlse INTERFACE $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/backends/cuda/hopper>)
# An imported target cannot be exported: installed consumers link the installed file.
target_link_libraries(tiledlse INTERFACE $<BUILD_INTERFACE:tiledlse_hopper>
                      $<INSTALL_INTERFACE:$<INSTALL_PREFIX>/${CMAKE_INSTALL_LIBDIR}/libtiledlse_hopper.so>)
install(FILES ${hopper_library} DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(FILES backends/cuda/hopper/tlse_hopper.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
