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
install(EXPORT TiledLSETargets NAMESPACE TiledLSE:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/TiledLSE)
configure_package_config_file(cmake/TiledLSEConfig.cmake.in ${CMAKE_CURRENT_BINARY_DIR}/TiledLSEConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/TiledLSE)
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/TiledLSEConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/TiledLSEConfig.cmake ${CMAKE_CURRENT_BINARY_DIR}/TiledLSEConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/TiledLSE)
