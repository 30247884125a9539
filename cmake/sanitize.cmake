# IDEM_SANITIZE: a -fsanitize= list (e.g. "address,undefined" or "thread") applied to every target
# idem defines after this file is included: the library, its tests, examples and benchmarks.
set(IDEM_SANITIZE "" CACHE STRING "Sanitizers for idem's targets, e.g. address,undefined or thread")
if(IDEM_SANITIZE)
  add_compile_options(-fsanitize=${IDEM_SANITIZE} -fno-omit-frame-pointer
                      -fno-sanitize-recover=all)
  add_link_options(-fsanitize=${IDEM_SANITIZE})
  # Instrumented code makes GCC's -Wmaybe-uninitialized report false positives (e.g. inside
  # libstdc++'s <regex>), which -Werror would turn into a failed build.
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    add_compile_options(-Wno-maybe-uninitialized)
  endif()
endif()
