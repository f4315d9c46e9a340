# Each public header compiles on its own (as ArborX checks): for every header, a generated
# translation unit that includes only that header (twice: its include guard too), compiled with
# the rest of the build, so that a header that leans on an include of its includer fails the
# build. The units include headers only, nothing is instantiated: each costs the parse of Kokkos
# and of the header, a few seconds. `cmake --build <dir> --target tlse_header_check` builds them
# alone. One object library per target whose usage requirements its units get, and no other's:
#   tlse_header_check_core         core/tlse/*.hpp, core/tlse/testing/*.hpp (TiledLSE::TiledLSE)
#   tlse_header_check_distributed  distributed/tlse/distributed.hpp, distributed/tlse/distributed/*.hpp
#                                  (TiledLSE::Distributed; the MPI and NCCL communicators when the
#                                  build has them)
#   tlse_header_check_c            c_api/include/tlse.h (TiledLSE::C), as C++ and, strictly, as C99
# New headers in these folders are picked up at the next build (CONFIGURE_DEPENDS).
file(GLOB core_headers CONFIGURE_DEPENDS RELATIVE ${PROJECT_SOURCE_DIR}/core
     ${PROJECT_SOURCE_DIR}/core/tlse/*.hpp ${PROJECT_SOURCE_DIR}/core/tlse/testing/*.hpp)
file(GLOB distributed_headers CONFIGURE_DEPENDS RELATIVE ${PROJECT_SOURCE_DIR}/distributed
     ${PROJECT_SOURCE_DIR}/distributed/tlse/distributed*.hpp ${PROJECT_SOURCE_DIR}/distributed/tlse/distributed/*.hpp)
if(NOT TiledLSE_ENABLE_MPI)
  list(REMOVE_ITEM distributed_headers tlse/distributed/mpi_communicator.hpp)
endif()
if(NOT TiledLSE_ENABLE_NCCL)
  list(REMOVE_ITEM distributed_headers tlse/distributed/nccl_communicator.hpp)
endif()

# tlse_header_check(<name> <extension> <header>...): one unit per header, named as a user
# includes it (tlse/linear_lse.hpp), in the object library tlse_header_check_<name>.
function(tlse_header_check name extension)
  if(NOT TARGET tlse_header_check_${name})
    add_library(tlse_header_check_${name} OBJECT)
    add_dependencies(tlse_header_check tlse_header_check_${name})
  endif()
  foreach(header ${ARGN})
    set(TLSE_HEADER ${header})
    string(REGEX REPLACE "[/.]" "_" stem ${header})
    set(source ${CMAKE_CURRENT_BINARY_DIR}/header_check/${stem}.${extension})
    configure_file(${CMAKE_CURRENT_SOURCE_DIR}/header_check.in ${source} @ONLY)  # written only when changed
    target_sources(tlse_header_check_${name} PRIVATE ${source})
  endforeach()
  target_compile_options(tlse_header_check_${name} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra>)
endfunction()

add_custom_target(tlse_header_check)
tlse_header_check(core cpp ${core_headers})
target_link_libraries(tlse_header_check_core PRIVATE TiledLSE::TiledLSE)
tlse_header_check(distributed cpp ${distributed_headers})
target_link_libraries(tlse_header_check_distributed PRIVATE TiledLSE::Distributed)
if(TiledLSE_ENABLE_C_API)
  tlse_header_check(c cpp tlse.h)
  target_link_libraries(tlse_header_check_c PRIVATE TiledLSE::C)
  if(TiledLSE_ENABLE_CUDA)
    # As for test_c_api: nvcc_wrapper compiles the C++ unit for nvcc's default architecture (no
    # Kokkos flags name one) and warns that it is deprecated; the unit holds no device code.
    target_compile_options(tlse_header_check_c PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wno-deprecated-gpu-targets>)
  endif()
  # The header promises C99: checked as such where the machine has a C compiler.
  include(CheckLanguage)
  check_language(C)
  if(CMAKE_C_COMPILER)
    enable_language(C)
    tlse_header_check(c c tlse.h)
    set_target_properties(tlse_header_check_c PROPERTIES C_STANDARD 99 C_STANDARD_REQUIRED ON C_EXTENSIONS OFF)
    target_compile_options(tlse_header_check_c PRIVATE $<$<COMPILE_LANGUAGE:C>:-Wall -Wextra -pedantic-errors>)
  else()
    message(STATUS "tlse_header_check: no C compiler found, tlse.h is checked as C++ only")
  endif()
endif()
