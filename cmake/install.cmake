# Install rules: headers, the library, a CMake package (idem-config.cmake, version file, exported
# targets) and idem.pc for pkg-config. Included from the top-level CMakeLists.txt when IDEM_INSTALL.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(IDEM_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/idem)
# Shared or static as built (BUILD_SHARED_LIBS is the top-level project's, maybe unset).
get_target_property(IDEM_LIBRARY_TYPE idem TYPE)
if(IDEM_LIBRARY_TYPE STREQUAL "SHARED_LIBRARY")
  set(IDEM_SHARED ON)
else()
  set(IDEM_SHARED OFF)
endif()

install(TARGETS idem EXPORT idem-targets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/idem DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
if(TARGET idemctl)  # IDEM_BUILD_TOOLS, with its dependencies found
  install(TARGETS idemctl RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()
install(EXPORT idem-targets NAMESPACE idem:: DESTINATION ${IDEM_INSTALL_CMAKEDIR})

configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/idem-config.cmake.in
  ${PROJECT_BINARY_DIR}/idem-config.cmake INSTALL_DESTINATION ${IDEM_INSTALL_CMAKEDIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/idem-config-version.cmake
  COMPATIBILITY SameMajorVersion)
install(FILES ${PROJECT_BINARY_DIR}/idem-config.cmake ${PROJECT_BINARY_DIR}/idem-config-version.cmake
  DESTINATION ${IDEM_INSTALL_CMAKEDIR})

# idem.pc finds its prefix relative to itself, so `cmake --install --prefix` relocates it. A static
# libidem needs its dependencies on every link line (Requires); a shared one only privately.
file(RELATIVE_PATH IDEM_PC_TO_PREFIX /p/${CMAKE_INSTALL_LIBDIR}/pkgconfig /p)
string(REGEX REPLACE "/$" "" IDEM_PC_TO_PREFIX "${IDEM_PC_TO_PREFIX}")
if(IDEM_SHARED)
  set(IDEM_PC_REQUIRES "Requires.private")
else()
  set(IDEM_PC_REQUIRES "Requires")
endif()
configure_file(${CMAKE_CURRENT_LIST_DIR}/idem.pc.in ${PROJECT_BINARY_DIR}/idem.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/idem.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
