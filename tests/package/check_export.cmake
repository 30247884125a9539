# cmake -DBINARY_DIR=<idem's build dir> -P check_export.cmake
# Fails when the exported idem-targets.cmake (what `cmake --install` installs) names an empty
# `$<LINK_ONLY:>` or a build-tree-only `$<BUILD_INTERFACE:...>` in idem's link interface.
file(GLOB_RECURSE exports ${BINARY_DIR}/CMakeFiles/Export/idem-targets.cmake)
if(NOT exports)
  message(FATAL_ERROR "no exported idem-targets.cmake under ${BINARY_DIR}/CMakeFiles/Export")
endif()
foreach(export IN LISTS exports)
  file(STRINGS ${export} links REGEX "INTERFACE_LINK_LIBRARIES")
  if(NOT links)
    message(FATAL_ERROR "${export} sets no INTERFACE_LINK_LIBRARIES")
  endif()
  if(links MATCHES "LINK_ONLY:>" OR links MATCHES "BUILD_INTERFACE")
    message(FATAL_ERROR "${export}: an empty or build-only entry in ${links}")
  endif()
  message(STATUS "${links}")
endforeach()
