# `find_package(pipetrain)` for users: the library, its headers and a config that finds Torch.
include(CMakePackageConfigHelpers)

install(TARGETS pipetrain EXPORT pipetrainTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(DIRECTORY include/pipetrain DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT pipetrainTargets NAMESPACE pipetrain::
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/pipetrain)
configure_package_config_file(cmake/pipetrainConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/pipetrainConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/pipetrain)
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/pipetrainConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/pipetrainConfig.cmake
  ${CMAKE_CURRENT_BINARY_DIR}/pipetrainConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/pipetrain)
