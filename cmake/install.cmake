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
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/idem DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
# The sink's migration (embedded in the library; installed for a DBA to read or apply by hand).
install(FILES ${PROJECT_SOURCE_DIR}/src/sink/schema.sql DESTINATION ${CMAKE_INSTALL_DATADIR}/idem)
if(TARGET idemctl)  # IDEM_BUILD_TOOLS, with its dependencies found
  install(TARGETS idemctl RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()
install(EXPORT idem-targets NAMESPACE idem:: DESTINATION ${IDEM_INSTALL_CMAKEDIR})

# Written aside (package/), not in the build tree's root: idem_DIR=<build dir> finds no package
# there rather than one without its targets file.
# While the major version is 0, a minor version may break the API: find_package(idem 0.1)
# accepts 0.1.x only.
if(PROJECT_VERSION_MAJOR EQUAL 0)
  set(IDEM_COMPATIBILITY SameMinorVersion)
else()
  set(IDEM_COMPATIBILITY SameMajorVersion)
endif()
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/idem-config.cmake.in
  ${PROJECT_BINARY_DIR}/package/idem-config.cmake INSTALL_DESTINATION ${IDEM_INSTALL_CMAKEDIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/package/idem-config-version.cmake
  COMPATIBILITY ${IDEM_COMPATIBILITY})
install(FILES ${PROJECT_BINARY_DIR}/package/idem-config.cmake
  ${PROJECT_BINARY_DIR}/package/idem-config-version.cmake DESTINATION ${IDEM_INSTALL_CMAKEDIR})

# idem.pc finds its prefix relative to itself, so `cmake --install --prefix` relocates it. A static
# libidem needs its dependencies on every link line (Requires); a shared one only libpqxx, the
# public one (see target_link_libraries(idem)), and the others privately.
file(RELATIVE_PATH IDEM_PC_TO_PREFIX /p/${CMAKE_INSTALL_LIBDIR}/pkgconfig /p)
string(REGEX REPLACE "/$" "" IDEM_PC_TO_PREFIX "${IDEM_PC_TO_PREFIX}")
set(IDEM_PC_PRIVATE "hiredis libpq libssl libcrypto fmt simdjson")
if(IDEM_SHARED)
  set(IDEM_PC_REQUIRES "Requires: libpqxx\nRequires.private: ${IDEM_PC_PRIVATE}")
else()
  set(IDEM_PC_REQUIRES "Requires: libpqxx ${IDEM_PC_PRIVATE}")
endif()
list(TRANSFORM IDEM_ASIO_DEFINITIONS PREPEND "-D" OUTPUT_VARIABLE IDEM_PC_DEFINITIONS)
list(JOIN IDEM_PC_DEFINITIONS " " IDEM_PC_DEFINITIONS)
configure_file(${CMAKE_CURRENT_LIST_DIR}/idem.pc.in ${PROJECT_BINARY_DIR}/package/idem.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/package/idem.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
