# IDEM_SANITIZE: a -fsanitize= list (e.g. "address,undefined" or "thread") applied to every target
# idem defines after this file is included: the library, its tests, examples and benchmarks.
set(IDEM_SANITIZE "" CACHE STRING "Sanitizers for idem's targets, e.g. address,undefined or thread")
if(IDEM_SANITIZE)
  add_compile_options(-fsanitize=${IDEM_SANITIZE} -fno-omit-frame-pointer
                      -fno-sanitize-recover=all)
  add_link_options(-fsanitize=${IDEM_SANITIZE})
  # Optimisation and debug info of sanitized builds, after the build type's (the last -O and -g
  # win): -O1 with line tables only compiles in half the time of RelWithDebInfo's -O2 -g (ASan +
  # UBSan, measured on the facade's plan test: 24 s against 13 s), and reports still name file
  # and line. Empty keeps the build type's flags.
  set(IDEM_SANITIZE_FLAGS "-O1;-g1" CACHE STRING "Extra compile options of sanitized builds")
  add_compile_options(${IDEM_SANITIZE_FLAGS})
  # Clang 14 cannot emit UBSan's function check (data before each function) for the parts a
  # C++20 coroutine is split into: "Cannot represent a difference across sections" in every
  # translation unit of the async driver. The check (a call through a function pointer of
  # another type) is left to GCC's UBSan builds, which have no such check to lose.
  if(CMAKE_CXX_COMPILER_ID STREQUAL "Clang" AND IDEM_SANITIZE MATCHES "undefined")
    add_compile_options(-fno-sanitize=function)
  endif()
  # Instrumented code makes GCC's -Wmaybe-uninitialized report false positives (e.g. inside
  # libstdc++'s <regex>), which -Werror would turn into a failed build.
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    add_compile_options(-Wno-maybe-uninitialized)
  endif()
endif()
