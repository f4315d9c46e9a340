# `cmake --install` lays out a relocatable package: headers, the exported targets (paths relative
# to the package's own location) and a config that finds only the dependencies this build used.
#   find_package(TiledLSE CONFIG REQUIRED)            -> TiledLSE::TiledLSE (header-only C++ API)
#   find_package(TiledLSE CONFIG REQUIRED COMPONENTS C) -> also TiledLSE::C (libtiledlse_c, tlse.h)
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)
install(TARGETS tiledlse EXPORT TiledLSETargets)
install(DIRECTORY core/tlse backends/cuda/tlse DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
if(TARGET tiledlse_distributed)
  install(TARGETS tiledlse_distributed EXPORT TiledLSETargets)
  install(DIRECTORY distributed/tlse DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
endif()
if(TiledLSE_ENABLE_NCCL)
  install(FILES cmake/FindNCCL.cmake DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/TiledLSE)
endif()
if(TiledLSE_ENABLE_C_API)
  install(TARGETS tiledlse_c EXPORT TiledLSETargets
          LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
  install(FILES c_api/include/tlse.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
endif()
install(EXPORT TiledLSETargets NAMESPACE TiledLSE:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/TiledLSE)
configure_package_config_file(cmake/TiledLSEConfig.cmake.in ${CMAKE_CURRENT_BINARY_DIR}/TiledLSEConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/TiledLSE)
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/TiledLSEConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/TiledLSEConfig.cmake ${CMAKE_CURRENT_BINARY_DIR}/TiledLSEConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/TiledLSE)
